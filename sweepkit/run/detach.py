"""The run's two ways of not following its cells to their end here: ``--dry-run`` (show each
cell's plan and job, write only the job scripts an executor renders) and ``--detach`` with an
executor whose jobs need a driver (start this same command as a background driver and
return).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from sweepkit.errors import ExitCode
from sweepkit.run import plan as pl
from sweepkit.run.executors.base import Executor
from sweepkit.state import records as st


def dry_run(session, plans, jobs, executor: Executor) -> int:
    console = session.console
    for plan in plans:
        nodeid = plan.cell.nodeid
        if nodeid not in jobs:
            console.print(f"{plan.action.upper():<8} {nodeid}  ({plan.note})", markup=False)
            continue
        job = jobs[nodeid]
        console.print(f"{plan.action.upper():<8} {nodeid}" + (f"  ({plan.note})" if plan.note else ""), markup=False)
        console.print(f"  dir:  {session.display_path(plan.directory)}", markup=False)
        console.print(f"  argv: {shlex.join(job.argv)}", markup=False)
        for key, value in sorted(job.env.items()):
            console.print(f"  env:  {key}={value}", markup=False)
        if job.gpus:
            console.print(f"  gpus: {job.gpus}", markup=False)
    actions = (pl.FRESH, pl.RESUME, pl.SKIP, pl.ATTACH)
    counts = {action: sum(plan.action == action for plan in plans) for action in actions}
    scripts = executor.render_dry_run(list(jobs.values()))
    for path in scripts:
        console.print(f"job script: {session.display_path(path)}", markup=False)
    for note in executor.cap_notes():
        console.print(note, markup=False)
    written = (f"nothing was started; {len(scripts)} job script(s) written" if scripts
               else "nothing was started or written")
    console.print(f"dry run: would run {counts[pl.FRESH]} fresh, resume {counts[pl.RESUME]}, skip {counts[pl.SKIP]}, "
                  f"wait for {counts[pl.ATTACH]} running; {written}", markup=False)
    return ExitCode.OK


def status_command(session) -> str:
    """The ``sweep status`` that finds this run: with its --rootdir / --runs-dir when not the defaults."""
    words = ["sweep"]
    if session.rootdir != Path.cwd().resolve():
        words += ["--rootdir", str(session.rootdir)]
    if session.runs_dir != session.rootdir / "runs":
        words += ["--runs-dir", str(session.runs_dir)]
    return shlex.join([*words, "status"])


def start_background_driver(session, n_jobs: int) -> int:
    """``--detach`` with an executor whose jobs need a driver: start this same command
    without ``--detach`` in a new session, its output in the runs dir, and return."""
    logs = session.runs_dir / st.DRIVERS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    argv = [arg for arg in sys.argv[1:] if not (arg.startswith("--det") and "--detach".startswith(arg))]
    log = logs / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    with open(log, "w") as output:
        driver = subprocess.Popen([sys.executable, "-m", "sweepkit", *argv], stdout=output, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    session.console.print(f"detached: driver pid {driver.pid} runs {n_jobs} cell(s); its output: "
                          f"{session.display_path(log)}; follow with: {status_command(session)}", markup=False)
    return ExitCode.OK

