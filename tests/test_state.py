"""Run state on disk: atomic files, the cell lock, and the job function that honours both."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest

from sweepkit.state import files as fs
from sweepkit.state import records as st
from sweepkit.state import transitions as tr
from sweepkit.run.job import CellJob, run_cell
from test_run import script_grid


def pending_cell(directory: Path, token: str = "tok") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tr.write_state(directory, st.CellState(
        nodeid="grids/g.py::c", state="submitted", config_hash="h",
        submission=st.Submission(executor="test", token=token, submitted=time.time())))


def job_for(directory: Path, code: str, token: str = "tok") -> CellJob:
    return CellJob(nodeid="grids/g.py::c", cell_dir=str(directory), argv=(sys.executable, "-c", code),
                   env={"SWEEP_CELL": "grids/g.py::c"}, token=token, executor="test")


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "condition not reached"
        time.sleep(0.02)


def test_state_round_trips_and_writes_leave_no_temp_files(tmp_path):
    state = st.CellState(nodeid="g::c", state="failed", config_hash="h", profile="smoke",
                         attempts=[st.Attempt(n=1, executor="local", job_id="12", returncode=1, failure="boom")])
    tr.write_state(tmp_path, state)
    assert st.read_state(tmp_path).attempts == state.attempts
    assert st.read_state(tmp_path).profile == "smoke"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["state.json"]
    with pytest.raises(ValueError, match="state"):
        st.CellState(nodeid="g::c", state="exploded", config_hash="h")
    (tmp_path / "state.json").write_text('{"nodeid": "g::c"}')
    with pytest.raises(st.DamagedFile, match="state.json: not a state record: missing keys state, config_hash"):
        st.load_state(tmp_path)


@pytest.mark.parametrize("text, reason", [
    ("", "empty"),
    ('{"nodeid": "g::c", "state": "comp', "not valid JSON"),
    ("[1, 2]", "not a state record: not a JSON object"),
    ('{"nodeid": "g::c", "state": "exploded", "config_hash": "h"}', "not a state record"),
    ('{"nodeid": "g::c", "state": "failed", "config_hash": "h", "attempts": [7]}', "not a state record"),
])
def test_a_damaged_state_file_reads_as_no_state_and_says_why(tmp_path, text, reason):
    (tmp_path / "state.json").write_text(text)
    assert st.read_state(tmp_path) is None  # so a fresh run (--rerun) can write a new one
    problem = st.state_problem(tmp_path)
    assert problem.path == tmp_path / "state.json" and problem.reason.startswith(reason), problem
    assert st.state_problem(tmp_path.parent) is None
    tr.update_state(tmp_path, lambda state: st.CellState(nodeid="g::c", state="pending", config_hash="h"))
    assert st.read_state(tmp_path).state == "pending" and st.state_problem(tmp_path) is None


def damaged_grid(sweeper):
    """Two cells run to completion; then base's state.json is cut short."""
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    script_grid(sweeper, "g", "other = sk.cell(steps=2)", steps=1, sleep=0.0)
    assert sweeper.run("run").ret == 0
    state = sweeper.path / "runs/g/base/state.json"
    state.write_text(state.read_text()[:25])
    return state


