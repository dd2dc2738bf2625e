"""The local and debug executors, driven directly through the Executor interface."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from sweepkit.state import records as st
from sweepkit.state import transitions as tr
from sweepkit.run.executors import DONE, CellJob
from sweepkit.run.executors.debug import DebugExecutor
from sweepkit.run.executors.local import LocalExecutor, detect_gpus
from sweepkit.state.transitions import claimed as mark_submitted


def prepared(tmp_path: Path, name: str, gpus: int = 0, code: str = "pass") -> CellJob:
    """A cell dir in the state a driver leaves it in just before submitting."""
    directory = tmp_path / name
    directory.mkdir()
    tr.write_state(directory, st.CellState(nodeid=f"g::{name}", state="pending", config_hash="h"))
    job = CellJob(nodeid=f"g::{name}", cell_dir=str(directory), gpus=gpus, token=name, executor="local",
                  argv=(sys.executable, "-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES')); " + code))
    assert mark_submitted(job)
    return job


@pytest.mark.parametrize(("visible", "expected"), [("0,1", ["0", "1"]), ("", []), ("-1", []),
                                                   ("GPU-3f2a, 2", ["GPU-3f2a", "2"])])
def test_detect_gpus_from_cuda_visible_devices(visible, expected):
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": visible}) == expected


def test_take_respects_slots_and_free_gpus(tmp_path):
    executor = LocalExecutor(["0", "1"])
    assert executor.max_parallel == 2
    big, small, other = (prepared(tmp_path, name, gpus) for name, gpus in (("big", 2), ("small", 1), ("other", 1)))
    assert executor.take([big, small, other]) == [big]  # takes both GPUs, the rest waits
    assert executor.take([small, other]) == [small, other]
    assert LocalExecutor([], max_parallel=None).take([small]) == []  # needs a GPU the machine lacks
    assert LocalExecutor([]).check(big) == ("needs gpus=2 but this machine has 0 usable GPU(s) "
                                            "(none; from CUDA_VISIBLE_DEVICES or nvidia-smi -L)")
    cpu = [prepared(tmp_path, f"cpu{n}") for n in range(3)]
    assert LocalExecutor([]).take(cpu) == cpu[:1]
    assert LocalExecutor([], max_parallel=2).take(cpu) == cpu[:2]


def test_local_submit_places_gpus_and_releases_them(tmp_path):
    executor = LocalExecutor(["3", "4"])
    jobs = [prepared(tmp_path, "a", gpus=1), prepared(tmp_path, "b", gpus=1)]
    handles = executor.submit(executor.take(jobs))
    assert len(handles) == 2 and executor.take([prepared(tmp_path, "c", gpus=1)]) == []
    deadline = time.time() + 60
    while any(executor.poll(handle) != DONE for handle in handles):
        assert time.time() < deadline
        time.sleep(0.05)
    devices = sorted((Path(job.cell_dir) / "stdout.log").read_text().strip() for job in jobs)
    assert devices == ["3", "4"]
    for job, handle in zip(jobs, handles):
        state = st.read_state(Path(job.cell_dir))
        assert state.state == "completed"
        assert state.attempts[0].job_id == handle.job_id
        assert state.attempts[0].devices in ("3", "4")
    assert sorted(executor._free) == ["3", "4"]


def test_cells_of_other_drivers_hold_slots_on_this_machine(tmp_path):
    executor = LocalExecutor(["0", "1"])
    foreign = st.Attempt(n=1, executor="local", host=socket.gethostname(), devices="1")
    executor.hold_foreign("g::elsewhere", foreign)
    jobs = [prepared(tmp_path, "a", gpus=1), prepared(tmp_path, "b", gpus=1)]
    assert executor.take(jobs) == jobs[:1]
    (handle,) = executor.submit(executor.take(jobs))
    assert handle.gpu_ids == ("0",)
    executor.release_foreign("g::elsewhere")
    assert executor.take(jobs[1:]) == jobs[1:]
    remote = st.Attempt(n=1, executor="slurm", host="node7", devices="0")
    executor.hold_foreign("g::remote", remote)  # runs on another machine: takes nothing here
    assert executor.take(jobs[1:]) == jobs[1:]
    while executor.poll(handle) != DONE:
        time.sleep(0.05)


def test_debug_executor_runs_in_this_process(tmp_path):
    executor = DebugExecutor()
    job = prepared(tmp_path, "a", code="import sys; sys.exit(2)")
    assert executor.take([job, job]) == [job]
    (handle,) = executor.submit([job])
    assert executor.poll(handle) == DONE
    state = st.read_state(Path(job.cell_dir))
    assert state.state == "failed" and state.attempts[0].returncode == 2
    assert state.attempts[0].pid == os.getpid()
