"""``sweep status`` from disk: while a driver runs, after it is killed, and for a dead run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import polars as pl

from cell_program import read_events
from test_run import completed_grid, rerun_in_flight, script_grid, state_of


def status_line(sweeper, nodeid: str) -> str:
    result = sweeper.run("status")
    assert result.ret == 0, result
    return next(line for line in result.stdout.splitlines() if line.startswith(nodeid + " "))


def test_status_of_a_running_then_killed_run(sweeper):
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    script_grid(sweeper, "g", "", steps=2, sleep=0.0, hang_at=1)
    env = {**os.environ, **sweeper.env}
    driver = subprocess.Popen([sys.executable, "-m", "sweepkit", "run"], cwd=sweeper.path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = sweeper.path / "runs" / "g" / "base" / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().endswith("\n")):
        time.sleep(0.05)

    line = status_line(sweeper, "grids/g.py::base")
    assert line.split()[1:4] == ["running", "1", "1"]  # status, attempts, step
    assert "local:" in line
    report = sweeper.run("report", "--format", "parquet")
    assert report.ret == 0, report
    row = pl.read_parquet(sweeper.path / "runs/g/report/throughput.parquet").row(0, named=True)
    assert (row["cell"], row["status"], row["steps"]) == ("base", "running", 1)

    # Kill everything: the driver, the job process and the cell's own process.
    job_pid = state_of(sweeper, "g", "base")["attempts"][0]["pid"]
    cell_pid = read_events(sweeper.path / "events.jsonl")[0]["pid"]
    for pid in (driver.pid, job_pid, cell_pid):
        os.kill(pid, signal.SIGKILL)
    driver.wait()
    deadline = time.time() + 30
    while time.time() < deadline and " INTERRUPTED " not in status_line(sweeper, "grids/g.py::base"):
        time.sleep(0.05)
    assert " INTERRUPTED " in status_line(sweeper, "grids/g.py::base")
    assert json.loads((sweeper.path / "runs/g/base/state.json").read_text())["state"] == "running"

    # Its checkpoint must not be silently run over nor silently resumed.
    refused = sweeper.run("run")
    assert refused.ret != 0
    assert "base: was interrupted and has checkpoints" in refused.stderr
    assert "--resume" in refused.stderr and "--rerun" in refused.stderr

    resumed = sweeper.run("run", "--resume")
    assert resumed.ret == 0, resumed
    starts = [event["start_step"] for event in read_events(sweeper.path / "events.jsonl") if event["event"] == "start"]
    assert starts == [0, 1]
    line = status_line(sweeper, "grids/g.py::base")
    assert line.split()[1:4] == ["PASSED", "2", "2"]


def test_status_lists_cells_never_run(sweeper):
    script_grid(sweeper, "g", "other = sk.cell(steps=2)")
    result = sweeper.run("status")
    assert result.ret == 0, result
    assert "grids/g.py::other" in result.stdout and "not run" in result.stdout


def test_mid_rerun_a_cell_not_started_again_shows_no_numbers_of_its_old_run(sweeper):
    # Its old metrics.jsonl and stdout.log stay until it starts (so that an interrupted
    # rerun loses nothing), but they are no results of the attempt it waits for.
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    grid = completed_grid(sweeper)
    driver = rerun_in_flight(sweeper, grid)
    try:
        status = sweeper.run("status")
        report = sweeper.run("report", "--format", "json")
    finally:
        os.killpg(driver.pid, signal.SIGINT)
        driver.communicate(timeout=120)
    assert status.ret == 0 and report.ret == 0, (status, report)
    lines = {line.split()[0]: line.split()[1:] for line in status.stdout.splitlines() if line.startswith("grids/")}
    assert lines["grids/g.py::base"][:3] == ["running", "2", "1"], status.stdout  # status, attempts, step
    for cell in ("grids/g.py::c1", "grids/g.py::c2"):
        assert lines[cell] == ["pending", "1"], status.stdout  # one attempt so far; no step, reward, age, job
    (document,) = [json.loads(line) for line in report.stdout.splitlines()]  # one JSON line a grid
    for table in document["tables"].values():
        rows = {row["cell"]: row for row in table}
        assert rows["base"]["steps"] == 1
        for cell in ("c1", "c2"):
            numbers = {key: value for key, value in rows[cell].items() if key not in ("cell", "status", "diff")}
            assert rows[cell]["status"] == "pending" and set(numbers.values()) == {None}, rows[cell]


def status_table(sweeper, *args: str) -> tuple[dict[str, list[str]], str]:
    result = sweeper.run("status", *args)
    assert result.ret == 0, result
    return ({line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if line.startswith("grids/")},
            result.stdout)


def test_status_after_the_grid_file_changed_shows_every_cell_on_disk_and_how_it_changed(sweeper):
    # The grid is edited while a detached run goes on: a cell is removed, another's config
    # changed. Both ran and completed; status shows them, marked, as report does.
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    grid = script_grid(sweeper, "g", "gone = sk.cell(steps=2)\nkept = sk.cell(steps=4)", sleep=0.0)
    assert sweeper.run("run", "--detach").ret == 0
    deadline = time.time() + 120
    while time.time() < deadline and status_table(sweeper)[1].splitlines()[-1] != "3 PASSED":
        time.sleep(0.3)
    grid.write_text(grid.read_text().replace("gone = sk.cell(steps=2)\n", "").replace("steps=4", "steps=5"))

    for args in ((), ("grids/g.py",)):
        rows, text = status_table(sweeper, *args)
        assert rows["grids/g.py::base"][:2] == ["PASSED", "1"], text  # no mark: as it ran
        assert rows["grids/g.py::gone"][:3] == ["PASSED", "removed", "1"], text
        assert rows["grids/g.py::kept"][:3] == ["PASSED", "changed", "1"], text
        assert "removed: 1 cell no longer in its grid file" in text and "changed: 1 cell its grid file" in text
    rows, _ = status_table(sweeper, "grids/g.py::base")  # a cell named alone is shown alone
    assert list(rows) == ["grids/g.py::base"]
    report = sweeper.run("report", "--format", "csv", "--table", "throughput")
    assert report.ret == 0 and "gone,passed," in report.stdout, report


def test_a_rerun_whose_driver_was_killed_shows_the_earlier_numbers_of_the_cells_it_never_started(sweeper):
    # The driver of a --rerun is killed (with its cells) while its first cell runs: the cells
    # it had not started keep their earlier run's files, and status and report show that
    # run's numbers, marked as an interrupted rerun.
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    grid = completed_grid(sweeper)
    driver = rerun_in_flight(sweeper, grid)
    os.killpg(driver.pid, signal.SIGKILL)  # the driver, its local job and the cell it runs
    driver.communicate(timeout=60)

    rows, text = status_table(sweeper)
    assert rows["grids/g.py::base"][0] == "INTERRUPTED", text
    for cell, steps in (("c1", "2"), ("c2", "4")):
        # status, grid (the rerun changed their config), attempts, step, then the earlier numbers
        assert rows[f"grids/g.py::{cell}"][:4] == ["RERUN-INTERRUPTED", "changed", "1", steps], text
    report = sweeper.run("report", "--format", "json")
    assert report.ret == 0, report
    (document,) = [json.loads(line) for line in report.stdout.splitlines()]
    rows = {row["cell"]: row for row in document["tables"]["throughput"]}
    for cell, steps in (("c1", 2), ("c2", 4)):
        assert (rows[cell]["status"], rows[cell]["steps"]) == ("rerun-interrupted", steps), rows[cell]
        assert rows[cell]["sec_per_step"] is not None
