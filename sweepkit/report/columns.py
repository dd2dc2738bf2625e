"""The report's columns: one frozen spec per column, the one home of what a column is.

A :class:`ReportColumn` says which built-in tables hold the column, how its number is made
(and where: most are polars aggregates, ``sweepkit.report.tables.AGGREGATES``, keyed by the
column's name; some are made by ``sweepkit.report.intervals``), how it reads on the terminal
(header, drop rank, cut floor), which direction is better, which default noise rule
``sweep compare`` applies to it, whether it carries an interval (its ``_lo`` / ``_hi``
bounds) and how its repeats over seeds fold into one row. Everything else is derived from
:data:`COLUMNS`: the tables' column tuples (``tables.THROUGHPUT`` / ``ACCURACY``), the
terminal's headers (``renderers.SCREEN``), the intervals (``INTERVALS`` / ``BOUNDS``),
``suggest.DIRECTIONS`` and ``SIGNALS``, ``compare.DEFAULT_NOISE``, ``intervals.FOLDS``, the
metrics the report reads, and the column documentation in ``sweepkit.report.tables``'s
docstring (:func:`column_docs`). Adding a built-in column is one spec here plus, for a polars
aggregate, its expression in ``tables.AGGREGATES``.

A plugin's table brings the specs of its own columns (``ReportTable(columns=...)``); the
report merges them with these (:func:`merge`), so its columns get their headers, intervals,
directions and noise rules too.

polars is not imported here: this module is loaded by every ``sweep`` command (through the
renderers).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from types import MappingProxyType

import attrs

from sweepkit.errors import UsageError
from sweepkit.screen import Column

THROUGHPUT_TABLE, ACCURACY_TABLE = "throughput", "accuracy"
BOTH = (THROUGHPUT_TABLE, ACCURACY_TABLE)

# Where a column's number is made, in the order the report makes them: from the cell's files
# (cell.json, state.json, its run's info and stop records), a polars aggregate over its train
# steps or its eval records, a polars expression over a run's aggregates, by
# sweepkit.report.intervals (estimates, seeds folded, Δ vs base), a polars expression over the
# row with its seeds folded in. The polars ones are tables.AGGREGATES[name]. A plugin's column
# is made by its own table's query.
MADE = {"cell": "the cell's files", "train": "its train steps", "eval": "its eval records",
        "run": "its run's aggregates", "intervals": "sweepkit.report.intervals", "row": "the folded row",
        "table": "its table's query"}
# The stages whose expression is a polars aggregate of tables.AGGREGATES.
EXPRESSION_STAGES = ("train", "eval", "run", "row")
DTYPES = ("text", "integer", "float", "boolean")
# compare's default noise rules (sweepkit.report.compare.NOISE_RULES holds them); a column
# with none takes compare.OTHER, 5 % of |a|.
NOISE = {
    "timing": "5 % of |a|",
    "share": "0.02 absolute",
    "rate": "0.02 absolute",
    "points": "5 points (a Δ in percent)",
    "exact": "any change",
}
# How a row folds the values of its repeats over seeds (intervals.FOLDS); none: the row
# keeps its own cell's value, or intervals.fold makes it.
FOLD = {"mean": "their mean", "max": "their maximum", "min": "their minimum", "sum": "their sum",
        "first": "the first seed's with a value", "any": "true if any is"}
# How a value reads on the terminal (renderers._screen_value).
SHOWS = ("number", "text", "percent", "status", "verdict", "collapse", "bottleneck")
# How an interval reads beside its value (renderers.interval_text): ``1.234 ±1.8%``,
# ``-12.3% [-15.0, -9.4]``, ``+0.012 [-0.020, +0.044]``, ``0.78 [0.74, 0.82]``.
INTERVAL_STYLES = ("relative", "delta_percent", "delta", "rate")


def _one_of(options, *, optional: bool = True):
    def check(instance, attribute, value):
        if value not in options and not (optional and value is None):
            raise ValueError(f"column {getattr(instance, 'name', '?')!r}: {attribute.name}={value!r}, "
                             f"expected one of {', '.join(map(repr, options))}")
    return check


@attrs.frozen(kw_only=True)
class Interval:
    """The interval a column carries: its bound columns (``None``: ``<name>_lo`` /
    ``<name>_hi``), how it reads beside the value (:data:`INTERVAL_STYLES`), and the screen
    column it gets after its value's: ``header`` and ``drop`` rank."""

    style: str = attrs.field(default="relative", validator=_one_of(INTERVAL_STYLES, optional=False))
    header: str = "±"
    drop: int | None = None
    low: str | None = None
    high: str | None = None


