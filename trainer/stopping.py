"""Stop at a step boundary, with a checkpoint, when the run is told to end.

SLURM sends SIGTERM to every process of a job at its time limit and SIGKILL
``KillWait`` seconds later (30 by default); Ctrl-C in a terminal sends SIGINT
to every process of the foreground job, the cells of a local sweep included.
Dying mid-step would lose everything since the last periodic checkpoint, and a
chained cell whose ``ckpt_interval`` is 0 would start its next link from
scratch. So the first SIGTERM, SIGINT (or SIGUSR1, for a warning asked with
``sbatch --signal``) only asks the loop to stop after the step it is in; the
loop then checkpoints that step and exits with ``128 + signal`` (after the last
step, which is checkpointed anyway, it ends as a complete run). Signals within
``COALESCE_S`` of the first are the same request (Ctrl-C in a sweep reaches a
cell as the terminal's SIGINT and, a moment later, its job's SIGTERM); a signal
after that acts at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
COALESCE_S = 5.0


class Stopped(Exception):
    """The run stopped early on a signal, its last step checkpointed (``checkpointed`` is
    False only when it stopped before its first step); ``exit_code`` is 128 + signal."""

    def __init__(self, signum: int, step: int, *, checkpointed: bool):
        self.signum = signum
        self.step = step
        self.checkpointed = checkpointed
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}")


class StopRequest:
    """Installs the handlers for as long as the run lasts (``with StopRequest(...) as stop``);
    ``stop.signum`` is the first signal received, or None."""

    def __init__(self, stderr=None):
        self.signum: int | None = None
        self._first = 0.0
        self._stderr = stderr or sys.stderr
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopRequest":
        # Handlers can only be set from the main thread (an embedding caller may train elsewhere).
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        now = time.monotonic()
        if self.signum is not None:
            if now - self._first < COALESCE_S:
                return  # the same request, delivered twice
            # A later signal is not a request: it ends the process the usual way.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum, self._first = signum, now
        print(f"sweep-train: {signal.Signals(signum).name}: stopping after this step, with a checkpoint",
              file=self._stderr, flush=True)
