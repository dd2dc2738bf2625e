"""``sweep cancel`` of a local run: it stops the driver as Ctrl-C would, the trainer
checkpoints the step it is in, and the cells never started are recorded cancelled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

TRAINER_GRID = """
import sweepkit as sk
base = sk.base(model="tiny-random", dataset="synthetic", device="cpu", backend="hf", num_gpus=0, gpus=0,
               train_batch_size=4, policy_mini_batch_size=2, n_samples_per_prompt=4, max_generate_length=6,
               lr=3e-3, epochs=1000, max_steps=100000, ckpt_interval=0, eval_before_train=False,
               export_final=False)
slower = sk.cell(lr=1e-3)
"""


def train_steps(path) -> list[int]:
    if not path.is_file():
        return []
    return [record["step"] for record in map(json.loads, path.read_text().splitlines()) if record["kind"] == "train"]


def start_driver(sweeper, **popen) -> subprocess.Popen:
    """``sweep run`` of the trainer grid, once its first cell has logged two steps."""
    sweeper.grid("t", TRAINER_GRID)
    env = {**os.environ, "COLUMNS": "200", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(sweeper.path), os.environ.get("PYTHONPATH", "")) if p)}
    driver = subprocess.Popen([sys.executable, "-m", "sweepkit", "run"], cwd=sweeper.path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)
    deadline = time.monotonic() + 180
    while len(train_steps(sweeper.path / "runs" / "t" / "base" / "metrics.jsonl")) < 2:
        assert driver.poll() is None, driver.stdout.read()
        assert time.monotonic() < deadline, "the trainer logged no second step within three minutes"
        time.sleep(0.1)
    return driver


def test_cancel_stops_a_background_run_and_the_trainer_checkpoints_its_step(sweeper):
    # As a shell starts a background job: SIGINT ignored, inherited by all it starts.
    driver = start_driver(sweeper, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    metrics = sweeper.path / "runs" / "t" / "base" / "metrics.jsonl"

    cancelled = sweeper.run("cancel", env={"CUDA_VISIBLE_DEVICES": ""})
    output, _ = driver.communicate(timeout=120)

    assert cancelled.ret == 0, cancelled
    assert "stop    sweep run pid" in cancelled.stdout and "runs/t/slower" in cancelled.stdout
    assert "Traceback" not in output, output
    cell = sweeper.path / "runs" / "t" / "base"
    state = json.loads((cell / "state.json").read_text())
    assert state["state"] == "cancelled" and state["attempts"][-1]["returncode"] == 128 + signal.SIGTERM
    last = train_steps(metrics)[-1]
    assert sorted(p.name for p in (cell / "ckpt").glob("global_step_*")) == [f"global_step_{last}"]
    never_started = json.loads((sweeper.path / "runs" / "t" / "slower" / "state.json").read_text())
    assert never_started["state"] == "cancelled" and never_started["attempts"] == []
    status = sweeper.run("status")
    assert "2 CANCELLED" in status.stdout, status
    # The run goes on from the checkpoint when asked.
    plan = sweeper.run("run", "grids/t.py::base", "--resume", "--dry-run")
    assert "RESUME   grids/t.py::base" in plan.stdout, plan


def test_ctrl_c_stops_the_trainer_after_its_step_with_a_checkpoint(sweeper):
    # Ctrl-C in a terminal: SIGINT to the driver's whole process group, the cell included,
    # which its job follows with a SIGTERM; the trainer takes the two as one request.
    driver = start_driver(sweeper, start_new_session=True)
    os.killpg(driver.pid, signal.SIGINT)
    driver.communicate(timeout=120)
    cell = sweeper.path / "runs" / "t" / "base"
    deadline = time.monotonic() + 120
    while subprocess.run(["flock", "-n", str(cell / ".lock"), "true"]).returncode != 0:
        assert time.monotonic() < deadline, "the cell's process did not end within two minutes"
        time.sleep(0.2)

    assert driver.returncode != 0
    last = train_steps(cell / "metrics.jsonl")[-1]
    assert sorted(p.name for p in (cell / "ckpt").glob("global_step_*")) == [f"global_step_{last}"]
    assert "; checkpointed in" in (cell / "stderr.log").read_text()
    status = sweeper.run("status", "grids/t.py::base")
    assert any(word in status.stdout for word in ("CANCELLED", "INTERRUPTED")), status
    resumed = sweeper.run("run", "grids/t.py::base", "--resume", "--dry-run")
    assert "RESUME   grids/t.py::base" in resumed.stdout, resumed


def test_cancel_of_a_debug_run_stops_the_driver_not_only_its_current_cell(sweeper):
    sweeper.grid("d", """
        import sweepkit as sk
        target = sk.command("{python}", "-c", "import time; time.sleep(120)")
        base = sk.base(lr=1.0)
        other = sk.cell(lr=2.0)
    """)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(p for p in (str(sweeper.path), os.environ.get("PYTHONPATH", "")) if p)}
    driver = subprocess.Popen([sys.executable, "-m", "sweepkit", "run", "--executor", "debug"], cwd=sweeper.path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    state = sweeper.path / "runs" / "d" / "base" / "state.json"
    deadline = time.monotonic() + 60
    while not (state.is_file() and json.loads(state.read_text())["state"] == "running"):
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)

    cancelled = sweeper.run("cancel")
    driver.communicate(timeout=60)

    assert cancelled.ret == 0, cancelled
    states = {cell: json.loads((sweeper.path / "runs" / "d" / cell / "state.json").read_text())["state"]
              for cell in ("base", "other")}
    assert states == {"base": "cancelled", "other": "cancelled"}


def test_cancel_says_so_when_a_cell_runs_on_with_no_driver_to_stop(sweeper):
    # A driver killed with SIGKILL leaves its local cell running (holding its lock).
    sweeper.grid("k", """
        import sweepkit as sk
        target = sk.command("{python}", "-c", "import time; time.sleep(60)")
        base = sk.base(lr=1.0)
    """)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(p for p in (str(sweeper.path), os.environ.get("PYTHONPATH", "")) if p)}
    driver = subprocess.Popen([sys.executable, "-m", "sweepkit", "run"], cwd=sweeper.path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    cell = sweeper.path / "runs" / "k" / "base"
    deadline = time.monotonic() + 60
    while not ((cell / "state.json").is_file() and json.loads((cell / "state.json").read_text())["state"] == "running"):
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    driver.kill()
    driver.wait()
    try:
        cancelled = sweeper.run("cancel")
        assert cancelled.ret == 1, cancelled
        host, pid = (cell / ".lock").read_text().split()
        assert f"still running with no live sweep run to stop: runs/k/base (its process: pid {pid} on {host})" \
            in cancelled.stdout
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the orphaned job and its command


def test_ctrl_c_after_the_last_step_leaves_a_complete_cell_and_no_traceback(sweeper):
    # The trainer has run its last step and is checkpointing, exporting: stopping it now
    # stops nothing, so the cell is complete (not cancelled, not waiting for --resume).
    sweeper.grid("t", TRAINER_GRID.replace("max_steps=100000", "max_steps=3").replace(
        "export_final=False", "export_final=True"))
    env = {**os.environ, "COLUMNS": "200", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(sweeper.path), os.environ.get("PYTHONPATH", "")) if p)}
    driver = subprocess.Popen([sys.executable, "-m", "sweepkit", "run", "grids/t.py::base"], cwd=sweeper.path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    cell = sweeper.path / "runs" / "t" / "base"
    deadline = time.monotonic() + 180
    while 3 not in train_steps(cell / "metrics.jsonl"):
        assert driver.poll() is None and time.monotonic() < deadline, driver.stdout.read()
        time.sleep(0.01)
    os.killpg(driver.pid, signal.SIGINT)  # Ctrl-C: the driver's whole process group
    output, _ = driver.communicate(timeout=120)
    while subprocess.run(["flock", "-n", str(cell / ".lock"), "true"]).returncode != 0:
        assert time.monotonic() < deadline, "the cell's process did not end"
        time.sleep(0.2)

    assert "sweep-train: SIGINT: stopping after this step" in (cell / "stderr.log").read_text()
    assert "Traceback" not in output, output
    state = json.loads((cell / "state.json").read_text())
    assert state["state"] == "completed", state
    assert [attempt["failure"] for attempt in state["attempts"]] == [None]
    assert (cell / "ckpt" / "global_step_3").is_dir() and (cell / "ckpt" / "export").is_dir()
    again = sweeper.run("run", "grids/t.py::base", "--dry-run", env={"CUDA_VISIBLE_DEVICES": ""})
    assert "SKIP     grids/t.py::base  (completed)" in again.stdout, again