@attrs.frozen(kw_only=True)
class ReportColumn:
    """One column of the report.

    ``tables``: the built-in tables that hold it (a plugin's spec names its own table).
    ``made``: where its number is made (:data:`MADE`); ``doc`` how, in a sentence of the
    generated documentation; ``reads``: the per-step metrics its making reads (the report
    gives a cell set that never logged one nulls).
    ``dtype``: its type in the per-cell frame (:data:`DTYPES`).
    On screen: ``header``, ``justify``, ``floor`` (cut down to, for free text; None: never
    cut), ``drop`` (its rank among the columns left out to fit, lowest first; None: never
    left out, as a verdict never is), ``shows`` (how the value reads, :data:`SHOWS`).
    Decisions: ``better`` (``lower`` / ``higher`` / None: ``sweep suggest`` needs it said),
    ``noise`` (compare's default rule, :data:`NOISE`; None: its 5 % of |a|), ``verdict``
    (the verdict column that says whether the column's Δ vs base is a finding),
    ``interval`` (its bounds, or None), ``fold`` (how repeats over seeds fold, :data:`FOLD`).
    """

    name: str
    tables: tuple[str, ...] = attrs.field(converter=tuple)
    made: str = attrs.field(validator=_one_of(MADE, optional=False))
    doc: str = ""
    reads: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    dtype: str = attrs.field(default="float", validator=_one_of(DTYPES, optional=False))
    header: str = attrs.field()
    justify: str = attrs.field(validator=_one_of(("left", "right", "center"), optional=False))
    floor: int | None = None
    drop: int | None = attrs.field(default=None)
    shows: str = attrs.field(validator=_one_of(SHOWS, optional=False))
    better: str | None = attrs.field(default=None, validator=_one_of(("lower", "higher")))
    noise: str | None = attrs.field(default=None, validator=_one_of(NOISE))
    verdict: str | None = None
    interval: Interval | None = None
    fold: str | None = attrs.field(default=None, validator=_one_of(FOLD))

    @header.default
    def _header(self) -> str:
        return self.name

    @justify.default
    def _justify(self) -> str:
        return "left" if self.dtype == "text" else "right"

    @shows.default
    def _shows(self) -> str:
        return "text" if self.dtype == "text" else "number"

    @drop.validator
    def _never_drop_a_verdict(self, attribute, value) -> None:
        # A number within the noise must read as such at any width.
        if value is not None and self.shows == "verdict":
            raise ValueError(f"column {self.name!r}: a verdict is never left out to fit (drop={value})")

    @property
    def bounds(self) -> tuple[str, str] | None:
        """The names of its interval's low and high columns, or None."""
        if self.interval is None:
            return None
        return (self.interval.low or f"{self.name}_lo", self.interval.high or f"{self.name}_hi")

    @property
    def columns(self) -> tuple[str, ...]:
        """The table columns this spec is the home of: itself, then its bounds."""
        return (self.name, *(self.bounds or ()))

    @property
    def screen(self) -> Column:
        """Its column on the terminal (``sweepkit.screen``)."""
        return Column(header=self.header, justify=self.justify, floor=self.floor, drop=self.drop)


# -- derived views ---------------------------------------------------------------------------


def by_name(specs: Iterable[ReportColumn]) -> dict[str, ReportColumn]:
    return {spec.name: spec for spec in specs}


def table_columns(specs: Iterable[ReportColumn], table: str) -> tuple[str, ...]:
    """The columns of ``table`` in order: each spec that names it, followed by its bounds."""
    return tuple(column for spec in specs if table in spec.tables for column in spec.columns)


def screen_columns(specs: Iterable[ReportColumn]) -> dict[str, Column]:
    """Column name -> how it shows on the terminal (the bounds show with their value)."""
    return {spec.name: spec.screen for spec in specs}


def interval_bounds(specs: Iterable[ReportColumn]) -> dict[str, tuple[str, str]]:
    """Value column -> its (low, high) bound columns, for the columns with an interval."""
    return {spec.name: spec.bounds for spec in specs if spec.bounds is not None}


