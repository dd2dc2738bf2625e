"""``sweep run --executor slurm`` against the real local SLURM cluster (scripts/local-slurm).

Every cell asks for 1 CPU so that two run at once on the 2-CPU test node. Waits are
bounded by deadlines that guard against hanging, never asserted as performance.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cell_program import PROGRAM, intervals, read_events

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "local-slurm"
DEADLINE_S = 240


def on_cluster(test):
    """Marks a test that submits to the local cluster: ``slurm``, skipped without sbatch."""
    test = pytest.mark.usefixtures("cluster")(test)
    test = pytest.mark.skipif(shutil.which("sbatch") is None, reason="sbatch is not on PATH: no SLURM here "
                              "(start one with `sudo scripts/local-slurm start`)")(test)
    return pytest.mark.slurm(test)

RESOURCES = {"cpus": 1, "mem_gb": 0.25}


def script_grid(sweeper, name: str, cells: str, **base) -> Path:
    """A grid of tests/cell_program.py cells, 1 CPU each; ``base`` goes into ``sk.base``."""
    values = {"steps": 3, "sleep": 0.1, "events": str(sweeper.path / "events.jsonl"), **RESOURCES, **base}
    args = ", ".join(f"{key}={value!r}" for key, value in values.items())
    lines = ["import sweepkit as sk", f"target = sk.command('{{python}}', {PROGRAM!r})", f"base = sk.base({args})"]
    return sweeper.grid(name, "\n".join(lines + [line.strip() for line in cells.strip().splitlines()]) + "\n")


def state_of(sweeper, grid: str, cell: str) -> dict:
    return json.loads((sweeper.path / "runs" / grid / cell / "state.json").read_text())


def status_rows(sweeper) -> dict[str, str]:
    """``sweep status``'s line of each cell, by cell name."""
    status = sweeper.run("status")
    assert status.ret == 0, status
    return {line.split()[0].split("::")[1]: line for line in status.stdout.splitlines() if "::" in line}


def sacct_states(job_ids: list[str]) -> dict[str, str]:
    masters = sorted({job_id.split("_")[0] for job_id in job_ids})
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(masters)],
                         capture_output=True, text=True, check=True).stdout
    rows = dict(line.split("|")[:2] for line in out.splitlines() if "|" in line)
    return {job_id: rows.get(job_id, "").split(" ")[0] for job_id in job_ids}


def squeue_names() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, check=True).stdout
    return out.split()


def wait_for(what: str, check, deadline_s: float = DEADLINE_S, every: float = 0.5):
    deadline = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what} after {deadline_s}s")
        time.sleep(every)


def starts(sweeper) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for event in read_events(sweeper.path / "events.jsonl"):
        if event["event"] == "start":
            found.setdefault(event["cell"].split("::")[1], []).append(event)
    return found


