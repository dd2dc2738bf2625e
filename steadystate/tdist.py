"""Student's t distribution: its CDF and quantiles, for any positive degrees of freedom.

The standard library has the normal distribution only; an interval resting on a few
steps or seeds needs t's heavier tails (t at 97.5 % is 12.7 with one degree of freedom,
4.30 with two, 2.26 with nine, against the normal's 1.96). The CDF goes through the
regularized incomplete beta function (a continued fraction, evaluated with Lentz's
method, as Numerical Recipes does); quantiles invert it by bisection. Degrees of freedom
need not be whole: an autocorrelated series has an effective sample size.
"""

from __future__ import annotations

import functools
import math

_EPSILON = 1e-15
_TINY = 1e-300


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            result *= c * d
        if abs(c * d - 1.0) < _EPSILON:
            break
    return result


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, dof: float) -> float:
    """P(T <= t) for T with ``dof`` degrees of freedom."""
    if dof <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {dof!r}")
    tail = 0.5 * incomplete_beta(dof / 2.0, 0.5, dof / (dof + t * t))
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, dof: float) -> float:
    """The ``p`` quantile of t with ``dof`` degrees of freedom (``t_quantile(0.975, 9)`` is
    2.262); ``dof`` of infinity gives the normal quantile."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    if math.isinf(dof):
        from statistics import NormalDist

        return NormalDist().inv_cdf(p)
    if p < 0.5:
        return -t_quantile(1.0 - p, dof)
    if p == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while t_cdf(high, dof) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if t_cdf(middle, dof) < p:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)