def bound_names(specs: Iterable[ReportColumn]) -> frozenset[str]:
    return frozenset(bound for spec in specs for bound in spec.bounds or ())


def spreads(specs: Iterable[ReportColumn]) -> dict[str, tuple[str, int | None]]:
    """Value column -> (header, drop rank) of the screen column its interval gets."""
    return {spec.name: (spec.interval.header, spec.interval.drop) for spec in specs if spec.interval is not None}


def interval_styles(specs: Iterable[ReportColumn]) -> dict[str, str]:
    return {spec.name: spec.interval.style for spec in specs if spec.interval is not None}


def directions(specs: Iterable[ReportColumn]) -> dict[str, bool]:
    """Column name -> True where lower is better, for the columns with a known direction."""
    return {spec.name: spec.better == "lower" for spec in specs if spec.better is not None}


def noise_classes(specs: Iterable[ReportColumn]) -> dict[str, str]:
    """Column name -> its default noise rule's name (:data:`NOISE`), where it has one."""
    return {spec.name: spec.noise for spec in specs if spec.noise is not None}


def folds(specs: Iterable[ReportColumn]) -> dict[str, str]:
    """Column name -> how its seeds fold (:data:`FOLD`), where a rule does it."""
    return {spec.name: spec.fold for spec in specs if spec.fold is not None}


def shown_as(specs: Iterable[ReportColumn], shows: str) -> tuple[str, ...]:
    """The columns whose values read as ``shows`` on screen (``verdict``, ``percent``, ...)."""
    return tuple(spec.name for spec in specs if spec.shows == shows)


def metrics_read(specs: Iterable[ReportColumn]) -> tuple[str, ...]:
    """Every per-step metric the columns' making reads, in the columns' order, once."""
    return tuple(dict.fromkeys(metric for spec in specs for metric in spec.reads))


def row_types(specs: Iterable[ReportColumn], tables: Iterable[str] = BOTH) -> dict[str, str]:
    """Every column of ``tables`` (in the tables' order, each once) -> its dtype; a bound is
    a float."""
    specs = tuple(specs)
    dtypes = {column: "float" for spec in specs for column in spec.columns}
    dtypes.update((spec.name, spec.dtype) for spec in specs)
    names = dict.fromkeys(column for table in tables for column in table_columns(specs, table))
    return {name: dtypes[name] for name in names}


def owners(specs: Iterable[ReportColumn]) -> dict[str, list[str]]:
    """Table column -> the names of the specs that claim it (one, in a sound registry)."""
    claimed: dict[str, list[str]] = {}
    for spec in specs:
        for column in spec.columns:
            claimed.setdefault(column, []).append(spec.name)
    return claimed


def merge(*groups: Iterable[ReportColumn], where: str = "") -> dict[str, ReportColumn]:
    """The specs of ``groups`` by name (the built-in ones and those a plugin's tables bring):
    one spec named twice must be the same spec; a column claimed by two specs (a bound named
    as another's value) is an error."""
    merged: dict[str, ReportColumn] = {}
    for spec in (spec for group in groups for spec in group):
        if not isinstance(spec, ReportColumn):
            raise UsageError(f"report column{where}: expected a sweepkit.report.columns.ReportColumn, got {spec!r}")
        known = merged.get(spec.name)
        if known is not None and known != spec:
            raise UsageError(f"report column {spec.name!r}{where} is defined twice, differently")
        merged[spec.name] = spec
    twice = {column: names for column, names in owners(merged.values()).items() if len(names) > 1}
    if twice:
        raise UsageError(*(f"report column {column!r}{where} is claimed by {' and '.join(names)}"
                           for column, names in twice.items()))
    return merged


def column_docs(specs: Iterable[ReportColumn], width: int = 92) -> str:
    """The columns' documentation, a bullet a column, rendered from the specs (the tables'
    module docstring ends with it)."""
    lines = []
    for spec in specs:
        facts = [" / ".join(spec.tables), MADE[spec.made]]
        if spec.better is not None:
            facts.append(f"{spec.better} is better")
        if spec.bounds is not None:
            facts.append(f"``{spec.bounds[0]}`` / ``{spec.bounds[1]}``")
        text = f"- ``{spec.name}`` ({'; '.join(facts)}): {spec.doc}."
        if spec.fold is not None:
            text += f" Over seeds: {FOLD[spec.fold]}."
        if spec.noise is not None:
            text += f" Noise: {NOISE[spec.noise]}."
        lines.append(textwrap.fill(text, width=width, subsequent_indent="  ", break_on_hyphens=False))
    return "\n".join(lines)


