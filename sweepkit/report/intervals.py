"""The numbers a decision rests on: each run's steady-state sec/step and tokens/s with their
intervals, repeats over seeds folded into one row, and each row's Δ against base with a
verdict that says whether it is a finding.

How (``steadystate`` holds the estimators and says why each):

- a run's ``sec_per_step`` and ``tok_per_s`` are the means of its steps after the warm-up
  its data shows (``steadystate.warmup``), with an interval that allows for neighbouring
  steps being alike; a resumed run is several processes, each with its own warm-up
  (their starts are the steps of the run's ``info`` records);
- the runs of a setting that differ only in seed are one row: its numbers are the means
  over the seeds, and its intervals the seeds' t intervals (the seed spread: with two
  seeds that is one degree of freedom, so use three or more);
- a row of one seed takes its pass@k interval from the seed spread the grid measured
  elsewhere (the pooled variance of its rows of several seeds); without any, its
  interval is the eval's sampling error alone (Wilson, over the held-out prompts) and
  its Δ cannot be a finding: the verdict says ``1 seed``;
- Δ vs base (``delta_vs_base_pct`` of sec/step, ``pass_at_k_vs_base``) and its interval
  come from the two rows' intervals (MOVER), at a level that holds for all of the
  grid's comparisons with base at once (Bonferroni: with 17 cells at 95 %, each at
  99.7 %): among many knobs, one that does nothing must not come out as a finding.

The verdicts: ``faster`` / ``slower`` (``better`` / ``worse``) when the interval of Δ
excludes 0; ``within noise`` when it does not; ``inert`` when every knob the row changes
was reported by its run as having no effect (the trainer's ``inert_knobs``), whatever the
numbers; ``too few steps`` when a side has no interval; ``1 seed`` for pass@k without a
seed spread. None for base and for rows without the number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import attrs
import polars as pl

from steadystate import (
    LEVEL,
    Estimate,
    Interval,
    Proportion,
    difference,
    mean_estimate,
    ratio,
    simultaneous_level,
    starts_of,
    steady_mean,
    warmup,
)
from sweepkit.report.columns import BY_NAME, COLUMNS, folds

BASE = "base"
FINISHED = ("passed", "xpassed")
STEP_TIME = "timing/step"
TOKENS_PER_S = "throughput/tokens_per_s"
FASTER, SLOWER, BETTER, WORSE = "faster", "slower", "better", "worse"
NOISE, INERT, FEW_STEPS, ONE_SEED = "within noise", "inert", "too few steps", "1 seed"
# Verdicts that are no finding: a renderer shows them apart, suggest never picks them.
NOT_FINDINGS = (NOISE, INERT, FEW_STEPS, ONE_SEED)


# -- one run ---------------------------------------------------------------------------


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def run_estimates(records: pl.DataFrame) -> tuple[dict[str, dict[str, Estimate | None]], pl.DataFrame]:
    """Per cell of ``records`` (the per-step frame of a grid: ``cell``, ``kind``, ``step``
    and the metrics): ``{"sec_per_step": Estimate, "tok_per_s": Estimate}``, and a frame of
    ``cell``, ``step``, ``warmup`` (a train step left out as warm-up)."""
    train = (records.filter(pl.col("kind") == "train").select("cell", "step", STEP_TIME, TOKENS_PER_S)
             .sort("cell", "step"))
    starts: dict[str, list[int]] = {}
    for cell, step in records.filter(pl.col("kind") == "info").select("cell", "step").iter_rows():
        starts.setdefault(cell, []).append(step)
    estimates: dict[str, dict[str, Estimate | None]] = {}
    flags: list[tuple[str, int, bool]] = []
    for (cell,), frame in train.partition_by("cell", as_dict=True, maintain_order=True).items():
        rows = [(step, time, tokens) for step, time, tokens in frame.select("step", STEP_TIME, TOKENS_PER_S).iter_rows()
                if _finite(time)]
        steps = [step for step, _, _ in rows]
        positions = starts_of(steps, starts.get(cell, ()))
        times = [time for _, time, _ in rows]
        estimate = steady_mean(times, positions)
        mask = warmup(times, positions)
        flags += [(cell, step, skipped) for step, skipped in zip(steps, mask)]
        tokens = [value for (_, _, value), skipped in zip(rows, mask) if not skipped and _finite(value)]
        estimates[cell] = {
            "sec_per_step": estimate,
            "tok_per_s": mean_estimate(tokens, autocorrelated=True, warmup_steps=sum(mask)),
        }
    warm = pl.DataFrame(flags, schema={"cell": pl.String, "step": pl.Int64, "warmup": pl.Boolean}, orient="row")
    return estimates, warm


# -- repeats over seeds: one row -----------------------------------------------------------


def _mean(values: list) -> float | None:
    return math.fsum(values) / len(values) if values else None


# How a row folds each number of its runs (the runs whose numbers count: see fold), by the
# ``fold`` of the column's spec (sweepkit.report.columns).
FOLD_FUNCTIONS = {"mean": _mean, "max": max, "min": min, "sum": math.fsum, "first": lambda values: values[0],
                  "any": any}
FOLDS = {name: FOLD_FUNCTIONS[how] for name, how in folds(COLUMNS).items()}


def row_status(statuses: Sequence[str]) -> str:
    """One status for a row of runs: theirs when they agree, else the first that is not a
    finish (a seed still running, or one that failed, is what the row is)."""
    if len(set(statuses)) == 1:
        return statuses[0]
    return next((status for status in statuses if status not in FINISHED), statuses[0])


def _combined(runs: list[dict], estimates: Mapping[str, Mapping[str, Estimate | None]], key: str) -> Estimate | None:
    """The row's estimate of ``key``: one run's own, or the mean over its seeds."""
    own = [estimates.get(run["cell"], {}).get(key) for run in runs]
    own = [estimate for estimate in own if estimate is not None]
    if len(own) == 1:
        return own[0]
    combined = mean_estimate([estimate.mean for estimate in own], unit="seeds")
    return replace(combined, warmup=sum(e.warmup for e in own)) if combined is not None else None


def fold(runs: Sequence[dict], estimates: Mapping[str, Mapping[str, Estimate | None]]) -> list[dict]:
    """One row per group of ``runs`` (dicts of a run's columns, with ``cell``, ``group``,
    ``status``, ``diff``, ``failure``, ``note``, ``inert``, in grid order): a run alone is its own
    row; the runs of a group are folded by :data:`FOLDS` over those that finished (all of
    them while none has). Each row keeps its numbers' estimates under ``_estimates``."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        groups.setdefault(run.get("group") or run["cell"], []).append(run)
    rows = []
    for name, members in groups.items():
        leader = next((run for run in members if run["cell"] == name), members[0])
        finished = [run for run in members if run["status"] in FINISHED]
        used = finished or members
        row = {key: value for key, value in leader.items()}
        row["cell"] = name
        row["status"] = row_status([run["status"] for run in members])
        for key, how in FOLDS.items():
            values = [run.get(key) for run in used if run.get(key) is not None
                      and not (isinstance(run.get(key), float) and math.isnan(run[key]))]
            row[key] = how(values) if values else None
        best = [run for run in used if run.get("pass_at_k_best") is not None]
        row["pass_at_k_best_step"] = max(best, key=lambda run: run["pass_at_k_best"])["pass_at_k_best_step"] \
            if best else None
        row["failure"] = next((run["failure"] if run is leader else f"{run['cell']}: {run['failure']}"
                               for run in members if run.get("failure")), None)
        # How many runs the row's numbers rest on (none before any has numbers).
        row["seeds"] = sum(1 for run in used if run.get("steps") is not None or run.get("pass_at_k") is not None) \
            or None
        notes = [leader.get("note")] if leader.get("note") else []
        unfinished = [run["cell"] for run in members if run not in used]
        if finished and unfinished:
            notes.append(f"{len(finished)} of {len(members)} seeds finished; left out: {', '.join(unfinished)}")
        row["note"] = "; ".join(notes) or None
        sec = _combined(used, estimates, "sec_per_step")
        tokens = _combined(used, estimates, "tok_per_s")
        passes = [run["pass_at_k"] for run in used if run.get("pass_at_k") is not None]
        row["_estimates"] = {
            "sec_per_step": sec,
            "tok_per_s": tokens,
            "pass_at_k": (mean_estimate(passes, unit="seeds") if len(passes) > 1 else
                          Proportion(rate=passes[0], n=int(row.get("eval_prompts") or 0)) if passes else None),
        }
        row["pass_at_k"] = _mean(passes)
        timed = [estimate.n for run in used if (estimate := estimates.get(run["cell"], {}).get("sec_per_step"))]
        row["timed_steps"] = sum(timed) if timed else None
        row["warmup_steps"] = sec.warmup if sec is not None else None
        rows.append(row)
    return rows


