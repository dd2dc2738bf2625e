"""Every change of a cell's ``state.json``, by name: the one module that writes it.

A transition reads the cell's state, decides, and writes the new one, all under the cell's
``.state.lock``; one that no longer applies (a job holds the cell's lock, another driver
took the cell, the job is not the cell's current submission) writes nothing and says so
in what it returns. Callers hand in facts (an executor's job id, an exit status, what a
fresh start deleted); no executor, job or command writes state itself.

====================  ========================  ================================================
transition            called by                 the cell's state after it
====================  ========================  ================================================
:func:`pending`       the driver, preparing     ``pending`` under this driver (over an earlier
                                                run: ``previous`` names that run's state)
:func:`withdrawn`     the driver, giving up     the earlier run's state again, else ``cancelled``
:func:`claimed`       the driver, submitting    ``submitted``, the submission's token recorded
:func:`submitted`     the driver                the executor's job id recorded (only here)
:func:`started`       the job                   ``running`` (``failed``: the start was refused)
:func:`finished`      the job                   ``completed``, ``failed`` or ``cancelled``
:func:`waiting_for_link`  a chain link's job    ``submitted`` again: a later link resumes
:func:`lost`          the driver                ``failed``: the job ended without recording so
:func:`stopped`       the driver (a guard)      ``failed``, with the guard's failure class
:func:`classified`    the driver                the failure classes of ended attempts
:func:`cancelled`     ``sweep cancel``          ``cancelled``
:func:`cleaned`       ``sweep clean --yes``     unchanged (a finished cell), with a ``cleaned``
                                                record of the checkpoints it deleted
====================  ========================  ================================================

A cell goes ``pending`` -> ``submitted`` -> ``running`` -> finished; a resume is the same
way with the submission's ``resume`` set, a chain link after the head a ``started`` of the
same submission. See ``docs/ARCHITECTURE.md`` (State on disk) for what each state means.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from sweepkit.state.files import STATE_FILE, STATE_LOCK_FILE, flock, is_locked, write_json
from sweepkit.state.records import FINISHED, Attempt, CellState, Submission, read_state

if TYPE_CHECKING:
    from sweepkit.run.job import CellJob


# -- the primitives ---------------------------------------------------------------------
# The named transitions below are the only callers in sweepkit; tests set up a cell's
# state with them.


def write_state(directory: Path, state: CellState) -> None:
    """Write ``state`` as the cell's whole record (atomically; see :mod:`sweepkit.state.files`)."""
    write_json(Path(directory) / STATE_FILE, attrs.evolve(state, updated=time.time()).to_json())


def update_state(directory: Path, change: Callable[[CellState | None], CellState | None]) -> CellState | None:
    """Read, change and write ``state.json`` under ``.state.lock``; ``change`` returning
    None leaves the file as it is. Returns what was written, or None."""
    directory = Path(directory)
    with flock(directory / STATE_LOCK_FILE):
        new = change(read_state(directory))
        if new is not None:
            write_state(directory, new)
        return new


def _mine(state: CellState | None, token: str) -> bool:
    return state is not None and state.submission is not None and state.submission.token == token


# -- the driver's ------------------------------------------------------------------------


def _earlier_run(state: CellState | None) -> str | None:
    """The state of the earlier run whose files a fresh attempt will start over, if any."""
    if state is None or not state.attempts:
        return None
    return state.previous or state.state  # a fresh attempt that never started leaves the run before it


def pending(directory: Path, *, nodeid: str, config_hash: str, profile: str | None, fresh: bool,
            driver: Path) -> CellState | None:
    """The driver holding the lock file ``driver`` will run the cell; None when a job holds
    the cell's lock (it is not this driver's to run). A fresh attempt over an earlier run
    keeps that run's ``config_hash`` and ``profile`` (they describe its files until the
    job starts the attempt) and remembers its state in ``previous``."""

    def change(state: CellState | None) -> CellState | None:
        if is_locked(directory):
            return None
        previous = _earlier_run(state) if fresh else None
        return CellState(
            nodeid=nodeid, state="pending",
            config_hash=state.config_hash if previous else config_hash,
            profile=state.profile if previous else profile,
            attempts=state.attempts if state else (), submission=None,
            driver=str(driver), previous=previous,
        )

    return update_state(directory, change)


