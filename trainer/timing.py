"""Measure until sure: a timing run ends itself once its sec/step is known to ``timing_target``.

A throughput cell is there for one number, its steady-state sec/step. A fixed step count
either wastes GPU time on a number that was settled long ago or stops before the noise
has averaged out. :class:`TimingRule` is fed each step's time and answers after each step
whether the interval of that number (``steadystate.steady_mean``: the warm-up its times
show left out, neighbouring steps allowed to be alike) is within ``timing_target`` of the
mean, on at least ``timing_min_steps`` timed steps: a few alike steps can make a narrow
interval by chance, and the floor keeps one of those from ending the run.

A resumed run is one run: the rule starts from the step times of the earlier processes
(their metrics records, which the resume keeps), each process with a warm-up of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from steadystate import check_level, starts_of, steady_mean

RULE = "timing_target"
STEP_TIME = "timing/step"


@attrs.frozen(kw_only=True)
class Verdict:
    """Whether the run's sec/step is known precisely enough to stop it, and why (``reason``,
    a sentence). ``half_width`` is None while there is no interval (fewer than 2 timed
    steps), ``sec_per_step`` while no step is timed."""

    stop: bool
    reason: str
    sec_per_step: float | None = None
    half_width: float | None = None  # the interval's half-width over the mean
    timed_steps: int = 0
    warmup_steps: int = 0

    def record(self) -> dict[str, Any]:
        """The fields of the ``kind="stop"`` metrics record this verdict ends a run with."""
        return {
            "rule": RULE,
            "reason": self.reason,
            "timing/sec_per_step": self.sec_per_step,
            "timing/half_width": self.half_width,
            "timing/timed_steps": self.timed_steps,
            "timing/warmup_steps": self.warmup_steps,
        }


class TimingRule:
    """Fed each step's time (:meth:`add`), says whether the steady-state sec/step is known to
    ±``target`` at ``level`` on at least ``min_steps`` timed steps (:meth:`verdict`).

    ``earlier_times`` are the step times of the run's earlier processes, in step order, and
    ``earlier_starts`` the positions among them where each of those processes started; this
    process's first step starts a process of its own.
    """

    def __init__(self, *, target: float, level: float, min_steps: int, earlier_times: Sequence[float] = (),
                 earlier_starts: Sequence[int] = ()):
        self.target = target
        self.level = check_level(level, "timing_level")
        self.min_steps = min_steps
        self.times = list(earlier_times)
        self.starts = [*earlier_starts, len(self.times)]

    @classmethod
    def for_run(cls, cfg, history: Iterable[Mapping[str, Any]] = ()) -> "TimingRule":
        """The rule of ``cfg`` (a ``TrainerConfig`` with ``timing_target`` set), continuing from
        ``history``: the metrics records earlier processes of the run left (``MetricsLogger.history``)."""
        times, starts = earlier_steps(history)
        return cls(target=cfg.timing_target, level=cfg.timing_level, min_steps=cfg.timing_min_steps,
                   earlier_times=times, earlier_starts=starts)

    def add(self, seconds: float) -> None:
        """The time of the step just taken."""
        self.times.append(seconds)

    def verdict(self) -> Verdict:
        estimate = steady_mean(self.times, self.starts)
        if estimate is None:
            return Verdict(stop=False, reason="no timed step yet")
        interval = estimate.interval(self.level)
        counts = dict(timed_steps=estimate.n, warmup_steps=estimate.warmup)
        steps = f"{_count(estimate.n, 'timed step')} after {_count(estimate.warmup, 'warm-up step')}"
        if interval is None:
            return Verdict(stop=False, reason=f"{steps}: no interval yet", sec_per_step=estimate.mean, **counts)
        half_width = interval.relative_half_width
        measured = (f"sec/step {estimate.mean:.4g} ±{_percent(half_width)} ({_percent(self.level)} interval) "
                    f"over {steps}")
        target = f"±{_percent(self.target)} target"
        if half_width > self.target:
            reason, stop = f"{measured}: not yet within the {target}", False
        elif estimate.n < self.min_steps:
            reason, stop = f"{measured}: within the {target} but short of timing_min_steps={self.min_steps}", False
        else:
            reason, stop = f"{measured}: within the {target}", True
        return Verdict(stop=stop, reason=reason, sec_per_step=estimate.mean,
                       half_width=half_width if math.isfinite(half_width) else None, **counts)


def earlier_steps(records: Iterable[Mapping[str, Any]]) -> tuple[list[float], list[int]]:
    """From a run's metrics records: its train steps' times in step order, and the positions
    among them where each process started (each logs an ``info`` record at the step it
    started from, and its first timed step is the one after it), as sweepkit's report reads
    them."""
    records = list(records)
    timed = sorted((record["step"], record[STEP_TIME]) for record in records
                   if record.get("kind") == "train" and _finite(record.get(STEP_TIME)))
    started = [record["step"] for record in records
               if record.get("kind") == "info" and isinstance(record.get("step"), int)]
    return [seconds for _, seconds in timed], starts_of([step for step, _ in timed], started)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _percent(fraction: float) -> str:
    """0.018 -> '1.8%', 0.95 -> '95%', 0.975 -> '97.5%': as many digits as say it."""
    if not math.isfinite(fraction):
        return "inf%"
    return f"{fraction * 100:.2g}%" if fraction < 0.001 else f"{round(fraction * 100, 1):g}%"