def background(sweeper, *args: str) -> subprocess.Popen:
    env = {**os.environ, "COLUMNS": "200", **sweeper.env,
           "PYTHONPATH": os.pathsep.join(p for p in (str(sweeper.path), os.environ.get("PYTHONPATH", "")) if p)}
    log = open(sweeper.path / f"driver-{time.time_ns()}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "sweepkit", *args], cwd=sweeper.path, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture
def cluster(sweeper):
    status = subprocess.run([str(SCRIPT), "status"], capture_output=True, text=True)
    if status.returncode != 0:
        pytest.skip(f"the local SLURM cluster is not healthy (scripts/local-slurm start):\n{status.stdout}")
    yield sweeper
    # Whatever a failing test left behind must not hold the node's CPUs for the next one.
    subprocess.run([sys.executable, "-m", "sweepkit", "cancel"], cwd=sweeper.path, capture_output=True)


# -- no cluster needed ---------------------------------------------------------------------

SWEEPCONF_WITH_CLUSTER = '''
import attrs
from sweepkit import hookimpl

@attrs.frozen
class Pieces:
    nodes: int = 1
    preamble: tuple = ("echo preamble-ran >&2", "#SBATCH --comment=from-the-cluster")
    env: dict = attrs.field(factory=lambda: {"CLUSTER_VALUE": "$(id); rm -rf ~ `uname`"})
    argv_prefix: tuple = ("env", "WRAPPED=by-the-container")

@hookimpl
def sweep_job_resources(cell, session):
    return Pieces()

@hookimpl
def sweep_job_sbatch_options(cell, session):
    return {"nice": "10"}

@hookimpl
def sweep_job_concurrency_cap(session):
    return 3
'''


def test_dry_run_writes_the_job_scripts_and_submits_nothing(sweeper):
    sweeper.write("grids/sweepconf.py", SWEEPCONF_WITH_CLUSTER)
    script_grid(sweeper, "dry", """
        other = sk.cell(steps=4)
        chained = sk.cell(time_limit="00:01:00", max_restarts=2)
    """)
    result = sweeper.run("run", "--executor", "slurm", "--dry-run")
    assert result.ret == 0, result
    scripts = sweeper.path / "runs" / ".dry-run" / "dry"
    assert sorted(path.name for path in scripts.iterdir()) == [
        "dry_base+1.sbatch", "dry_chained.link1.sbatch", "dry_chained.link2.sbatch", "dry_chained.sbatch"]
    assert "4 job script(s) written" in result.stdout
    array = (scripts / "dry_base+1.sbatch").read_text()
    assert "#SBATCH --array=0-1%3" in array  # two equal cells, parallelism from the cluster's cap
    assert "#SBATCH --cpus-per-task=1" in array and "#SBATCH --mem=256M" in array
    assert "#SBATCH --nice=10" in array and "#SBATCH --comment=from-the-cluster" in array
    assert "export CLUSTER_VALUE='$(id); rm -rf ~ `uname`'" in array
    link = (scripts / "dry_chained.link2.sbatch").read_text()
    assert "#SBATCH --time=00:01:00" in link and "#SBATCH --dependency=afterany:PREVIOUS_LINK_JOB_ID" in link
    assert "--dependency" not in (scripts / "dry_chained.sbatch").read_text()
    # Nothing was submitted: no registry, no submitit folder, no state.
    assert not (sweeper.path / "runs" / ".slurm").exists()
    assert not (sweeper.path / "runs" / "dry" / ".slurm").exists()
    assert not (sweeper.path / "runs" / "dry" / "base").exists()


def test_a_partition_with_a_line_break_is_refused_before_anything_runs(sweeper):
    script_grid(sweeper, "bad", "", partition="debug\nrm -rf ~")
    result = sweeper.run("run", "--executor", "slurm", "--dry-run")
    assert result.ret == 4, result
    assert "partition: 'debug\\nrm -rf ~' has a line break" in result.stderr
    assert "grids/bad.py" in result.stderr


def test_default_executor_stays_local_unless_slurm_is_asked_for(sweeper):
    script_grid(sweeper, "choose", "")
    local = sweeper.run("run", "--dry-run")
    assert "job script" not in local.stdout  # the local executor writes none
    if shutil.which("sbatch") is not None:
        asked = sweeper.run("run", "--dry-run", env={"SWEEP_SLURM": "1"})
        assert "job script: runs/.dry-run/choose/choose_base.sbatch" in asked.stdout, asked


# -- against the cluster ----------------------------------------------------------------------


@on_cluster
def test_smoke_grid_completes_and_the_report_has_its_rows(sweeper):
    script_grid(sweeper, "scripts", """
        longer = sk.cell(steps=4)
        quick = sk.cell(sleep=0.0)
        chained = sk.cell(time_limit=5, max_restarts=1, mem_gb=0.3)
    """)
    sweeper.grid("learner", """
        import sweepkit as sk
        base = sk.base(model="tiny-random", dataset="synthetic", cpus=1, mem_gb=1)
    """)
    result = sweeper.run("run", "--executor", "slurm", "--profile", "smoke", timeout=DEADLINE_S)
    assert result.ret == 0, result
    assert "5 passed" in result.stdout
    states = {cell: state_of(sweeper, "scripts", cell) for cell in ("base", "longer", "quick", "chained")}
    assert all(state["state"] == "completed" for state in states.values())
    # The three equal cells went out as one array; the chained one as a head and a link.
    array_ids = {states[cell]["submission"]["job_id"] for cell in ("base", "longer", "quick")}
    assert len({job_id.split("_")[0] for job_id in array_ids}) == 1 and all("_" in i for i in array_ids)
    # Each task of the array carries its own cell's name in sacct, as a single job would.
    names = dict(line.split("|")[:2] for line in subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "JobID,JobName", "-j", next(iter(array_ids)).split("_")[0]],
        capture_output=True, text=True, check=True).stdout.splitlines())
    assert {names[states[cell]["submission"]["job_id"]] for cell in ("base", "longer", "quick")} == {
        "scripts_base", "scripts_longer", "scripts_quick"}
    head, link = states["chained"]["submission"]["job_id"].split(",")
    assert sacct_states([head, link]) == {head: "COMPLETED", link: "CANCELLED"}  # no retraining after COMPLETED
    assert len(starts(sweeper)["chained"]) == 1
    assert state_of(sweeper, "learner", "base")["state"] == "completed"

    report = sweeper.run("report", "--format", "csv", "--table", "throughput")
    assert report.ret == 0, report
    rows = [line for line in report.stdout.splitlines() if line.startswith(("base,", "longer,", "quick,", "chained,"))]
    assert len(rows) >= 4 and all(",passed," in row for row in rows)
    assert all("PASSED" in line for line in status_rows(sweeper).values())


