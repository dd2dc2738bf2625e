"""Validation before anything runs: every error of every cell at once, with file:line; nothing runs."""

from pathlib import Path

from sweepkit.grid.validate import check_type, runs_dir_problem


def assert_nothing_ran(sweeper):
    runs = sweeper.path / "runs"
    assert not runs.exists() or not any(runs.rglob("state.json")), list(runs.rglob("*"))


def test_all_errors_reported_together_and_nothing_runs(sweeper):
    sweeper.grid("g", '''
import sweepkit as sk

base = sk.base(lr=1e-6, lrr=3.0, train_batch_size=32, policy_mini_batch_size=32)
slow = sk.cell(lr="fast")
wide = sk.cell(train_batch_size=48, gpus="four", time_limit="half an hour")
ok = sk.cell(lr=1e-5)
''')
    result = sweeper.run("run")
    assert result.ret == 4, result
    err = result.stderr
    assert "grids/g.py:3: base, slow, wide, ok (4 cells): lrr: unknown key for target 'trainer' " \
           "(did you mean 'lr'?)" in err
    assert "grids/g.py:4: slow: lr: expected float, got 'fast' (str)" in err
    assert "grids/g.py:5: wide: gpus: expected int | null, got 'four' (str)" in err
    assert "grids/g.py:5: wide: time_limit: expected 'HH:MM:SS' or minutes, got 'half an hour'" in err
    # The trainer plugin's own rule, for a value of the right type.
    assert "grids/g.py:5: wide: train_batch_size: 48 is not a multiple of policy_mini_batch_size=32" in err
    assert "5 errors found; nothing was run" in err
    assert_nothing_ran(sweeper)


def test_wrong_type_for_a_command_target_is_judged_by_the_base_value(sweeper):
    sweeper.grid("g", '''
import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
base = sk.base(steps=10, name="a", flags=[1])
more = sk.cell(steps="ten")
other = sk.cell(steps=2.5, name="b", flags=(1, 2), anything_new={"x": 1})
''')
    result = sweeper.run("run")
    assert result.ret == 4, result
    assert "grids/g.py:4: more: steps: expected int like the base's 10, got 'ten' (str)" in result.stderr
    assert "1 error found" in result.stderr
    assert_nothing_ran(sweeper)


def test_list_reports_invalid_cells_after_listing_them(sweeper):
    sweeper.grid("g", 'import sweepkit as sk\nbase = sk.base(lr=-1.0)\n')
    result = sweeper.run("list")
    assert result.ret == 4
    assert "grids/g.py::base" in result.stdout
    assert "grids/g.py:2: base: lr: must be > 0, got -1.0" in result.stderr


def test_unwritable_runs_dir(sweeper):
    sweeper.grid("g", 'import sweepkit as sk\ntarget = sk.command("{python}", "-c", "pass")\n'
                      'base = sk.base(lr=1.0)\n')
    blocker = sweeper.write("blocker", "a regular file, so nothing can be created under it\n")
    result = sweeper.run("--runs-dir", str(blocker / "runs"), "run")
    assert result.ret == 4, result
    assert f"runs dir {blocker / 'runs'} is not writable: {blocker} is not a directory" in result.stderr
    assert "nothing was run" in result.stderr


def test_runs_dir_problem_accepts_a_dir_to_be_made(tmp_path):
    assert runs_dir_problem(tmp_path / "a" / "b") is None
    assert not (tmp_path / "a").exists()


def test_check_type_follows_json_and_annotations():
    from typing import Optional

    assert check_type(1, float) and not check_type(True, int) and not check_type(1.5, int)
    assert check_type(None, Optional[int]) and check_type([0.9, 0.99], tuple[float, float])
    assert not check_type([0.9], tuple[float, float])
    assert check_type({"A": "1"}, dict[str, str]) and not check_type({"A": 1}, dict[str, str])


