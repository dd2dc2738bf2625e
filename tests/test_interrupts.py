"""sweepkit.run.interrupts: a driver's stop signals, noted and acted on between its steps."""

from __future__ import annotations

import os
import signal

import pytest

from sweepkit.run.interrupts import deferred_interrupts, interrupts_at_once


def deliver(signum: int) -> None:
    """Send ``signum`` to this process; its Python handler has run when this returns."""
    os.kill(os.getpid(), signum)
    signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a call: the handler runs at this boundary


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_first_signal_is_noted_and_raised_where_the_loop_checks(signum):
    steps = []
    with deferred_interrupts() as stop:
        stop.check()  # nothing yet
        deliver(signum)
        steps.append("the step in flight ends")
        with pytest.raises(KeyboardInterrupt, match=signal.Signals(signum).name):
            stop.check()
    assert steps == ["the step in flight ends"]


def test_a_second_signal_before_the_check_interrupts_at_once():
    with deferred_interrupts():
        deliver(signal.SIGTERM)
        with pytest.raises(KeyboardInterrupt, match="SIGINT, a second time"):
            deliver(signal.SIGINT)


def test_the_handlers_before_the_block_come_back_after_it():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a job a shell put in the background
    try:
        with deferred_interrupts():
            # Taken, so a process the driver starts does not inherit it ignored.
            assert signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, signal.SIG_DFL)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_step_that_runs_a_cell_is_interrupted_at_once_and_only_inside_it():
    with deferred_interrupts() as stop:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            with interrupts_at_once():
                deliver(signal.SIGTERM)
                pytest.fail("the signal did not interrupt the block")
        stop.signum = None  # acted on: the runner stops the driver here
        deliver(signal.SIGINT)  # after the block: noted again
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            stop.check()


def test_a_request_taken_before_the_step_stops_it_before_it_starts():
    with deferred_interrupts():
        deliver(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            with interrupts_at_once():
                pytest.fail("the step started although a stop was requested")


def test_outside_a_driver_loop_interrupts_at_once_changes_nothing():
    handlers = lambda: {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}  # noqa: E731
    before = handlers()
    with interrupts_at_once():
        inside = handlers()
    assert inside == before == handlers()
