"""``sweep run`` end to end on grids of real script cells (tests/cell_program.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import test_slurm_executor as slurm
from cell_program import PROGRAM, intervals, max_overlap, read_events
from test_slurm_executor import cluster, on_cluster  # noqa: F401 (the fixture on_cluster asks for)


def script_grid(sweeper, name: str, cells: str, **base) -> Path:
    """A grid whose cells run the test program; ``base`` values go into ``sk.base``."""
    events = sweeper.path / "events.jsonl"
    values = {"steps": 3, "sleep": 0.1, "events": str(events), **base}
    args = ", ".join(f"{key}={value!r}" for key, value in values.items())
    lines = ["import sweepkit as sk", f"target = sk.command('{{python}}', {PROGRAM!r})", f"base = sk.base({args})"]
    return sweeper.grid(name, "\n".join(lines + [line.strip() for line in cells.strip().splitlines()]) + "\n")


def state_of(sweeper, grid: str, cell: str) -> dict:
    return json.loads((sweeper.path / "runs" / grid / cell / "state.json").read_text())


def started(sweeper) -> list[str]:
    return [event["cell"].split("::")[1] for event in read_events(sweeper.path / "events.jsonl")
            if event["event"] == "start"]


@pytest.fixture
def cpu_sweeper(sweeper):
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""  # no GPUs: one cell at a time by default
    return sweeper


def test_runs_grid_then_skips_completed_cells(cpu_sweeper):
    script_grid(cpu_sweeper, "g", """
        longer = sk.cell(steps=4)
        quick = sk.cell(sleep=0.0)
    """)
    result = cpu_sweeper.run("run")
    assert result.ret == 0, result
    assert "3 passed" in result.stdout
    assert sorted(started(cpu_sweeper)) == ["base", "longer", "quick"]
    # The default cap on a machine without GPUs is one cell at a time.
    assert max_overlap(intervals(read_events(cpu_sweeper.path / "events.jsonl"))) == 1

    cell = cpu_sweeper.path / "runs" / "g" / "longer"
    assert json.loads((cell / "config.json").read_text())["steps"] == 4
    record = json.loads((cell / "cell.json").read_text())
    assert record["nodeid"] == "grids/g.py::longer"
    assert record["diff"] == {"steps": [3, 4]}
    state = state_of(cpu_sweeper, "g", "longer")
    assert state["state"] == "completed"
    assert [attempt["returncode"] for attempt in state["attempts"]] == [0]
    assert sorted(path.name for path in (cell / "ckpt").iterdir()) == ["step_1", "step_2", "step_3", "step_4"]
    assert len((cell / "metrics.jsonl").read_text().splitlines()) == 5  # 4 train + 1 eval

    again = cpu_sweeper.run("run")
    assert again.ret == 0, again
    assert "3 skipped" in again.stdout
    assert len(started(cpu_sweeper)) == 3  # nothing ran a second time


def test_rerun_of_one_cell_runs_only_it_and_wipes_its_checkpoints(cpu_sweeper):
    script_grid(cpu_sweeper, "g", "other = sk.cell(steps=2)")
    assert cpu_sweeper.run("run").ret == 0
    stale = cpu_sweeper.path / "runs" / "g" / "base" / "ckpt" / "stale_marker"
    stale.write_text("from an earlier run")

    result = cpu_sweeper.run("run", "grids/g.py::base", "--rerun")
    assert result.ret == 0, result
    assert started(cpu_sweeper).count("base") == 2
    assert started(cpu_sweeper).count("other") == 1
    assert "DELETED" in result.stdout and "stale_marker" in result.stdout
    assert not stale.exists()
    assert len(state_of(cpu_sweeper, "g", "base")["attempts"]) == 2


def cell_files(sweeper, grid: str, cell: str) -> dict:
    """What a cell's run left: its checkpoint entries, metrics and stdout."""
    directory = sweeper.path / "runs" / grid / cell
    return {"ckpt": sorted(path.name for path in (directory / "ckpt").iterdir()),
            "metrics": (directory / "metrics.jsonl").read_text(),
            "stdout": (directory / "stdout.log").read_text()}


