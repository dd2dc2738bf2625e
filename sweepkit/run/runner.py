"""``sweep run`` after validation: plan each cell, prepare its dir, hand it to the executor,
follow it to its end, and sum up like pytest.

The loop is the same for every executor (see ``sweepkit.run.executors.base``): ``take`` the
cells that may start now, ``submit`` them, ``poll`` the handles, and read each cell's
result from its ``state.json``, which only the job writes once it runs. Cells another
driver is running are watched through their lock until it is released.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import attrs
from rich.text import Text

from sweepkit.errors import ExitCode, UsageError
from sweepkit.hookspec import hookimpl
from sweepkit.run import failures
from sweepkit.run import plan as pl
from sweepkit.run.executors.base import DONE, Executor, Handle
from sweepkit.run.job import ignoring
from sweepkit.run.progress import STYLES, RunDisplay, describe, fmt_duration, label
from sweepkit.state import records as st
from sweepkit.state.metrics import Follower, Summary

POLL_INTERVAL_S = 0.2
# A submission whose job has not taken the cell's lock after this long, while its driver
# is gone, is taken over by the next driver (local jobs start within a second or two).
ABANDONED_AFTER_S = 30.0


@hookimpl
def sweep_addoption(parser):
    parser.addoption("--max-parallel", commands=("run",), type=int, default=None, metavar="N",
                     help="run at most N cells at once (local executor; default: one per GPU, "
                          "one without GPUs; slurm: the concurrency cap over the runs dir's queued jobs)")


@hookimpl
def sweep_validate_cell(cell, session):
    options = session.options
    if getattr(options, "command", None) != "run":
        return []
    if options.rerun and options.resume:
        return ["--rerun and --resume exclude each other: --rerun starts over, --resume continues"]
    try:
        pl.plan_cell(cell, session.runs_dir, rerun=options.rerun, resume=options.resume,
                     queued=queue_probe(session), checkpoints=pl.checkpoint_dir(cell, session),
                     preview=options.dry_run)
    except pl.PlanError as error:
        return [str(error)]
    return []


def queue_probe(session):
    """``plan_cell``'s ``queued``: asks the executor that submitted a job whether it is
    still queued there (executors are made once per session, on first need)."""
    made = session.stash.setdefault("runner.probe_executors", {})

    def queued(submission: st.Submission) -> bool:
        if submission.executor not in made:
            spec = session.registry.executors.get(submission.executor)
            try:
                made[submission.executor] = spec.factory(session) if spec is not None else None
            except UsageError:
                made[submission.executor] = None  # cannot be asked here (no sbatch): not queued
        executor = made[submission.executor]
        handle = executor.attach(submission.job_id) if executor is not None else None
        return handle is not None and executor.poll(handle) != DONE

    return queued


def make_executor(session) -> Executor:
    name = session.options.executor or session.hook.sweep_choose_executor(session=session)
    spec = session.registry.executors.get(name)
    if spec is None:
        known = ", ".join(sorted(session.registry.executors)) or "none"
        raise UsageError(f"--executor {name}: no such executor (known: {known})")
    return spec.factory(session)


def run_cells(session, cells) -> int:
    """Run the selected, validated cells; returns the exit code."""
    options = session.options
    if not options.dry_run:  # a dry run writes nothing there unless its executor renders job scripts
        try:
            session.runs_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(f"runs dir {session.runs_dir}: cannot create it ({error.strerror})") from None
        if not os.access(session.runs_dir, os.W_OK):
            raise UsageError(f"runs dir {session.runs_dir}: not writable")
    executor = make_executor(session)
    plans, errors = [], []
    for cell in cells:
        try:
            plans.append(pl.plan_cell(cell, session.runs_dir, rerun=options.rerun, resume=options.resume,
                                      queued=queue_probe(session), checkpoints=pl.checkpoint_dir(cell, session),
                                      preview=options.dry_run))
        except pl.PlanError as error:  # the state changed since validation
            file, line = cell.location
            errors.append(f"{file}:{line}: {cell.name}: {error}")
    jobs = {}
    for plan in plans:
        if plan.action in (pl.FRESH, pl.RESUME):
            try:
                jobs[plan.cell.nodeid] = executor.bind(pl.make_job(plan, executor.name, session), plan.cell)
            except UsageError as error:  # one cell's job cannot be made: report every such cell
                errors.extend(error.lines)
    for plan in plans:
        problem = executor.check(jobs[plan.cell.nodeid]) if plan.cell.nodeid in jobs else None
        if problem:
            file, line = plan.cell.location_of("gpus")
            errors.append(f"{file}:{line}: {plan.cell.name}: {problem}")
    if errors:
        raise UsageError(*errors, f"{len(errors)} error{'s' if len(errors) > 1 else ''} found; nothing was run")
    if options.dry_run:
        return dry_run(session, plans, jobs, executor)
    if options.detach and not executor.jobs_outlive_driver:
        return start_background_driver(session, len(jobs))
    return Run(session, executor, plans, jobs).execute()


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
    counts = {action: sum(plan.action == action for plan in plans) for action in (pl.FRESH, pl.RESUME, pl.SKIP, pl.ATTACH)}
    scripts = executor.render_dry_run(list(jobs.values()))
    for path in scripts:
        console.print(f"job script: {session.display_path(path)}", markup=False)
    written = f"nothing was started; {len(scripts)} job script(s) written" if scripts else "nothing was started or written"
    console.print(f"dry run: would run {counts[pl.FRESH]} fresh, resume {counts[pl.RESUME]}, skip {counts[pl.SKIP]}, "
                  f"wait for {counts[pl.ATTACH]} running; {written}", markup=False)
    return ExitCode.OK


@contextlib.contextmanager
def sigterm_interrupts():
    """SIGTERM (``sweep cancel``, ``kill``) stops a driver the way Ctrl-C does: its running
    cells are cancelled and recorded. A driver started in the background by a shell ignores
    SIGINT, so SIGTERM is how it is stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    # A driver a shell put in the background inherits SIGINT ignored, and so would every
    # process it starts: submitit cancels a local job with SIGINT, which must not be lost.
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


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