@on_cluster
@pytest.mark.slurm_sleeps  # two minutes of 2 s sleeps under a 1-minute limit, run beside other tests
def test_failure_classes_and_a_chain_past_the_wall_limit(sweeper):
    # One grid so the slow cells share the time: the chain needs ~100 s of steps under a
    # 1-minute limit (SLURM ends a link 60-90 s in), the timeout cell hangs past its limit.
    script_grid(sweeper, "classes", """
        raises = sk.cell(steps=3, fail_at=2)
        killed = sk.cell(steps=3, hang_at=1)
        probe = sk.cell(steps=2, fail_at=1, marks=sk.mark.xfail(reason="ceiling probe"))
        timeout = sk.cell(steps=3, hang_at=1, time_limit=1)
        chain = sk.cell(steps=50, sleep=2.0, time_limit=1, max_restarts=2, mem_gb=0.3)
    """)
    driver = background(sweeper, "run", "--executor", "slurm")
    try:
        killed_job = wait_for("the 'killed' cell to run", lambda: (
            (sweeper.path / "runs/classes/killed/state.json").exists()
            and state_of(sweeper, "classes", "killed")["state"] == "running"
            and state_of(sweeper, "classes", "killed")["attempts"][-1]["job_id"]))
        subprocess.run(["scancel", killed_job], check=True)
        assert driver.wait(timeout=DEADLINE_S + 60) == 1  # failures were expected
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)

    rows = status_rows(sweeper)
    assert "EXCEPTION: RuntimeError: boom at step 2" in rows["raises"], rows
    assert "CANCELLED" in rows["killed"], rows
    assert "TIMEOUT" in rows["timeout"], rows
    assert "XFAIL (EXCEPTION: RuntimeError: boom at step 1)" in rows["probe"], rows
    assert "PASSED" in rows["chain"], rows
    report = sweeper.run("report", "--format", "csv", "--table", "throughput")
    assert "TIMEOUT" in report.stdout and "EXCEPTION: RuntimeError: boom at step 2" in report.stdout

    chain = state_of(sweeper, "classes", "chain")
    assert chain["state"] == "completed"
    attempts = chain["attempts"]
    assert len(attempts) >= 2
    assert [attempt["failure_class"] for attempt in attempts[:-1]] == ["TIMEOUT"] * (len(attempts) - 1)
    assert attempts[-1]["failure"] is None
    link_ids = chain["submission"]["job_id"].split(",")
    assert [attempt["job_id"] for attempt in attempts] == link_ids[:len(attempts)]
    assert all(sacct_states([job_id])[job_id] == "TIMEOUT" for job_id in link_ids[:len(attempts) - 1])
    # Each link resumed where the checkpoints stopped: the step count goes on, nothing lost.
    chain_starts = starts(sweeper)["chain"]
    assert chain_starts[0]["start_step"] == 0 and all(s["start_step"] > 0 for s in chain_starts[1:])
    steps = [json.loads(line)["step"] for line in
             (sweeper.path / "runs/classes/chain/metrics.jsonl").read_text().splitlines() if '"train"' in line]
    assert sorted(set(steps)) == list(range(1, 51))
    assert steps == sorted(steps)  # monotonic across links
    assert len(steps) - len(set(steps)) <= len(attempts) - 1  # at most the step in flight at each kill
    # One link at a time: each attempt started after the one before had ended.
    assert all(earlier["ended"] <= later["started"] for earlier, later in zip(attempts, attempts[1:]))


