"""``sweep cancel [PATH[::CELL] ...]``: stop the cells' runs: the SLURM jobs of cells,
chains included, and the live ``sweep run`` drivers on this machine that run any of them.

A driver is stopped as Ctrl-C stops it (SIGTERM, see :mod:`sweepkit.run.interrupts`): its
running cells are interrupted through their own job process (a trainer checkpoints its
step first) and the cells it had not started are recorded cancelled; a cell whose job
ended before it could record its end is recorded cancelled here. A local cell runs under
its driver, so stopping the driver stops every cell it runs, named or not; the command
lists them first.

Every job a cell may still have in the queue is cancelled in one ``scancel``: the job of
its last submission (for a chain, all its links: an ``afterany`` link whose predecessor
was cancelled would otherwise start) and any earlier job of the cell the runs dir's
registry still lists. Then the cells are recorded ``cancelled``: at once for a cell whose
job had not started, and for a running cell once its job has ended and released the
cell's lock (its own end, "killed by SIGTERM", stays in its attempt). Nothing reads a
driver: this works whether the driver that submitted the cells runs, exited or was killed.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import attrs

from sweepkit.errors import ExitCode, UsageError
from sweepkit.run import failures
from sweepkit.run.executors import sacct
from sweepkit.run.executors.slurm_jobs import Registry, alive
from sweepkit.state import files as fs
from sweepkit.state import records as st
from sweepkit.state import transitions as tr

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
    submitted = registry.submitted_times()  # job id -> when it was submitted, to tell a reused id
    targets = []
    for directory in directories:
        state = st.read_state(directory)
        if state is None:
            continue
        ids = []
        if state.submission is not None and state.submission.executor == failures.SLURM:
            chain = sacct.split_ids([state.submission.job_id])
            ids += chain
            submitted.update(dict.fromkeys(chain, state.submission.submitted))
        ids += registry_jobs(registry, state.nodeid)
        if ids:
            token = state.submission.token if state.submission else None
            targets.append(Cancelled(directory=directory, token=token, job_ids=tuple(dict.fromkeys(ids))))
    records = sacct.query(job_id for target in targets for job_id in target.job_ids)
    now = time.time()

    def to_cancel(job_id: str) -> bool:  # a job sacct does not know yet is cancelled all the same
        record = records.get(job_id)
        return record is None or alive(record, submitted.get(job_id, 0.0), now)

    live = [attrs.evolve(target, job_ids=tuple(filter(to_cancel, target.job_ids))) for target in targets]
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
    return tr.cancelled(target.directory, token=target.token, failure_class=failures.CANCELLED)


@attrs.frozen
class Driver:
    """A live ``sweep run`` that runs some of the cells to cancel, and every cell it runs."""

    lock: Path
    host: str
    pid: int
    cells: tuple[Path, ...]


def _driver_of(state: st.CellState | None) -> Path | None:
    """The lock of the driver that has a cell it has not finished."""
    if state is None or not state.driver or state.state in st.FINISHED:
        return None
    return Path(state.driver)


def live_drivers(runs_dir: Path, directories: list[Path]) -> list[Driver]:
    """The local drivers, alive now, that run any of these cells; with each, all the cells of
    the runs dir it has not finished (stopping it stops them all). A driver of SLURM jobs is
    left alone: its jobs outlive it and are cancelled one by one."""
    locks = {lock for directory in directories if (lock := _driver_of(st.read_state(directory))) and st.is_held(lock)}
    if not locks:
        return []
    states = {directory: st.read_state(directory) for directory in st.find_cell_dirs(runs_dir, [])}
    drivers = []
    for lock in sorted(locks):
        try:
            host, pid = lock.read_text().split()
        except (OSError, ValueError):
            continue  # released meanwhile
        cells = {directory: state for directory, state in states.items() if _driver_of(state) == lock}
        if not any(state.submission is not None and state.submission.executor == failures.SLURM
                   for state in cells.values()):
            drivers.append(Driver(lock=lock, host=host, pid=int(pid), cells=tuple(cells)))
    return drivers


def stop_drivers(drivers: list[Driver], timeout_s: float = SETTLE_TIMEOUT_S) -> list[Driver]:
    """SIGTERM the drivers on this host and wait for them and their cells' processes to end;
    returns the drivers still alive (or on another host) at the deadline."""
    here = [driver for driver in drivers if driver.host == socket.gethostname()]
    for driver in here:
        try:
            os.kill(driver.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    while here and time.monotonic() < deadline:
        if not any(st.is_held(driver.lock) for driver in here) and \
                not any(st.is_locked(cell) for driver in here for cell in driver.cells):
            break
        time.sleep(SETTLE_POLL_S)
    return [driver for driver in drivers if driver not in here or st.is_held(driver.lock)]


def cancel_command(session, specs) -> int:
    try:
        directories = st.find_cell_dirs(session.runs_dir, specs)
    except ValueError as error:
        raise UsageError(str(error)) from None
    console = session.console
    for directory in directories:  # its jobs and driver are not known: it is left alone
        if (problem := st.state_problem(directory)) is not None:
            session.err_console.print(f"WARNING: {session.display_path(problem.path)}: {problem.reason}; the cell's "
                                      "jobs and driver cannot be read from it, so it is left alone", markup=False)
    drivers = live_drivers(session.runs_dir, directories)
    for driver in drivers:
        cells = ", ".join(session.display_path(cell) for cell in driver.cells)
        console.print(f"stop    sweep run pid {driver.pid} on {driver.host}, and with it every cell it runs: "
                      f"{cells}", markup=False)
    left_running = stop_drivers(drivers) if drivers else []
    stopped = [driver for driver in drivers if driver not in left_running]
    for driver in stopped:  # cells whose job ended before it could record so, or never started
        for cell in driver.cells:
            state = st.read_state(cell)
            if state is not None and state.state not in st.FINISHED and not st.is_locked(cell):
                mark_cancelled(Cancelled(directory=cell, token=None, job_ids=()))
    for driver in left_running:
        where = "on another machine: run sweep cancel there" if driver.host != socket.gethostname() \
            else f"still running after {SETTLE_TIMEOUT_S:.0f}s"
        console.print(f"not stopped: sweep run pid {driver.pid} on {driver.host} ({where})", markup=False)
    slurm_cells = [d for d in directories if (state := st.read_state(d)) is not None and state.submission is not None
                   and state.submission.executor == failures.SLURM]
    try:
        cancelled = cancel_cells(session.runs_dir, directories) if slurm_cells or not drivers else []
    except sacct.SlurmUnavailable as error:
        raise UsageError(f"sweep cancel needs SLURM's sacct and scancel: {error}") from None
    if not cancelled:
        orphans = [directory for directory in directories if st.is_locked(directory)]
        if orphans:  # a driver killed with SIGKILL leaves its local cells running, unled
            for directory in orphans:
                console.print(f"still running with no live sweep run to stop: {session.display_path(directory)} "
                              f"(its process: {fs.lock_holder(directory)})", markup=False)
            return ExitCode.CELLS_FAILED
        if not drivers:
            console.print(f"no running cell or SLURM job to cancel among {len(directories)} cell(s)", markup=False)
        return ExitCode.CELLS_FAILED if left_running else ExitCode.OK
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
