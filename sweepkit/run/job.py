"""What a job runs for one cell, on whatever machine the executor put it.

``run_cell`` is the function submitit pickles: it takes the cell's ``.lock`` (blocking, so
a second job for the same cell waits instead of running alongside), checks that it is
still the job the last driver asked for, starts a fresh run over (deletes what
``CellJob.fresh`` names of the cell's earlier run, here and never earlier, so that a sweep
stopped before it got to a cell leaves that cell's earlier run whole), writes the cell's
``config.json`` for this start (the only place it is written: fresh, resumed or a chain
link's resume, ``CellJob.config``), runs the cell's command as a child process with its
output in ``stdout.log`` / ``stderr.log``, and hands what happened (the attempt's start,
its exit) to the transitions of :mod:`sweepkit.state.transitions`, which record it.
It imports only the standard library, attrs and ``sweepkit.state``, so a job starts fast.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from sweepkit.state import checkpoints
from sweepkit.state import files as fs
from sweepkit.state import records as st
from sweepkit.state import transitions as tr

RESUME_ENV = "SWEEP_RESUME"  # "1" in a cell's environment when it is to continue from its checkpoint
# How long a child gets between SIGTERM and SIGKILL when its job is interrupted: a
# trainer finishes its step and checkpoints it (a GPU step can take half a minute).
TERMINATE_GRACE_S = 60.0


def _str_tuple(values) -> tuple[str, ...]:
    return tuple(str(value) for value in values)


@attrs.frozen(kw_only=True)
class FreshStart:
    """What the job of a fresh run does before the cell's command starts, and only then.

    The earlier run's ``metrics.jsonl`` and logs go; with ``rerun`` (``sweep run --rerun``)
    every entry of the cell dir's ``ckpt/`` (never through a ``ckpt/`` linked out of the
    cell dir) and ``checkpoint_entries``, the checkpoints of dirs outside the cell dir that
    a plugin keeps them in, checked and listed when the driver prepared the cell
    (``sweep_prepare_cell_dir``, ``sweep_cell_checkpoints``). Then the new attempt's
    ``record`` (``cell.json``) is written and its ``config_hash`` / ``profile`` recorded:
    until now they described the earlier run.
    """

    rerun: bool = False
    checkpoint_entries: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    record: Mapping[str, Any] | None = None
    config_hash: str
    profile: str | None = None


@attrs.frozen(kw_only=True)
class CellJob:
    """Everything needed to run one cell, independent of the grid file (picklable).

    ``env`` is added to the job's inherited environment; it already holds the ``SWEEP_*``
    variables, the hooks' variables and, for GPU placement, ``CUDA_VISIBLE_DEVICES``.
    ``config`` is the ``config.json`` this start writes (None: the job leaves the file as
    it is); ``resume_argv`` and ``resume_config`` are the command and config of the same
    cell continued from its latest checkpoint (what a chain link after the head runs;
    empty: ``argv``, ``config``). ``fresh`` is what a fresh run deletes and writes when it
    starts; a resumed job (``resume``, which every chain link after the head is) ignores
    it and goes on from what is there.
    """

    nodeid: str
    cell_dir: str
    argv: tuple[str, ...] = attrs.field(converter=_str_tuple)
    resume_argv: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    env: Mapping[str, str] = attrs.field(factory=dict)
    config: Mapping[str, Any] | None = None
    resume_config: Mapping[str, Any] | None = None
    gpus: int = 0
    resume: bool = False
    token: str
    executor: str
    fresh: FreshStart | None = None


def resumed(job: CellJob) -> CellJob:
    """The same cell job continuing from the latest checkpoint: its resumed command (a
    target's resume arguments, e.g. SkyRL's ``++trainer.resume_mode=latest``), config
    (``resume_mode=latest`` for a target that has the key) and env."""
    return attrs.evolve(job, argv=job.resume_argv or job.argv, config=job.resume_config or job.config,
                        resume=True, env={**job.env, RESUME_ENV: "1"})


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
    lock = fs.CellLock(directory)
    lock.acquire(blocking=True)
    try:
        if not _is_current(job, directory):
            return "superseded"  # and deletes nothing: the cell is another job's now
        if _already_completed(job, directory):
            return "completed"  # the same submission ran the cell to its end (a requeued job)
        deleted, refused = _start_over(job, directory)
        if refused is None:
            refused = _write_config(job, directory)
        attempt = tr.started(job, job_id=job_id or current_job_id(), deleted=deleted, refused=refused)
        if attempt is None:
            return "superseded"
        if refused is not None:
            return "failed"
        ended = _run_child(job, directory, lock.fd)
        # The interrupt that reached this job may come again (the driver cancels its jobs
        # after the terminal's Ctrl-C): it is the same request, and must not cut the record short.
        with ignoring(signal.SIGINT) if ended.interruption is not None else contextlib.nullcontext():
            tr.finished(directory, attempt.n, returncode=ended.returncode, failure=ended.failure, final=ended.final)
        if reraise_interrupt and isinstance(ended.interruption, KeyboardInterrupt):
            raise ended.interruption
        return ended.final
    finally:
        lock.release()


def _is_current(job: CellJob, directory: Path) -> bool:
    """The last driver's submission of the cell is this job's (while this job holds the
    cell's lock, no driver can submit the cell again)."""
    state = st.read_state(directory)
    return state is not None and state.submission is not None and state.submission.token == job.token


def _already_completed(job: CellJob, directory: Path) -> bool:
    """This job's submission has completed the cell already: SLURM requeued a job that had
    finished (a restarted controller does), and the cell is not trained again."""
    state = st.read_state(directory)
    return (state is not None and state.state == "completed" and state.submission is not None
            and state.submission.token == job.token and bool(state.attempts))


def _start_over(job: CellJob, directory: Path) -> tuple[tuple[str, ...], str | None]:
    """Do what ``job.fresh`` says; returns what was deleted and, if a deletion was refused
    (or failed), why the cell is not started."""
    fresh = job.fresh
    if fresh is None or job.resume:
        return (), None
    deleted: list[Path] = []
    try:
        if fresh.rerun:
            deleted += checkpoints.wipe_checkpoints(directory)
        deleted += checkpoints.delete_checkpoints(map(Path, fresh.checkpoint_entries))
    except (checkpoints.DeletionRefused, OSError) as error:
        return tuple(map(str, deleted)), f"not started: {error}"
    for name in (st.METRICS_FILE, st.STDOUT_FILE, st.STDERR_FILE):
        (directory / name).unlink(missing_ok=True)
    if fresh.record is not None:
        try:
            fs.write_json(directory / st.CELL_FILE, fresh.record)
        except OSError as error:
            return tuple(map(str, deleted)), f"not started: {error}"
    return tuple(map(str, deleted)), None


def _write_config(job: CellJob, directory: Path) -> str | None:
    """Write the ``config.json`` of this start; why the cell is not started, if it cannot be."""
    if job.config is None:
        return None
    try:
        fs.write_json(directory / st.CONFIG_FILE, dict(job.config))
    except OSError as error:
        return f"not started: {error}"
    return None


@attrs.frozen
class Ended:
    """How the cell's command ended: its return code, the failure text (None when it
    passed), the cell's final state, and the interruption that ended it, if one did."""

    returncode: int | None
    failure: str | None
    final: str
    interruption: BaseException | None = None


def _run_child(job: CellJob, directory: Path, lock_fd: int) -> Ended:
    """Run the cell's command to its end (or until this job is interrupted)."""
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
            if child.returncode == 0:  # it had reached its end: there was nothing left to stop
                return Ended(0, None, "completed", interruption)
            failure = f"interrupted: {type(interruption).__name__} {interruption}".strip()
            return Ended(child.returncode, failure, "cancelled", interruption)
    if returncode == 0:
        return Ended(0, None, "completed")
    return Ended(returncode, _describe_failure(returncode, directory), "failed")


def _terminate(child: subprocess.Popen) -> None:
    # Ctrl-C reaches this process more than once (the terminal's SIGINT, then the driver
    # cancelling its job); a second must not cut short the wait for the child to end.
    with ignoring(signal.SIGINT):
        if child.poll() is not None:
            return
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(TERMINATE_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@contextlib.contextmanager
def ignoring(*signums: int):
    """The signals ignored for as long as it lasts (in the main thread; elsewhere nothing
    changes), then their handlers as they were."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _describe_failure(returncode: int, directory: Path) -> str:
    if returncode < 0:
        cause = f"killed by {signal.Signals(-returncode).name}"
    else:
        cause = f"exit code {returncode}"
    last = last_line(directory / st.STDERR_FILE)
    failure = f"{cause}: {last}" if last else cause
    if fs.no_space_left(directory):
        # Its stderr may not even hold the error: the file system it writes to is full.
        failure += f" (no space left on device: {directory}'s file system is full)"
    return failure


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