@on_cluster
def test_killed_driver_then_run_again_submits_only_the_rest(sweeper):
    # Different memory requests keep the cells out of one array, so a cap of 2 lets the
    # first driver submit only half of the grid.
    script_grid(sweeper, "half", """
        b = sk.cell(mem_gb=0.26)
        c = sk.cell(mem_gb=0.27)
        d = sk.cell(mem_gb=0.28)
    """, steps=3, sleep=2.0)
    registry = sweeper.path / "runs" / ".slurm" / "jobs.jsonl"
    first = background(sweeper, "run", "--executor", "slurm", "--max-parallel", "2")
    try:
        wait_for("two submissions", lambda: registry.exists() and len(registry.read_text().splitlines()) >= 2,
                 every=0.05)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert len(registry.read_text().splitlines()) == 2
    # Its two submitted cells go on in SLURM; the two it never submitted are shown as such.
    words = sorted(line.split()[1] for line in status_rows(sweeper).values())
    assert words.count("abandoned") == 2 and len(words) == 4, words

    again = sweeper.run("run", "--executor", "slurm", "--max-parallel", "2", timeout=DEADLINE_S)
    assert again.ret == 0, again
    assert "4 passed" in again.stdout
    # The second driver submitted only the other two cells; the first driver's two were
    # followed (queued, running, or already finished under a slow machine), not submitted again.
    resubmitted = [line for line in again.stdout.splitlines() if line.startswith("submitted")]
    assert len(resubmitted) == 2, again
    cells = starts(sweeper)
    assert sorted(cells) == ["b", "base", "c", "d"] and all(len(events) == 1 for events in cells.values())
    job_ids = [state_of(sweeper, "half", cell)["attempts"][0]["job_id"] for cell in cells]
    assert len(set(job_ids)) == 4
    # The cap held across the two drivers: never more than 2 cells at once.
    spans = intervals(read_events(sweeper.path / "events.jsonl"))
    points = sorted([(start, 1) for _, start, _ in spans] + [(end, -1) for _, _, end in spans])
    running, most = 0, 0
    for _, change in points:
        running += change
        most = max(most, running)
    assert most <= 2


@on_cluster
def test_two_racing_drivers_keep_the_runs_dir_within_its_cap(sweeper):
    # Different memory requests keep every cell its own job, so each counts against the cap.
    for grid in ("racea", "raceb"):
        script_grid(sweeper, grid, """
            b = sk.cell(mem_gb=0.26)
            c = sk.cell(mem_gb=0.27)
        """, steps=2, sleep=1.0)
    drivers = [background(sweeper, "run", f"grids/{grid}.py", "--executor", "slurm", "--max-parallel", "2")
               for grid in ("racea", "raceb")]
    most = 0
    try:
        while any(driver.poll() is None for driver in drivers):
            queued = [name for name in squeue_names() if name.startswith(("racea_", "raceb_"))]
            most = max(most, len(queued))
            time.sleep(0.1)
    finally:
        for driver in drivers:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert [driver.returncode for driver in drivers] == [0, 0]
    assert sorted(starts(sweeper)) == ["b", "base", "c"] and sum(len(e) for e in starts(sweeper).values()) == 6
    assert 1 <= most <= 2  # queued jobs of this runs dir, pending ones included, never above the cap
    job_ids = {state_of(sweeper, grid, cell)["attempts"][0]["job_id"]
               for grid in ("racea", "raceb") for cell in ("base", "b", "c")}
    assert len(job_ids) == 6


@on_cluster
def test_cancel_of_one_cell_leaves_the_other_jobs_of_a_live_driver_alone(sweeper):
    # SLURM jobs outlive their driver: cancelling one cell scancels its job, not the driver.
    script_grid(sweeper, "one", "other = sk.cell(mem_gb=0.26)", steps=8, sleep=1.0)
    driver = background(sweeper, "run", "--executor", "slurm")
    try:
        wait_for("both cells to run", lambda: all(
            (sweeper.path / f"runs/one/{cell}/state.json").exists()
            and state_of(sweeper, "one", cell)["state"] == "running" for cell in ("base", "other")))
        cancelled = sweeper.run("cancel", "grids/one.py::base")
        assert cancelled.ret == 0, cancelled
        assert "stop    sweep run" not in cancelled.stdout
        driver.wait(timeout=DEADLINE_S)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert state_of(sweeper, "one", "base")["state"] == "cancelled"
    assert state_of(sweeper, "one", "other")["state"] == "completed"


