"""How a driver takes SIGINT (Ctrl-C) and SIGTERM (``sweep cancel``, ``kill``): as a request
to stop, acted on between the steps of its loop.

Either signal stops a driver: its running cells are cancelled and recorded, the cells it had
not started are given back (``sweepkit.run.runner``). A KeyboardInterrupt raised wherever the
signal lands could fall between an executor starting a cell's job and the driver noting its
handle (the job then runs on, never cancelled), or inside a first import (the module then
stays half-imported). So :func:`deferred_interrupts` notes the first signal and the loop acts
on it at :meth:`StopRequest.check`, between its steps. A second signal before then acts at
once, for a step that hangs (a controller that does not answer). Where an executor runs a
cell inside a step (the ``debug`` executor), :func:`interrupts_at_once` lets a signal
interrupt that step as soon as it comes.

A driver a shell put in the background inherits SIGINT ignored; taking it here also keeps
the processes it starts from inheriting it (submitit cancels a local job with SIGINT, which
must not be lost). SIGTERM is how such a driver is stopped.
"""

from __future__ import annotations

import contextlib
import signal
import threading

_ACTIVE: list["StopRequest"] = []  # the request of the deferred_interrupts block this process is in


class StopRequest:
    """A stop signal the driver has taken and not yet acted on."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.at_once = False

    def check(self) -> None:
        """Act on a request: raise the KeyboardInterrupt that stops the driver."""
        if self.signum is not None:
            raise KeyboardInterrupt(f"signal {signal.Signals(self.signum).name}")

    def _take(self, signum, frame) -> None:
        again = self.signum is not None
        self.signum = signum
        if again or self.at_once:
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}" + (", a second time" if again else ""))


@contextlib.contextmanager
def deferred_interrupts():
    """SIGINT and SIGTERM noted as a :class:`StopRequest` for as long as it lasts (in the main
    thread; elsewhere signals are not delivered, and nothing changes), then their handlers
    as they were."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {signum: signal.signal(signum, stop._take) for signum in (signal.SIGINT, signal.SIGTERM)}
    _ACTIVE.append(stop)
    try:
        yield stop
    finally:
        _ACTIVE.remove(stop)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def interrupts_at_once():
    """Within a :func:`deferred_interrupts` block, a stop signal interrupts this block as
    soon as it comes (a request already taken does so on entry); elsewhere it changes
    nothing. For a step that runs a cell itself, where an interrupt is the cell's to take."""
    if not _ACTIVE:
        yield
        return
    stop = _ACTIVE[-1]
    stop.check()
    stop.at_once = True
    try:
        yield
    finally:
        stop.at_once = False