def test_a_damaged_state_json_is_named_and_the_rest_of_the_grid_keeps_working(sweeper):
    state = damaged_grid(sweeper)
    damaged = state.read_text()

    status = sweeper.run("status")
    assert status.ret == 0, status
    rows = {line.split()[0]: line.split()[1] for line in status.stdout.splitlines() if "::" in line}
    assert rows == {"grids/g.py::base": "DAMAGED", "grids/g.py::other": "PASSED"}, status
    assert "runs/g/base/state.json: not valid JSON" in status.output, status
    assert "sweep run grids/g.py::base --rerun" in status.output, status

    report = sweeper.run("report", "--format", "csv", "--table", "throughput")
    assert report.ret == 0, report
    assert "base,damaged," in report.stdout and "other,passed," in report.stdout, report
    assert "runs/g/base/state.json: not valid JSON" in report.stderr, report

    cancel = sweeper.run("cancel")
    assert cancel.ret == 0, cancel
    assert "runs/g/base/state.json: not valid JSON" in cancel.stderr, cancel

    for args in (("run",), ("run", "--failed"), ("run", "--resume")):
        result = sweeper.run(*args)
        assert result.ret == 1, result  # the damaged cell did not pass
        assert "runs/g/base/state.json: not valid JSON" in result.stderr, result
        assert "sweep run grids/g.py::base --rerun starts it over" in result.stderr, result
        assert state.read_text() == damaged  # neither run over nor silently repaired
        if args == ("run",):  # the rest of the grid is planned as usual
            assert any("SKIPPED" in line and "grids/g.py::other" in line for line in result.stdout.splitlines()), result

    for result in (status, report, cancel):
        assert "Traceback" not in result.output, result
    rerun = sweeper.run("run", "grids/g.py::base", "--rerun")
    assert rerun.ret == 0, rerun
    assert json.loads(state.read_text())["state"] == "completed"
    status = sweeper.run("status")
    assert status.stdout.splitlines()[-1] == "2 PASSED" and status.stderr == "", status


def test_a_damaged_cell_json_is_named_and_its_state_still_shown(sweeper):
    damaged_grid(sweeper)
    (sweeper.path / "runs/g/other/cell.json").write_text("")
    status = sweeper.run("status")
    assert status.ret == 0, status
    assert "runs/g/other/cell.json: empty" in status.stderr, status
    assert "PASSED" in next(line for line in status.stdout.splitlines() if line.startswith("grids/g.py::other "))
    report = sweeper.run("report", "--format", "csv", "--table", "throughput")
    assert report.ret == 0 and "other,passed," in report.stdout, report
    assert "runs/g/other/cell.json: empty" in report.stderr, report


def test_lock_is_held_while_its_process_lives_and_freed_by_sigkill(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from sweepkit.state.files import CellLock; "
        f"CellLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    tr.write_state(tmp_path, st.CellState(nodeid="g::c", state="running", config_hash="h"))
    assert st.is_locked(tmp_path)
    assert st.effective_state(tmp_path, st.read_state(tmp_path)) == "running"
    assert not fs.CellLock(tmp_path).acquire(blocking=False)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert not st.is_locked(tmp_path)
    # A run that recorded "running" and whose lock is free died without recording its end.
    assert st.effective_state(tmp_path, st.read_state(tmp_path)) == "interrupted"


def test_run_cell_records_attempt_output_and_failure(tmp_path):
    pending_cell(tmp_path)
    code = "import sys; print('out'); print('Traceback ...\\nValueError: bad lr', file=sys.stderr); sys.exit(3)"
    assert run_cell(job_for(tmp_path, code), job_id="j1") == "failed"
    state = st.read_state(tmp_path)
    assert state.state == "failed"
    (attempt,) = state.attempts
    assert (attempt.n, attempt.job_id, attempt.returncode) == (1, "j1", 3)
    assert attempt.failure == "exit code 3: ValueError: bad lr"
    assert attempt.pid == os.getpid() and attempt.started <= attempt.ended
    assert (tmp_path / "stdout.log").read_text() == "out\n"
    assert not st.is_locked(tmp_path)


def test_a_requeued_job_of_a_completed_submission_runs_nothing(tmp_path):
    # A restarted slurmctld can requeue a job that had already run its cell to the end.
    pending_cell(tmp_path)
    assert run_cell(job_for(tmp_path, "pass"), job_id="j1") == "completed"
    marker = tmp_path / "ran"
    assert run_cell(job_for(tmp_path, f"open({str(marker)!r}, 'w')"), job_id="j1") == "completed"
    assert not marker.exists()
    state = st.read_state(tmp_path)
    assert state.state == "completed" and len(state.attempts) == 1


def test_superseded_job_runs_nothing(tmp_path):
    pending_cell(tmp_path, token="newer")
    marker = tmp_path / "ran"
    assert run_cell(job_for(tmp_path, f"open({str(marker)!r}, 'w')", token="older")) == "superseded"
    assert not marker.exists()
    assert st.read_state(tmp_path).attempts == ()


def test_cell_process_keeps_the_lock_when_its_job_is_killed(tmp_path):
    pending_cell(tmp_path)
    pid_file = tmp_path / "child.pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    job = subprocess.Popen([sys.executable, "-c", (
        "import pickle, sys; from sweepkit.run.job import run_cell; "
        "run_cell(pickle.loads(sys.stdin.buffer.read()), job_id='j')")], stdin=subprocess.PIPE)
    job.stdin.write(pickle.dumps(job_for(tmp_path, code)))
    job.stdin.close()
    wait_for(lambda: pid_file.exists() and pid_file.read_text())
    job.send_signal(signal.SIGKILL)
    job.wait()
    # The job died, but the cell's command still runs: nobody may start it again yet.
    assert st.is_locked(tmp_path)
    assert st.effective_state(tmp_path, st.read_state(tmp_path)) == "running"
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    wait_for(lambda: not st.is_locked(tmp_path))
    assert st.effective_state(tmp_path, st.read_state(tmp_path)) == "interrupted"


