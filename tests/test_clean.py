"""``sweep clean`` end to end on real tiny trainer cells: what goes, what stays, what is refused."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import CHECKPOINTED_TINY_GRID, Sweeper

TINY = CHECKPOINTED_TINY_GRID
# The same run under a command that fails once the trainer is done: a failed cell with checkpoints.
FAILING = """
import sweepkit as sk
RUN = "import subprocess, sys; subprocess.run([sys.executable, '-m', 'trainer', *sys.argv[1:]]); sys.exit(1)"
target = sk.command("{python}", "-c", RUN, "{config}", "--ckpt-dir", "{ckpt_dir}", "--metrics", "{metrics}")
base = sk.base(model="tiny-random", dataset="synthetic", device="cpu", backend="hf", num_gpus=0,
               train_batch_size=4, policy_mini_batch_size=4, n_samples_per_prompt=2, max_generate_length=4,
               max_steps=2, eval_limit=4, ckpt_interval=1, eval_before_train=False, synthetic_size=64,
               export_final=False)
"""


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> Path:
    """One run of both grids; each test cleans a copy of it."""
    sweeper = Sweeper.new(tmp_path_factory.mktemp("clean"))
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    sweeper.grid("tiny", TINY)
    sweeper.grid("failing", FAILING)
    assert sweeper.run("run", "grids/tiny.py").ret == 0
    failed = sweeper.run("run", "grids/failing.py")
    assert failed.ret == 1, failed
    return sweeper.path


@pytest.fixture
def project(ran, tmp_path) -> Sweeper:
    copy = tmp_path / "project"
    shutil.copytree(ran, copy, symlinks=True)
    sweeper = Sweeper(copy)
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    return sweeper


def ckpt(project: Sweeper, grid: str = "tiny") -> Path:
    return project.path / "runs" / grid / "base" / "ckpt"


def steps(project: Sweeper, grid: str = "tiny") -> list[str]:
    return sorted(path.name for path in ckpt(project, grid).glob("global_step_*"))


def tree_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file() and not file.is_symlink())


def best_step(project: Sweeper) -> int:
    evals = [json.loads(line) for line in (ckpt(project).parent / "metrics.jsonl").read_text().splitlines()]
    evals = {record["step"]: record["eval/pass_at_k"] for record in evals if record["kind"] == "eval"}
    return max(sorted(evals), key=lambda step: evals[step])


def state(project: Sweeper, grid: str = "tiny") -> dict:
    return json.loads((project.path / "runs" / grid / "base" / "state.json").read_text())


def test_a_dry_run_lists_and_deletes_nothing(project):
    before = {path.name: tree_bytes(path) for path in ckpt(project).iterdir()}
    result = project.run("clean", "grids/tiny.py", "--keep", "best")
    assert result.ret == 0, result
    best = best_step(project)
    gone = [f"global_step_{step}" for step in (1, 2, 3) if step != best]
    for name in gone:
        assert f"would delete runs/tiny/base/ckpt/{name}" in result.stdout
    assert "add --yes to delete" in result.stdout
    assert {path.name: tree_bytes(path) for path in ckpt(project).iterdir()} == before
    assert state(project)["cleaned"] is None


def test_keep_best_keeps_exactly_the_chosen_step_and_frees_the_rest(project):
    best = best_step(project)
    gone = [f"global_step_{step}" for step in (1, 2, 3) if step != best]
    freed = sum(tree_bytes(ckpt(project) / name) for name in gone)
    metrics = (ckpt(project).parent / "metrics.jsonl").read_text()
    result = project.run("clean", "grids/tiny.py", "--keep", "best", "--yes")
    assert result.ret == 0, result
    assert steps(project) == [f"global_step_{best}"]
    assert (ckpt(project) / "latest").read_text().strip() == f"global_step_{best}"
    assert (ckpt(project) / "run_info.json").is_file()  # not a checkpoint: kept
    assert (ckpt(project).parent / "metrics.jsonl").read_text() == metrics
    record = state(project)
    assert record["state"] == "completed"
    assert record["cleaned"]["kept"] == best and sorted(record["cleaned"]["deleted"]) == gone
    assert record["cleaned"]["freed_bytes"] == freed and record["cleaned"]["by"] == "eval/pass_at_k"
    status = project.run("status", "grids/tiny.py")
    assert status.ret == 0, status
    assert f"cleaned (kept step {best})" in status.stdout
    again = project.run("clean", "grids/tiny.py", "--keep", "best", "--yes")
    assert again.ret == 0 and "nothing to delete" in again.stdout, again


def test_keep_last_and_keep_none(project):
    assert project.run("clean", "grids/tiny.py", "--keep", "last", "--yes").ret == 0
    assert steps(project) == ["global_step_3"]
    assert (ckpt(project) / "latest").read_text().strip() == "global_step_3"
    result = project.run("clean", "grids/tiny.py", "--keep", "none", "--yes")
    assert result.ret == 0, result
    assert steps(project) == [] and not (ckpt(project) / "latest").exists()
    assert (ckpt(project) / "run_info.json").is_file()
    assert state(project)["cleaned"]["kept"] is None
    assert "cleaned (no checkpoint kept)" in project.run("status", "grids/tiny.py").stdout


def test_a_symlinked_checkpoint_loses_its_link_and_keeps_its_target(project):
    elsewhere = project.path / "elsewhere" / "global_step_1"
    elsewhere.parent.mkdir()
    os.replace(ckpt(project) / "global_step_1", elsewhere)
    (ckpt(project) / "global_step_1").symlink_to(elsewhere)
    files = sorted(path.name for path in elsewhere.iterdir())
    result = project.run("clean", "grids/tiny.py", "--keep", "last", "--yes")
    assert result.ret == 0, result
    assert not (ckpt(project) / "global_step_1").is_symlink() and steps(project) == ["global_step_3"]
    assert sorted(path.name for path in elsewhere.iterdir()) == files and tree_bytes(elsewhere) > 0


def test_a_ckpt_dir_linked_out_of_the_cell_dir_is_refused(project):
    outside = project.path / "shared-ckpt"
    os.replace(ckpt(project), outside)
    ckpt(project).symlink_to(outside)
    before = sorted(path.name for path in outside.iterdir())
    result = project.run("clean", "grids/tiny.py", "--keep", "none", "--yes")
    assert result.ret == 1, result
    assert "REFUSED  grids/tiny.py::base: its checkpoint dir" in result.stderr and "symlink" in result.stderr
    assert sorted(path.name for path in outside.iterdir()) == before


def test_a_running_cell_keeps_its_checkpoints(project):
    from sweepkit.state.files import LOCK_FILE, flock

    with flock(ckpt(project).parent / LOCK_FILE):  # the lock a running cell's job holds
        result = project.run("clean", "grids/tiny.py", "--keep", "none", "--yes")
    assert result.ret == 1, result
    assert "REFUSED  grids/tiny.py::base: is running now" in result.stderr
    assert steps(project) == ["global_step_1", "global_step_2", "global_step_3"]
    assert state(project)["cleaned"] is None


def test_keep_best_of_a_cell_without_evals_at_its_checkpoints_deletes_nothing(project):
    shutil.rmtree(ckpt(project, "failing") / "global_step_2")  # its only eval was at step 2
    result = project.run("clean", "grids/failing.py", "grids/tiny.py", "--keep", "best", "--yes")
    assert result.ret == 4, result
    assert "no eval of eval/pass_at_k at a checkpointed step (checkpointed steps: 1; evals at steps 2)" \
        in result.stderr and "nothing was deleted" in result.stderr
    assert steps(project, "failing") == ["global_step_1"]
    assert steps(project) == ["global_step_1", "global_step_2", "global_step_3"]


def test_resume_after_keep_none_refuses(project):
    assert state(project, "failing")["state"] == "failed" and steps(project, "failing")
    attempts = len(state(project, "failing")["attempts"])
    assert project.run("clean", "grids/failing.py", "--keep", "none", "--yes").ret == 0
    assert steps(project, "failing") == []
    result = project.run("run", "grids/failing.py", "--resume")
    assert result.ret == 4, result
    assert "sweep clean --keep none" in result.stderr and "--rerun" in result.stderr
    assert len(state(project, "failing")["attempts"]) == attempts


# A command target with a checkpoint layout of its own: steps 1-3, its best eval at step 1, and a
# latest-step pointer ``LATEST_STEP`` holding the step's number. Its plugin says so.
OWN_LAYOUT = '''
import json, os, pathlib, sys
ckpt = pathlib.Path(sys.argv[1])
with open(os.environ["SWEEP_METRICS"], "a") as metrics:
    for step, score in ((1, 0.9), (2, 0.1), (3, 0.2)):
        (ckpt / f"global_step_{step}").mkdir(parents=True)
        (ckpt / f"global_step_{step}" / "weights.bin").write_bytes(bytes(1000))
        (ckpt / "LATEST_STEP").write_text(f"{step}\\n")
        metrics.write(json.dumps({"kind": "train", "step": step, "loss": 1.0}) + "\\n")
        metrics.write(json.dumps({"kind": "eval", "step": step, "eval/pass_at_k": score}) + "\\n")
'''
POINTER_PLUGIN = '''
import sweepkit as sk

@sk.hookimpl
def sweep_checkpoint_pointer(cell, entry, session):
    return "{}" if entry.name == "LATEST_STEP" else None
'''


@pytest.mark.parametrize("plugin", [True, False], ids=["its-plugin-names-the-pointer", "no-plugin"])
def test_a_pointer_a_plugin_names_is_rewritten_to_the_kept_step(tmp_path, plugin):
    sweeper = Sweeper.new(tmp_path)
    sweeper.write("own.py", OWN_LAYOUT)
    if plugin:
        sweeper.write("grids/sweepconf.py", POINTER_PLUGIN)
    sweeper.grid("own", 'import sweepkit as sk\ntarget = sk.command("{python}", "{root}/own.py", "{ckpt_dir}")\n'
                        'base = sk.base(x=1)\n')
    assert sweeper.run("run", "grids/own.py").ret == 0
    result = sweeper.run("clean", "grids/own.py", "--keep", "best", "--by", "eval/pass_at_k", "--yes")
    assert result.ret == 0, result
    own = ckpt(sweeper, "own")
    assert steps(sweeper, "own") == ["global_step_1"]
    if plugin:  # rewritten to the kept step before anything was deleted
        assert (own / "LATEST_STEP").read_text() == "1\n"
    else:  # no plugin knows it for a pointer: an entry like any other, left as it was
        assert (own / "LATEST_STEP").read_text() == "3\n"