def pooled_seed_spread(rows: Iterable[dict], key: str) -> tuple[float, float] | None:
    """(sd, degrees of freedom) of ``key`` between the seeds of the rows that have several:
    the pooled variance sum((n - 1) s²) / sum(n - 1); None where no row has two seeds."""
    total, dof = 0.0, 0
    for row in rows:
        estimate = row["_estimates"].get(key)
        if isinstance(estimate, Estimate) and estimate.unit == "seeds" and estimate.se is not None:
            n = estimate.n
            total += (n - 1) * (estimate.se * math.sqrt(n)) ** 2
            dof += n - 1
    return (math.sqrt(total / dof), float(dof)) if dof else None


# -- Δ against base -----------------------------------------------------------------------


def _interval(estimate, level: float) -> Interval | None:
    return estimate.interval(level) if estimate is not None else None


def _bounds(column: str, interval: Interval | None, scale: float = 1.0) -> dict[str, float | None]:
    """``column``'s bound columns (its spec's) with ``interval``'s bounds."""
    low = interval.low * scale if interval is not None and interval.low is not None else None
    high = interval.high * scale if interval is not None and interval.high is not None else None
    low_name, high_name = BY_NAME[column].bounds
    return {low_name: low, high_name: high}


def decide(rows: list[dict], level: float = LEVEL) -> list[dict]:
    """Each row with its intervals at ``level`` and its Δ against the base row, at the
    simultaneous level of all the grid's comparisons (see the module docstring)."""
    spread = pooled_seed_spread(rows, "pass_at_k")
    for row in rows:
        estimate = row["_estimates"]["pass_at_k"]
        if isinstance(estimate, Proportion) and spread is not None:
            # One seed, but the grid measured how much seeds move pass@k: that spread is its noise.
            row["_estimates"]["pass_at_k"] = Estimate(mean=estimate.rate, se=spread[0], dof=spread[1], n=1,
                                                      unit="seeds")
    base = next((row for row in rows if row["cell"] == BASE), None)
    for key in ("sec_per_step", "tok_per_s", "pass_at_k"):
        for row in rows:
            estimate = row["_estimates"][key]
            row[key] = estimate.mean if estimate is not None else row.get(key)
            row.update(_bounds(key, _interval(estimate, level)))
            low = BY_NAME[key].bounds[0]
            if key != "pass_at_k" and row[low] is not None:
                row[low] = max(row[low], 0.0)  # a time or a rate is never below 0
    for spec in AGAINST:
        _against_base(rows, base, level, spec)
    return rows


