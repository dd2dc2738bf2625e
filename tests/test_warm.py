"""Warm starts on the local executor: a cell forked from a worker that preloaded its
target's modules is the process a cold start would have been (``sweepkit.run.executors.warm``).

The cell program is ``tests/warm_modules/warm_probe.py``, run as ``python -m warm_probe``;
it reports its own argv, cwd, environment, signals and descriptors, and says whether it
found its heavy module (``warm_heavy``) imported by another process.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from sweepkit.state import records as st
from sweepkit.state import transitions as tr
from sweepkit.grid.cell import Cell, Target
from sweepkit.run.executors import DONE, CellJob
from sweepkit.run.executors.local import LocalExecutor
from sweepkit.run.executors.warm import WarmStart, WarmTarget, module_of, warm_enabled
from sweepkit.state.transitions import claimed as mark_submitted

MODULES = Path(__file__).parent / "warm_modules"
PROBE_ARGV = ("{python}", "-m", "warm_probe", "--cell-dir", "{cell_dir}")
WARM = WarmTarget(name="probe", argv=PROBE_ARGV, preload=("warm_heavy",), preload_env=("PROBE_*",))


@pytest.fixture(autouse=True)
def probe_importable(monkeypatch):
    """Cells (and their warm worker) find the probe modules, as a project's own would be."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(MODULES), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("PROBE_VAR", "from the driver")


def cell_of(target: Target, name: str = "c") -> Cell:
    return Cell(grid="g.py", grid_name="g", name=name, target=target, config={}, location=("g.py", 1))


def prepared(tmp_path: Path, name: str, target: Target = WARM, **config) -> tuple[CellJob, Cell]:
    """A cell dir as a driver leaves it just before submitting, with the probe's config."""
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    tr.write_state(directory, st.CellState(nodeid=f"g::{name}", state="pending", config_hash="h"))
    argv = target.render_argv(python=sys.executable, cell_dir=str(directory))
    job = CellJob(nodeid=f"g::{name}", cell_dir=str(directory), token=name, executor="local", argv=argv,
                  env={"SWEEP_CELL": f"g::{name}"})
    assert mark_submitted(job)
    return job, cell_of(target, name)


def run_all(executor: LocalExecutor, prepared_cells, timeout_s: float = 120) -> list:
    jobs = [executor.bind(job, cell) for job, cell in prepared_cells]
    handles = []
    pending = list(jobs)
    deadline = time.monotonic() + timeout_s
    while pending or any(executor.poll(handle) != DONE for handle in handles):
        taken = executor.take(pending)
        handles += executor.submit(taken)
        pending = [job for job in pending if job not in taken]
        assert time.monotonic() < deadline, "the cells did not end in time"
        time.sleep(0.05)
    return handles


def outcome(directory: Path) -> dict:
    """What a cell leaves, less what may differ between two runs of it (pids, times, the
    probe's own warm/cold marker)."""
    state = st.read_state(directory)
    attempt = state.attempts[-1]
    report = json.loads((directory / "stdout.log").read_text().splitlines()[0])
    return {"state": state.state, "returncode": attempt.returncode, "failure": attempt.failure,
            "report": report, "stdout": (directory / "stdout.log").read_text(),
            "stderr": (directory / "stderr.log").read_text(),
            "metrics": (directory / "metrics.jsonl").read_text() if (directory / "metrics.jsonl").exists() else None}


def warm_of(directory: Path) -> bool:
    return json.loads((directory / "warm.json").read_text())["warm"]


def run_warm_and_cold(tmp_path: Path, **config) -> tuple[dict, dict]:
    cold_executor = LocalExecutor([], max_parallel=1, warm=False)
    warm_executor = LocalExecutor([], max_parallel=1)
    (tmp_path / "cold").mkdir()
    (tmp_path / "warm").mkdir()
    cold, warm = prepared(tmp_path / "cold", "c", **config), prepared(tmp_path / "warm", "c", **config)
    try:
        run_all(cold_executor, [cold])
        run_all(warm_executor, [warm])
    finally:
        warm_executor.close()
    cold_dir, warm_dir = Path(cold[0].cell_dir), Path(warm[0].cell_dir)
    assert not warm_of(cold_dir) and warm_of(warm_dir)
    return outcome(cold_dir), outcome(warm_dir)


def test_under_a_driver_that_ignores_sigint_both_cells_take_it(tmp_path):
    # `nohup sweep run ... &` or a CI runner's background job: the driver starts with SIGINT
    # ignored, yet cancel stops a local cell with SIGINT, so the cell must take it.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        cold, warm = run_warm_and_cold(tmp_path, value=1)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert cold["report"]["sigint"] == warm["report"]["sigint"] == str(signal.default_int_handler)


def same_but_dirs(cold: dict, warm: dict, tmp_path: Path) -> None:
    as_text = json.dumps(cold).replace(str(tmp_path / "cold"), "<run>")
    assert json.loads(as_text) == json.loads(json.dumps(warm).replace(str(tmp_path / "warm"), "<run>"))