def withdrawn(directory: Path, *, driver: Path) -> CellState | None:
    """The driver gives back a cell it took and never got started: still ``pending`` under
    it, or ``submitted`` by it when the submission itself failed (no job id, no job holding
    the lock). A cell whose fresh attempt was to start over an earlier run is that run again
    (its files are untouched); any other is ``cancelled``."""

    def change(state: CellState | None) -> CellState | None:
        if state is None or state.driver != str(driver) or is_locked(directory):
            return None
        unsent = state.state == "submitted" and state.submission is not None and not state.submission.job_id
        if state.state != "pending" and not unsent:
            return None
        if state.previous in (*FINISHED, "running"):  # "running": its lock is free, so interrupted
            return attrs.evolve(state, state=state.previous, previous=None, driver=None, submission=None)
        return attrs.evolve(state, state="cancelled", submission=None)

    return update_state(directory, change)


def claimed(job: CellJob, driver: Path | None = None) -> bool:
    """The cell is ``job``'s: its token is written before the job can start (see
    :mod:`sweepkit.run.job`). False when another process holds the cell's lock, so the job
    must not be submitted; with ``driver`` (the lock of the driver that marked the cell
    pending), also False unless the cell is still pending under that driver: another
    driver that took the cell since (marked it pending itself, submitted it, or finished
    it) keeps it, and a completed cell is not run again."""
    directory = Path(job.cell_dir)
    taken = []

    def change(state: CellState | None) -> CellState | None:
        if state is None or is_locked(directory) or (
                driver is not None and (state.state != "pending" or state.driver != str(driver))):
            taken.append(True)
            return None
        submission = Submission(executor=job.executor, token=job.token, submitted=time.time(), resume=job.resume)
        return attrs.evolve(state, state="submitted", submission=submission)

    update_state(directory, change)
    return not taken


def submitted(job: CellJob, job_id: str) -> None:
    """The executor's id of ``job`` (for a chain, every link's), recorded next to its token
    so that ``status``, ``cancel`` and a later driver find the job."""

    def change(state: CellState | None) -> CellState | None:
        if not _mine(state, job.token):
            return None
        return attrs.evolve(state, submission=attrs.evolve(state.submission, job_id=job_id))

    update_state(Path(job.cell_dir), change)


def lost(job: CellJob, failure: str) -> CellState | None:
    """``job`` ended without recording its end (its process was killed, or it crashed before
    running the cell): the cell is failed, so that its state stays truthful."""

    def change(state: CellState | None) -> CellState | None:
        if not _mine(state, job.token) or state.state not in ("submitted", "running"):
            return None
        if state.state == "running" and state.attempts:
            last = attrs.evolve(state.attempts[-1], failure=failure, ended=time.time())
            return attrs.evolve(state, state="failed", attempts=(*state.attempts[:-1], last))
        # It never got as far as recording its start.
        last = Attempt(n=len(state.attempts) + 1, executor=job.executor, job_id=state.submission.job_id,
                       failure=failure, ended=time.time())
        return attrs.evolve(state, state="failed", attempts=(*state.attempts, last))

    return update_state(Path(job.cell_dir), change)


def stopped(directory: Path, *, failure: str, failure_class: str) -> CellState | None:
    """The driver stopped the cell's running attempt on purpose (a live guard): the attempt
    is failed with ``failure`` and its class; a cell that completed meanwhile stays so."""

    def change(state: CellState | None) -> CellState | None:
        if state is None or not state.attempts or state.state == "completed":
            return None
        last = state.attempts[-1]
        ended = attrs.evolve(last, ended=last.ended or time.time(), failure=failure, failure_class=failure_class)
        return attrs.evolve(state, state="failed", attempts=(*state.attempts[:-1], ended))

    return update_state(directory, change)


def classified(directory: Path, classes: Mapping[int, str]) -> None:
    """The failure class of ended attempts (by attempt number), once their job's final state
    is known, so that ``status`` shows it without asking the scheduler again; an attempt
    classified already keeps its class."""
    if not classes:
        return

    def change(state: CellState | None) -> CellState | None:
        if state is None:
            return None
        attempts = tuple(
            attrs.evolve(attempt, failure_class=classes[attempt.n])
            if attempt.n in classes and attempt.failure is not None and attempt.failure_class is None else attempt
            for attempt in state.attempts)
        return attrs.evolve(state, attempts=attempts) if attempts != state.attempts else None

    update_state(directory, change)


# -- the job's ---------------------------------------------------------------------------


