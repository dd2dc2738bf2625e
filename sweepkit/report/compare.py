"""``sweep compare``: two report tables of the same grid, cell by cell.

The tables come from two runs dirs of a grid, or from git: :func:`committed_table` reads
the report tables committed at a revision (``sweep compare v1:results/g HEAD:results/g``).

For each numeric column ``c`` compared, the result has ``c_a``, ``c_b``, ``c_delta``
(b - a), ``c_delta_lo`` / ``c_delta_hi`` (the interval of the Δ, where both tables hold the
column's interval), ``c_delta_pct`` (``c_delta / |a|`` in percent; null where a is 0),
``c_noise`` (the |Δ| that still counts as noise for that row, where no interval decides)
and ``c_differs``:

- true when the interval of Δ excludes 0 (or, without one, |Δ| > noise), or when only one
  side has a value (a number appeared or vanished);
- false otherwise;
- null when neither side has a value, or the cell is on one side only.

``present`` says ``both``, ``a`` or ``b``: a cell on one side only keeps its row, its other
side null. Rows follow ``a``'s order, then the cells only ``b`` has. ``status_a`` /
``status_b`` come along where the tables have a status.

Noise. The report's tables hold intervals for ``sec_per_step``, ``tok_per_s``, ``pass_at_k``
and the Δ vs base columns (``sweepkit.report.intervals``): the seeds' spread where a row repeats
a cell over seeds, its timed steps otherwise. The interval of a Δ between two tables comes
from the two rows' intervals (MOVER, ``steadystate.difference``), each a row's own: with
many cells compared, about one in twenty whose true value did not move still reads as
moved at 95 %, so read a lone ``*`` with that in mind. ``noise={"sec_per_step": 0.12}``
gives a column's noise as an absolute |Δ| instead, measured from whole repeats of the grid
(:func:`noise_from_repeats`). A column with neither takes :data:`DEFAULT_NOISE` (the rule
where nothing was measured; each column's rule is the ``noise`` of its spec,
``sweepkit.report.columns``, one of :data:`NOISE_RULES`):

- ``timing`` (timings, throughput, memory) and any column without a rule (KL, entropy,
  gradient norms, a plugin's): 5 % of |a| (run-to-run spread of step times on a shared node
  is a few percent);
- ``share`` (shares of the step's time, ``*_frac``): 0.02 absolute (two points of the step);
- ``rate`` (rewards and pass rates): 0.02 absolute (two points; GSM8K's test set of 1,319
  problems has a standard error of about 0.013 per rate, so this flags only clear moves:
  measure);
- ``points`` (``delta_vs_base_pct``, a Δ in percent): 5 points; ``exact`` (``steps``,
  ``eval_k``): any change.
"""

from __future__ import annotations

import io
import math
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs
import polars as pl

from sweepkit.errors import UsageError, did_you_mean
from sweepkit.report.columns import COLUMNS, ReportColumn, bound_names, interval_bounds, noise_classes

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
# The rules a column's spec names as its ``noise``.
NOISE_RULES = {"timing": TIMING, "share": SHARE, "rate": RATE, "points": Noise(absolute=5.0), "exact": EXACT}


def default_noise(specs: Iterable[ReportColumn]) -> dict[str, Noise]:
    """Column name -> its default noise rule, for the columns whose spec names one."""
    return {name: NOISE_RULES[rule] for name, rule in noise_classes(specs).items()}


DEFAULT_NOISE: dict[str, Noise] = default_noise(COLUMNS)
# The columns with an interval (value -> its bounds) and their bounds' names.
INTERVALS = interval_bounds(COLUMNS)
BOUNDS = bound_names(COLUMNS)
OTHER = TIMING  # any column not listed