def test_a_warm_cell_leaves_what_a_cold_one_leaves(tmp_path):
    cold, warm = run_warm_and_cold(tmp_path, value=3)
    same_but_dirs(cold, warm, tmp_path)
    report = warm["report"]
    cell_dir = str(tmp_path / "warm" / "c")
    # The cell's own argv, cwd, environment and sys.path, as `python -m warm_probe` sets them.
    assert report["argv"] == ["--cell-dir", cell_dir] and report["argv0"] == "warm_probe.py"
    assert report["orig_argv"] == ["-m", "warm_probe", "--cell-dir", cell_dir]
    assert report["cwd"] == cell_dir and report["path0"] == cell_dir and report["name"] == "__main__"
    assert report["env"] == {"SWEEP_CELL": "g::c", "PROBE_VAR": "from the driver", "PYTHONUNBUFFERED": "1",
                             "CUDA_VISIBLE_DEVICES": "", "WARM_HEAVY_SET": "by the import"}
    # Its signals and descriptors: stdio and the cell's lock, nothing of the worker's.
    assert report["sigint"] == str(signal.default_int_handler) and report["blocked"] == []
    assert (report["sigterm"], report["sigpipe"]) == (str(int(signal.SIG_DFL)), str(int(signal.SIG_IGN)))
    assert len(report["fds"]) == 4 and report["fds"][:3] == [0, 1, 2]
    assert report["stdin"] == "" and report["stdout_buffered"] is False
    assert report["pgid"] == os.getpgrp()  # the driver's process group, as a cold cell's
    assert warm["state"] == "completed" and warm["metrics"] == '{"kind": "train", "step": 1, "value": 3}\n'


@pytest.mark.parametrize(("config", "state", "returncode", "failure"), [
    ({"exit": 3}, "failed", 3, "exit code 3: probe: started"),
    ({"mode": "raise"}, "failed", 1, "exit code 1: RuntimeError: probe: failed on purpose"),
    ({"mode": "kill"}, "failed", -9, "killed by SIGKILL: probe: started"),
])
def test_a_failing_warm_cell_fails_as_a_cold_one(tmp_path, config, state, returncode, failure):
    cold, warm = run_warm_and_cold(tmp_path, **config)
    same_but_dirs(cold, warm, tmp_path)
    assert (warm["state"], warm["returncode"], warm["failure"]) == (state, returncode, failure)
    if config.get("mode") == "raise":
        assert "Traceback (most recent call last):" in warm["stderr"]


def test_a_crashing_cell_fails_alone(tmp_path):
    executor = LocalExecutor([], max_parallel=3)
    cells = [prepared(tmp_path, "before", value=1), prepared(tmp_path, "crash", mode="kill"),
             prepared(tmp_path, "after", value=2)]
    try:
        run_all(executor, cells)
    finally:
        executor.close()
    states = {name: st.read_state(tmp_path / name) for name in ("before", "crash", "after")}
    assert {name: state.state for name, state in states.items()} == {
        "before": "completed", "crash": "failed", "after": "completed"}
    assert states["crash"].attempts[0].returncode == -signal.SIGKILL
    assert all(warm_of(tmp_path / name) for name in states)
    assert (tmp_path / "after" / "metrics.jsonl").read_text() == '{"kind": "train", "step": 1, "value": 2}\n'


def test_cancel_stops_a_warm_cell_and_its_process(tmp_path):
    executor = LocalExecutor([], max_parallel=1)
    job, cell = prepared(tmp_path, "hang", mode="hang")
    try:
        (handle,) = executor.submit(executor.take([executor.bind(job, cell)]))
        pid_file = tmp_path / "hang" / "pid"
        deadline = time.monotonic() + 60
        while not pid_file.is_file() or st.read_state(tmp_path / "hang").state != "running":
            assert executor.poll(handle) != DONE and time.monotonic() < deadline
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        executor.cancel(handle)
        while executor.poll(handle) != DONE:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        executor.close()
    state = st.read_state(tmp_path / "hang")
    assert state.state == "cancelled" and state.attempts[0].returncode == -signal.SIGTERM
    assert warm_of(tmp_path / "hang")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the forked cell process itself has ended (and been reaped)


def test_commands_that_are_not_python_dash_m_of_this_interpreter_start_cold(tmp_path):
    assert module_of([sys.executable, "-m", "trainer", "cfg.json"]) == "trainer"
    assert module_of([sys.executable, "-u", "-m", "trainer"]) is None  # interpreter options: cold
    assert module_of(["/other/python", "-m", "trainer"]) is None
    assert module_of([sys.executable, "script.py"]) is None
    assert module_of([sys.executable, "-m", "not a module"]) is None
    script = WarmTarget(name="script", argv=("{python}", str(MODULES / "warm_probe.py")), preload=("warm_heavy",))
    plain = Target(name="plain", argv=PROBE_ARGV)
    executor = LocalExecutor([], max_parallel=2)
    try:
        handles = run_all(executor, [prepared(tmp_path, "script", script), prepared(tmp_path, "plain", plain)])
    finally:
        executor.close()
    for handle, name in zip(handles, ("script", "plain")):
        assert handle.cell.argv[0] == sys.executable and "run" not in handle.cell.argv[1:3]
        assert st.read_state(tmp_path / name).state == "completed" and not warm_of(tmp_path / name)
    assert WarmStart.of(plain) is None and WarmStart.of(script) is not None


