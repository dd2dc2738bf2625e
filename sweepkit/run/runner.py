"""``sweep run`` after validation: prepare each planned cell, hand it to the executor,
follow it to its end, and sum up like pytest.

The plans are the command's (:class:`sweepkit.run.context.RunContext`: made once, during
validation). The loop is the same for every executor (see ``sweepkit.run.executors.base``):
``take`` the cells that may start now, ``submit`` them, ``poll`` the handles, and read each
cell's result from its ``state.json``, which the job records as it runs. What the driver
learns on the way (a job's id, a job that died without recording its end, the failure
classes its executor knows, a guard's stop) it records through the transitions of
:mod:`sweepkit.state.transitions`. Cells another driver is running are watched through
their lock until it is released.

A runs dir whose file system fills up starts nothing more. When a cell fails and the runs
dir has no space left, the driver says so and gives back the cells it had not started
(their earlier run's state again, else cancelled; ``--maxfail``'s way) while the running
ones end on their own. When one of the driver's own writes finds no space (even in place,
see :mod:`sweepkit.state.files`), it names the file and stops as an interrupt does, but
with exit 1: it cancels its running cells too. Either way no half-written file is left.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import attrs

from sweepkit.errors import ExitCode, UsageError
from sweepkit.hookspec import hookimpl
from sweepkit.run import failures
from sweepkit.run import plan as pl
from sweepkit.run import prepare
from sweepkit.run.context import RunContext
from sweepkit.run.detach import dry_run, start_background_driver
from sweepkit.run.executors.base import DONE, Executor, Handle
from sweepkit.run.interrupts import deferred_interrupts
from sweepkit.run.job import ignoring
from sweepkit.run.progress import RunDisplay, describe, fmt_duration, label
from sweepkit.run.summary import Summary as RunSummary
from sweepkit.state import files as fs
from sweepkit.state import records as st
from sweepkit.state import transitions as tr
from sweepkit.state.metrics import Follower, Summary, import_readers

POLL_INTERVAL_S = 0.2
# A submission whose job has not taken the cell's lock after this long, while its driver
# is gone, is taken over by the next driver (local jobs start within a second or two).
ABANDONED_AFTER_S = 30.0


@hookimpl
def sweep_addoption(parser):
    parser.addoption("--max-parallel", commands=("run",), type=int, default=None, metavar="N",
                     help="run at most N cells at once (local executor; default: one per GPU, "
                          "one without GPUs; slurm: the cap over this runs dir's queued jobs, beside a "
                          "cluster's cap over the user's)")


@hookimpl
def sweep_validate_cell(cell, session):
    options = session.options
    if getattr(options, "command", None) != "run":
        return []
    if options.rerun and options.resume:
        return ["--rerun and --resume exclude each other: --rerun starts over, --resume continues"]
    try:
        RunContext.of(session).plan(cell)
    except pl.PlanError as error:
        return [str(error)]
    return []


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
    context = RunContext.of(session)
    executor = context.executor
    plans, errors = [], []
    for cell in cells:
        try:
            plans.append(context.plan(cell))
        except pl.PlanError as error:  # a cell validation did not see
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
        self.summary = RunSummary(session.console, len(plans))
        self.maxfail = getattr(session.options, "maxfail", 0) or 0
        self.display = RunDisplay(session.console, [plan.cell.nodeid for plan in plans],
                                  quiet=getattr(session.options, "verbose", 0) < 0)
        self.began = time.time()
        self.driver_lock = fs.DriverLock(session.runs_dir)

    def execute(self) -> int:
        import_readers()  # the loop reads metrics: not a first import there, where a second Ctrl-C can cut it
        self.driver_lock.acquire()
        try:
            return self._execute()
        finally:
            self.driver_lock.release()

    def _execute(self) -> int:
        # A Ctrl-C or SIGTERM is acted on at each stop.check(), between the loop's steps.
        with self.display, deferred_interrupts() as stop:
            try:
                for plan in self.plans:
                    stop.check()
                    tracked = Tracked(plan=plan, follower=Follower(plan.directory),
                                      job=self.jobs.get(plan.cell.nodeid))
                    if plan.action == pl.SKIP:
                        self._finish(tracked, "skipped", plan.note)
                    elif plan.action == pl.ATTACH or not self._prepare(tracked):
                        self._attach(tracked)
                    else:
                        self.queue.append(tracked)
                while self.queue or self.active or self.attached:
                    for step in (self._watch, self._submit_ready, self._poll, self._show_executor_events):
                        stop.check()
                        step()
                    self.display.refresh()
                    if self.session.options.detach and not self.queue:
                        break  # jobs_outlive_driver: everything is queued at the executor
                    if self.queue or self.active or self.attached:
                        time.sleep(POLL_INTERVAL_S)  # a signal meanwhile: acted on as the loop goes round
                stop.check()
            except KeyboardInterrupt:
                self._stop("cancelled", "interrupted; cancelled the running cells")
                return ExitCode.INTERRUPTED
            except fs.NoSpace as full:
                self._stop("stopping", f"{full}; cancelled the running cells, the cells not started are left "
                                       "as they were: free some space and run again")
                return ExitCode.CELLS_FAILED
        self.executor.close()
        return self.summary.close(time.time() - self.began, detached=self.session.options.detach)

    def _stop(self, kind: str, why: str) -> None:
        """Stop everything (Ctrl-C, ``sweep cancel``, a full runs dir): cancel the running
        cells, give back those not started, and sum up."""
        # A second Ctrl-C (or `sweep cancel`) meanwhile is the same request: it must not cut
        # short the cancelling (a cluster's can take seconds) or the record.
        with ignoring(signal.SIGINT, signal.SIGTERM):
            for tracked in self.active:
                self.executor.cancel(tracked.handle)
            for tracked in self.queue:  # asked to stop: the cells it had not started are given back
                self._withdraw(tracked)
            self.display.event(kind, "run", why)
            self.executor.close()
            self.summary.close(time.time() - self.began)

    def _withdraw(self, tracked: Tracked) -> None:
        try:
            prepare.withdraw(tracked.plan, self.driver_lock.path)
        except fs.NoSpace:
            pass  # still pending under this driver: abandoned once it exits, started by the next run

    def _prepare(self, tracked: Tracked) -> bool:
        """Mark the cell pending and ready its dir (:mod:`sweepkit.run.prepare`); False when
        a job runs it already."""
        job = prepare.prepare(tracked.plan, tracked.job, self.driver_lock.path, self.session)
        if job is None:
            return False
        tracked.job = job
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
        """A submission whose job never started (its driver died first): run it here. Its
        state changed since this command planned it, so it is planned again."""
        self.attached.remove(tracked)
        self.executor.release_foreign(tracked.plan.cell.nodeid)
        try:
            plan = RunContext.of(self.session).plan_now(tracked.plan.cell, rerun=False)
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
            if tr.claimed(job, driver=self.driver_lock.path):
                batch.append(tracked)
            else:
                self._attach(tracked)
        # Even with none left: submit is what releases what take held.
        try:
            handles = self.executor.submit([tracked.job for tracked in batch])
        except OSError as error:
            if error.errno not in fs.FULL:
                raise
            self.queue[:0] = batch  # given back with the rest as the run stops
            raise fs.NoSpace(Path(error.filename or self.session.runs_dir), error.errno) from error
        for tracked, handle in zip(batch, handles):
            tracked.handle = handle
            tr.submitted(tracked.job, handle.job_id)
            self.active.append(tracked)
            what = "resume" if tracked.job.resume else "run"
            self.display.update(tracked.plan.cell.nodeid, status="submitted", started=time.time())
            self.display.event("submitted", tracked.plan.cell.nodeid,
                               f"{self.executor.name} job {handle.job_id} ({what})")

    def _show_executor_events(self) -> None:
        for kind, nodeid, text in self.executor.events():
            self.display.event(kind, nodeid, text)

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
            tr.classified(tracked.plan.directory, self.executor.failure_classes(tracked.handle))
            state = st.read_state(tracked.plan.directory)
            mine = state is not None and state.submission is not None and state.submission.token == tracked.job.token
            if not mine:  # a later driver took the cell over before this job got its lock
                self._attach(tracked)
                continue
            if state.state in ("submitted", "running"):
                failure = self.executor.error(tracked.handle) or "the job ended without recording a result"
                state = tr.lost(tracked.job, failure) or st.read_state(tracked.plan.directory)
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
        if tracked.guard is not None:  # the attempt a guard stopped is failed, its failure the guard's rule
            state = tr.stopped(directory, failure=f"guard: {tracked.guard}",
                               failure_class=failures.GUARD) or st.read_state(directory)
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
            self.summary.explain(tracked.plan.cell.nodeid, reason + (
                f" (log: {self.session.display_path(log)})" if log.exists() else ""))
        if result in ("xfailed", "xpassed", "xpassed-strict") and xfail.reason:
            parts.append(f"[xfail: {xfail.reason}]")
        self._finish(tracked, result, "  ".join(part for part in parts if part), summary=summary,
                     ended=attempt.ended if attempt else None)
        if state is not None:
            self.session.hook.sweep_cell_finished(cell=tracked.plan.cell, state=state)
        if result in st.FAILING_OUTCOMES and self.queue and fs.no_space_left(self.session.runs_dir):
            runs = self.session.display_path(self.session.runs_dir)
            self._stop_starting(f"no space left on device: the file system of the runs dir {runs} is full",
                                "not started: the runs dir is full")

    def _finish(self, tracked: Tracked, result: str, detail: str, **row) -> None:
        nodeid = tracked.plan.cell.nodeid
        self.summary.record(nodeid, result, detail)
        self.display.update(nodeid, status=result, **row)
        self.display.event(result, nodeid, detail)
        failures = self.summary.failures
        if self.maxfail and failures >= self.maxfail and self.queue:
            self._stop_starting(f"stopping after {failures} failure{'s' * (failures != 1)} (--maxfail={self.maxfail})",
                                f"not started (--maxfail={self.maxfail})")

    def _stop_starting(self, why: str, reason: str) -> None:
        """pytest's -x / --maxfail, and a full runs dir: the cells not yet started are given
        back (their earlier run's state, else cancelled); running ones finish."""
        kept, self.queue = self.queue, []
        self.display.event("cancelled", "run", f"{why}: {len(kept)} cells not started")
        for tracked in kept:
            self._withdraw(tracked)
            nodeid = tracked.plan.cell.nodeid
            self.summary.record(nodeid, "cancelled")
            self.summary.explain(nodeid, reason)
            self.display.update(nodeid, status="cancelled")