def test_nan_and_inf_are_refused_for_every_target(sweeper):
    sweeper.grid("g", '''
import sweepkit as sk
base = sk.base(lr=float("nan"))
high = sk.cell(lr=float("inf"), adam_betas=(0.9, float("-inf")))
''')
    sweeper.grid("h", '''
import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
base = sk.base(scale=1.0, env={})
odd = sk.cell(scale=float("nan"), mem_gb=float("inf"))
''')
    result = sweeper.run("run")
    assert result.ret == 4, result
    err = result.stderr
    assert "grids/g.py:2: base: lr: expected a finite number, got nan" in err
    assert "grids/g.py:3: high: lr: expected a finite number, got inf" in err
    assert "grids/g.py:3: high: adam_betas: expected a finite number, got (0.9, -inf)" in err
    assert "grids/h.py:4: odd: scale: expected a finite number, got nan" in err
    assert "grids/h.py:4: odd: mem_gb: expected a finite number, got inf" in err
    assert "5 errors found; nothing was run" in err
    assert_nothing_ran(sweeper)


def test_a_profile_does_not_hide_the_grids_own_values(sweeper):
    sweeper.grid("g", '''
import sweepkit as sk
base = sk.base(model="Qwen/Qwen2.5-1.5B-Instruct", train_batch_size=-32, policy_mini_batch_size=32)
four = sk.cell(train_batch_size=32, gpus="four")
text = sk.cell(train_batch_size="64")
''')
    for command in (("run", "--profile", "smoke", "--dry-run"), ("list", "--profile", "smoke")):
        result = sweeper.run(*command)
        assert result.ret == 4, result
        err = result.stderr
        assert "Traceback" not in result.output, result
        assert "grids/g.py:2: base: train_batch_size: must be > 0, got -32" in err
        assert "grids/g.py:3: four: gpus: expected int | null, got 'four' (str)" in err
        assert "grids/g.py:4: text: train_batch_size: expected int, got '64' (str)" in err
    assert "3 errors found; nothing was run" in sweeper.run("run", "--profile", "smoke", "--dry-run").stderr
    assert_nothing_ran(sweeper)


def test_the_values_a_profile_sets_are_validated_after_the_grids(sweeper):
    sweeper.write("sweepconf.py", '''
from sweepkit import hookimpl

@hookimpl
def sweep_register_profiles(register):
    register("broken", lambda config, target: {"top_p": 1.5}, "sets a value the trainer refuses")
''')
    sweeper.grid("g", 'import sweepkit as sk\nbase = sk.base(top_p=0.9)\n')
    result = sweeper.run("run", "--profile", "broken", "--dry-run")
    assert result.ret == 4, result
    assert "grids/g.py:2: base: top_p: must be in (0, 1], got 1.5 (the value --profile broken sets)" in result.stderr
    assert "1 error found" in result.stderr


def test_the_builtin_trainers_grids_run_the_measured_engine_and_vllm_says_it_is_unrun(sweeper):
    """The shipped grids use backend='auto'; a grid that asks for vllm is told, in its dry
    run, that nothing here has run that engine (and the cell is still planned)."""
    for grid in ("gsm8k_throughput", "opd_qwen3"):
        assert 'backend="auto"' in (Path(__file__).parents[1] / "grids" / f"{grid}.py").read_text()
    sweeper.grid("v", '''
import sweepkit as sk
base = sk.base(model="tiny-random", dataset="synthetic", backend="vllm")
other = sk.cell(lr=1e-5)
''')
    result = sweeper.run("run", "--dry-run")
    assert result.ret == 0, result
    warnings = [line for line in result.stderr.splitlines() if "backend='vllm'" in line]
    assert len(warnings) == 1, result.stderr  # once for the grid, where base sets it
    assert warnings[0].startswith("warning: grids/v.py:2: base: backend='vllm' runs an engine no tested machine")
    assert "backend='auto'" in warnings[0]
    assert "would run 2 fresh" in result.stdout