@on_cluster
@pytest.mark.skipif(os.geteuid() != 0, reason="restarting slurmctld needs root")
def test_status_recovers_after_the_controller_restarts(sweeper, restarts_the_controller):
    script_grid(sweeper, "restart", "other = sk.cell(steps=5)", steps=6, sleep=2.0)
    submitted = sweeper.run("run", "--executor", "slurm", "--detach")
    assert submitted.ret == 0, submitted
    wait_for("both cells to run", lambda: all(
        (sweeper.path / f"runs/restart/{cell}/state.json").exists()
        and state_of(sweeper, "restart", cell)["state"] == "running" for cell in ("base", "other")))
    restarted = subprocess.run([str(SCRIPT), "restart-ctld"], capture_output=True, text=True, timeout=120)
    assert restarted.returncode == 0, restarted.stderr
    during = status_rows(sweeper)
    assert all(line.split()[1] in ("running", "PASSED") for line in during.values()), during
    def all_passed():
        rows = status_rows(sweeper)
        return rows if all("PASSED" in line for line in rows.values()) else None

    final = wait_for("both cells to pass", all_passed, every=2)
    assert all("slurm:" in line for line in final.values())
    assert "2 skipped" in sweeper.run("run", "--executor", "slurm").stdout


@on_cluster
def test_rerun_cancels_the_old_chain_and_cancel_empties_the_queue(sweeper):
    script_grid(sweeper, "stop", """
        other = sk.cell(steps=4)
        chain = sk.cell(steps=2, time_limit=1, max_restarts=2, mem_gb=0.3)
    """, steps=3, hang_at=1)
    assert sweeper.run("run", "--executor", "slurm", "--detach").ret == 0
    # Both CPUs are taken by the hanging cells, so the chain's head waits in the queue.
    wait_for("the hanging cells to run", lambda: all(
        state_of(sweeper, "stop", cell)["state"] == "running" for cell in ("base", "other")))
    old_chain = state_of(sweeper, "stop", "chain")["submission"]["job_id"].split(",")
    assert len(old_chain) == 3

    rerun = sweeper.run("run", "grids/stop.py::chain", "--executor", "slurm", "--rerun", "--detach")
    assert rerun.ret == 0, rerun
    new_chain = state_of(sweeper, "stop", "chain")["submission"]["job_id"].split(",")
    assert set(new_chain).isdisjoint(old_chain)
    wait_for("the old chain to be cancelled",
             lambda: set(sacct_states(old_chain).values()) == {"CANCELLED"})

    cancelled = sweeper.run("cancel", "grids/stop.py")
    assert cancelled.ret == 0, cancelled
    assert not [name for name in squeue_names() if name.startswith("stop_")]
    rows = status_rows(sweeper)
    assert sorted(rows) == ["base", "chain", "other"]
    assert all(line.split()[1] == "CANCELLED" for line in rows.values()), rows


@on_cluster
def test_shell_metacharacters_reach_the_cell_as_data(sweeper):
    sweeper.write("grids/sweepconf.py", SWEEPCONF_WITH_CLUSTER)
    sentinel = sweeper.path / "pwned"
    evil = f'"; touch {sentinel}; echo "'
    probe = ("import json, os, sys; json.dump({'argv': sys.argv[1:], 'env': {k: os.environ.get(k) for k in "
             "('EVIL', 'CLUSTER_VALUE', 'WRAPPED')}, 'config': json.load(open(os.environ['SWEEP_CONFIG']))}, "
             "open('seen.json', 'w'))")
    sweeper.grid("inject", f"""
        import sweepkit as sk
        target = sk.command("{{python}}", "-c", {probe!r}, "{{config}}")
        base = sk.base(note={evil!r}, other="$(id)", cpus=1, mem_gb=0.25,
                       env={{"EVIL": {evil!r} + " $(touch {sentinel})"}},
                       sbatch={{"comment": "$(touch {sentinel})"}})
    """)
    result = sweeper.run("run", "--executor", "slurm", timeout=DEADLINE_S)
    assert result.ret == 0, result
    seen = json.loads((sweeper.path / "runs/inject/base/seen.json").read_text())
    assert seen["config"] == {"note": evil, "other": "$(id)"}
    assert seen["env"] == {"EVIL": evil + f" $(touch {sentinel})", "CLUSTER_VALUE": "$(id); rm -rf ~ `uname`",
                           "WRAPPED": "by-the-container"}
    assert seen["argv"] == [str(sweeper.path / "runs/inject/base/config.json")]
    assert not sentinel.exists()