@attrs.frozen(kw_only=True)
class Against:
    """One Δ-vs-base comparison the report makes: of ``key``, into the column ``column`` (the
    Δ, with the interval its spec names) and ``verdict``; ``change`` makes the interval of
    the Δ from the two intervals (``ratio`` in percent, or ``difference``); ``lower`` /
    ``higher`` name a finding by its direction."""

    key: str
    column: str
    verdict: str
    change: Any
    scale: float
    lower: str
    higher: str

    def delta(self, base: float, other: float) -> float | None:
        if self.change is ratio:
            return (other / base - 1) * self.scale if base else None
        return (other - base) * self.scale


AGAINST = (
    Against(key="sec_per_step", column="delta_vs_base_pct", verdict="verdict", change=ratio, scale=100.0,
            lower=FASTER, higher=SLOWER),
    Against(key="pass_at_k", column="pass_at_k_vs_base", verdict="pass_at_k_verdict", change=difference, scale=1.0,
            lower=WORSE, higher=BETTER),
)


def _against_base(rows: list[dict], base: dict | None, level: float, spec: Against) -> None:
    """Each row's Δ of ``spec.key`` against base, its interval at the level of all the rows'
    comparisons at once, and its verdict."""
    column = spec.column
    for row in rows:
        row.update({column: None, **_bounds(column, None), spec.verdict: None})
    if base is None or base["_estimates"][spec.key] is None:
        return
    base[column] = 0.0
    base_estimate = base["_estimates"][spec.key]
    others = [row for row in rows if row is not base and row["_estimates"][spec.key] is not None]
    each = simultaneous_level(level, len(others))
    for row in others:
        estimate = row["_estimates"][spec.key]
        row[column] = spec.delta(base_estimate.mean, estimate.mean)
        a, b = _interval(base_estimate, each), _interval(estimate, each)
        change = spec.change(a, b) if a is not None and b is not None else None
        if change is not None:
            row.update(_bounds(column, change, spec.scale))
        if row.get("inert"):
            row[spec.verdict] = INERT
        elif isinstance(estimate, Proportion) or isinstance(base_estimate, Proportion):
            row[spec.verdict] = ONE_SEED  # the eval's sampling error alone: no seed spread
        elif change is None:
            row[spec.verdict] = FEW_STEPS
        elif change.excludes(0.0):
            row[spec.verdict] = spec.lower if change.value < 0 else spec.higher
        else:
            row[spec.verdict] = NOISE
