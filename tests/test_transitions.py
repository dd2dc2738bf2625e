"""Every change of a cell's state is a named transition (``sweepkit.state.transitions``), and
the files they write are whole or absent, also on a file system that fills up: checked on
a real tmpfs of a few MiB, mounted for the test (as root; skipped, with the reason, where
mounting is not allowed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest

from sweepkit.run.job import CellJob
from sweepkit.state import files as fs
from sweepkit.state import records as st
from sweepkit.state import transitions as tr


@pytest.fixture
def tmpfs():
    """``tmpfs(path, size)`` mounts a tmpfs of ``size`` at ``path`` (made if need be), unmounted
    after the test."""
    mounted: list[Path] = []

    def mount(path: Path, size: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("mounting a tmpfs needs root and mount(8)")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path) -> Path:
    """Write zeros into ``directory`` until its file system refuses another block."""
    blob = directory / "blob"
    with open(blob, "wb", buffering=0) as handle:
        for size in (65536, 512):  # then in small writes, so that not even part of a block is left
            try:
                while True:
                    handle.write(b"\0" * size)
            except OSError:
                pass
    return blob


def temp_files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.name.endswith(".tmp"))


def job(directory: Path, token: str = "t") -> CellJob:
    return CellJob(nodeid="grids/g.py::c", cell_dir=str(directory), argv=(sys.executable, "-c", "pass"),
                   token=token, executor="local")


def test_a_cell_goes_pending_claimed_submitted_started_finished_through_the_transitions(tmp_path):
    driver = tmp_path / "driver.lock"
    lock = fs.FileLock(driver)
    lock.acquire()
    try:
        state = tr.pending(tmp_path, nodeid="grids/g.py::c", config_hash="h", profile=None, fresh=True, driver=driver)
        assert (state.state, state.previous, state.driver) == ("pending", None, str(driver))
        assert st.effective_state(tmp_path, st.read_state(tmp_path)) == "pending"
        assert tr.claimed(job(tmp_path), driver=driver)
        assert not tr.claimed(job(tmp_path, "later"), driver=driver)  # no longer pending under it
        tr.submitted(job(tmp_path), "42")
        tr.submitted(job(tmp_path, "other"), "99")  # not the cell's submission: nothing written
        assert st.read_state(tmp_path).submission.job_id == "42"
        attempt = tr.started(job(tmp_path), job_id=None)
        assert (attempt.n, attempt.job_id) == (1, "42")
        tr.finished(tmp_path, attempt.n, returncode=0, failure=None, final="completed")
        assert st.read_state(tmp_path).state == "completed"
        # A fresh attempt over it remembers the run whose files stay until its job starts,
        # and a driver that gives it up puts that run back.
        again = tr.pending(tmp_path, nodeid="grids/g.py::c", config_hash="new", profile=None, fresh=True,
                           driver=driver)
        assert (again.previous, again.config_hash) == ("completed", "h")
        tr.withdrawn(tmp_path, driver=driver)
        back = st.read_state(tmp_path)
        assert (back.state, back.previous, back.driver, len(back.attempts)) == ("completed", None, None, 1)
    finally:
        lock.release()
    # The driver is gone: a cell it left pending over an earlier run is an interrupted rerun,
    # whose earlier numbers are shown.
    tr.write_state(tmp_path, st.CellState(nodeid="grids/g.py::c", state="pending", config_hash="h",
                                          attempts=back.attempts, driver=str(driver), previous="completed"))
    view = st.view(tmp_path)
    assert (view.effective, view.outcome, view.stale_files, view.waiting) == (
        "abandoned", "rerun-interrupted", False, False)
    assert view.attempt == back.attempts[-1]


def test_a_submission_that_failed_is_given_back_and_its_job_would_run_nothing(tmp_path):
    driver = tmp_path / "driver.lock"
    tr.pending(tmp_path, nodeid="grids/g.py::c", config_hash="h", profile=None, fresh=True, driver=driver)
    assert tr.claimed(job(tmp_path), driver=driver)
    tr.withdrawn(tmp_path, driver=driver)  # its executor could not submit it
    state = st.read_state(tmp_path)
    assert (state.state, state.submission) == ("cancelled", None)
    assert tr.started(job(tmp_path), job_id="1") is None  # a job that started all the same is superseded
    # One whose job id is recorded was submitted: it is no longer the driver's to give back.
    tr.pending(tmp_path, nodeid="grids/g.py::c", config_hash="h", profile=None, fresh=True, driver=driver)
    assert tr.claimed(job(tmp_path, "second"), driver=driver)
    tr.submitted(job(tmp_path, "second"), "7")
    assert tr.withdrawn(tmp_path, driver=driver) is None and st.read_state(tmp_path).state == "submitted"


def test_writes_on_a_full_file_system_go_in_place_or_name_the_file_and_leave_no_temp_file(tmp_path, tmpfs):
    small = tmpfs(tmp_path / "small", "1m")
    state = small / "state.json"
    fs.write_json(state, {"state": "running"})
    fill(small)
    assert fs.no_space_left(small)

    # What fits in the blocks the file holds is written over it in place, and reads back.
    fs.write_json(state, {"state": "failed", "failure": "no space left on device"})
    assert json.loads(state.read_text()) == {"state": "failed", "failure": "no space left on device"}
    fs.write_json(state, {"state": "x"})  # shorter: padded, never followed by the old text's tail
    assert json.loads(state.read_text()) == {"state": "x"}

    # A new file, or a text larger than the file's blocks: refused, naming the file.
    with pytest.raises(fs.NoSpace, match=f"no space left on device: cannot write {small / 'config.json'}"):
        fs.write_json(small / "config.json", {"lr": 1.0})
    with pytest.raises(fs.NoSpace, match="state.json"):
        fs.write_json(state, {"big": "x" * 10_000})
    assert json.loads(state.read_text()) == {"state": "x"}  # left as it was
    assert temp_files(small) == [] and not (small / "config.json").exists()


FILLER = """
import json, os, sys
config = json.load(open("config.json"))
if config.get("fill"):
    with open("blob", "wb") as blob:
        while True:  # until the file system refuses: OSError, no space left on device
            blob.write(b"\\0" * 65536)
            blob.flush()