@attrs.define
class Tracked:
    plan: pl.Plan
    follower: Follower
    job: object = None
    handle: Handle | None = None
    started_seen: bool = False
    held: bool = False  # counted by the executor as another driver's running cell (hold_foreign)
    guard: str | None = None  # why a live guard stopped it (sweep_watch_cell)
    watched: int = 0  # metric records the guards have seen


class Run:
    """One driver's pass over its cells: ``queue`` waits for the executor, ``active`` was
    submitted by this driver, ``attached`` runs under another driver and is watched."""

    def __init__(self, session, executor: Executor, plans, jobs):
        self.session = session
        self.executor = executor
        self.plans = plans
        self.jobs = jobs
        self.queue: list[Tracked] = []
        self.active: list[Tracked] = []
        self.attached: list[Tracked] = []
        self.outcomes: dict[str, str] = {}
        self.reasons: dict[str, str] = {}  # why each failing cell failed, for the short summary
        self.maxfail = getattr(session.options, "maxfail", 0) or 0
        self.display = RunDisplay(session.console, [plan.cell.nodeid for plan in plans],
                                  quiet=getattr(session.options, "verbose", 0) < 0)
        self.began = time.time()
        self.driver_lock = st.DriverLock(session.runs_dir)

    def execute(self) -> int:
        self.driver_lock.acquire()
        try:
            return self._execute()
        finally:
            self.driver_lock.release()

    def _execute(self) -> int:
        with self.display, sigterm_interrupts():
            try:
                for plan in self.plans:
                    tracked = Tracked(plan=plan, follower=Follower(plan.directory),
                                      job=self.jobs.get(plan.cell.nodeid))
                    if plan.action == pl.SKIP:
                        self._finish(tracked, "skipped", plan.note)
                    elif plan.action == pl.ATTACH or not self._prepare(tracked):
                        self._attach(tracked)
                    else:
                        self.queue.append(tracked)
                while self.queue or self.active or self.attached:
                    self._watch()
                    self._submit_ready()
                    self._poll()
                    self.display.refresh()
                    if self.session.options.detach and not self.queue:
                        break  # jobs_outlive_driver: everything is queued at the executor
                    if self.queue or self.active or self.attached:
                        time.sleep(POLL_INTERVAL_S)
            except KeyboardInterrupt:
                # A second Ctrl-C (or `sweep cancel`) meanwhile is the same request: it must not
                # cut short the cancelling (a cluster's can take seconds) or the record.
                with ignoring(signal.SIGINT, signal.SIGTERM):
                    for tracked in self.active:
                        self.executor.cancel(tracked.handle)
                    for tracked in self.queue:  # asked to stop: the cells it had not started are cancelled too
                        pl.mark_cancelled(tracked.plan, driver=self.driver_lock.path)
                    self.display.event("cancelled", "run", "interrupted; cancelled the running cells")
                    self.executor.close()
                    self._summary()
                return ExitCode.INTERRUPTED
        self.executor.close()
        return self._summary()

    def _prepare(self, tracked: Tracked) -> bool:
        """Mark the cell pending and ready its dir. Nothing of its earlier run is deleted
        yet: its job does that as it starts the cell (``CellJob.fresh``)."""
        plan = tracked.plan
        state = pl.mark_pending(plan, driver=self.driver_lock.path)
        if state is None:
            return False
        pl.write_cell_files(plan, state)
        answers = self.session.hook.sweep_prepare_cell_dir(cell=plan.cell, cell_dir=plan.directory,
                                                           fresh=plan.action == pl.FRESH, rerun=plan.rerun,
                                                           session=self.session)
        wipe = [str(path) for paths in answers for path in paths or ()]
        if wipe and tracked.job.fresh is not None:
            tracked.job = attrs.evolve(tracked.job, fresh=attrs.evolve(tracked.job.fresh, checkpoint_dirs=wipe))
        return True

    def _attach(self, tracked: Tracked) -> None:
        nodeid = tracked.plan.cell.nodeid
        state = st.read_state(tracked.plan.directory)
        tracked.held = False
        if state is None or state.state != "pending":  # one another driver will start takes nothing yet
            self._hold(tracked, state)
        self.attached.append(tracked)
        self.display.update(nodeid, status="attached", started=time.time(), note="started by another driver")
        self.display.event("attached", nodeid, tracked.plan.note or "running under another driver; waiting for it")

    def _hold(self, tracked: Tracked, state: st.CellState | None) -> None:
        self.executor.hold_foreign(tracked.plan.cell.nodeid,
                                   state.last_attempt if state and state.state == "running" else None)
        tracked.held = True

    def _watch(self) -> None:
        for tracked in list(self.attached):
            directory = tracked.plan.directory
            nodeid = tracked.plan.cell.nodeid
            if st.is_locked(directory):
                if not tracked.held:
                    self._hold(tracked, st.read_state(directory))
                self.display.update(nodeid, summary=tracked.follower.summary())
                continue
            state = st.read_state(directory)
            if state is not None and state.state == "submitted" and state.submission is not None:
                if self._queued_elsewhere(state.submission):
                    continue  # another driver's job has not started yet
                self._take_over(tracked)
                continue
            if state is not None and state.state == "pending":
                if state.driver and state.driver != str(self.driver_lock.path) and st.is_held(Path(state.driver)):
                    continue  # another live driver will submit it
                self._take_over(tracked)  # its driver is gone (abandoned)
                continue
            self.attached.remove(tracked)
            self.executor.release_foreign(nodeid)
            self._finished(tracked, state)

    def _queued_elsewhere(self, submission: st.Submission) -> bool:
        if submission.executor == self.executor.name and submission.job_id:
            handle = self.executor.attach(submission.job_id)
            if handle is not None:  # an executor that can follow the job (a cluster queue)
                return self.executor.poll(handle) != DONE
        return time.time() - submission.submitted < ABANDONED_AFTER_S

    def _take_over(self, tracked: Tracked) -> None:
        """A submission whose job never started (its driver died first): run it here."""
        self.attached.remove(tracked)
        self.executor.release_foreign(tracked.plan.cell.nodeid)
        options = self.session.options
        try:
            plan = pl.plan_cell(tracked.plan.cell, self.session.runs_dir, rerun=False, resume=options.resume,
                                queued=queue_probe(self.session),
                                checkpoints=pl.checkpoint_dir(tracked.plan.cell, self.session))
        except pl.PlanError as error:
            self._finish(tracked, "failed", str(error))
            return
        tracked.plan = plan
        tracked.job = self.executor.bind(pl.make_job(plan, self.executor.name, self.session), plan.cell)
        if plan.action == pl.ATTACH or not self._prepare(tracked):
            self._attach(tracked)
        else:
            self.queue.append(tracked)

    def _submit_ready(self) -> None:
        ready = self.executor.take([tracked.job for tracked in self.queue])
        if not ready:
            return
        by_token = {tracked.job.token: tracked for tracked in self.queue}
        batch = []
        for job in ready:
            tracked = by_token[job.token]
            self.queue.remove(tracked)
            # Decided again now, under the executor's submit lock (a cluster's: runs/.slurm):
            # since this driver marked the cell pending, another driver may have taken it
            # over, or submitted and finished it.
            if pl.mark_submitted(job, driver=self.driver_lock.path):
                batch.append(tracked)
            else:
                self._attach(tracked)
        # Even with none left: submit is what releases what take held.
        handles = self.executor.submit([tracked.job for tracked in batch])
        for tracked, handle in zip(batch, handles):
            tracked.handle = handle
            pl.record_job_id(tracked.job, handle.job_id)
            self.active.append(tracked)
            what = "resume" if tracked.job.resume else "run"
            self.display.update(tracked.plan.cell.nodeid, status="submitted", started=time.time())
            self.display.event("submitted", tracked.plan.cell.nodeid,
                               f"{self.executor.name} job {handle.job_id} ({what})")

    def _poll(self) -> None:
        for tracked in list(self.active):
            nodeid = tracked.plan.cell.nodeid
            state = st.read_state(tracked.plan.directory)
            if not tracked.started_seen and state is not None and state.state == "running":
                self._started(tracked, state)
            if self.executor.poll(tracked.handle) != DONE:
                # Until a fresh run starts, the cell's metrics are its earlier run's.
                shown = tracked.started_seen or tracked.job.resume
                self.display.update(nodeid, summary=tracked.follower.summary() if shown else Summary(),
                                    status="running" if tracked.started_seen else "submitted")
                if tracked.started_seen and tracked.guard is None:
                    self._guard(tracked)
                continue
            self.active.remove(tracked)
            state = st.read_state(tracked.plan.directory)
            mine = state is not None and state.submission is not None and state.submission.token == tracked.job.token
            if not mine:  # a later driver took the cell over before this job got its lock
                self._attach(tracked)
                continue
            if state.state in ("submitted", "running"):
                failure = self.executor.error(tracked.handle) or "the job ended without recording a result"
                state = pl.record_lost_job(tracked.job, failure) or st.read_state(tracked.plan.directory)
            if not tracked.started_seen and state.attempts:
                self._started(tracked, state)
            self._finished(tracked, state)

    def _guard(self, tracked: Tracked) -> None:
        """Ask the live guards about a running cell's new metrics; stop it if one says so."""
        records = tracked.follower.ordered
        if len(records) == tracked.watched:
            return
        tracked.watched = len(records)
        reason = self.session.hook.sweep_watch_cell(cell=tracked.plan.cell, records=list(records))
        if reason:
            tracked.guard = reason
            self.display.event("stopping", tracked.plan.cell.nodeid, f"guard: {reason}; stopping it with a checkpoint")
            self.executor.cancel(tracked.handle)

    def _record_guard(self, tracked: Tracked) -> st.CellState | None:
        """The attempt a guard stopped is failed, its failure the guard's rule."""
        def change(state: st.CellState | None) -> st.CellState | None:
            if state is None or not state.attempts or state.state == "completed":
                return None
            last = state.attempts[-1]
            stopped = attrs.evolve(last, ended=last.ended or time.time(), failure=f"guard: {tracked.guard}",
                                   failure_class=failures.GUARD)
            return attrs.evolve(state, state="failed", attempts=(*state.attempts[:-1], stopped))

        return st.update_state(tracked.plan.directory, change) or st.read_state(tracked.plan.directory)

    def _started(self, tracked: Tracked, state: st.CellState) -> None:
        tracked.started_seen = True
        attempt = state.last_attempt
        if not tracked.job.resume:  # its job has started the metrics over
            tracked.follower = Follower(tracked.plan.directory)
        if attempt is not None and attempt.deleted:
            self.display.event("deleted", tracked.plan.cell.nodeid, self._deleted_text(attempt.deleted))
        self.display.update(tracked.plan.cell.nodeid, status="running", attempt=attempt.n if attempt else None,
                            started=(attempt.started if attempt and attempt.started else time.time()))
        self.session.hook.sweep_cell_started(cell=tracked.plan.cell, state=state)

    def _deleted_text(self, deleted) -> str:
        """``2 entries in runs/g/c/ckpt: global_step_1, latest`` for each dir of ``deleted``."""
        by_dir: dict[Path, list[str]] = {}
        for path in map(Path, deleted):
            by_dir.setdefault(path.parent, []).append(path.name)
        parts = []
        for directory, names in by_dir.items():
            shown = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
            parts.append(f"{len(names)} checkpoint entr{'y' if len(names) == 1 else 'ies'} "
                         f"in {self.session.display_path(directory)}: {shown}")
        return "; ".join(parts) + " (the earlier run's, as this run started)"

    def _finished(self, tracked: Tracked, state: st.CellState | None) -> None:
        directory = tracked.plan.directory
        if tracked.guard is not None:
            state = self._record_guard(tracked)
        effective = st.effective_state(directory, state)
        xfail = tracked.plan.cell.xfail
        result = st.outcome(effective, None if xfail is None else {
            "strict": bool(xfail.kwargs.get("strict", False))})
        attempt = state.last_attempt if state else None
        summary = tracked.follower.summary()
        parts = [describe(summary)]
        if attempt and attempt.started and attempt.ended:
            parts.append(f"in {fmt_duration(attempt.ended - attempt.started)}")
        if attempt and attempt.failure and result != "passed":
            parts.append(f"({attempt.failure})")
        if result in st.FAILING_OUTCOMES:
            reason = attempt.failure if attempt and attempt.failure else f"the cell ended {label(result)}"
            if result == "xpassed-strict":
                reason = f"passed, but is marked xfail(strict=True): {xfail.reason}" if xfail.reason else \
                    "passed, but is marked xfail(strict=True)"
            log = directory / "stderr.log"
            self.reasons[tracked.plan.cell.nodeid] = reason + (
                f" (log: {self.session.display_path(log)})" if log.exists() else "")
        if result in ("xfailed", "xpassed", "xpassed-strict") and xfail.reason:
            parts.append(f"[xfail: {xfail.reason}]")
        self._finish(tracked, result, "  ".join(part for part in parts if part), summary=summary,
                     ended=attempt.ended if attempt else None)
        if state is not None:
            self.session.hook.sweep_cell_finished(cell=tracked.plan.cell, state=state)

    def _finish(self, tracked: Tracked, result: str, detail: str, **row) -> None:
        nodeid = tracked.plan.cell.nodeid
        self.outcomes[nodeid] = result
        if result in st.FAILING_OUTCOMES:
            self.reasons.setdefault(nodeid, detail or label(result))
        self.display.update(nodeid, status=result, **row)
        self.display.event(result, nodeid, detail)
        failures = sum(outcome in st.FAILING_OUTCOMES for outcome in self.outcomes.values())
        if self.maxfail and failures >= self.maxfail and self.queue:
            self._stop_starting(failures)

    def _stop_starting(self, failures: int) -> None:
        """pytest's -x / --maxfail: the cells not yet started are cancelled; running ones finish."""
        kept, self.queue = self.queue, []
        self.display.event("cancelled", "run", f"stopping after {failures} failure{'s' * (failures != 1)} "
                                               f"(--maxfail={self.maxfail}): {len(kept)} cells not started")
        for tracked in kept:
            pl.mark_cancelled(tracked.plan, driver=self.driver_lock.path)
            nodeid = tracked.plan.cell.nodeid
            self.outcomes[nodeid] = "cancelled"
            self.reasons[nodeid] = f"not started (--maxfail={self.maxfail})"
            self.display.update(nodeid, status="cancelled")

    def _summary(self) -> int:
        counts: dict[str, int] = {}
        for result in self.outcomes.values():
            counts[result] = counts.get(result, 0) + 1
        order = ("failed", "xpassed-strict", "interrupted", "cancelled", "passed", "skipped", "xfailed", "xpassed")
        parts = [f"{counts[key]} {key}" for key in order if key in counts]
        unfinished = len(self.plans) - len(self.outcomes)
        if unfinished:
            parts.append(f"{unfinished} not finished")
        failing = any(result in st.FAILING_OUTCOMES for result in self.outcomes.values()) or unfinished
        elapsed = time.time() - self.began
        self._short_summary()
        self.session.console.print(f"==== {', '.join(parts) or 'no cells'} in {elapsed:.2f}s ====",
                                   style="bold red" if failing else "bold green", markup=False)
        if self.session.options.detach and unfinished:
            return ExitCode.OK  # submitted to a queue that runs them without this process
        return ExitCode.CELLS_FAILED if failing else ExitCode.OK

    def _short_summary(self) -> None:
        """pytest's "short test summary info": one line per failing cell, with why, in run order."""
        failing = [(nodeid, result) for nodeid, result in self.outcomes.items() if result in st.FAILING_OUTCOMES]
        if not failing:
            return
        console = self.session.console
        console.print("==== short summary ====", style="bold", markup=False)
        for nodeid, result in failing:
            line = Text(f"{label(result)} ", style=STYLES.get(result, ""))
            line.append(f"{nodeid} - {self.reasons.get(nodeid, label(result))}")
            console.print(line, soft_wrap=True)
        if any(result == "failed" for _, result in failing):
            console.print("run the failed cells again with: sweep run … --lf", markup=False)