def compare(a: pl.DataFrame, b: pl.DataFrame, *, columns: Sequence[str] | None = None,
            noise: Mapping[str, float] | None = None, specs: Iterable[ReportColumn] = COLUMNS) -> pl.DataFrame:
    """``a`` and ``b`` (report tables, one row per ``cell``) joined cell by cell, with Δ,
    Δ% and a ``differs`` flag per column of ``columns`` (default: every numeric column
    both tables have). ``specs``: the columns' specs (their intervals and default noise
    rules; the built-in ones, and those a plugin's tables bring)."""
    specs = tuple(specs)
    intervals, rules = interval_bounds(specs), default_noise(specs)
    for name, frame in (("a", a), ("b", b)):
        if KEY not in frame.columns:
            raise UsageError(f"compare: table {name} has no {KEY!r} column")
        duplicates = frame[KEY].filter(frame[KEY].is_duplicated()).unique().to_list()
        if duplicates:
            raise UsageError(f"compare: table {name} has cells twice: {', '.join(map(str, duplicates))}")
    columns = compared_columns(a, b, columns, specs)
    noise = dict(noise or {})
    unknown = [name for name in noise if name not in columns]
    if unknown:
        raise UsageError(f"compare: noise for columns not compared: {', '.join(unknown)}")
    bad = [name for name, value in noise.items()
           if not isinstance(value, (int, float)) or math.isnan(value) or value < 0]
    if bad:
        raise UsageError(f"compare: noise must be a number >= 0: {', '.join(bad)}")

    # A column whose interval both tables hold is compared by the interval of its Δ.
    with_bounds = [name for name in columns if name in intervals
                   and all(bound in frame.columns for frame in (a, b) for bound in intervals[name])]
    bounds = [bound for name in with_bounds for bound in intervals[name]]

    def side(frame: pl.DataFrame, suffix: str) -> pl.LazyFrame:
        status = [pl.col("status").alias(f"status_{suffix}")] if "status" in frame.columns else []
        values = _numbers(frame, [*columns, *bounds], suffix=f"_{suffix}")
        return frame.lazy().select(pl.col(KEY), pl.lit(True).alias(f"_in_{suffix}"), *status, *values)

    joined = side(a, "a").join(side(b, "b"), on=KEY, how="full", coalesce=True, maintain_order="left_right")
    present = (pl.when(pl.col("_in_a") & pl.col("_in_b")).then(pl.lit("both"))
               .when(pl.col("_in_a")).then(pl.lit("a")).otherwise(pl.lit("b")))
    both = pl.col("_in_a").fill_null(False) & pl.col("_in_b").fill_null(False)
    per_column = []
    for name in columns:
        value_a, value_b = pl.col(f"{name}_a"), pl.col(f"{name}_b")
        delta = value_b - value_a
        low, high = _moved(name, intervals[name]) if name in with_bounds else (pl.lit(None, dtype=pl.Float64),) * 2
        bounded = low.is_not_null() & high.is_not_null() if name not in noise else pl.lit(False)
        # A row without an interval (one timed step) falls back on the noise given or the default rule.
        rule = pl.lit(float(noise[name])) if name in noise else rules.get(name, OTHER).expr(value_a)
        threshold = pl.when(bounded).then(pl.lit(None, dtype=pl.Float64)).otherwise(rule)
        one_sided = value_a.is_null() != value_b.is_null()
        beyond = pl.when(bounded).then((low > 0) | (high < 0)).otherwise(delta.abs() > rule)
        differs = (pl.when(~both | (value_a.is_null() & value_b.is_null())).then(pl.lit(None, dtype=pl.Boolean))
                   .when(one_sided).then(pl.lit(True))
                   .otherwise(beyond))
        per_column += [
            value_a, value_b, delta.alias(f"{name}_delta"), low.alias(f"{name}_delta_lo"),
            high.alias(f"{name}_delta_hi"),
            pl.when(value_a != 0).then(delta / value_a.abs() * 100).alias(f"{name}_delta_pct"),
            threshold.alias(f"{name}_noise"), differs.alias(f"{name}_differs"),
        ]
    status = [pl.col(f"status_{s}") if f"status_{s}" in joined.collect_schema().names()
              else pl.lit(None, dtype=pl.String).alias(f"status_{s}") for s in ("a", "b")]
    return joined.select(pl.col(KEY), present.alias(PRESENT), *status, *per_column).collect()


def _moved(name: str, bounds: tuple[str, str]) -> tuple[pl.Expr, pl.Expr]:
    """The interval of b - a from the two sides' intervals (MOVER, ``steadystate.difference``),
    ``bounds`` the names of a side's (low, high)."""
    low_name, high_name = bounds
    a, b = pl.col(f"{name}_a"), pl.col(f"{name}_b")
    a_low, a_high, b_low, b_high = (pl.col(f"{bound}_{side}") for side, bound in
                                    (("a", low_name), ("a", high_name), ("b", low_name), ("b", high_name)))
    delta = b - a
    low = delta - ((b - b_low) ** 2 + (a_high - a) ** 2).sqrt()
    high = delta + ((b_high - b) ** 2 + (a - a_low) ** 2).sqrt()
    return low, high


def compared_columns(a: pl.DataFrame, b: pl.DataFrame, columns: Sequence[str] | None,
                     specs: Iterable[ReportColumn] = COLUMNS) -> list[str]:
    """``columns`` checked against both tables, or (None) every numeric column both have but
    the bounds of intervals (they are compared with their value; ``specs`` name them)."""
    bounds = bound_names(specs)

    def numeric(frame: pl.DataFrame) -> set[str]:
        return {name for name, dtype in frame.schema.items() if dtype.is_numeric() and name not in bounds}

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


