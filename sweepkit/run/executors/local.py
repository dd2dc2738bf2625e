"""The ``local`` executor: cells as submitit local jobs on this machine, a few at a time.

submitit's ``LocalExecutor`` starts a job the moment it is submitted, so the cap lives
here: ``take`` hands out only as many cells as there are free slots, and GPUs are handed
out by id, each running cell getting its own ``CUDA_VISIBLE_DEVICES``. By default there is
one slot per GPU, or a single slot on a machine without GPUs (a training run uses every
core it gets); ``--max-parallel N`` overrides the slot count. GPUs are found without
torch: ``CUDA_VISIBLE_DEVICES`` when set, else ``nvidia-smi -L``.

A local job is a process tree started by this driver (submitit's controller, then the
job, then the cell's command). It does not die with the driver: a driver that is killed
leaves its running cells running, holding their locks, and the next driver waits for them.

A cell whose target declares modules to preload (:class:`~sweepkit.run.executors.warm.WarmTarget`,
the built-in trainer does) and whose command is ``{python} -m MODULE ...`` starts from a
warm worker of this sweep run that has imported them once (``sweepkit.run.executors.warm``):
the job then runs the worker's client instead of the command, and the cell's process is a
fork of the worker, with everything else as below. ``SWEEP_WARM=0`` starts every cell cold.

The tree stays in the driver's process group, so the terminal's Ctrl-C reaches the job and
the cell's command as it reaches the driver, but not the controller: it starts with SIGINT
blocked. Interrupted, the controller would print its traceback on the terminal and kill
the job a second later, before the job has recorded how the cell ended (a trainer first
finishes its step, checkpoints it, or completes). The job takes SIGINT again
(:func:`run_local_cell`); the driver cancels a job that has not started its cell with a
SIGTERM to the controller, which forwards it to the job.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

import attrs

from sweepkit.hookspec import hookimpl
from sweepkit.run.executors.base import DONE, RUNNING, Executor, Handle
from sweepkit.run.executors.warm import WarmPool, WarmStart, warm_enabled
from sweepkit.run.job import CellJob, run_cell
from sweepkit.state import records as st

# submitit kills a local job after its timeout; a local run has no wall limit of its own.
NO_TIMEOUT_MIN = 60 * 24 * 365


def detect_gpus(environ=None) -> list[str]:
    """The ids of the GPUs cells may use: from ``CUDA_VISIBLE_DEVICES`` when it is set
    (empty or ``-1`` means none), else one per line of ``nvidia-smi -L``."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [part.strip() for part in visible.split(",") if part.strip() and part.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if listing.returncode != 0:
        return []
    return [str(n) for n, line in enumerate(line for line in listing.stdout.splitlines() if line.startswith("GPU "))]


