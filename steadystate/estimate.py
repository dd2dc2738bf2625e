"""Steady-state estimates: warm-up found from the data, a mean with an interval that allows
for autocorrelation, and the difference or ratio of two estimates with its own interval.

Warm-up. The first steps of a process compile, capture CUDA graphs and meet their first
length buckets: they are slower, and they say nothing about the setting. A process's
warm-up is its first steps up to the last one, among the first half of its steps (at
least its first), that is slower than the steady steps by more than both
:data:`WARMUP_EXCESS` of their median and :data:`WARMUP_ROBUST_Z` robust standard
deviations (1.4826 x their median absolute deviation). The steady steps are those outside
every process's first half: a run that was resumed is several processes, each with its
own warm-up. A step that is slow for a reason that is not warm-up (a checkpoint written
every ten steps) is kept: it is a cost of the setting. Only slow steps at the start are
left out, so noise alone seldom removes anything (a noise step at 5 robust standard
deviations is rare), and the mean is not biased by cherry-picked points.

Interval. The mean of the steps after warm-up, with a t interval whose variance allows
for the correlation of neighbouring steps (a slow step is often followed by another: the
response lengths drift, the node warms): the variance of a mean of n steps whose lag-1
autocorrelation is r is about s²/n x (1 + r)/(1 - r) (an AR(1) process), with t's n - 1
degrees of freedom. r is estimated from the steps with Kendall's small-sample bias
correction (r + (1 + 3r)/n), kept in [0, :data:`MAX_AUTOCORRELATION`]; below four steps it
is taken as 0. Why not a block bootstrap: with the 5-50 steps a throughput cell has,
resampling blocks of a few steps gives intervals that cover the truth well below their
nominal rate, and a random interval is no help to a rule that decides when to stop. Why
not fewer degrees of freedom (the effective sample size's): a short run whose step time
drifts (5 steps from 1.02 to 1.06 s) would read as ±30 %, and a halving of the step time
as noise. Simulated AR(1) step times with a compile step (``tests/test_steadystate.py``)
cover the true mean at 95-97 % for independent steps, at 91-93 % for r = 0.3 and at
85-93 % for r = 0.5, from 6 timed steps on.

Two estimates. The interval of a difference b - a, or of a ratio b / a (on the log
scale), is built from the two intervals by the MOVER method (Zou & Donner, 2008): each
side's distance from its estimate to its bounds stands for its own variance. It needs
nothing but the intervals, so report tables that hold only ``low`` and ``high`` can be
compared as well as the estimates they were made from.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from steadystate.tdist import t_quantile

LEVEL = 0.95
WARMUP_ROBUST_Z = 5.0
WARMUP_EXCESS = 0.10
MAX_AUTOCORRELATION = 0.9
# The normal consistency constant of the median absolute deviation.
MAD_SCALE = 1.4826


def check_level(level, name: str = "level") -> float:
    """``level`` as a float in (0, 1); ValueError naming ``name`` otherwise."""
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0.0 < level < 1.0:
        raise ValueError(f"{name}: must be a number in (0, 1), got {level!r}")
    return float(level)


@dataclass(frozen=True)
class Interval:
    """``value`` and its interval [``low``, ``high``] at ``level``; ``low`` or ``high`` is
    None where the interval is unbounded on that side (a ratio whose base interval reaches 0)."""

    value: float
    low: float | None
    high: float | None
    level: float

    def excludes(self, x: float = 0.0) -> bool:
        """True when the interval lies wholly on one side of ``x``."""
        return (self.low is not None and self.low > x) or (self.high is not None and self.high < x)

    @property
    def relative_half_width(self) -> float:
        """Half the interval's width over |value| (infinite when unbounded or value is 0)."""
        if self.low is None or self.high is None or self.value == 0:
            return math.inf
        return (self.high - self.low) / 2 / abs(self.value)


@dataclass(frozen=True)
class Estimate:
    """A mean with its standard error and degrees of freedom; ``se`` is None where too few
    observations leave no interval. ``n`` counts what it rests on (``unit``: timed steps,
    seeds); ``warmup`` is how many steps were left out before it."""

    mean: float
    se: float | None
    dof: float | None
    n: int
    unit: str = "steps"
    warmup: int = 0
    autocorrelation: float = 0.0

    def interval(self, level: float = LEVEL) -> Interval | None:
        """The two-sided t interval at ``level``, or None without a standard error."""
        if self.se is None or self.dof is None:
            return None
        half = t_quantile(0.5 + check_level(level) / 2, self.dof) * self.se
        return Interval(value=self.mean, low=self.mean - half, high=self.mean + half, level=level)


@dataclass(frozen=True)
class Proportion:
    """A rate measured on ``n`` independent trials (pass@k over held-out prompts): the
    Wilson score interval, which stays inside [0, 1] and is sound near 0 and 1."""

    rate: float
    n: int
    unit: str = "prompts"

    @property
    def mean(self) -> float:
        return self.rate

    def interval(self, level: float = LEVEL) -> Interval | None:
        if self.n < 1:
            return None
        z = t_quantile(0.5 + check_level(level) / 2, math.inf)
        p, n = min(max(self.rate, 0.0), 1.0), self.n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return Interval(value=self.rate, low=max(centre - half, 0.0), high=min(centre + half, 1.0), level=level)


