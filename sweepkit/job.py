"""What a job runs for one cell, on whatever machine the executor put it.

``run_cell`` is the function submitit pickles: it takes the cell's ``.lock`` (blocking, so
a second job for the same cell waits instead of running alongside), checks that it is
still the job the last driver asked for, records the attempt, runs the cell's command as
a child process with its output in ``stdout.log`` / ``stderr.log``, and records the end.
It imports only the standard library, attrs and ``sweepkit.state``, so a job starts fast.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import attrs

from sweepkit import state as st

# How long a child gets between SIGTERM and SIGKILL when its job is interrupted: a
# trainer finishes its step and checkpoints it (a GPU step can take half a minute).
TERMINATE_GRACE_S = 60.0


def _str_tuple(values) -> tuple[str, ...]:
    return tuple(str(value) for value in values)


@attrs.frozen(kw_only=True)
class CellJob:
    """Everything needed to run one cell, independent of the grid file (picklable).

    ``env`` is added to the job's inherited environment; it already holds the ``SWEEP_*``
    variables, the hooks' variables and, for GPU placement, ``CUDA_VISIBLE_DEVICES``.
    ``resume_argv`` is the command of the same cell continued from its latest checkpoint
    (what a chain link after the head runs); empty: ``argv``.
    """

    nodeid: str
    cell_dir: str
    argv: tuple[str, ...] = attrs.field(converter=_str_tuple)
    resume_argv: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    env: Mapping[str, str] = attrs.field(factory=dict)
    gpus: int = 0
    resume: bool = False
    token: str
    executor: str


def current_job_id() -> str | None:
    """The executor's id of the job this process runs in, when there is one."""
    try:
        import submitit

        return str(submitit.JobEnvironment().job_id)
    except (ImportError, RuntimeError, KeyError):
        return None


def added_env(job: CellJob) -> dict[str, str]:
    """The variables the cell's process gets on top of the job's inherited environment."""
    return {**job.env, "PYTHONUNBUFFERED": "1"}


def run_cell(job: CellJob, job_id: str | None = None, *, reraise_interrupt: bool = False) -> str:
    """Run one cell to its end and return its final state (``completed``, ``failed``,
    ``cancelled``), or ``superseded`` when a later submission took the cell over before
    this job got the lock. With ``reraise_interrupt``, a KeyboardInterrupt that cancelled
    the cell is raised again once the cell's end is recorded (the caller was interrupted
    too)."""
    directory = Path(job.cell_dir)
    lock = st.CellLock(directory)
    lock.acquire(blocking=True)
    try:
        attempt = _start_attempt(job, directory, job_id or current_job_id())
        if attempt is None:
            return "superseded"
        returncode, failure, final, interruption = _run_child(job, directory, lock.fd)
        _finish_attempt(directory, attempt.n, returncode, failure, final)
        if reraise_interrupt and isinstance(interruption, KeyboardInterrupt):
            raise interruption
        return final
    finally:
        lock.release()


def _start_attempt(job: CellJob, directory: Path, job_id: str | None) -> st.Attempt | None:
    started: list[st.Attempt] = []

    def change(state: st.CellState | None) -> st.CellState | None:
        if state is None or state.submission is None or state.submission.token != job.token:
            return None
        attempt = st.Attempt(
            n=len(state.attempts) + 1,
            executor=job.executor,
            job_id=job_id or state.submission.job_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            resume=job.resume,
            devices=job.env.get("CUDA_VISIBLE_DEVICES"),
            started=time.time(),
        )
        started.append(attempt)
        return attrs.evolve(state, state="running", attempts=(*state.attempts, attempt))

    st.update_state(directory, change)
    return started[0] if started else None


def _run_child(job: CellJob, directory: Path, lock_fd: int):
    """(returncode, failure, final state, the interruption that ended it or None)."""
    # A resumed run keeps the earlier output, so metrics read from stdout stay continuous.
    mode = "a" if job.resume else "w"
    env = {**os.environ, **added_env(job)}
    with open(directory / st.STDOUT_FILE, mode) as stdout, open(directory / st.STDERR_FILE, mode) as stderr:
        # The child shares the lock: if this job process is killed, the cell still counts
        # as running for as long as its command does, so nobody starts it a second time.
        # The cell stays in this process group: a hang-up or a kill of the group ends it
        # too, and SLURM's process tracking may go by group (proctrack/pgid). Ctrl-C so
        # reaches it twice (the terminal's SIGINT, then the SIGTERM below); the trainer
        # takes signals that close together as one request to stop after its step.
        child = subprocess.Popen(
            list(job.argv), cwd=directory, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
            pass_fds=(lock_fd,),
        )
        try:
            returncode = child.wait()
        except BaseException as interruption:  # KeyboardInterrupt, submitit's timeout, SystemExit
            _terminate(child)
            failure = f"interrupted: {type(interruption).__name__} {interruption}".strip()
            return child.returncode, failure, "cancelled", interruption
    if returncode == 0:
        return 0, None, "completed", None
    return returncode, _describe_failure(returncode, directory / st.STDERR_FILE), "failed", None


def _terminate(child: subprocess.Popen) -> None:
    # Ctrl-C reaches this process more than once (the terminal's SIGINT, then the driver
    # cancelling its job); a second must not cut short the wait for the child to end.
    with _ignoring(signal.SIGINT):
        if child.poll() is not None:
            return
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(TERMINATE_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@contextlib.contextmanager
def _ignoring(signum: int):
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def _describe_failure(returncode: int, stderr_path: Path) -> str:
    if returncode < 0:
        cause = f"killed by {signal.Signals(-returncode).name}"
    else:
        cause = f"exit code {returncode}"
    last = last_line(stderr_path)
    return f"{cause}: {last}" if last else cause


def last_line(path: Path, tail_bytes: int = 8192) -> str | None:
    """The last non-empty line of a log (for a traceback, the exception itself)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - tail_bytes))
            lines = handle.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        if line.strip():
            return line.strip()[:300]
    return None


def _finish_attempt(directory: Path, n: int, returncode: int | None, failure: str | None, final: str) -> None:
    def change(state: st.CellState | None) -> st.CellState | None:
        attempts = tuple(
            attrs.evolve(attempt, ended=time.time(), returncode=returncode, failure=failure)
            if attempt.n == n
            else attempt
            for attempt in state.attempts
        )
        return attrs.evolve(state, state=final, attempts=attempts)

    st.update_state(directory, change)
