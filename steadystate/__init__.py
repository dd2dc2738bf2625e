"""Steady-state estimates of a run's numbers, shared by the trainer (which stops a timing
run once it is sure) and sweepkit's report (which decides on the numbers): the standard
library only, so that neither side imports the other."""

from steadystate.estimate import (
    LEVEL,
    Estimate,
    Interval,
    Proportion,
    check_level,
    difference,
    lag1_autocorrelation,
    mean_estimate,
    ratio,
    simultaneous_level,
    starts_of,
    steady_mean,
    warmup,
)
from steadystate.tdist import t_cdf, t_quantile

__all__ = [
    "LEVEL", "Estimate", "Interval", "Proportion", "check_level", "difference", "lag1_autocorrelation",
    "mean_estimate", "ratio", "simultaneous_level", "starts_of", "steady_mean", "t_cdf", "t_quantile", "warmup",
]