# -- the built-in columns --------------------------------------------------------------------
# In the tables' order: the columns both tables share first and last, the throughput table's,
# then the accuracy table's. Windows: "first / last" is the mean over the first / last 10 %
# of the train steps that report the metric, at least 1 and at most 10 steps.

ONLY_THROUGHPUT, ONLY_ACCURACY = (THROUGHPUT_TABLE,), (ACCURACY_TABLE,)
_WINDOW = "over the {} 10 % of the train steps that report it (at least 1, at most 10 steps)"
_SHARE = ("mean of ``{}`` over the steps after warm-up, divided by the mean of ``timing/step`` over "
          "them: its share of the step")

COLUMNS: tuple[ReportColumn, ...] = (
    ReportColumn(name="cell", tables=BOTH, made="cell", dtype="text",
                 doc="the cell's id; the cells that repeat one over seeds are one row, under its id"),
    ReportColumn(name="status", tables=BOTH, made="cell", dtype="text", shows="status",
                 doc="the cell's outcome; a row of seeds takes theirs when they agree, else the first "
                     "that did not finish"),
    ReportColumn(name="seeds", tables=BOTH, made="intervals", dtype="integer", drop=2,
                 doc="how many runs the row's numbers rest on (none before any has numbers)"),
    ReportColumn(name="steps", tables=BOTH, made="train", dtype="integer", drop=3, noise="exact", fold="max",
                 doc="the last train step logged"),
    # -- throughput
    ReportColumn(name="sec_per_step", tables=ONLY_THROUGHPUT, made="intervals", reads=("timing/step",), header="s/step",
                 better="lower", noise="timing", verdict="verdict", interval=Interval(style="relative", drop=9),
                 doc="mean of ``timing/step`` over the steps after the warm-up its data shows "
                     "(``steadystate.warmup``: each process of a resumed run has its own), its interval "
                     "allowing for neighbouring steps being alike; over seeds, their mean and t interval"),
    ReportColumn(name="timed_steps", tables=ONLY_THROUGHPUT, made="intervals", dtype="integer", header="n", drop=4,
                 doc="how many steps ``sec_per_step`` rests on (over seeds, summed)"),
    ReportColumn(name="warmup_steps", tables=ONLY_THROUGHPUT, made="intervals", dtype="integer", header="warm", drop=1,
                 doc="how many steps were left out as warm-up"),
    ReportColumn(name="delta_vs_base_pct", tables=ONLY_THROUGHPUT, made="intervals", header="vs base", better="lower",
                 noise="points", verdict="verdict",
                 interval=Interval(style="delta_percent", header="Δ interval", drop=8, low="delta_vs_base_lo",
                                   high="delta_vs_base_hi"),
                 doc="``sec_per_step`` against the grid's ``base`` row in percent (negative is faster), its "
                     "interval (MOVER) at a level that holds for all the grid's comparisons with base at once"),
    ReportColumn(name="verdict", tables=ONLY_THROUGHPUT, made="intervals", dtype="text", shows="verdict",
                 doc="``faster`` / ``slower`` when the interval of ``delta_vs_base_pct`` excludes 0, else "
                     "``within noise``; ``inert`` when every knob the row changes was reported by its run "
                     "as having no effect; ``too few steps`` when a side has no interval; none for base"),
    ReportColumn(name="tok_per_s", tables=ONLY_THROUGHPUT, made="intervals", reads=("throughput/tokens_per_s",),
                 header="tok/s",
                 drop=7, better="higher", noise="timing", interval=Interval(style="relative", drop=3),
                 doc="mean of ``throughput/tokens_per_s`` over the steps ``sec_per_step`` rests on, with "
                     "its interval"),
    ReportColumn(name="gen_frac", tables=ONLY_THROUGHPUT, made="train", reads=("timing/generate", "timing/step"),
                 header="gen",
                 drop=6, shows="percent", noise="share", fold="mean", doc=_SHARE.format("timing/generate")),
    ReportColumn(name="train_frac", tables=ONLY_THROUGHPUT, made="train", reads=("timing/policy_train", "timing/step"),
                 header="train", drop=5, shows="percent", noise="share", fold="mean",
                 doc=_SHARE.format("timing/policy_train")),
    ReportColumn(name="sync_frac", tables=ONLY_THROUGHPUT, made="train", reads=("timing/sync_weights", "timing/step"),
                 header="sync", drop=2, shows="percent", noise="share", fold="mean",
                 doc=_SHARE.format("timing/sync_weights")),
    ReportColumn(name="ref_frac", tables=ONLY_THROUGHPUT, made="train", reads=("timing/ref", "timing/step"),
                 header="ref",
                 drop=1, shows="percent", noise="share", fold="mean", doc=_SHARE.format("timing/ref")),
    ReportColumn(name="teacher_frac", tables=ONLY_THROUGHPUT, made="train", reads=("timing/teacher", "timing/step"),
                 header="teacher", drop=6, shows="percent", noise="share", fold="mean",
                 doc=_SHARE.format("timing/teacher") + " (OPD's teacher scoring)"),
    ReportColumn(name="bottleneck", tables=ONLY_THROUGHPUT, made="row", dtype="text", header="bound", justify="right",
                 drop=8,
                 shows="bottleneck",
                 doc="the largest share of the step: ``generate-bound``, ``train-bound``, ``ref-bound``, "
                     "``teacher-bound`` or ``sync-bound``; none without a timing split"),
    ReportColumn(name="memory_peak_gb", tables=ONLY_THROUGHPUT, made="train", reads=("memory/peak_gb",),
                 header="mem GB", drop=3,
                 better="lower", noise="timing", fold="max", doc="maximum of ``memory/peak_gb``"),
    ReportColumn(name="gpu_hours", tables=ONLY_THROUGHPUT, made="cell", header="GPU h", drop=4, fold="sum",
                 doc="the cell's GPUs x the wall time of its attempts (none on CPU)"),
    # -- accuracy
    ReportColumn(name="reward_first", tables=ONLY_ACCURACY, made="train", reads=("reward/mean",), header="rew first",
                 drop=6,
                 noise="rate", fold="mean", doc="mean of ``reward/mean`` " + _WINDOW.format("first")),
    ReportColumn(name="reward_last", tables=ONLY_ACCURACY, made="train", reads=("reward/mean",), header="rew last",
                 better="higher", noise="rate", fold="mean", doc="mean of ``reward/mean`` " + _WINDOW.format("last")),
    ReportColumn(name="kl_first", tables=ONLY_ACCURACY, made="train", reads=("distill/token_kl_mean",),
                 header="kl first",
                 drop=6, fold="mean",
                 doc="mean of ``distill/token_kl_mean`` " + _WINDOW.format("first") + " (OPD; it should fall)"),
    ReportColumn(name="kl_last", tables=ONLY_ACCURACY, made="train", reads=("distill/token_kl_mean",), header="kl last",
                 better="lower", fold="mean", doc="mean of ``distill/token_kl_mean`` " + _WINDOW.format("last")),
    ReportColumn(name="pass_at_1", tables=ONLY_ACCURACY, made="eval", reads=("eval/pass_at_1",), header="pass@1",
                 drop=3,
                 better="higher", noise="rate", fold="mean", doc="``eval/pass_at_1`` of the last eval record"),
    ReportColumn(name="pass_at_k", tables=ONLY_ACCURACY, made="eval", reads=("eval/pass_at_k",), header="pass@k",
                 better="higher", noise="rate", verdict="pass_at_k_verdict",
                 interval=Interval(style="rate", header="interval", drop=5),
                 doc="``eval/pass_at_k`` of the last eval record; its interval and the mean over seeds by "
                     "``sweepkit.report.intervals``: the seeds' t interval, for one seed the seed spread the "
                     "grid measured elsewhere, else the eval's sampling error (Wilson, over ``eval_prompts``)"),
    ReportColumn(name="eval_k", tables=ONLY_ACCURACY, made="eval", reads=("eval/k",), dtype="integer", header="k",
                 drop=2,
                 noise="exact", fold="first", doc="``eval/k`` of the last eval record"),
    ReportColumn(name="eval_prompts", tables=ONLY_ACCURACY, made="eval", reads=("eval/prompts",), dtype="integer",
                 header="prompts", drop=2, fold="first",
                 doc="``eval/prompts`` of the last eval record: the held-out prompts pass@k rests on"),
    ReportColumn(name="pass_at_k_vs_base", tables=ONLY_ACCURACY, made="intervals", header="@k vs base", drop=9,
                 interval=Interval(style="delta", header="Δ interval", drop=9),
                 doc="``pass_at_k`` minus base's, its interval (MOVER) at the level of all the grid's "
                     "comparisons with base at once"),
    ReportColumn(name="pass_at_k_verdict", tables=ONLY_ACCURACY, made="intervals", dtype="text", header="@k verdict",
                 shows="verdict",
                 doc="``better`` / ``worse`` when the interval of ``pass_at_k_vs_base`` excludes 0, else as "
                     "``verdict``; ``1 seed`` where pass@k has no seed spread to rest on"),
    ReportColumn(name="pass_at_k_best", tables=ONLY_ACCURACY, made="eval", reads=("eval/pass_at_k",), header="best@k",
                 drop=4,
                 fold="max", doc="the highest ``eval/pass_at_k`` of any eval"),
    ReportColumn(name="pass_at_k_best_step", tables=ONLY_ACCURACY, made="eval", reads=("eval/pass_at_k",),
                 dtype="integer",
                 header="at", drop=3, doc="the step of ``pass_at_k_best`` (over seeds, the best seed's)"),
    ReportColumn(name="pass_at_k_per_gpu_hour", tables=ONLY_ACCURACY, made="run", header="@k/GPU h", drop=3,
                 fold="mean",
                 doc="the run's last ``pass_at_k`` over its ``gpu_hours``; none without GPU hours"),
    ReportColumn(name="entropy_first", tables=ONLY_ACCURACY, made="train", reads=("policy/entropy",),
                 header="ent first",
                 drop=2, fold="mean", doc="mean of ``policy/entropy`` " + _WINDOW.format("first")),
    ReportColumn(name="entropy_last", tables=ONLY_ACCURACY, made="train", reads=("policy/entropy",),
                 header="ent last", drop=4,
                 fold="mean", doc="mean of ``policy/entropy`` " + _WINDOW.format("last")),
    ReportColumn(name="entropy_min", tables=ONLY_ACCURACY, made="train", reads=("policy/entropy",), header="min ent",
                 drop=5,
                 fold="min", doc="minimum of ``policy/entropy``"),
    ReportColumn(name="entropy_collapse", tables=ONLY_ACCURACY, made="run", dtype="boolean", header="collapse",
                 shows="collapse", fold="any",
                 doc="``entropy_last`` below ``COLLAPSE_FRACTION`` (0.2) of ``entropy_first``: the seeds' "
                     "mandatory collapse guard"),
    ReportColumn(name="logratio_max", tables=ONLY_ACCURACY, made="train", reads=("policy/kl",), header="max logr",
                 drop=1,
                 fold="max", doc="maximum of ``policy/kl``: the update's drift from the sampling policy"),
    ReportColumn(name="grad_norm_max", tables=ONLY_ACCURACY, made="train", reads=("policy/grad_norm",),
                 header="max grad",
                 drop=1, fold="max", doc="maximum of ``policy/grad_norm``"),
    # -- both, last
    ReportColumn(name="note", tables=BOTH, made="cell", dtype="text", floor=16, drop=5,
                 doc="when the row's diff touches only knobs its run reported as having no effect (the "
                     "trainer's ``inert_knobs``), why a run stopped early (its ``stop`` record), and the "
                     "seeds left out while others finished"),
    ReportColumn(name="diff", tables=BOTH, made="cell", dtype="text", floor=16, drop=4,
                 doc="what the cell changes against base, ``key=value`` each"),
    ReportColumn(name="failure", tables=BOTH, made="cell", dtype="text", floor=16,
                 doc="why the cell failed (``sweepkit.run.failures``); for a row of seeds, the first that "
                     "failed, named"),
)
# The built-in specs by name, read-only: a default shared by every report.
BY_NAME: Mapping[str, ReportColumn] = MappingProxyType(by_name(COLUMNS))
