"""``sweep compare``: two report tables of the same grid, cell by cell.

For each numeric column ``c`` compared, the result has ``c_a``, ``c_b``, ``c_delta``
(b - a), ``c_delta_pct`` (``c_delta / |a|`` in percent; null where a is 0), ``c_noise`` (the
|Δ| that still counts as noise for that row) and ``c_differs``:

- true when |Δ| > noise, or when only one side has a value (a number appeared or vanished);
- false when |Δ| <= noise;
- null when neither side has a value, or the cell is on one side only.

``present`` says ``both``, ``a`` or ``b``: a cell on one side only keeps its row, its other
side null. Rows follow ``a``'s order, then the cells only ``b`` has. ``status_a`` /
``status_b`` come along where the tables have a status.

Noise. ``noise={"sec_per_step": 0.12}`` gives a column's noise as an absolute |Δ|, in the
column's unit, e.g. from repeated runs of the same cells (:func:`noise_from_repeats`).
A column without one takes :data:`DEFAULT_NOISE` (the rule where nothing was measured):

- timings, throughput, memory, KL, entropy, gradient norms and any other column: 5 % of
  |a| (run-to-run spread of step times on a shared node is a few percent);
- shares of the step's time (``*_frac``): 0.02 absolute (two points of the step);
- rewards and pass rates: 0.02 absolute (two points; GSM8K's test set of 1,319 problems has
  a standard error of about 0.013 per rate, so this flags only clear moves: measure);
- ``delta_vs_base_pct``: 5 points; ``steps`` and ``eval_k``: any change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs
import polars as pl

from sweepkit.errors import UsageError, did_you_mean

KEY = "cell"
PRESENT = "present"


@attrs.frozen(kw_only=True)
class Noise:
    """|Δ| above ``max(absolute, relative * |a|)`` is a difference."""

    absolute: float = 0.0
    relative: float = 0.0

    def expr(self, a: pl.Expr) -> pl.Expr:
        return pl.max_horizontal(pl.lit(self.absolute), a.abs() * self.relative)


TIMING = Noise(relative=0.05)
SHARE = Noise(absolute=0.02)
RATE = Noise(absolute=0.02)
EXACT = Noise()
DEFAULT_NOISE: dict[str, Noise] = {
    "sec_per_step": TIMING, "tok_per_s": TIMING, "memory_peak_gb": TIMING,
    "gen_frac": SHARE, "train_frac": SHARE, "sync_frac": SHARE, "ref_frac": SHARE, "teacher_frac": SHARE,
    "reward_first": RATE, "reward_last": RATE, "pass_at_1": RATE, "pass_at_k": RATE,
    "delta_vs_base_pct": Noise(absolute=5.0),
    "steps": EXACT, "eval_k": EXACT,
}
OTHER = TIMING  # any column not listed


def compare(a: pl.DataFrame, b: pl.DataFrame, *, columns: Sequence[str] | None = None,
            noise: Mapping[str, float] | None = None) -> pl.DataFrame:
    """``a`` and ``b`` (report tables, one row per ``cell``) joined cell by cell, with Δ,
    Δ% and a ``differs`` flag per column of ``columns`` (default: every numeric column
    both tables have)."""
    for name, frame in (("a", a), ("b", b)):
        if KEY not in frame.columns:
            raise UsageError(f"compare: table {name} has no {KEY!r} column")
        duplicates = frame[KEY].filter(frame[KEY].is_duplicated()).unique().to_list()
        if duplicates:
            raise UsageError(f"compare: table {name} has cells twice: {', '.join(map(str, duplicates))}")
    columns = _columns(a, b, columns)
    noise = dict(noise or {})
    unknown = [name for name in noise if name not in columns]
    if unknown:
        raise UsageError(f"compare: noise for columns not compared: {', '.join(unknown)}")
    bad = [name for name, value in noise.items()
           if not isinstance(value, (int, float)) or math.isnan(value) or value < 0]
    if bad:
        raise UsageError(f"compare: noise must be a number >= 0: {', '.join(bad)}")

    def side(frame: pl.DataFrame, suffix: str) -> pl.LazyFrame:
        status = [pl.col("status").alias(f"status_{suffix}")] if "status" in frame.columns else []
        values = [(pl.col(name).cast(pl.Float64).fill_nan(None) if name in frame.columns
                   else pl.lit(None, dtype=pl.Float64)).alias(f"{name}_{suffix}") for name in columns]
        return frame.lazy().select(pl.col(KEY), pl.lit(True).alias(f"_in_{suffix}"), *status, *values)

    joined = side(a, "a").join(side(b, "b"), on=KEY, how="full", coalesce=True, maintain_order="left_right")
    present = (pl.when(pl.col("_in_a") & pl.col("_in_b")).then(pl.lit("both"))
               .when(pl.col("_in_a")).then(pl.lit("a")).otherwise(pl.lit("b")))
    both = pl.col("_in_a").fill_null(False) & pl.col("_in_b").fill_null(False)
    per_column = []
    for name in columns:
        value_a, value_b = pl.col(f"{name}_a"), pl.col(f"{name}_b")
        delta = value_b - value_a
        threshold = (pl.lit(float(noise[name])) if name in noise
                     else DEFAULT_NOISE.get(name, OTHER).expr(value_a))
        one_sided = value_a.is_null() != value_b.is_null()
        differs = (pl.when(~both | (value_a.is_null() & value_b.is_null())).then(pl.lit(None, dtype=pl.Boolean))
                   .when(one_sided).then(pl.lit(True))
                   .otherwise(delta.abs() > threshold))
        per_column += [
            value_a, value_b, delta.alias(f"{name}_delta"),
            pl.when(value_a != 0).then(delta / value_a.abs() * 100).alias(f"{name}_delta_pct"),
            threshold.alias(f"{name}_noise"), differs.alias(f"{name}_differs"),
        ]
    status = [pl.col(f"status_{s}") if f"status_{s}" in joined.collect_schema().names()
              else pl.lit(None, dtype=pl.String).alias(f"status_{s}") for s in ("a", "b")]
    return joined.select(pl.col(KEY), present.alias(PRESENT), *status, *per_column).collect()


def _columns(a: pl.DataFrame, b: pl.DataFrame, columns: Sequence[str] | None) -> list[str]:
    def numeric(frame: pl.DataFrame) -> set[str]:
        return {name for name, dtype in frame.schema.items() if dtype.is_numeric()}

    if columns is None:
        shared = numeric(a) & numeric(b)
        return [name for name in a.columns if name in shared]
    columns = list(dict.fromkeys(columns))
    problems = []
    for name in columns:
        sides = [frame for frame in (a, b) if name in frame.columns]
        if not sides:
            problems.append(f"no column {name!r} in either table{did_you_mean(name, [*a.columns, *b.columns])}")
        elif any(not frame.schema[name].is_numeric() and frame.schema[name] != pl.Null for frame in sides):
            problems.append(f"column {name!r} is not numeric")
    if problems:
        raise UsageError(*(f"compare: {problem}" for problem in problems))
    return columns


def noise_from_repeats(tables: Sequence[pl.DataFrame], *, columns: Sequence[str],
                       spread: float = 2.0) -> dict[str, float]:
    """Noise per column from two or more report tables of the same cells run again:
    ``spread * sqrt(2) * s``, ``s`` the pooled standard deviation of each cell's repeats
    (the root of the mean per-cell variance), ``sqrt(2)`` because a Δ is the difference of
    two such runs. A column no cell has two values of is left out."""
    if len(tables) < 2:
        raise UsageError("compare: noise from repeats needs at least two tables")
    stacked = pl.concat([frame.lazy().select(pl.col(KEY), *(pl.col(name).cast(pl.Float64).fill_nan(None)
                                                             for name in columns))
                         for frame in tables], how="vertical_relaxed")
    variances = stacked.group_by(KEY).agg(pl.col(name).var(ddof=1) for name in columns)
    pooled = variances.select(pl.col(name).mean().sqrt() for name in columns).collect()
    return {name: spread * math.sqrt(2) * value for name in columns
            if (value := pooled[name][0]) is not None and not math.isnan(value)}


def _number(value) -> str:
    return "" if value is None else f"{value:.4g}"


def format_compare(frame: pl.DataFrame) -> str:
    """A compact text of a :func:`compare` frame: the status (``a → b`` where it changed),
    per compared column ``a → b (Δ%)`` and a ``*`` where it differs beyond noise; then a line naming the cells that differ and those
    on one side only."""
    columns = [name[: -len("_differs")] for name in frame.columns if name.endswith("_differs")]
    header = [KEY, "status", *columns]
    rows = []
    differing: list[str] = []
    for row in frame.iter_rows(named=True):
        if row[PRESENT] != "both":
            rows.append([row[KEY], f"only in {row[PRESENT]}", *([""] * len(columns))])
            continue
        status_a, status_b = row["status_a"], row["status_b"]
        status = (status_a or "") if status_a == status_b else f"{status_a} → {status_b}"
        cells, moved = [row[KEY], status], []
        for name in columns:
            a, b, pct, differs = (row[f"{name}_a"], row[f"{name}_b"], row[f"{name}_delta_pct"],
                                  row[f"{name}_differs"])
            if a is None and b is None:
                cells.append("")
                continue
            text = f"{_number(a) or '-'} → {_number(b) or '-'}"
            if pct is not None:
                text += f" ({pct:+.1f}%)"
            elif a is not None and b is not None:
                text += f" ({b - a:+.4g})"
            if differs:
                text += " *"
                moved.append(name)
            cells.append(text)
        if moved:
            differing.append(f"{row[KEY]} ({', '.join(moved)})")
        rows.append(cells)
    widths = [max(len(str(line[i])) for line in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(value).ljust(width) for value, width in zip(line, widths)).rstrip()
             for line in [header, *rows]]
    compared = frame.filter(pl.col(PRESENT) == "both").height
    summary = f"{len(differing)} of {compared} cells differ beyond noise (*)"
    if differing:
        summary += ": " + ", ".join(differing)
    for side in ("a", "b"):
        only = frame.filter(pl.col(PRESENT) == side)[KEY].to_list()
        if only:
            summary += f"; only in {side}: {', '.join(only)}"
    return "\n".join([*lines, summary]) + "\n"
