"""``steadystate``: t quantiles, warm-up found from the data, and intervals that cover the
truth at their nominal rate on simulated step times (autocorrelated, with a compile step)."""

from __future__ import annotations

import math
import random

import pytest

from steadystate import (Estimate, Interval, Proportion, check_level, difference, mean_estimate, ratio,
                         simultaneous_level, starts_of, steady_mean, t_cdf, t_quantile, warmup)


@pytest.mark.parametrize("p, dof, expected", [
    (0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 9, 2.2622), (0.995, 30, 2.7500), (0.95, 4.5, 2.0656),
    (0.975, math.inf, 1.9600), (0.025, 9, -2.2622), (0.5, 3, 0.0),
])
def test_t_quantiles_match_the_tables(p, dof, expected):
    assert t_quantile(p, dof) == pytest.approx(expected, abs=1e-4)
    if math.isfinite(dof):
        assert t_cdf(t_quantile(p, dof), dof) == pytest.approx(p, abs=1e-9)


def test_warm_up_is_the_slow_start_of_each_process_and_nothing_else():
    steady = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.03, 0.97, 1.0, 1.01]
    assert warmup(steady) == [False] * 10  # noise alone: nothing
    # A compile step, then a first-bucket step two steps later: both, and the one between.
    compiled = [82.0, 1.0, 3.5, *steady]
    assert warmup(compiled) == [True, True, True] + [False] * 10
    # A slow step in the second half is a cost of the run, not warm-up.
    late = [*steady, 5.0, 1.0, 1.0]
    assert not any(warmup(late))
    # A resumed run: its second process compiled again.
    resumed = [30.0, *steady[:5], 25.0, *steady[5:]]
    assert warmup(resumed, [0, 6]) == [True, *[False] * 5, True, *[False] * 5]
    assert starts_of([1, 2, 3, 4, 5, 6, 7], [0, 3]) == [0, 3]  # the process from step 3 first ran step 4
    # Two steps: the first is warm-up when the second shows it was slow.
    assert warmup([10.0, 1.0]) == [True, False] and warmup([1.0, 1.02]) == [False, False]
    assert warmup([5.0]) == [False] and warmup([]) == []


def test_a_steady_mean_says_what_it_rests_on():
    estimate = steady_mean([82.0, 1.0, 1.1, 0.9, 1.0, 1.05, 0.95])
    assert (estimate.n, estimate.warmup) == (6, 1)
    assert estimate.mean == pytest.approx(1.0)
    interval = estimate.interval(0.95)
    assert interval.low < 1.0 < interval.high and interval.relative_half_width < 0.1
    assert steady_mean([3.0]).interval() is None  # one step: no interval
    assert steady_mean([]) is None


def ar1(rng: random.Random, n: int, rho: float, sd: float) -> list[float]:
    noise = [rng.gauss(0.0, sd / math.sqrt(1 - rho * rho))]
    for _ in range(n - 1):
        noise.append(rho * noise[-1] + rng.gauss(0.0, sd))
    return noise


def simulated_run(rng: random.Random, mean: float, n: int, rho: float) -> list[float]:
    """Step times: a compile step (20-80x), a first-bucket step or two early on, then AR(1)
    noise of 5 % around ``mean``."""
    times = [mean * (1 + e) for e in ar1(rng, n, rho, 0.05)]
    times[0] += mean * rng.uniform(20, 80)
    for _ in range(rng.randint(0, 2)):
        times[rng.randint(1, max(1, n // 3))] += mean * rng.uniform(0.5, 3.0)
    return times


@pytest.mark.parametrize("rho, lowest", [(0.0, 0.92), (0.3, 0.87)])
def test_intervals_cover_the_true_mean_at_about_their_level(rho, lowest):
    rng = random.Random(1)
    covered = total = 0
    for n in (8, 12, 20, 40):
        for _ in range(150):
            interval = steady_mean(simulated_run(rng, 2.0, n, rho)).interval(0.95)
            covered += interval.low <= 2.0 <= interval.high
            total += 1
    assert lowest <= covered / total <= 0.99, covered / total


def test_ratio_intervals_cover_the_true_change():
    rng = random.Random(2)
    covered = total = 0
    for _ in range(300):
        base = steady_mean(simulated_run(rng, 2.0, 15, 0.2)).interval(0.95)
        other = steady_mean(simulated_run(rng, 1.6, 15, 0.2)).interval(0.95)
        change = ratio(base, other)
        covered += change.low <= -0.2 <= change.high
        total += 1
    assert 0.92 <= covered / total <= 0.995, covered / total


def test_simultaneous_intervals_keep_every_zero_effect_at_zero_together():
    # 17 knobs that do nothing, 200 grids: at 95 % for all at once, at most about 5 % of the
    # grids show any of them as moved; at 95 % each, most grids would.
    rng = random.Random(3)
    any_moved = each_moved = 0
    for _ in range(200):
        base = steady_mean(simulated_run(rng, 1.0, 12, 0.0))
        others = [steady_mean(simulated_run(rng, 1.0, 12, 0.0)) for _ in range(17)]
        level = simultaneous_level(0.95, len(others))
        any_moved += any(ratio(base.interval(level), other.interval(level)).excludes(0.0) for other in others)
        each_moved += any(ratio(base.interval(0.95), other.interval(0.95)).excludes(0.0) for other in others)
    assert any_moved / 200 <= 0.08 and each_moved > 3 * any_moved, (any_moved, each_moved)


def test_mover_difference_and_ratio_of_known_intervals():
    a = Interval(value=10.0, low=9.0, high=11.0, level=0.95)
    b = Interval(value=12.0, low=11.0, high=13.0, level=0.95)
    change = difference(a, b)
    assert (change.value, change.low, change.high) == pytest.approx((2.0, 2 - math.sqrt(2), 2 + math.sqrt(2)))
    assert change.excludes(0.0) and not change.excludes(1.0)
    assert ratio(a, b).value == pytest.approx(0.2)
    # A base that may be 0: the ratio is unbounded above, yet b is surely the larger.
    open_ended = ratio(Interval(value=1.0, low=-0.5, high=2.5, level=0.95), b)
    assert open_ended.high is None and open_ended.low > 0 and open_ended.excludes(0.0)
    assert not ratio(Interval(value=1.0, low=-0.5, high=20.0, level=0.95), b).excludes(0.0)
    assert difference(a, Interval(value=1.0, low=None, high=None, level=0.95)).low is None


def test_seeds_and_prompts():
    seeds = mean_estimate([0.70, 0.74, 0.72], unit="seeds")
    assert (seeds.n, seeds.unit, seeds.autocorrelation) == (3, "seeds", 0.0)
    assert seeds.se == pytest.approx(0.02 / math.sqrt(3))
    assert seeds.interval(0.95).high == pytest.approx(0.72 + 4.3027 * 0.02 / math.sqrt(3), abs=1e-4)
    # Wilson: 40 of 50, at 95 %
    wilson = Proportion(rate=0.8, n=50).interval(0.95)
    assert (wilson.low, wilson.high) == pytest.approx((0.6696, 0.8876), abs=1e-4)
    assert Proportion(rate=1.0, n=8).interval(0.95).high == 1.0
    assert isinstance(seeds, Estimate)


@pytest.mark.parametrize("level", [0, 1, 1.5, -0.1, "0.9", True, math.nan])
def test_a_level_outside_0_1_is_refused_naming_its_key(level):
    with pytest.raises(ValueError, match=r"timing_level: must be a number in \(0, 1\)"):
        check_level(level, "timing_level")
