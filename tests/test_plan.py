"""What ``sweep run`` plans for a cell with checkpoints, through the real ``sweep`` command,
for both places a cell's checkpoints can be: its cell dir's ``ckpt/`` (``$SWEEP_CKPT_DIR``)
and its own dir under a checkpoint root (``$CHECKPOINTS_DIR/<grid>/<cell>``, exported as
``$CKPT_DIR``, the layout of SkyRL-style cells). The rules must be the same for both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# Records what it found, leaves a checkpoint and fails on a fresh run; succeeds on a resume.
STEPPER = '''
import json, os, sys
ckpt = os.environ[sys.argv[1]]
found = sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []
with open(os.path.join(os.environ["SWEEP_CELL_DIR"], "seen.jsonl"), "a") as seen:
    seen.write(json.dumps({"resume": os.environ["SWEEP_RESUME"], "found": found}) + "\\n")
if os.environ["SWEEP_RESUME"] != "1":
    os.makedirs(os.path.join(ckpt, "global_step_5"), exist_ok=True)
    sys.exit("stepper: stopped after step 5")
'''

GRID = '''
import sweepkit as sk
target = sk.command("{{python}}", "-m", "stepper", "{variable}")
base = sk.base(lr=1.0, resume_mode=None)
'''

# layout -> (the variable the cell writes its checkpoints under, $CHECKPOINTS_DIR, where they are)
LAYOUTS = {
    "checkpoint_root": ("CKPT_DIR", lambda project: str(project / "ckpts"),
                        lambda project: project / "ckpts" / "g" / "base"),
    # Relative to the directory sweep runs in, not to the cell dir the cell's process runs in.
    "relative_checkpoint_root": ("CKPT_DIR", lambda project: "ckpts", lambda project: project / "ckpts" / "g" / "base"),
    "cell_dir": ("SWEEP_CKPT_DIR", lambda project: "", lambda project: project / "runs" / "g" / "base" / "ckpt"),
}


@pytest.fixture(params=sorted(LAYOUTS))
def failed_cell(request, sweeper):
    """A cell whose first run failed after leaving ``global_step_5``; returns its checkpoint dir."""
    variable, root, where = LAYOUTS[request.param]
    sweeper.write("stepper.py", STEPPER)
    sweeper.grid("g", GRID.format(variable=variable))
    sweeper.env.update({"CHECKPOINTS_DIR": root(sweeper.path), "CLEAN_CKPT": "", "SWEEP_CLUSTER": ""})
    first = sweeper.run("run", "--executor", "debug")
    assert first.ret != 0 and "stepper: stopped after step 5" in first.output, first
    ckpt = where(sweeper.path)
    assert (ckpt / "global_step_5").is_dir()
    return ckpt


def seen(sweeper) -> list[dict]:
    lines = (sweeper.path / "runs" / "g" / "base" / "seen.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_a_plain_rerun_stops_and_keeps_the_checkpoints(sweeper, failed_cell):
    again = sweeper.run("run", "--executor", "debug")
    assert again.ret != 0, again
    assert f"base: was failed and has checkpoints in {failed_cell}; pass --resume" in again.output
    assert "nothing was run" in again.output and "deleting" not in again.output
    assert (failed_cell / "global_step_5").is_dir()
    assert len(seen(sweeper)) == 1  # the cell did not start


def test_resume_continues_from_the_checkpoints(sweeper, failed_cell):
    resumed = sweeper.run("run", "--executor", "debug", "--resume")
    assert resumed.ret == 0, resumed
    assert "deleting" not in resumed.output
    assert seen(sweeper)[-1] == {"resume": "1", "found": ["global_step_5"]}
    assert (failed_cell / "global_step_5").is_dir()


def test_rerun_deletes_them_and_starts_over(sweeper, failed_cell):
    rerun = sweeper.run("run", "--executor", "debug", "--rerun")
    assert rerun.ret != 0 and "stepper: stopped after step 5" in rerun.output, rerun
    assert "global_step_5" in rerun.output  # what is deleted is named first
    assert seen(sweeper)[-1] == {"resume": "0", "found": []}


def test_the_dry_run_plans_the_resume(sweeper, failed_cell):
    planned = sweeper.run("run", "--executor", "debug", "--resume", "--dry-run")
    assert planned.ret == 0, planned
    assert "RESUME   grids/g.py::base  (resuming a failed run)" in planned.stdout
    assert "env:  SWEEP_RESUME=1" in planned.stdout
    assert (failed_cell / "global_step_5").is_dir()


def test_only_the_job_of_a_rerun_plan_empties_the_cell_dirs_checkpoints(sweeper, monkeypatch):
    # Preparing a cell deletes nothing. Its job empties ckpt/ as it starts the cell, and only
    # for a --rerun plan: a plain run's fresh plan found ckpt/ empty, and what another
    # process wrote there since is kept.
    from sweepkit.run import plan as pl
    from sweepkit.run.prepare import mark_pending, write_cell_files
    from sweepkit.state.transitions import claimed as mark_submitted
    from sweepkit.state import records as st
    from sweepkit.cli import start_session
    from sweepkit.grid.collect import collect
    from sweepkit.run.job import run_cell

    sweeper.write("stepper.py", STEPPER)
    sweeper.grid("g", GRID.format(variable="SWEEP_CKPT_DIR"))
    monkeypatch.setenv("PYTHONPATH", str(sweeper.path))
    session = start_session(["run", "--rootdir", str(sweeper.path), str(sweeper.path / "grids")])
    session.configure()
    (cell,) = collect(session, [str(sweeper.path / "grids")]).cells
    directory = sweeper.path / "runs" / "g" / "base"
    step = directory / "ckpt" / "global_step_3"
    step.mkdir(parents=True)

    for rerun in (False, True):
        plan = pl.Plan(cell=cell, directory=directory, action=pl.FRESH, rerun=rerun)
        write_cell_files(plan, mark_pending(plan, driver=sweeper.path / "driver.lock"))
        assert step.is_dir()
        job = pl.make_job(plan, "debug", session)
        assert mark_submitted(job)
        assert run_cell(job) == "failed"  # "stepper: stopped after step 5"
        assert step.is_dir() is not rerun
    first, second = st.read_state(directory).attempts
    assert first.deleted == ()
    assert [Path(path).name for path in second.deleted] == ["global_step_3", "global_step_5"]


def test_rerun_never_deletes_through_a_ckpt_symlink_that_leaves_the_cell_dir(sweeper):
    # The cell's ckpt/ points at a directory it shares with others: --rerun refuses, naming
    # the link and its target, and deletes nothing anywhere.
    sweeper.write("stepper.py", STEPPER)
    sweeper.grid("g", GRID.format(variable="SWEEP_CKPT_DIR") + "other = sk.cell(lr=2.0)\n")
    sweeper.env.update({"CHECKPOINTS_DIR": "", "SWEEP_CLUSTER": ""})
    assert sweeper.run("run", "--executor", "debug").ret == 1
    shared = sweeper.path / "shared"
    (shared / "global_step_1").mkdir(parents=True)  # another cell's checkpoint
    (shared / "important.txt").write_text("keep")
    link = sweeper.path / "runs" / "g" / "base" / "ckpt"
    for entry in link.iterdir():
        entry.rmdir()
    link.rmdir()
    link.symlink_to(shared)

    rerun = sweeper.run("run", "--executor", "debug", "--rerun")
    assert rerun.ret == 4, rerun
    assert f"base: its checkpoint dir {link} is a symlink to {shared}, outside its cell dir" in rerun.output
    assert "nothing was run" in rerun.output
    assert sorted(path.name for path in shared.iterdir()) == ["global_step_1", "important.txt"]
    assert (sweeper.path / "runs" / "g" / "other" / "ckpt" / "global_step_5").is_dir()
    assert len(seen(sweeper)) == 1  # it did not start again


FAILS_AFTER_WRITING = """
import sweepkit as sk
target = sk.command("{{python}}", "-c",
    "import os, sys, pathlib; d = pathlib.Path(os.environ['SWEEP_CKPT_DIR']); "
    "(d / 'run_info.json').write_text('{{}}'); (d / 'reference.safetensors').write_text(''); "
    "[(d / name).write_text('weights') for name in sys.argv[1:]]; sys.exit(1)", {names})
base = sk.base(lr=1.0)
"""


def test_the_trainers_start_files_are_no_checkpoint_to_resume_from(sweeper):
    # The trainer writes run_info.json (and its KL reference) before step 1: a run that
    # failed before its first checkpoint (even during its write) is started again fresh,
    # not refused; a file of any other name is a checkpoint.
    sweeper.grid("g", FAILS_AFTER_WRITING.format(names='".tmp-global_step_1"'))  # killed mid-write
    assert sweeper.run("run", "--executor", "debug").ret == 1
    again = sweeper.run("run", "--executor", "debug")
    assert again.ret == 1 and "nothing was run" not in again.output, again  # it ran again
    sweeper.grid("g", FAILS_AFTER_WRITING.format(names='"model.pt"'))
    assert sweeper.run("run", "--executor", "debug", "--rerun").ret == 1
    refused = sweeper.run("run", "--executor", "debug")
    assert refused.ret == 4 and "has checkpoints in" in refused.output, refused
