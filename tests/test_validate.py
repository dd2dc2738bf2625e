"""Validation before anything runs: every error of every cell at once, with file:line; nothing runs."""

from sweepkit.validate import check_type, runs_dir_problem


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
    assert "grids/g.py:5: wide: gpus: expected int, got 'four' (str)" in err
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