def started(job: CellJob, *, job_id: str | None, deleted: tuple[str, ...] = (),
            refused: str | None = None) -> Attempt | None:
    """``job`` starts its attempt (running; with ``refused``, the reason it does not start:
    failed); ``deleted``: what its fresh start deleted of the earlier run. A fresh start
    records its config's hash and profile now: until now they described the earlier run.
    None when the cell is no longer this job's."""
    begun: list[Attempt] = []

    def change(state: CellState | None) -> CellState | None:
        if not _mine(state, job.token):
            return None
        now = time.time()
        attempt = Attempt(
            n=len(state.attempts) + 1, executor=job.executor, job_id=job_id or state.submission.job_id,
            host=socket.gethostname(), pid=os.getpid(), resume=job.resume,
            devices=job.env.get("CUDA_VISIBLE_DEVICES"), started=now,
            ended=now if refused is not None else None, failure=refused, deleted=deleted,
        )
        begun.append(attempt)
        if refused is not None:  # the earlier run's files (what is left of them) stay its own
            return attrs.evolve(state, state="failed", attempts=(*state.attempts, attempt))
        if job.fresh is not None and not job.resume:
            state = attrs.evolve(state, config_hash=job.fresh.config_hash, profile=job.fresh.profile)
        # A new attempt writes checkpoints again: what an earlier ``sweep clean`` left is its past.
        return attrs.evolve(state, state="running", attempts=(*state.attempts, attempt), previous=None,
                            cleaned=None)

    update_state(Path(job.cell_dir), change)
    return begun[0] if begun else None


def finished(directory: Path, n: int, *, returncode: int | None, failure: str | None, final: str) -> None:
    """Attempt ``n`` ended: its return code and failure, and the cell's final state."""

    def change(state: CellState | None) -> CellState | None:
        if state is None:
            return None
        attempts = tuple(
            attrs.evolve(attempt, ended=time.time(), returncode=returncode, failure=failure)
            if attempt.n == n else attempt
            for attempt in state.attempts)
        return attrs.evolve(state, state=final, attempts=attempts)

    update_state(directory, change)


def waiting_for_link(job: CellJob) -> None:
    """A chain link's cell failed or ran out of time with a link still to come: it is
    ``submitted`` again, waiting for that link, rather than failed."""

    def change(state: CellState | None) -> CellState | None:
        if not _mine(state, job.token) or state.state not in ("failed", "cancelled"):
            return None
        return attrs.evolve(state, state="submitted")

    update_state(Path(job.cell_dir), change)


# -- sweep cancel's ------------------------------------------------------------------------


def cancelled(directory: Path, *, token: str | None, failure_class: str) -> bool:
    """``sweep cancel`` stopped the cell: ``cancelled``, if it is still the submission that
    was cancelled (``token``; None: whatever it is) and no job runs it; its last attempt, if
    it had no class yet, ends with ``failure_class``. False when nothing was recorded."""
    done = []

    def change(state: CellState | None) -> CellState | None:
        if state is None or is_locked(directory) or (token and not _mine(state, token)):
            return None
        if state.state == "completed":
            return None
        attempts = state.attempts
        if state.state in ("running", "failed", "submitted") and attempts and attempts[-1].failure_class is None:
            last = attempts[-1]
            attempts = (*attempts[:-1], attrs.evolve(last, ended=last.ended or time.time(),
                                                     failure=last.failure or "cancelled by sweep cancel",
                                                     failure_class=failure_class))
        done.append(True)
        return attrs.evolve(state, state="cancelled", attempts=attempts)

    update_state(directory, change)
    return bool(done)


# -- sweep clean's ---------------------------------------------------------------------------


def cleaned(directory: Path, *, kept: int | None, deleted: list[str], freed_bytes: int,
            by: str) -> CellState | None:
    """``sweep clean`` deleted the cell's checkpoint entries ``deleted`` (their names), keeping
    step ``kept`` (None: none), chosen ``by`` (a metric, ``last`` or ``none``). The state stays
    what it was (a completed cell stays completed); None, writing nothing, when the cell is no
    longer finished or has no state. The caller holds the cell's ``.lock`` while it deletes, so
    no run starts meanwhile."""

    def change(state: CellState | None) -> CellState | None:
        if state is None or state.state not in FINISHED or state.previous is not None:
            return None
        record = {"kept": kept, "deleted": list(deleted), "freed_bytes": int(freed_bytes), "by": by,
                  "at": time.time()}
        return attrs.evolve(state, cleaned=record)

    return update_state(directory, change)