def completed_grid(sweeper) -> Path:
    """A grid whose three cells completed, reporting both ways (metrics.jsonl and stdout)."""
    grid = script_grid(sweeper, "g", """
        c1 = sk.cell(steps=2)
        c2 = sk.cell(steps=4)
    """, sleep=0.0, report="both")
    first = sweeper.run("run")
    assert first.ret == 0 and "3 passed" in first.stdout, first
    return grid


def rerun_in_flight(sweeper, grid: Path, *args: str) -> subprocess.Popen:
    """``sweep run --rerun`` of :func:`completed_grid`, its config changed so that its cells
    hang after their first step: the driver, in its own session as a terminal's foreground
    job, once ``base`` hangs and ``c1``, ``c2`` wait their turn."""
    grid.write_text(grid.read_text().replace("report='both'", "report='both', hang_at=1"))
    env = {**os.environ, **sweeper.env, "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join(p for p in (str(sweeper.path), os.environ.get("PYTHONPATH", "")) if p)}
    driver = subprocess.Popen([sys.executable, "-m", "sweepkit", "run", "--rerun", *args], cwd=sweeper.path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    metrics = sweeper.path / "runs" / "g" / "base" / "metrics.jsonl"
    deadline = time.time() + 60
    while not (started(sweeper).count("base") == 2 and metrics.is_file() and metrics.read_text().count("\n") == 1):
        assert driver.poll() is None, driver.stdout.read()
        assert time.time() < deadline, "the rerun's first cell did not reach its first step"
        time.sleep(0.05)
    return driver


def test_an_interrupted_rerun_leaves_the_cells_it_never_started_as_they_were(cpu_sweeper):
    # --rerun deletes a cell's old run when that cell starts, not all of them up front:
    # Ctrl-C during the first cell leaves the others their old checkpoints and metrics.
    grid = completed_grid(cpu_sweeper)
    before = {cell: cell_files(cpu_sweeper, "g", cell) for cell in ("c1", "c2")}
    assert before["c2"]["ckpt"] == ["step_1", "step_2", "step_3", "step_4"]
    driver = rerun_in_flight(cpu_sweeper, grid)
    os.killpg(driver.pid, signal.SIGINT)
    output, _ = driver.communicate(timeout=120)

    assert driver.returncode == 2, output
    # Only the cell that started lost its earlier run (the driver shows it once it sees the start).
    assert {line.split()[1] for line in output.splitlines() if line.startswith("DELETED")} <= {"grids/g.py::base"}
    deleted = state_of(cpu_sweeper, "g", "base")["attempts"][-1]["deleted"]
    assert sorted(Path(path).name for path in deleted) == ["step_1", "step_2", "step_3"]
    for cell in ("c1", "c2"):
        assert cell_files(cpu_sweeper, "g", cell) == before[cell]
        state = state_of(cpu_sweeper, "g", cell)
        # Its finished run is still what the cell is: the rerun never started it.
        assert state["state"] == "completed" and len(state["attempts"]) == 1
    assert started(cpu_sweeper).count("c1") == started(cpu_sweeper).count("c2") == 1


IMPATIENT_EXECUTOR = """
import os, signal

import sweepkit as sk
from sweepkit.run.executors.local import LocalExecutor


class Impatient(LocalExecutor):
    def cancel(self, handle):
        os.kill(os.getpid(), signal.SIGINT)  # the user's second Ctrl-C, as the driver cancels
        super().cancel(handle)


@sk.hookimpl
def sweep_register_executors(register):
    register("impatient", lambda session: Impatient([], max_parallel=1), "local, Ctrl-C twice")
"""


def test_a_second_ctrl_c_as_the_driver_cancels_does_not_cut_its_record_short(cpu_sweeper):
    grid = completed_grid(cpu_sweeper)
    cpu_sweeper.write("grids/sweepconf.py", IMPATIENT_EXECUTOR)
    driver = rerun_in_flight(cpu_sweeper, grid, "--executor", "impatient")
    os.killpg(driver.pid, signal.SIGINT)
    output, _ = driver.communicate(timeout=120)

    assert driver.returncode == 2, output
    assert "CANCELLED     run  interrupted" in output and "==== 3 not finished" in output, output
    assert state_of(cpu_sweeper, "g", "base")["state"] == "cancelled"
    for cell in ("c1", "c2"):  # queued when the first Ctrl-C came: their finished runs again
        state = state_of(cpu_sweeper, "g", cell)
        assert state["state"] == "completed" and len(state["attempts"]) == 1


HASTY_EXECUTOR = """
import os, signal

import sweepkit as sk
from sweepkit.run.executors.local import LocalExecutor


class Hasty(LocalExecutor):
    def submit(self, jobs):
        handles = super().submit(jobs)  # the cell's job has started
        if jobs:
            with open("started.txt", "w") as out:
                out.write(" ".join(str(handle.job_id) for handle in handles))
            os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, before the driver has its handle
        return handles


@sk.hookimpl
def sweep_register_executors(register):
    register("hasty", lambda session: Hasty([], max_parallel=1), "local, Ctrl-C as a cell starts")
"""


def test_a_ctrl_c_while_a_cell_starts_cancels_that_cell_too(cpu_sweeper):
    # A Ctrl-C raised where it landed, between the executor starting a cell's job and the
    # driver noting its handle, left that job unknown to the driver: never cancelled, it ran
    # its cell to the end (the driver's close waited for it) under a driver that then said
    # "interrupted".
    script_grid(cpu_sweeper, "g", "", steps=200, sleep=0.1)  # 20 s if nothing stops it
    cpu_sweeper.write("grids/sweepconf.py", HASTY_EXECUTOR)
    result = cpu_sweeper.run("run", "--executor", "hasty")

    assert result.ret == 2, result
    assert "interrupted; cancelled the running cells" in result.stdout, result
    assert (cpu_sweeper.path / "started.txt").read_text()  # the job had started
    # Its driver has ended, and its jobs with it: cancelled before its cell started (the next
    # run takes it over) or as it had started, never run on.
    state = state_of(cpu_sweeper, "g", "base")
    assert state["state"] in ("submitted", "cancelled"), f"the cell ran on after the Ctrl-C: {state}"
    assert [attempt["failure_class"] for attempt in state["attempts"]] in ([], ["CANCELLED"]), state


WATCHFUL_EXECUTOR = """
import json, sys

import sweepkit as sk
from sweepkit.run.executors.local import LocalExecutor


class Watchful(LocalExecutor):
    def submit(self, jobs):
        polars, steady = sys.modules.get("polars"), sys.modules.get("steadystate")
        imported = {"polars": hasattr(polars, "DataFrame"), "steadystate": hasattr(steady, "steady_mean")}
        with open("imported.jsonl", "a") as out:
            out.write(json.dumps({"cells": len(jobs), **imported}) + "\\n")
        return super().submit(jobs)


@sk.hookimpl
def sweep_register_executors(register):
    register("watchful", lambda session: Watchful([], max_parallel=1), "local, notes what is imported")
"""


def test_the_driver_has_imported_its_metric_readers_before_it_submits_a_cell(cpu_sweeper):
    # A Ctrl-C that cut the driver's first import of polars short (its first read of a
    # cell's metrics, in the loop) left polars half-imported and the interrupted driver
    # killed by SIGINT after its summary, instead of exiting 2 (CI, 1 run in 15 to 30);
    # steadystate, which the summary's sec/step reads, was imported there too.
    script_grid(cpu_sweeper, "g", """
        c1 = sk.cell(steps=2)
    """, sleep=0.0)
    cpu_sweeper.write("grids/sweepconf.py", WATCHFUL_EXECUTOR)
    result = cpu_sweeper.run("run", "--executor", "watchful")

    assert result.ret == 0 and "2 passed" in result.stdout, result
    submits = [json.loads(line) for line in (cpu_sweeper.path / "imported.jsonl").read_text().splitlines()]
    assert submits == [{"cells": 1, "polars": True, "steadystate": True}] * 2


@on_cluster
def test_on_slurm_a_queued_cells_old_run_stays_until_its_job_starts(sweeper):
    # The SLURM executor submits every cell at once; two take the 2-CPU node and hang, the
    # third waits in the queue: its old run stays, and status shows no numbers of it, until
    # its job starts, which it never does here.
    grid = slurm.script_grid(sweeper, "again", """
        c1 = sk.cell(steps=2)
        c2 = sk.cell(steps=4)
    """, sleep=0.0)
    assert sweeper.run("run", "--executor", "slurm", timeout=slurm.DEADLINE_S).ret == 0
    cells = ("base", "c1", "c2")

    def files(cell):
        directory = sweeper.path / "runs" / "again" / cell
        return sorted(path.name for path in (directory / "ckpt").iterdir()), (directory / "metrics.jsonl").read_text()

    old = {cell: files(cell) for cell in cells}
    grid.write_text(grid.read_text().replace("sleep=0.0", "sleep=0.0, hang_at=1"))
    driver = slurm.background(sweeper, "run", "--executor", "slurm", "--rerun")
    try:
        hanging = slurm.wait_for("two cells to start again", lambda: (
            found if len(found := [cell for cell in cells if len(slurm.starts(sweeper).get(cell, [])) == 2]) == 2
            else None))
        (waiting,) = set(cells) - set(hanging)
        assert files(waiting) == old[waiting]
        row = slurm.status_rows(sweeper)[waiting].split()
        assert row[1:3] == ["submitted", "1"] and len(row) == 4 and row[3].startswith("slurm:"), row
    finally:
        assert sweeper.run("cancel").ret == 0
        driver.wait(timeout=slurm.DEADLINE_S)
    assert files(waiting) == old[waiting]
    assert len(slurm.starts(sweeper)[waiting]) == 1


def test_changed_config_of_completed_cell_needs_rerun(cpu_sweeper):
    grid = script_grid(cpu_sweeper, "g", "")
    assert cpu_sweeper.run("run").ret == 0
    grid.write_text(grid.read_text().replace("steps=3", "steps=2"))
    result = cpu_sweeper.run("run")
    assert result.ret != 0
    assert "base: completed with a different config" in result.stderr and "--rerun" in result.stderr
    assert started(cpu_sweeper) == ["base"]
    assert cpu_sweeper.run("run", "--rerun").ret == 0
    assert json.loads((cpu_sweeper.path / "runs/g/base/config.json").read_text())["steps"] == 2


def test_a_cell_completed_under_a_profile_names_the_profile_when_run_without_it(cpu_sweeper):
    script_grid(cpu_sweeper, "g", "")
    cpu_sweeper.write("grids/sweepconf.py", """
        from sweepkit import hookimpl

        @hookimpl
        def sweep_register_profiles(register):
            register("short", lambda config, target: {"steps": 1}, "one step")
    """)
    assert cpu_sweeper.run("run", "--profile", "short").ret == 0
    result = cpu_sweeper.run("run")
    assert result.ret != 0
    assert "base: completed under --profile short, not no profile; pass --rerun" in result.stderr


def test_failed_cell_with_checkpoints_needs_resume_or_rerun_and_resumes(cpu_sweeper):
    script_grid(cpu_sweeper, "g", """
        flaky = sk.cell(steps=5, fail_at=3)
        broken = sk.cell(steps=4, fail_at=2)
    """)
    first = cpu_sweeper.run("run", "--max-parallel", "3")
    assert first.ret == 1, first
    assert "2 failed" in first.stdout and "1 passed" in first.stdout
    assert "RuntimeError: boom at step 3" in first.stdout
    assert state_of(cpu_sweeper, "g", "flaky")["attempts"][0]["failure"] == "exit code 1: RuntimeError: boom at step 3"

    refused = cpu_sweeper.run("run")
    assert refused.ret != 0
    # Every such cell is reported at once, and nothing ran.
    for cell in ("flaky", "broken"):
        assert f"{cell}: was failed and has checkpoints" in refused.stderr
    assert "--resume" in refused.stderr and "--rerun" in refused.stderr
    assert len(started(cpu_sweeper)) == 3

    resumed = cpu_sweeper.run("run", "grids/g.py::flaky", "--resume")
    assert resumed.ret == 0, resumed
    flaky_starts = [event for event in read_events(cpu_sweeper.path / "events.jsonl")
                    if event["event"] == "start" and event["cell"].endswith("::flaky")]
    assert [event["start_step"] for event in flaky_starts] == [0, 3]
    steps = [json.loads(line)["step"] for line in
             (cpu_sweeper.path / "runs/g/flaky/metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert steps == [1, 2, 3, 4, 5]
    attempts = state_of(cpu_sweeper, "g", "flaky")["attempts"]
    assert [attempt["resume"] for attempt in attempts] == [False, True]


def test_driver_killed_mid_grid_next_run_finishes_the_rest_without_overlap(cpu_sweeper):
    # c1 runs long enough (4.5 s) to be still running when the second driver starts, even on
    # a loaded machine: that driver must find it running under the killed one's orphan.
    script_grid(cpu_sweeper, "g", """
        c1 = sk.cell(steps=15)
        c2 = sk.cell(steps=5)
        c3 = sk.cell(steps=2)
    """, sleep=0.3)
    env = {**os.environ, **cpu_sweeper.env, "PYTHONPATH": str(cpu_sweeper.path)}
    driver = subprocess.Popen([sys.executable, "-m", "sweepkit", "run"], cwd=cpu_sweeper.path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    events = cpu_sweeper.path / "events.jsonl"
    deadline = time.time() + 60
    # Kill it while its second cell runs: one cell done, one in flight, two not started.
    while time.time() < deadline and len([e for e in read_events(events) if e["event"] == "start"]) < 2:
        assert driver.poll() is None, "the driver ended before it could be killed"
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    # The two cells it had not got to will never be started by it: status says so.
    status = cpu_sweeper.run("status")
    words = {line.split()[0].split("::")[1]: line.split()[1] for line in status.stdout.splitlines() if "::" in line}
    assert sorted(words.values()).count("abandoned") == 2, status.stdout
    assert words["base"] == "PASSED" and words["c1"] in ("running", "PASSED"), status.stdout

    result = cpu_sweeper.run("run")
    assert result.ret == 0, result
    assert "running under another driver" in result.stdout or "already running" in result.stdout
    spans = intervals(read_events(events))
    assert sorted(cell.split("::")[1] for cell, _, _ in spans) == ["base", "c1", "c2", "c3"]
    assert max_overlap(spans) == 1  # the cap held across both drivers, and no cell ran twice
    for cell in ("base", "c1", "c2", "c3"):
        assert state_of(cpu_sweeper, "g", cell)["state"] == "completed"


def test_concurrency_cap_and_gpu_placement(sweeper):
    # Two GPU ids the driver may hand out; each cell asks for one.
    sweeper.env["CUDA_VISIBLE_DEVICES"] = "5,7"
    script_grid(sweeper, "g", """
        a = sk.cell(steps=2)
        b = sk.cell(steps=4)
        c = sk.cell(steps=1)
    """, gpus=1, sleep=0.3)
    result = sweeper.run("run")
    assert result.ret == 0, result
    events = read_events(sweeper.path / "events.jsonl")
    spans = intervals(events)
    assert len(spans) == 4
    assert max_overlap(spans) <= 2
    by_pid = {event["pid"]: event for event in events if event["event"] == "start"}
    assert {event["devices"] for event in by_pid.values()} <= {"5", "7"}
    # Cells running at the same time never share a GPU.
    for i, (cell_a, start_a, end_a) in enumerate(spans):
        for cell_b, start_b, end_b in spans[i + 1:]:
            if start_a < end_b and start_b < end_a:
                devices = {e["devices"] for e in by_pid.values() if e["cell"] in (cell_a, cell_b)}
                assert len(devices) == 2, (cell_a, cell_b)


def test_needing_more_gpus_than_the_machine_has_is_refused(cpu_sweeper):
    script_grid(cpu_sweeper, "g", "", gpus=2)
    result = cpu_sweeper.run("run")
    assert result.ret != 0
    assert "grids/g.py:3: base: needs gpus=2" in result.stderr
    assert started(cpu_sweeper) == []


def test_a_trainer_cell_of_several_gpus_asks_for_them_without_a_gpus_key(cpu_sweeper):
    # The trainer starts num_gpus processes, one per GPU: given none, it would train on the CPU.
    cpu_sweeper.grid("g", """
import sweepkit as sk
base = sk.base(model="tiny-random", dataset="synthetic", num_gpus=4)
""")
    result = cpu_sweeper.run("run")
    assert result.ret != 0
    assert "grids/g.py:2: base: needs gpus=4" in result.stderr
    assert not (cpu_sweeper.path / "runs" / "g" / "base" / "metrics.jsonl").exists()


def test_xfail_and_xpass_outcomes(cpu_sweeper):
    script_grid(cpu_sweeper, "g", """
        probe_fails = sk.cell(fail_at=1, marks=sk.mark.xfail(reason="ceiling"))
        probe_passes = sk.cell(steps=2, marks=sk.mark.xfail(reason="might OOM"))
    """, sleep=0.0)
    result = cpu_sweeper.run("run", "--max-parallel", "3")
    assert result.ret == 0, result
    assert "XFAIL" in result.stdout and "XPASS" in result.stdout
    assert "1 passed, 1 xfailed, 1 xpassed" in result.stdout
    # The probe that failed as expected has its answer: a second run does not probe it again.
    again = cpu_sweeper.run("run", "grids/g.py::probe_fails")
    assert again.ret == 0, again
    assert "xfailed as expected; --rerun probes it again" in again.stdout and "1 skipped" in again.stdout
    assert len(state_of(cpu_sweeper, "g", "probe_fails")["attempts"]) == 1
    rerun = cpu_sweeper.run("run", "grids/g.py::probe_fails", "--rerun")
    assert "1 xfailed" in rerun.stdout and len(state_of(cpu_sweeper, "g", "probe_fails")["attempts"]) == 2

    strict = cpu_sweeper.grid("s", f"""
        import sweepkit as sk
        target = sk.command("{{python}}", {PROGRAM!r})
        base = sk.base(steps=1, sleep=0.0, marks=sk.mark.xfail(reason="should fail", strict=True))
    """)
    assert strict.exists()
    result = cpu_sweeper.run("run", "grids/s.py")
    assert result.ret == 1, result
    assert "XPASS(strict)" in result.stdout


def test_dry_run_shows_the_plan_and_runs_nothing(cpu_sweeper):
    script_grid(cpu_sweeper, "g", "other = sk.cell(steps=2)")
    result = cpu_sweeper.run("run", "--dry-run")
    assert result.ret == 0, result
    assert "FRESH    grids/g.py::other" in result.stdout
    assert PROGRAM in result.stdout
    assert "SWEEP_CONFIG=" in result.stdout and "runs/g/other/config.json" in result.stdout
    assert "SWEEP_RESUME=0" in result.stdout
    assert started(cpu_sweeper) == []
    assert not (cpu_sweeper.path / "runs").exists()  # "nothing was started or written"


def test_debug_executor_runs_cells_in_the_driver(cpu_sweeper):
    script_grid(cpu_sweeper, "g", "other = sk.cell(report='stdout')")
    result = cpu_sweeper.run("run", "--executor", "debug")
    assert result.ret == 0, result
    assert "2 passed" in result.stdout
    state = state_of(cpu_sweeper, "g", "other")
    assert state["attempts"][0]["executor"] == "debug"
    # In-process: the job ran in the driver, whose pid differs from the cell's parent's.
    assert state["attempts"][0]["job_id"].startswith("debug-")


def test_detach_then_status_follows_from_disk(cpu_sweeper):
    script_grid(cpu_sweeper, "g", "second = sk.cell(steps=4)", sleep=0.3)
    result = cpu_sweeper.run("run", "--detach")
    assert result.ret == 0, result
    assert "detached" in result.stdout and "follow with: sweep status" in result.stdout
    logs = list((cpu_sweeper.path / "runs" / ".drivers").glob("*.log"))
    assert len(logs) == 1

    seen = set()
    deadline = time.time() + 60
    while time.time() < deadline:
        status = cpu_sweeper.run("status")
        assert status.ret == 0, status
        lines = {line.split()[0]: line for line in status.stdout.splitlines() if line.startswith("grids/")}
        seen.update(line.split()[1] for line in lines.values())
        if all(" PASSED " in line for line in lines.values()) and len(lines) == 2:
            break
        time.sleep(0.3)
    assert all(" PASSED " in line for line in lines.values()), status
    # status saw the cells before they were done, from disk alone.
    assert seen & {"running", "pending", "submitted"}
    while time.time() < deadline and "====" not in logs[0].read_text():
        time.sleep(0.1)  # the driver sums up after the last job has recorded its end
    assert "==== 2 passed" in logs[0].read_text()
    assert "local:" in lines["grids/g.py::second"]


def test_resume_mode_goes_into_the_config_of_a_target_that_has_the_key(cpu_sweeper):
    keys = ("steps", "sleep", "events", "fail_at", "resume_mode")
    schema = {key: {"type": "typing.Any", "type_name": "any", "default": None, "doc": ""} for key in keys}
    cpu_sweeper.grid("k", f"""
        import typing
        import sweepkit as sk
        schema = {schema!r}
        for entry in schema.values():
            entry["type"] = typing.Any
        target = sk.command("{{python}}", {PROGRAM!r}, schema=schema)
        base = sk.base(steps=3, sleep=0.0, events={str(cpu_sweeper.path / 'events.jsonl')!r}, fail_at=2)
    """)
    assert cpu_sweeper.run("run").ret == 1
    config = cpu_sweeper.path / "runs" / "k" / "base" / "config.json"
    assert json.loads(config.read_text())["resume_mode"] is None
    resumed = cpu_sweeper.run("run", "--resume")
    assert resumed.ret == 0, resumed
    assert json.loads(config.read_text())["resume_mode"] == "latest"
    assert [event["start_step"] for event in read_events(cpu_sweeper.path / "events.jsonl")
            if event["event"] == "start"] == [0, 2]


@pytest.mark.slow
def test_real_trainer_cell_runs_and_reports(cpu_sweeper):
    cpu_sweeper.grid("tiny", """
        import sweepkit as sk
        base = sk.base(model="tiny-random", dataset="synthetic", device="cpu", backend="hf", num_gpus=0,
                       train_batch_size=4, policy_mini_batch_size=4, n_samples_per_prompt=2,
                       max_generate_length=4, max_steps=2, eval_limit=4, ckpt_interval=1,
                       synthetic_size=64, export_final=False)
    """)
    result = cpu_sweeper.run("run")
    assert result.ret == 0, result
    cell = cpu_sweeper.path / "runs" / "tiny" / "base"
    assert json.loads((cell / "config.json").read_text())["resume_mode"] is None
    assert sorted(path.name for path in (cell / "ckpt").glob("global_step_*")) == ["global_step_1", "global_step_2"]
    report = cpu_sweeper.run("report", "--format", "json")
    assert report.ret == 0, report
    tables = {name: rows[0] for name, rows in json.loads(report.stdout)["tables"].items()}
    throughput, accuracy = tables["throughput"], tables["accuracy"]
    assert (throughput["status"], throughput["steps"]) == ("passed", 2)
    assert throughput["sec_per_step"] > 0 and throughput["tok_per_s"] > 0
    assert 0 < throughput["gen_frac"] < 1 and 0 < throughput["train_frac"] < 1
    assert accuracy["pass_at_k"] is not None and accuracy["reward_last"] is not None


def test_the_status_command_a_detached_run_prints_finds_its_runs(tmp_path, monkeypatch):
    from sweepkit.cli import start_session
    from sweepkit.run.detach import status_command

    monkeypatch.chdir(tmp_path)
    assert status_command(start_session(["status"])) == "sweep status"
    elsewhere = start_session(["--runs-dir", "elsewhere", "status"])
    assert status_command(elsewhere) == f"sweep --runs-dir {tmp_path / 'elsewhere'} status"