def _pooled_noise(stacked: pl.LazyFrame, columns: Sequence[str], spread: float) -> dict[str, float]:
    """``spread * sqrt(2) * s`` per column, ``s`` the pooled standard deviation of the rows of
    each ``_group`` (``sum((n - 1) * var) / sum(n - 1)`` over the groups with two values or
    more), ``sqrt(2)`` because a Δ is the difference of two such runs. A column no group has
    two values of is left out."""
    per_group = stacked.group_by("_group").agg(
        *(pl.col(name).var(ddof=1).alias(f"{name}_var") for name in columns),
        *(pl.col(name).count().alias(f"{name}_n") for name in columns))
    sums = per_group.select(
        *((pl.col(f"{name}_var") * (pl.col(f"{name}_n") - 1)).filter(pl.col(f"{name}_n") > 1).sum().alias(name)
          for name in columns),
        *((pl.col(f"{name}_n") - 1).filter(pl.col(f"{name}_n") > 1).sum().alias(f"{name}_dof") for name in columns),
    ).collect().row(0, named=True)
    return {name: spread * math.sqrt(2) * math.sqrt(sums[name] / sums[f"{name}_dof"]) for name in columns
            if sums[f"{name}_dof"] and sums[name] is not None and not math.isnan(sums[name])}


def _numbers(frame: pl.DataFrame, columns: Sequence[str], *, suffix: str = "") -> list[pl.Expr]:
    """Each of ``columns`` as Float64 with NaN as null (null where ``frame`` lacks it), named
    with ``suffix``."""
    return [(pl.col(name).cast(pl.Float64).fill_nan(None) if name in frame.columns
             else pl.lit(None, dtype=pl.Float64)).alias(f"{name}{suffix}") for name in columns]


def noise_from_repeats(tables: Sequence[pl.DataFrame], *, columns: Sequence[str],
                       spread: float = 2.0) -> dict[str, float]:
    """Noise per column from two or more report tables of the same cells run again, each
    cell's runs a group of :func:`_pooled_noise`."""
    if len(tables) < 2:
        raise UsageError("compare: noise from repeats needs at least two tables")
    stacked = pl.concat([frame.lazy().select(pl.col(KEY).alias("_group"), *_numbers(frame, columns))
                         for frame in tables], how="vertical_relaxed")
    return _pooled_noise(stacked, columns, spread)


def committed_table(rootdir: Path, revision: str, path: str) -> dict[str, pl.DataFrame]:
    """The report tables committed at ``revision`` under ``path`` (a ``runs/<grid>`` dir,
    whose ``report/`` holds them, or that ``report/`` dir), read from git; parquet, else csv."""
    def show(name: str) -> bytes | None:
        done = subprocess.run(["git", "-C", str(rootdir), "show", f"{revision}:{name}"], capture_output=True)
        return done.stdout if done.returncode == 0 else None

    check = subprocess.run(["git", "-C", str(rootdir), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        raise UsageError(f"sweep compare: {revision}:{path}: {revision!r} is no commit of the git repository at "
                         f"{rootdir} ({check.stderr.strip() or 'git rev-parse found none'})")
    path = path.strip("/")
    for folder in (f"{path}/report", path):
        tables = {}
        for name in ("throughput", "accuracy"):
            for extension, read in (("parquet", pl.read_parquet), ("csv", pl.read_csv)):
                data = show(f"{folder}/{name}.{extension}")
                if data is not None:
                    tables[name] = read(io.BytesIO(data))
                    break
        if tables:
            return tables
    raise UsageError(f"sweep compare: {revision}:{path}: no report tables committed there (looked for "
                     f"{path}/report/throughput.parquet or .csv, and in {path}/ itself)")


def _number(value) -> str:
    return "" if value is None else f"{value:.4g}"


def noise_note(frame: pl.DataFrame) -> str:
    """One line saying what told each compared column's Δ from the noise."""
    columns = [name[: -len("_differs")] for name in frame.columns if name.endswith("_differs")]
    by_interval = [name for name in columns if frame[f"{name}_delta_lo"].null_count() < frame.height]
    by_rule = [name for name in columns if name not in by_interval]
    parts = []
    if by_interval:
        parts.append(f"{', '.join(by_interval)}: the interval of Δ from both rows' intervals (the seeds' spread "
                     f"where a row has seeds; else a time's timed steps, pass@k's eval sampling), the default rule "
                     f"where a row has none")
    if by_rule:
        parts.append(f"{', '.join(by_rule)}: the default rule (sweepkit.report.compare.DEFAULT_NOISE: 5% of |a| for "
                     f"timings, 0.02 for rates and shares, any change of steps) or the noise given")
    return "noise: " + "; ".join(parts)


def format_compare(frame: pl.DataFrame, noise_note: str | None = None) -> str:
    """A compact text of a :func:`compare` frame: the status (``a → b`` where it changed),
    per compared column ``a → b (Δ%)`` and a ``*`` where it differs beyond noise; then a
    line naming the cells that differ and those on one side only, and ``noise_note``
    (what the noise rests on) when given."""
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
            low, high = row.get(f"{name}_delta_lo"), row.get(f"{name}_delta_hi")
            if a is None and b is None:
                cells.append("")
                continue
            text = f"{_number(a) or '-'} → {_number(b) or '-'}"
            if pct is not None:
                text += f" ({pct:+.1f}%)"
            elif a is not None and b is not None:
                text += f" ({b - a:+.4g})"
            if low is not None and high is not None:
                text += f" Δ [{low:+.3g}, {high:+.3g}]"
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
    return "\n".join([*lines, summary, *([noise_note] if noise_note else [])]) + "\n"