"""


def test_a_runs_dir_that_fills_up_records_the_cell_failed_and_stops_cleanly(sweeper, tmpfs):
    # Once the runs dir is full the driver records the cell that filled it as failed (its
    # state.json written in place), says so, starts nothing more and leaves no temp file;
    # the cells it had not started are as they were, and run once there is space again.
    runs = tmpfs(sweeper.path / "runs", "8m")
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    sweeper.write("filler.py", FILLER)
    grid = sweeper.grid("g", """
        import sweepkit as sk
        target = sk.command("{python}", "{root}/filler.py")
        base = sk.base(fill=False, n=0)
        filler = sk.cell(fill=True)
        after = sk.cell(n=1)
        later = sk.cell(n=2)
    """)
    assert sweeper.run("run", "grids/g.py::base").ret == 0

    result = sweeper.run("run")
    assert result.ret in (1, 4), result
    assert "no space left on" in result.output, result
    assert "Traceback" not in result.output and "INTERNAL ERROR" not in result.output, result
    states = {cell: json.loads((runs / "g" / cell / "state.json").read_text()) for cell in
              ("base", "filler", "after", "later")}
    assert states["filler"]["state"] == "failed", states["filler"]
    assert "no space left on device" in states["filler"]["attempts"][-1]["failure"], states["filler"]
    assert states["base"]["state"] == "completed" and len(states["base"]["attempts"]) == 1
    for cell in ("after", "later"):
        assert states[cell]["state"] == "cancelled" and states[cell]["attempts"] == [], states[cell]
    assert temp_files(runs) == []

    status = sweeper.run("status")
    assert status.ret == 0 and "Traceback" not in status.output, status
    filler = next(line for line in status.stdout.splitlines() if line.startswith("grids/g.py::filler "))
    assert "FAILED" in filler and "DISK_FULL" in filler, status

    (runs / "g" / "filler" / "blob").unlink()
    grid.write_text(grid.read_text().replace("filler = sk.cell(fill=True)", "filler = sk.cell(n=3)"))
    again = sweeper.run("run")
    assert again.ret == 0 and "3 passed, 1 skipped" in again.stdout, again
    assert temp_files(runs) == []


def test_the_job_records_a_start_refused_for_want_of_space(tmp_path, tmpfs):
    # config.json is the job's to write as it starts the cell: on a full file system the
    # attempt is recorded failed (state.json written in place) rather than started half-way.
    from sweepkit.run.job import run_cell

    small = tmpfs(tmp_path / "small", "1m")
    cell = small / "c"
    cell.mkdir()
    tr.write_state(cell, st.CellState(nodeid="grids/g.py::c", state="submitted", config_hash="h",
                                      submission=st.Submission(executor="test", token="t", submitted=time.time())))
    fill(small)
    assert run_cell(attrs.evolve(job(cell), config={"lr": 1.0})) == "failed"
    state = st.read_state(cell)
    assert state.state == "failed"
    assert state.attempts[-1].failure == f"not started: no space left on device: cannot write {cell / 'config.json'}"
    assert temp_files(small) == []