def test_sweep_warm_0_turns_warm_starts_off(tmp_path):
    assert warm_enabled({}) and warm_enabled({"SWEEP_WARM": "1"})
    assert not any(warm_enabled({"SWEEP_WARM": value}) for value in ("0", "false", "off", "no"))
    executor = LocalExecutor([], warm=warm_enabled({"SWEEP_WARM": "0"}))
    (handle,) = run_all(executor, [prepared(tmp_path, "c")])
    executor.close()
    assert list(handle.cell.argv) == [sys.executable, "-m", "warm_probe", "--cell-dir", str(tmp_path / "c")]
    assert st.read_state(tmp_path / "c").state == "completed" and not warm_of(tmp_path / "c")


def test_a_preload_that_fails_starts_the_cell_cold_and_says_why(tmp_path):
    broken = WarmTarget(name="broken", argv=PROBE_ARGV, preload=("warm_heavy", "warm_broken"))
    executor = LocalExecutor([], max_parallel=1)
    try:
        run_all(executor, [prepared(tmp_path, "c", broken, value=5)])
    finally:
        executor.close()
    assert st.read_state(tmp_path / "c").state == "completed" and not warm_of(tmp_path / "c")
    assert (tmp_path / "c" / "stderr.log").read_text().splitlines() == [
        "sweepkit warm worker: preload of warm_broken failed: RuntimeError: warm_broken: fails at import on "
        "purpose; starting cold",
        "probe: started"]


def test_cells_whose_import_time_environment_differs_get_their_own_worker(tmp_path, monkeypatch):
    executor = LocalExecutor([], max_parallel=2)
    first, first_cell = prepared(tmp_path, "first")
    other, other_cell = prepared(tmp_path, "other")
    try:
        handles = run_all(executor, [(first, first_cell)])
        monkeypatch.setenv("PROBE_VAR", "changed")  # read at import (preload_env PROBE_*)
        handles += run_all(executor, [(other, other_cell)])
    finally:
        executor.close()
    sockets = {handle.cell.argv[5] for handle in handles}
    assert len(sockets) == 2
    reports = [json.loads((tmp_path / name / "stdout.log").read_text().splitlines()[0]) for name in ("first", "other")]
    assert [report["env"]["PROBE_VAR"] for report in reports] == ["from the driver", "changed"]
    assert warm_of(tmp_path / "first") and warm_of(tmp_path / "other")


def test_the_worker_ends_when_the_run_closes_and_its_cells_have_ended(tmp_path):
    executor = LocalExecutor([], max_parallel=1)
    (handle,) = run_all(executor, [prepared(tmp_path, "c")])
    (worker,) = executor._warm_pool._workers.values()
    socket_dir = Path(worker.socket_path).parent
    executor.close()
    assert worker.process.wait(timeout=30) == 0
    assert not socket_dir.exists()


@pytest.mark.slow
def test_the_trainer_warm_and_cold_leaves_the_same_metrics_and_state(sweeper):
    grid = """
        import sweepkit as sk
        base = sk.base(model="tiny-random", dataset="synthetic", device="cpu", backend="hf", num_gpus=0,
                       train_batch_size=4, policy_mini_batch_size=4, n_samples_per_prompt=2,
                       max_generate_length=4, max_steps=2, eval_limit=4, ckpt_interval=1,
                       synthetic_size=64, export_final=False)
        other = sk.cell(lr=1e-3)
    """
    sweeper.grid("tiny", grid)
    left = {}
    for warm in ("0", "1"):
        result = sweeper.run("--runs-dir", f"runs{warm}", "run", env={"CUDA_VISIBLE_DEVICES": "", "SWEEP_WARM": warm})
        assert result.ret == 0, result
        for name in ("base", "other"):
            cell = sweeper.path / f"runs{warm}" / "tiny" / name
            records = [json.loads(line) for line in (cell / "metrics.jsonl").read_text().splitlines()]
            state = st.read_state(cell)
            left[warm, name] = {
                "state": (state.state, [(a.returncode, a.failure) for a in state.attempts]),
                # Less what varies from run to run, and the peak memory: a fork starts with the
                # worker's pages counted in its peak resident size.
                "records": [{key: value for key, value in record.items()
                             if not key.startswith(("timing/", "throughput/", "memory/"))} for record in records],
                "ckpt": sorted(path.name for path in (cell / "ckpt").iterdir()),
                "stderr": [line for line in (cell / "stderr.log").read_text().replace(str(cell), "<cell>").splitlines()
                           # the last line and the first step's give seconds taken
                           if " in " not in line and not line.startswith("sweep-train: first step")],
            }
    for name in ("base", "other"):
        assert left["1", name] == left["0", name]
        assert left["1", name]["state"] == ("completed", [(0, None)])
        assert [record["step"] for record in left["1", name]["records"] if record["kind"] == "train"] == [1, 2]