@on_cluster
@pytest.mark.parametrize("second", [("grids/twice.py",), ("grids/twice.py::b", "grids/twice.py::c")],
                         ids=["same-cells", "overlapping"])
def test_two_drivers_on_the_same_cells_run_each_cell_once(sweeper, second):
    # A third grid's cell holds the cap of 1, so both drivers plan their cells as fresh and
    # wait; equal cells go out as one array of %1, and whichever driver gets the slot, the
    # other must not submit the cells it sees complete meanwhile.
    script_grid(sweeper, "blocker", "", steps=1, sleep=3.0)
    script_grid(sweeper, "twice", """
        b = sk.cell(steps=2)
        c = sk.cell(steps=3)
    """, steps=1, sleep=0.1)
    blocker = background(sweeper, "run", "grids/blocker.py", "--executor", "slurm", "--max-parallel", "1")
    drivers = []
    try:
        wait_for("the blocker to be submitted", lambda: (sweeper.path / "runs/.slurm/jobs.jsonl").exists(),
                 every=0.1)
        drivers = [background(sweeper, "run", *selection, "--executor", "slurm", "--max-parallel", "1")
                   for selection in (("grids/twice.py",), second)]
        codes = [driver.wait(timeout=DEADLINE_S) for driver in [blocker, *drivers]]
    finally:
        for driver in [blocker, *drivers]:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait()
    logs = [path.read_text() for path in sorted(sweeper.path.glob("driver-*.log"))]
    assert codes == [0, 0, 0], logs
    twice = [event for event in read_events(sweeper.path / "events.jsonl") if event["event"] == "start"
             and event["cell"].startswith("grids/twice.py::")]
    assert sorted(event["cell"].split("::")[1] for event in twice) == ["b", "base", "c"], twice
    assert "3 passed" in logs[1] and f"{4 - len(second)} passed" in logs[2], logs
    assert all(len(state_of(sweeper, "twice", cell)["attempts"]) == 1 for cell in ("base", "b", "c"))


def sacct_times(job_ids: list[str]) -> dict[str, tuple[str, str, str]]:
    """(state, start, end) of each job, as sacct's ISO times (``Unknown`` before it happens)."""
    masters = sorted({job_id.split("_")[0] for job_id in job_ids})
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,Start,End", "-j", ",".join(masters)],
                         capture_output=True, text=True, check=True).stdout
    rows = {fields[0]: (fields[1].split(" ")[0], fields[2], fields[3])
            for fields in (line.split("|") for line in out.splitlines()) if len(fields) >= 4}
    return {job_id: rows[job_id] for job_id in job_ids if job_id in rows}


@on_cluster
def test_a_job_its_killed_driver_never_recorded_is_cancelled_and_counted_by_the_next(sweeper):
    # The driver dies the moment sbatch returns: its job is queued, but neither the runs
    # dir's registry nor submitit's pickle knows it. The next driver must not run a second
    # job beside it under a cap of 1 (that job would wait 60 s for its pickle, then fail).
    script_grid(sweeper, "orphan", "other = sk.cell(mem_gb=0.26)", steps=2, sleep=0.5)
    answers = sweeper.path / "orphans.txt"
    fake = sweeper.write("fakebin/sbatch", f"""\
        #!/bin/bash
        out=$({shutil.which("sbatch")} "$@"); code=$?
        echo "$out" >> {answers}
        kill -9 $PPID  # the driver, before it reads the answer
        exit $code
    """)
    fake.chmod(0o755)
    sweeper.env["PATH"] = f"{fake.parent}{os.pathsep}{os.environ['PATH']}"
    first = background(sweeper, "run", "--executor", "slurm", "--max-parallel", "1")
    assert first.wait(timeout=60) == -signal.SIGKILL
    del sweeper.env["PATH"]
    orphan = answers.read_text().split()[-1]
    assert sacct_states([orphan]).get(orphan) in ("PENDING", "RUNNING", ""), answers.read_text()

    began = time.monotonic()
    again = sweeper.run("run", "--executor", "slurm", "--max-parallel", "1", timeout=DEADLINE_S)
    assert again.ret == 0, again
    assert "2 passed" in again.stdout, again
    assert time.monotonic() - began < 50  # not held up by the orphan's 60 s wait for its pickle
    cells = starts(sweeper)
    assert sorted(cells) == ["base", "other"] and all(len(events) == 1 for events in cells.values())
    ran = [state_of(sweeper, "orphan", cell)["attempts"][0]["job_id"] for cell in cells]
    times = wait_for("sacct to record the orphan's end", lambda: (
        found if (found := sacct_times([orphan, *ran]))[orphan][2] != "Unknown" else None))
    assert times[orphan][0] == "CANCELLED", times
    # One job of the runs dir at a time: the orphan ended before either cell's job started.
    assert all(times[orphan][2] <= times[job_id][1] for job_id in ran), times


