"""``sweep cancel [PATH[::CELL] ...]``: stop the SLURM jobs of cells, chains included.

Every job a cell may still have in the queue is cancelled in one ``scancel``: the job of
its last submission (for a chain, all its links: an ``afterany`` link whose predecessor
was cancelled would otherwise start) and any earlier job of the cell the runs dir's
registry still lists. Then the cells are recorded ``cancelled``: at once for a cell whose
job had not started, and for a running cell once its job has ended and released the
cell's lock (its own end, "killed by SIGTERM", stays in its attempt). Nothing reads a
driver: this works whether the driver that submitted the cells runs, exited or was killed.
"""

from __future__ import annotations

import time
from pathlib import Path

import attrs

from sweepkit import failures
from sweepkit import state as st
from sweepkit.errors import UsageError
from sweepkit.executors import sacct
from sweepkit.executors.slurm_jobs import Registry, alive
from sweepkit.session import ExitCode

# How long to wait for cancelled jobs to leave the queue (KillWait is 30 s on most clusters).
SETTLE_TIMEOUT_S = 90.0
SETTLE_POLL_S = 0.5


@attrs.frozen
class Cancelled:
    directory: Path
    token: str | None
    job_ids: tuple[str, ...]


def cancel_cells(runs_dir: Path, directories: list[Path]) -> list[Cancelled]:
    """scancel the SLURM jobs of the cells in ``directories``; returns what was cancelled."""
    registry = Registry(runs_dir)
    targets = []
    for directory in directories:
        state = st.read_state(directory)
        if state is None:
            continue
        ids = []
        if state.submission is not None and state.submission.executor == failures.SLURM:
            ids += sacct.split_ids([state.submission.job_id])
        ids += registry_jobs(registry, state.nodeid)
        if ids:
            token = state.submission.token if state.submission else None
            targets.append(Cancelled(directory=directory, token=token, job_ids=tuple(dict.fromkeys(ids))))
    records = sacct.query(job_id for target in targets for job_id in target.job_ids)
    now = time.time()
    live = [attrs.evolve(target, job_ids=tuple(job_id for job_id in target.job_ids
                                               if alive(records.get(job_id), now, now)))
            for target in targets]
    live = [target for target in live if target.job_ids]
    sacct.cancel(job_id for target in live for job_id in target.job_ids)
    return live


def registry_jobs(registry: Registry, nodeid: str) -> list[str]:
    return [cell["job_id"] for entry in registry.read() for cell in entry.cells if cell["nodeid"] == nodeid]


def wait_until_gone(cancelled: list[Cancelled], timeout_s: float = SETTLE_TIMEOUT_S) -> list[str]:
    """Wait for the cancelled jobs to end; returns those still alive at the deadline."""
    ids = [job_id for target in cancelled for job_id in target.job_ids]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            records = sacct.query(ids)
        except sacct.SlurmUnavailable:
            records = {}
        left = [job_id for job_id in ids if records.get(job_id) is not None and records[job_id].alive]
        queued = sacct.in_queue(ids)
        left += sorted((queued or set()) - set(left))  # ended in sacct but still completing in squeue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(SETTLE_POLL_S)


def mark_cancelled(target: Cancelled) -> bool:
    """Record the cell ``cancelled`` if it is still the submission that was cancelled and
    its job is no longer running it; True when recorded."""
    if st.is_locked(target.directory):
        return False
    done = []

    def change(state: st.CellState | None) -> st.CellState | None:
        if state is None or (target.token and (state.submission is None or state.submission.token != target.token)):
            return None
        if state.state == "completed":
            return None
        attempts = state.attempts
        if state.state in ("running", "failed", "submitted") and attempts and attempts[-1].failure_class is None:
            last = attempts[-1]
            attempts = (*attempts[:-1], attrs.evolve(last, ended=last.ended or time.time(),
                                                     failure=last.failure or "cancelled by sweep cancel",
                                                     failure_class=failures.CANCELLED))
        done.append(True)
        return attrs.evolve(state, state="cancelled", attempts=attempts)

    st.update_state(target.directory, change)
    return bool(done)


def cancel_command(session, specs) -> int:
    try:
        directories = st.find_cell_dirs(session.runs_dir, specs)
    except ValueError as error:
        raise UsageError(str(error)) from None
    console = session.console
    try:
        cancelled = cancel_cells(session.runs_dir, directories)
    except sacct.SlurmUnavailable as error:
        raise UsageError(f"sweep cancel needs SLURM's sacct and scancel: {error}") from None
    if not cancelled:
        console.print(f"no SLURM job to cancel among {len(directories)} cell(s)", markup=False)
        return ExitCode.OK
    for target in cancelled:
        console.print(f"cancel  {session.display_path(target.directory)}  slurm job(s) "
                      f"{','.join(target.job_ids)}", markup=False)
    left = wait_until_gone(cancelled)
    marked = sum(mark_cancelled(target) for target in cancelled)
    console.print(f"cancelled {sum(len(target.job_ids) for target in cancelled)} job(s) of {len(cancelled)} "
                  f"cell(s); {marked} cell(s) recorded cancelled", markup=False)
    if left:
        console.print(f"still in the queue after {SETTLE_TIMEOUT_S:.0f}s: {', '.join(left)}", markup=False)
        return ExitCode.CELLS_FAILED
    return ExitCode.OK