@pytest.mark.parametrize(("state", "xfail", "expected"), [
    ("completed", None, "passed"),
    ("failed", None, "failed"),
    ("interrupted", None, "interrupted"),
    ("failed", {"strict": False}, "xfailed"),
    ("interrupted", {"strict": False}, "xfailed"),
    ("completed", {"strict": False}, "xpassed"),
    ("completed", {"strict": True}, "xpassed-strict"),
    ("running", {"strict": False}, "running"),
    ("cancelled", None, "cancelled"),
])
def test_outcome(state, xfail, expected):
    assert st.outcome(state, xfail) == expected


def test_find_cell_dirs_from_disk(tmp_path):
    for grid, cell in (("g", "base"), ("g", "tbs128"), ("h", "base")):
        (tmp_path / grid / cell).mkdir(parents=True)
        fs.write_json(tmp_path / grid / cell / "cell.json", {"nodeid": f"grids/{grid}.py::{cell}"})
    (tmp_path / ".drivers").mkdir()
    assert [p.relative_to(tmp_path).as_posix() for p in st.find_cell_dirs(tmp_path, [])] == [
        "g/base", "g/tbs128", "h/base"]
    assert [p.name for p in st.find_cell_dirs(tmp_path, ["grids/g.py"])] == ["base", "tbs128"]
    assert [p.parent.name for p in st.find_cell_dirs(tmp_path, ["grids/h.py::base"])] == ["h"]
    with pytest.raises(ValueError, match="grids/g.py::nope: no runs of it"):
        st.find_cell_dirs(tmp_path, ["grids/g.py::nope"])
    assert json.loads((tmp_path / "g" / "base" / "cell.json").read_text())["nodeid"] == "grids/g.py::base"


def test_a_fresh_start_never_deletes_through_a_ckpt_link_out_of_the_cell_dir(tmp_path):
    # The plan refuses such a --rerun; a link made after the plan stops the job instead,
    # which records why and leaves the earlier run's files (and the link's target) alone.
    from sweepkit.run.job import FreshStart

    directory = tmp_path / "cell"
    pending_cell(directory)
    shared = tmp_path / "shared"
    (shared / "global_step_1").mkdir(parents=True)
    (shared / "important.txt").write_text("keep")
    (directory / "ckpt").symlink_to(shared)
    (directory / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    marker = tmp_path / "ran"
    job = attrs.evolve(job_for(directory, f"open({str(marker)!r}, 'w')"),
                       fresh=FreshStart(rerun=True, config_hash="new"))
    assert run_cell(job) == "failed"
    state = st.read_state(directory)
    assert state.state == "failed" and not marker.exists()
    assert state.attempts[-1].failure.startswith(f"not started: its checkpoint dir {directory / 'ckpt'} is a symlink "
                                                 f"to {shared}, outside its cell dir")
    assert sorted(path.name for path in shared.iterdir()) == ["global_step_1", "important.txt"]
    assert (directory / "metrics.jsonl").is_file() and state.config_hash == "h"
