"""Warm starts of local cells: a worker that imports a target's heavy modules once and
forks one process per cell.

A trainer cell spends seconds importing torch and transformers and a fraction of a
second training; a sweep of smoke cells is mostly imports. A target that is a Python
module run as ``{python} -m MODULE ...`` may say which modules a cell's process may find
already imported (:class:`WarmTarget`: ``preload``, and ``preload_env``, the environment
variables those imports read, such as ``OMP_NUM_THREADS``). The local executor then
(:class:`WarmPool`) starts, per sweep run, one worker for each set of preloads and
import-time environment (``sweepkit/run/executors/zygote.py``) and turns the cell's command
into that worker's client, which the job runs in place of the command: the cell still
gets its own process, with the cell's argv, environment, working directory, log files,
lock and process group, killed and interrupted as before (the client forwards signals and
ends as the cell's process ended).

Everything else starts cold, as a plain subprocess: a command that is not exactly
``sys.executable -m MODULE ...``, a target without preloads, ``SWEEP_WARM=0`` in the
driver's environment, a worker that failed to start or to import its modules (the client
then runs the command itself, and says why at the top of the cell's ``stderr.log``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import attrs

from sweepkit.grid.cell import Target
from sweepkit.run.executors.zygote import STARTUP_ENV, import_env
from sweepkit.run.job import CellJob, added_env

WARM_ENV = "SWEEP_WARM"
ZYGOTE = str(Path(__file__).with_name("zygote.py"))
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@attrs.frozen(kw_only=True)
class WarmTarget(Target):
    """A target whose process may start from a warm worker (on the local executor).

    ``preload``: modules the worker imports once, in order; a cell's process then finds
    them imported, as if its own imports had run. They must only be imported: a module
    that starts a Python thread or a device at import makes the worker refuse (cells
    start cold). ``preload_env``: the environment variables those imports read (``NAME``
    or ``PREFIX*``); cells that differ in them get different workers. The interpreter's
    own (``PYTHON*``, ``LC_*``, ``LANG``, ``LD_*``) always count.
    """

    preload: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    preload_env: tuple[str, ...] = attrs.field(default=(), converter=tuple)


@attrs.frozen(kw_only=True)
class WarmStart:
    """The warm-start declaration of one prepared job (its cell's target's)."""

    preload: tuple[str, ...]
    preload_env: tuple[str, ...] = ()

    @classmethod
    def of(cls, target: Target) -> "WarmStart | None":
        if isinstance(target, WarmTarget) and target.preload:
            return cls(preload=target.preload, preload_env=target.preload_env)
        return None


def warm_enabled(environ=None) -> bool:
    """False when ``SWEEP_WARM`` is ``0`` (or ``false``, ``no``, ``off``)."""
    environ = os.environ if environ is None else environ
    return environ.get(WARM_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def module_of(argv, python: str = sys.executable) -> str | None:
    """MODULE when ``argv`` is exactly ``python -m MODULE ...`` (no interpreter options, the
    driver's own interpreter), else None."""
    if len(argv) >= 3 and argv[0] == python and argv[1] == "-m" and _MODULE_NAME.fullmatch(argv[2]):
        return argv[2]
    return None


def client_argv(socket_path: str, argv) -> tuple[str, ...]:
    """The command a job runs instead of ``argv``: the worker's client, isolated (``-I -S``:
    it needs nothing but the standard library, and starts in milliseconds)."""
    return (sys.executable, "-I", "-S", ZYGOTE, "run", socket_path, "--", *argv)


@attrs.define(eq=False)
class _Worker:
    process: subprocess.Popen
    socket_path: str


class WarmPool:
    """The warm workers of one sweep run, started on first use, stopped by :meth:`close`
    (each then finishes reporting on the cells it runs and exits)."""

    def __init__(self) -> None:
        self._workers: dict[tuple, _Worker] = {}

    def place(self, job: CellJob, warm: WarmStart | None) -> CellJob:
        """``job`` with its command run through a warm worker, or unchanged (cold)."""
        if warm is None or module_of(job.argv) is None or (job.resume_argv and module_of(job.resume_argv) is None):
            return job
        environ = {**os.environ, **added_env(job)}
        patterns = (*STARTUP_ENV, *warm.preload_env)
        key = (warm.preload, warm.preload_env, tuple(sorted(import_env(environ, patterns).items())))
        worker = self._workers.get(key)
        if worker is None or worker.process.poll() is not None:
            worker = self._workers[key] = self._start(warm, environ)
        return attrs.evolve(job, argv=client_argv(worker.socket_path, job.argv),
                            resume_argv=client_argv(worker.socket_path, job.resume_argv) if job.resume_argv else ())

    def _start(self, warm: WarmStart, environ: dict[str, str]) -> _Worker:
        # A private dir (0700) of a short path: only this user reaches the socket, and the
        # path stays under the AF_UNIX limit wherever the runs dir is.
        directory = tempfile.mkdtemp(prefix="sweep-warm-")
        socket_path = os.path.join(directory, "socket")
        with open(os.path.join(directory, "worker.log"), "wb") as log:
            process = subprocess.Popen(
                [sys.executable, ZYGOTE, "serve", socket_path, ",".join(warm.preload_env), *warm.preload],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log, env=environ, cwd=directory)
        _wait_for_socket(process, socket_path)
        return _Worker(process=process, socket_path=socket_path)

    def close(self) -> None:
        for worker in self._workers.values():
            try:
                worker.process.stdin.close()  # the worker stops taking requests
            except OSError:
                pass
        self._workers.clear()


def _wait_for_socket(process: subprocess.Popen, socket_path: str, timeout_s: float = 10.0) -> None:
    """Until the worker listens (it binds before it imports; the cells queue meanwhile), so
    that a client never finds no socket and starts cold for nothing."""
    import time

    deadline = time.monotonic() + timeout_s
    while not os.path.exists(socket_path) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