class LocalExecutor(Executor):
    name = "local"

    def __init__(self, gpus: Sequence[str], max_parallel: int | None = None, warm: bool = True):
        self.gpus = list(gpus)
        self._max_parallel = max_parallel if max_parallel is not None else max(1, len(self.gpus))
        self._free = list(self.gpus)
        self._running: list[Handle] = []
        self._foreign: dict[str, list[str]] = {}  # cells of other drivers on this machine -> their GPUs
        self._warm_pool = WarmPool() if warm else None
        self._warm_starts: dict[str, WarmStart] = {}  # submission token -> its target's preloads

    def bind(self, job: CellJob, cell) -> CellJob:
        # Remembered, not applied: the command a job shows (--dry-run) stays the cell's own,
        # and the worker is started only for a cell that is submitted.
        warm = WarmStart.of(cell.target)
        if warm is not None:
            self._warm_starts[job.token] = warm
        return job

    @property
    def max_parallel(self) -> int:
        return self._max_parallel

    def check(self, job: CellJob) -> str | None:
        if job.gpus > len(self.gpus):
            found = ", ".join(self.gpus) if self.gpus else "none"
            return (f"needs gpus={job.gpus} but this machine has {len(self.gpus)} usable GPU(s) "
                    f"({found}; from CUDA_VISIBLE_DEVICES or nvidia-smi -L)")
        return None

    def take(self, pending: Sequence[CellJob]) -> list[CellJob]:
        slots = self._max_parallel - len(self._running) - len(self._foreign)
        free = len(self._free)
        taken = []
        for job in pending:
            if slots <= 0:
                break
            # A cell that needs more GPUs than are free waits; smaller ones behind it may start.
            if job.gpus <= free:
                taken.append(job)
                slots -= 1
                free -= job.gpus
        return taken

    def submit(self, jobs: Sequence[CellJob]) -> list[Handle]:
        import submitit

        handles = []
        for job in jobs:
            gpu_ids = tuple(self._free[: job.gpus])
            if len(gpu_ids) < job.gpus:
                raise RuntimeError(f"{job.nodeid}: submitted without {job.gpus} free GPUs")
            del self._free[: job.gpus]
            placed = attrs.evolve(job, env={**job.env, "CUDA_VISIBLE_DEVICES": ",".join(gpu_ids)})
            if self._warm_pool is not None:
                placed = self._warm_pool.place(placed, self._warm_starts.pop(job.token, None))
            executor = submitit.LocalExecutor(folder=Path(job.cell_dir) / ".submitit")
            # gpus_per_node=0: submitit would number GPUs itself; the job sets the ids above.
            executor.update_parameters(timeout_min=NO_TIMEOUT_MIN, gpus_per_node=0)
            with _sigint_blocked():  # inherited by the controller; the job unblocks it
                submitted = executor.submit(run_local_cell, placed)
            handle = Handle(executor=self.name, job_id=str(submitted.job_id), cell=placed,
                            job=submitted, gpu_ids=gpu_ids)
            self._running.append(handle)
            handles.append(handle)
        return handles

    def poll(self, handle: Handle) -> str:
        if handle.job.state == "RUNNING":
            return RUNNING
        self._release(handle)
        return DONE

    def _release(self, handle: Handle) -> None:
        if handle in self._running:
            self._running.remove(handle)
            self._free.extend(handle.gpu_ids)

    def hold_foreign(self, nodeid: str, attempt) -> None:
        if attempt is not None and (attempt.executor != self.name or attempt.host != socket.gethostname()):
            return  # runs elsewhere: takes nothing from this machine
        devices = [] if attempt is None or not attempt.devices else attempt.devices.split(",")
        held = [gpu for gpu in devices if gpu in self._free]
        for gpu in held:
            self._free.remove(gpu)
        self._foreign[nodeid] = held

    def release_foreign(self, nodeid: str) -> None:
        self._free.extend(self._foreign.pop(nodeid, []))

    def close(self) -> None:
        if self._warm_pool is not None:
            self._warm_pool.close()

    def error(self, handle: Handle) -> str | None:
        failure = handle.job.exception()
        if failure is None:
            return None
        lines = [line for line in str(failure).splitlines() if line.strip() and not line.startswith("---")]
        return lines[-1].strip() if lines else type(failure).__name__

    def cancel(self, handle: Handle) -> None:
        # Interrupt the job's own process, which stops the cell's command and records the
        # attempt; submitit's cancel would interrupt its controller, which dies with a
        # traceback on the driver's terminal. Before the job has started, submitit's.
        attempt = _running_attempt(handle)
        if attempt is None:
            try:
                handle.job._process.send_signal(signal.SIGTERM)  # the controller forwards it to the job
            except (AttributeError, ProcessLookupError):
                pass
            return
        try:
            os.kill(attempt.pid, signal.SIGINT)
        except ProcessLookupError:
            pass


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT blocked in this thread for as long as it lasts (a Ctrl-C meanwhile is delivered
    after); a process started meanwhile starts with it blocked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def run_local_cell(job: CellJob) -> str:
    """:func:`~sweepkit.run.job.run_cell` in a local job, which inherits SIGINT blocked from its
    controller: it takes SIGINT (Ctrl-C, the driver's cancel) again, and SIGTERM (the
    controller forwards it when the driver cancels the job before it started its cell; a
    kill of the process group) as the same interrupt, not as submitit's signal to ignore.

    SIGINT is taken even under a driver started with it ignored (``nohup sweep run ... &``, a
    CI runner's background job): the driver cancels a local cell with SIGINT, so the cell,
    cold or forked from the warm worker, must start with Python's default for it, as a
    process started from a terminal does."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return run_cell(job)


def _running_attempt(handle: Handle):
    """The attempt the handle's job runs on this machine now, or None."""
    if handle.cell is None:
        return None
    state = st.read_state(Path(handle.cell.cell_dir))
    attempt = state.last_attempt if state is not None and state.state == "running" else None
    if attempt is None or attempt.job_id != handle.job_id or attempt.host != socket.gethostname() or not attempt.pid:
        return None
    return attempt


def _make(session) -> LocalExecutor:
    return LocalExecutor(detect_gpus(), max_parallel=getattr(session.options, "max_parallel", None),
                         warm=warm_enabled())


@hookimpl
def sweep_register_executors(register):
    register("local", _make, "submitit local jobs on this machine; one cell per GPU "
             "(one at a time without GPUs), --max-parallel N to change; a target's preloaded modules "
             "are imported once per run (SWEEP_WARM=0: every cell cold)")