def warmup(values: Sequence[float], starts: Sequence[int] = ()) -> list[bool]:
    """Which of ``values`` (step times in step order) are warm-up; ``starts`` are the
    positions where a later process took over (a resumed run), position 0 always is one."""
    n = len(values)
    bounds = sorted({0, *(s for s in starts if 0 < s < n)}) + [n]
    segments = [(first, end) for first, end in zip(bounds, bounds[1:]) if end > first]
    # A process's first half may be warm-up; what lies beyond every first half is steady.
    heads = [(first, first + max(1, (end - first) // 2)) for first, end in segments]
    in_head = [False] * n
    for first, end in heads:
        for i in range(first, end):
            in_head[i] = True
    steady = [v for v, head in zip(values, in_head) if not head]
    mask = [False] * n
    if not steady:
        return mask
    median = statistics.median(steady)
    spread = MAD_SCALE * statistics.median(abs(v - median) for v in steady)
    threshold = median + max(WARMUP_ROBUST_Z * spread, WARMUP_EXCESS * abs(median))
    for first, end in heads:
        slow = [i for i in range(first, end) if values[i] > threshold]
        if slow:
            for i in range(first, slow[-1] + 1):
                mask[i] = True
    return mask


def starts_of(steps: Sequence[int], started_at: Sequence[int]) -> list[int]:
    """The positions in ``steps`` (step numbers in order) where a process took over: a
    process that started from step s (a fresh run from 0, a resumed one from its
    checkpoint's step) first ran the first step after s."""
    return [next((i for i, step in enumerate(steps) if step > start), len(steps)) for start in started_at]


def lag1_autocorrelation(values: Sequence[float]) -> float:
    """The lag-1 autocorrelation of ``values``, bias-corrected (Kendall) and kept in
    [0, MAX_AUTOCORRELATION]; 0 below four values or without variance."""
    n = len(values)
    if n < 4:
        return 0.0
    mean = math.fsum(values) / n
    deviations = [v - mean for v in values]
    total = math.fsum(d * d for d in deviations)
    if total == 0:
        return 0.0
    r = math.fsum(a * b for a, b in zip(deviations, deviations[1:])) / total
    r += (1 + 3 * r) / n
    return min(max(r, 0.0), MAX_AUTOCORRELATION)


def mean_estimate(values: Sequence[float], *, unit: str = "steps", autocorrelated: bool = False,
                  warmup_steps: int = 0) -> Estimate | None:
    """The mean of ``values`` with its standard error: independent observations (seeds),
    or ``autocorrelated`` ones (the steps of a run), see the module docstring. None for
    no values; no standard error for one."""
    n = len(values)
    if n == 0:
        return None
    mean = math.fsum(values) / n
    if n < 2:
        return Estimate(mean=mean, se=None, dof=None, n=n, unit=unit, warmup=warmup_steps)
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    r = lag1_autocorrelation(values) if autocorrelated else 0.0
    inflation = (1 + r) / (1 - r)
    return Estimate(mean=mean, se=math.sqrt(variance / n * inflation), dof=float(n - 1),
                    n=n, unit=unit, warmup=warmup_steps, autocorrelation=r)


def steady_mean(values: Sequence[float], starts: Sequence[int] = ()) -> Estimate | None:
    """The steady-state mean of a run's step times (step order; ``starts`` as for
    :func:`warmup`): warm-up left out, an autocorrelation-aware interval. None when there
    are no values."""
    mask = warmup(values, starts)
    timed = [v for v, skipped in zip(values, mask) if not skipped]
    return mean_estimate(timed, autocorrelated=True, warmup_steps=sum(mask))


def difference(a: Interval, b: Interval) -> Interval:
    """b - a with its interval (MOVER), from intervals of one level."""
    value = b.value - a.value
    if None in (a.low, a.high, b.low, b.high):
        return Interval(value=value, low=None, high=None, level=a.level)
    low = value - math.hypot(b.value - b.low, a.high - a.value)
    high = value + math.hypot(b.high - b.value, a.value - a.low)
    return Interval(value=value, low=low, high=high, level=a.level)


def ratio(a: Interval, b: Interval) -> Interval | None:
    """b / a - 1 with its interval (MOVER on the log scale), for positive values; None
    when a value is not positive. An end is None where an interval reaches 0 (the ratio
    is then unbounded on that side)."""
    if a.value <= 0 or b.value <= 0:
        return None
    value = b.value / a.value - 1

    def log_interval(interval: Interval) -> Interval:
        low = math.log(interval.low) if interval.low is not None and interval.low > 0 else None
        high = math.log(interval.high) if interval.high is not None else None
        return Interval(value=math.log(interval.value), low=low, high=high, level=interval.level)

    log_a, log_b = log_interval(a), log_interval(b)
    log_value = log_b.value - log_a.value
    low = high = None
    if log_b.low is not None and log_a.high is not None:
        low = math.expm1(log_value - math.hypot(log_b.value - log_b.low, log_a.high - log_a.value))
    if log_b.high is not None and log_a.low is not None:
        high = math.expm1(log_value + math.hypot(log_b.high - log_b.value, log_a.value - log_a.low))
    return Interval(value=value, low=low, high=high, level=a.level)


def simultaneous_level(level: float, comparisons: int) -> float:
    """The level of each of ``comparisons`` intervals that together cover at ``level``
    (Bonferroni): 0.95 over 17 comparisons is 0.99706 each."""
    return 1 - (1 - check_level(level)) / max(comparisons, 1)