@on_cluster
def test_a_rerun_that_cancels_a_job_its_killed_driver_never_recorded_says_so(sweeper):
    script_grid(sweeper, "orphaned", "", steps=1, sleep=0.0)
    answers = sweeper.path / "orphans.txt"
    fake = sweeper.write("fakebin/sbatch", f"""\
        #!/bin/bash
        out=$({shutil.which("sbatch")} --begin=now+600 "$@"); code=$?
        echo "$out" >> {answers}
        kill -9 $PPID  # the driver, before it reads the answer
        exit $code
    """)
    fake.chmod(0o755)
    sweeper.env["PATH"] = f"{fake.parent}{os.pathsep}{os.environ['PATH']}"
    first = background(sweeper, "run", "--executor", "slurm")
    assert first.wait(timeout=60) == -signal.SIGKILL
    del sweeper.env["PATH"]
    orphan = answers.read_text().split()[-1]

    rerun = sweeper.run("run", "--executor", "slurm", "--rerun", timeout=DEADLINE_S)
    assert rerun.ret == 0 and "1 passed" in rerun.stdout, rerun
    said = [line for line in rerun.stdout.splitlines() if line.startswith("SCANCELLED")]
    assert len(said) == 1 and "grids/orphaned.py::base" in said[0] and f"SLURM job {orphan}" in said[0], rerun
    assert "never recorded" in said[0], rerun
    assert wait_for("the orphan to end", lambda: sacct_states([orphan]).get(orphan, "").startswith("CANCELLED"))


@on_cluster
def test_a_cell_final_on_disk_is_final_whatever_slurm_still_holds_for_it(sweeper):
    # After slurmctld is killed and started again it may requeue array tasks whose cells
    # completed meanwhile (its saved state had them running): here the driver is paused
    # while its cells complete and one task is put back in the queue, held, as that does.
    script_grid(sweeper, "final", "other = sk.cell(steps=3)", steps=2, sleep=0.5)
    driver = background(sweeper, "run", "--executor", "slurm")
    tasks: list[str] = []
    try:
        wait_for("a cell to run", lambda: any(
            (sweeper.path / f"runs/final/{cell}/state.json").exists()
            and state_of(sweeper, "final", cell)["state"] == "running" for cell in ("base", "other")), every=0.1)
        os.kill(driver.pid, signal.SIGSTOP)
        tasks = [state_of(sweeper, "final", cell)["submission"]["job_id"] for cell in ("base", "other")]
        wait_for("both tasks to complete", lambda: set(sacct_states(tasks).values()) == {"COMPLETED"})
        subprocess.run(["scontrol", "requeuehold", tasks[0]], check=True, capture_output=True)
        wait_for("the task to be queued again", lambda: sacct_states(tasks)[tasks[0]] in ("REQUEUED", "PENDING"))
        os.kill(driver.pid, signal.SIGCONT)
        assert driver.wait(timeout=60) == 0
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        subprocess.run(["scancel", *tasks], capture_output=True)
    log = next(sweeper.path.glob("driver-*.log")).read_text()
    assert "2 passed" in log, log
    assert all(len(events) == 1 for events in starts(sweeper).values())
    wait_for("the requeued task to be cancelled", lambda: sacct_states(tasks)[tasks[0]] == "CANCELLED")
