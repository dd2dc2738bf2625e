"""``sweep report``: a throughput table and an accuracy table per grid, from disk alone.

Each cell's metrics are scanned lazily by the one reader of per-step frames
(:func:`sweepkit.state.metrics.scan`: ``metrics.jsonl`` with ``scan_ndjson``; the
``WANDB_MIRROR`` lines of ``stdout.log`` when there is no such file), joined across cells
with ``concat(how="diagonal_relaxed")`` (cells log different metric sets), aggregated by
expressions built once, and collected only at the end. Every cell with a ``cell.json``
gets a row, also one that is still running, failed, or has no metrics yet; a cell whose
fresh attempt has not started yet (``--rerun`` mid-sweep) gets one with no numbers, since
the files it still holds are its earlier run's.

Each grid's tables are headed by the profile, model and device its runs used. The tables
and the formats are registrations (``sweepkit.report.renderers`` holds the built-in ones and says
what each writes): a plugin adds a table (a query over :class:`GridFrames`) or a format with
one hookimpl. Among the files, ``runs/<grid>/report/index.html`` is one self-contained page
(no script, no network: clusters are offline) with the tables, each cell's diff and the
reward, pass@k, entropy and sec/step curves of every cell (``sweepkit.report.html``).

How each number is made, column by column (train steps of one cell, ordered by step, one
record per step: a step logged twice by a resumed run counts once, the later record; this
list is rendered from the specs of ``sweepkit.report.columns``, where a column is defined):

"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import attrs
import polars as pl

from steadystate import LEVEL, check_level
from sweepkit.errors import ExitCode, UsageError
from sweepkit.report import intervals
from sweepkit.report.columns import (ACCURACY_TABLE, COLUMNS, THROUGHPUT_TABLE, column_docs, metrics_read, row_types,
                                     table_columns)
from sweepkit.report.html import CURVES
from sweepkit.report.registry import GridReport, ReportTable, columns_of, report_registry
from sweepkit.report.status import file_warnings, grid_order
from sweepkit.run import failures
from sweepkit.state import metrics
from sweepkit.state import records as st

if __doc__ is not None:  # None under python -OO
    __doc__ += column_docs(COLUMNS) + "\n"

REPORT_DIR = "report"
BASE_CELL = "base"

THROUGHPUT = table_columns(COLUMNS, THROUGHPUT_TABLE)
ACCURACY = table_columns(COLUMNS, ACCURACY_TABLE)
# The timing split's columns and the label of the one that dominates a step (in this order:
# the first of equal shares names it).
BOTTLENECKS = {"gen_frac": "generate-bound", "train_frac": "train-bound", "ref_frac": "ref-bound",
               "teacher_frac": "teacher-bound", "sync_frac": "sync-bound"}
# Entropy collapse: the last steps' mean entropy below this share of the first steps'.
COLLAPSE_FRACTION = 0.2
# The built-in tables' columns (sweepkit.report.renderers registers them); a library caller
# without a session (compare, suggest, the benchmark) gets these.
TABLES = {THROUGHPUT_TABLE: THROUGHPUT, ACCURACY_TABLE: ACCURACY}
BUILTIN_TABLES = {
    THROUGHPUT_TABLE: ReportTable.of_columns(THROUGHPUT, "step time with its interval, its split and the "
                                                         "bottleneck, Δ vs base with a verdict"),
    ACCURACY_TABLE: ReportTable.of_columns(ACCURACY, "reward, pass@k with its interval and Δ vs base, entropy "
                                                     "(collapse), KL and drift"),
}
# The types of the columns of a row (a cell, its repeats over seeds folded in).
POLARS_TYPES = {"text": pl.String, "integer": pl.Int64, "float": pl.Float64, "boolean": pl.Boolean}
ROW_SCHEMA = {name: POLARS_TYPES[dtype] for name, dtype in row_types(COLUMNS, TABLES).items()}

# What the HTML page draws, by step.
CURVE_METRICS = tuple(name for name, _ in CURVES)
# Every metric a column's making or a curve reads; a cell set that never logged one gets nulls.
USED_METRICS = tuple(dict.fromkeys((*metrics_read(COLUMNS), *CURVE_METRICS)))


def _by_step(column: str) -> pl.Expr:
    return pl.col(column).sort_by("step")


def _window_mean(column: str, last: bool) -> pl.Expr:
    values = _by_step(column).drop_nulls()
    k = (values.len() // 10).clip(1, 10)
    return values.slice(values.len() - k, k).mean() if last else values.slice(0, k).mean()


def _steady(column: str) -> pl.Expr:
    """``column`` over the train steps that are not warm-up (``sweepkit.report.intervals``)."""
    return pl.col(column).filter(~pl.col("warmup").fill_null(False))


def _frac(column: str) -> pl.Expr:
    return _steady(column).mean() / _steady("timing/step").mean()


# The expression of each column made by polars (``made`` train, eval, run or row in its
# spec), by name; the stage it runs in is its spec's.
AGGREGATES = {
    "steps": pl.col("step").max(),
    "gen_frac": _frac("timing/generate"),
    "train_frac": _frac("timing/policy_train"),
    "sync_frac": _frac("timing/sync_weights"),
    "ref_frac": _frac("timing/ref"),
    "teacher_frac": _frac("timing/teacher"),
    "memory_peak_gb": pl.col("memory/peak_gb").max(),
    "reward_first": _window_mean("reward/mean", last=False),
    "reward_last": _window_mean("reward/mean", last=True),
    "kl_first": _window_mean("distill/token_kl_mean", last=False),
    "kl_last": _window_mean("distill/token_kl_mean", last=True),
    "entropy_first": _window_mean("policy/entropy", last=False),
    "entropy_last": _window_mean("policy/entropy", last=True),
    "entropy_min": pl.col("policy/entropy").min(),
    "logratio_max": pl.col("policy/kl").max(),
    "grad_norm_max": pl.col("policy/grad_norm").max(),
    "pass_at_1": _by_step("eval/pass_at_1").drop_nulls().last(),
    "pass_at_k": _by_step("eval/pass_at_k").drop_nulls().last(),
    "eval_k": _by_step("eval/k").drop_nulls().last(),
    "eval_prompts": _by_step("eval/prompts").drop_nulls().last().cast(pl.Int64),
    "pass_at_k_best": pl.col("eval/pass_at_k").max(),
    "pass_at_k_best_step": pl.col("step").sort_by("eval/pass_at_k", descending=True, nulls_last=True).first(),
    "entropy_collapse": pl.when(pl.col("entropy_first").is_not_null() & pl.col("entropy_last").is_not_null())
    .then(pl.col("entropy_last") < COLLAPSE_FRACTION * pl.col("entropy_first")),
    "pass_at_k_per_gpu_hour": pl.when(pl.col("gpu_hours") > 0).then(pl.col("pass_at_k") / pl.col("gpu_hours")),
    # The largest share of the step, named; none without a timing split.
    "bottleneck": pl.when(pl.max_horizontal(*BOTTLENECKS).is_not_null())
    .then(pl.concat_list([pl.col(c).fill_null(-1.0) for c in BOTTLENECKS]).list.arg_max()
          .replace_strict(dict(enumerate(BOTTLENECKS.values())), return_dtype=pl.String)),
}


def _stage(made: str) -> tuple[pl.Expr, ...]:
    """The expressions of the columns made at ``made``, in the columns' order."""
    return tuple(AGGREGATES[spec.name].alias(spec.name) for spec in COLUMNS if spec.made == made)


TRAIN_AGGREGATES = _stage("train")  # over a cell's train steps
EVAL_AGGREGATES = _stage("eval")  # over its eval records
RUN_EXPRESSIONS = _stage("run")  # over a run's row of aggregates
ROW_EXPRESSIONS = _stage("row")  # over a row, its seeds folded in


def _diff_text(record) -> str:
    diff = (record or {}).get("diff") or {}
    return " ".join(f"{key}={json.dumps(after)}" for key, (_, after) in diff.items())


def gpu_hours(view) -> float | None:
    """GPUs x the wall time of every attempt; None for a cell without GPUs or attempts."""
    gpus = ((view.record or {}).get("launch") or {}).get("gpus") or 0
    attempts = view.state.attempts if view.state else ()
    seconds = sum(a.ended - a.started for a in attempts if a.started and a.ended)
    return gpus * seconds / 3600 if gpus and seconds else None


def run_records(view) -> tuple[dict, dict]:
    """The trainer's first ``info`` record of the cell's run (device, inert knobs) and its last
    ``stop`` record (why it ended before ``max_steps``), each {} where there is none: their
    strings and lists are no metrics, so the per-step frame does not hold them."""
    info, stop = {}, {}
    try:
        with open(view.directory / st.METRICS_FILE) as handle:
            for line in handle:
                if '"info"' not in line and '"stop"' not in line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("kind") == "info" and not info:
                    info = record
                elif record.get("kind") == "stop":
                    stop = record
    except OSError:
        pass
    return info, stop


def run_info(view) -> dict:
    """The trainer's ``info`` record of the cell's run, or {} (:func:`run_records`)."""
    return run_records(view)[0]


def is_inert(view, info: dict) -> bool:
    """Every knob the cell's diff touches was reported by its run as having no effect."""
    diff = set(((view.record or {}).get("diff") or {}))
    return bool(diff) and diff <= set(info.get("inert_knobs") or ())


def cell_note(view, info: dict | None = None, stop: dict | None = None) -> str | None:
    """``inert: …`` for a cell whose diff touches only knobs its run reported as having no
    effect (``info``: its first ``info`` record, read here when not given), and why the run
    stopped early (``stop``: its ``stop`` record)."""
    if info is None:
        info, stop = run_records(view)
    notes = []
    if is_inert(view, info):
        knobs = ", ".join(sorted((view.record or {}).get("diff") or {}))
        notes.append(f"inert: {knobs} had no effect in this run")
    if stop and stop.get("reason"):
        notes.append(f"stopped at step {stop.get('step')}: {stop['reason']}")
    return "; ".join(notes) or None


def grid_heading(views, infos: list[dict]) -> str:
    """``profile smoke · model tiny-random · device cpu``: what the grid's runs used."""
    profiles = sorted({(v.record or {}).get("profile") or "none" for v in views if v.record})
    models = sorted({str(((v.record or {}).get("config") or {}).get("model", "?")) for v in views if v.record})
    devices = sorted({str(info["device"]) for info in infos if info.get("device")})
    parts = [f"profile {', '.join(profiles)}", f"model {', '.join(models)}"]
    if devices:
        parts.append(f"device {', '.join(devices)}")
    return " · ".join(parts)


@attrs.frozen(kw_only=True)
class GridFrames:
    """One grid's frames, lazy: ``cells`` a row a cell in the grid's order with every
    built-in column (status, diff, failure, cost, every aggregate above and the intervals
    and verdicts of ``sweepkit.report.intervals``), the cells that repeat one over seeds folded into
    the first one's row; ``runs`` a row a cell as it ran, repeats apart (no intervals);
    ``steps`` a row per cell, kind (train, eval) and step with every numeric metric any cell
    logged (the ``USED_METRICS`` always, null where none did) and ``warmup`` (a train step
    left out as warm-up). Tables are queries over them; ``level`` is their intervals'."""

    grid: str
    cells: pl.LazyFrame
    runs: pl.LazyFrame
    steps: pl.LazyFrame
    heading: str
    diffs: Mapping[str, str]
    level: float = LEVEL


def grid_tables(grid_dir: Path, cells: list[Path] | None = None,
                tables: Mapping[str, ReportTable] = BUILTIN_TABLES, level: float = LEVEL) -> dict[str, pl.DataFrame]:
    """The tables of one grid dir (the built-in two by default), optionally only for some of
    its cells, with intervals at ``level``."""
    return collect_report(grid_frames(grid_dir, cells, level), tables, report_dir=grid_dir / REPORT_DIR).tables


def wide_table(tables: Mapping[str, pl.DataFrame]) -> pl.DataFrame:
    """The built-in tables as one frame, a row a cell (what ``compare`` and ``suggest`` read)."""
    throughput, accuracy = tables.get("throughput"), tables.get("accuracy")
    if throughput is None or accuracy is None:
        return throughput if accuracy is None else accuracy
    shared = [name for name in accuracy.columns if name in throughput.columns and name != "cell"]
    return throughput.join(accuracy.drop(shared), on="cell", how="left", maintain_order="left")


def grid_frames(grid_dir: Path, cells: list[Path] | None = None, level: float = LEVEL) -> GridFrames:
    """The frames of a grid dir (or of some of its cells), from one read of every cell;
    intervals at ``level``."""
    views = [st.view(directory) for directory in (cells if cells is not None else st.cell_dirs(grid_dir))]
    job_states = failures.job_records(views)  # failure classes of SLURM attempts need their job states
    views.sort(key=grid_order)  # as `sweep list` shows them, not by name
    records_of = [run_records(view) for view in views]
    infos = [info for info, _ in records_of]
    diffs = {view.name: _diff_text(view.record) for view in views}
    cell_info = pl.LazyFrame(
        {
            "cell": [view.name for view in views],
            "group": [(view.record or {}).get("group") or view.name for view in views],
            "status": [view.outcome for view in views],
            "diff": list(diffs.values()),
            "failure": [None if view.waiting else failures.failure_text(view, job_states) for view in views],
            "gpu_hours": [gpu_hours(view) for view in views],
            "note": [cell_note(view, info, stop) for view, (info, stop) in zip(views, records_of)],
            "inert": [is_inert(view, info) for view, info in zip(views, infos)],
        },
        schema={"cell": pl.String, "group": pl.String, "status": pl.String, "diff": pl.String,
                "failure": pl.String, "gpu_hours": pl.Float64, "note": pl.String, "inert": pl.Boolean},
    )
    # A cell waiting to start over keeps its earlier run's metrics until it starts: no
    # numbers of the attempt its row is about.
    kinds = pl.col("kind").is_in(["train", "eval", "info"])
    frames = [frame.filter(kinds).with_columns(pl.lit(view.name).alias("cell"))
              for view in views if not view.stale_files and (frame := metrics.scan(view.directory)) is not None]
    if frames:
        records = pl.concat(frames, how="diagonal_relaxed")
        present = records.collect_schema().names()
        records = records.with_columns(
            pl.lit(None, dtype=pl.Float64).alias(name) for name in USED_METRICS if name not in present)
    else:
        records = pl.LazyFrame(schema={"cell": pl.String, "kind": pl.String, "step": pl.Int64,
                                       **{name: pl.Float64 for name in USED_METRICS}})
    # Read once: the tables and the curves all start from these rows (polars would otherwise
    # plan one scan of every cell's file per branch). The estimates need every step in hand.
    records = records.collect()
    estimates, warm = intervals.run_estimates(records)
    records = (records.filter(pl.col("kind") != "info")
               .join(warm, on=["cell", "step"], how="left", maintain_order="left").lazy())
    train = records.filter(pl.col("kind") == "train").group_by("cell").agg(TRAIN_AGGREGATES)
    evals = records.filter(pl.col("kind") == "eval").group_by("cell").agg(EVAL_AGGREGATES)
    runs = (cell_info.join(train, on="cell", how="left", maintain_order="left")
            .join(evals, on="cell", how="left", maintain_order="left")
            .with_columns(RUN_EXPRESSIONS)).collect()
    rows = intervals.decide(intervals.fold(runs.to_dicts(), estimates), level)
    compared = sum(1 for row in rows if row["cell"] != BASE_CELL and row["delta_vs_base_pct"] is not None)
    heading = grid_heading(views, infos) + f" · {level:.0%} intervals" + (
        f"; Δ vs base: {level:.0%} for its {compared} comparisons at once" if compared > 1 else "")
    folded = pl.DataFrame([{name: row.get(name) for name in ROW_SCHEMA} for row in rows], schema=ROW_SCHEMA,
                          orient="row").with_columns(ROW_EXPRESSIONS)
    return GridFrames(grid=grid_dir.name, cells=folded.lazy(), runs=runs.lazy(), steps=records,
                      heading=heading, diffs=diffs, level=level)


def collect_report(frames: GridFrames, tables: Mapping[str, ReportTable], *, report_dir: Path,
                   shown: tuple[str, ...] | None = None) -> GridReport:
    """Every table and the curves' steps of a grid, collected in one pass."""
    queries = []
    for name, table in tables.items():
        query = table.build(frames)
        if not isinstance(query, (pl.LazyFrame, pl.DataFrame)):
            raise UsageError(f"report table {name!r}: its build returned {type(query).__name__}, not a polars frame")
        queries.append(query.lazy())
    curves = frames.steps.select("cell", "kind", "step", "warmup", *CURVE_METRICS).sort("cell", "step")
    try:
        *collected, steps = pl.collect_all([*queries, curves])
    except pl.exceptions.ColumnNotFoundError as error:
        raise UsageError(f"a report table reads a column no cell of {frames.grid} has: {error}".splitlines()[0]) \
            from None
    return GridReport(grid=frames.grid, heading=frames.heading, tables=dict(zip(tables, collected)),
                      shown=tuple(tables) if shown is None else shown, steps=steps, diffs=frames.diffs,
                      report_dir=report_dir, columns=columns_of(tables))


def interval_level(level) -> float:
    """``--level`` checked: a number in (0, 1); a UsageError naming the option otherwise."""
    try:
        if isinstance(level, str):
            try:
                level = float(level)
            except ValueError:
                pass
        return check_level(level, "--level")
    except ValueError as error:
        raise UsageError(f"{error} (0.95 for 95 % intervals)") from None


def group_by_grid(runs_dir: Path, specs) -> dict[Path, list[Path] | None]:
    """Grid dir -> the cell dirs asked for (None: all of them)."""
    try:
        directories = st.find_cell_dirs(runs_dir, specs)
    except ValueError as error:
        raise UsageError(str(error)) from None
    grids: dict[Path, list[Path] | None] = {}
    whole = not specs or all("::" not in str(spec) and not hasattr(spec, "grid_name") for spec in specs)
    for directory in directories:
        if whole:
            grids.setdefault(directory.parent, None)
        else:
            grids.setdefault(directory.parent, []).append(directory)
    return grids


def make_report(session, specs, fmt: str = "table", table: str | None = None, level: float = LEVEL) -> int:
    """Build, write and print the tables of the grids (or cells) named by ``specs``.

    Every registered table is made (``sweep_register_report_tables``); every registered
    format writes its files, and ``fmt`` prints (``sweep_register_report_formats``). A
    data-only format (csv, json) prints data alone on stdout, what was written on stderr.
    """
    level = interval_level(level)
    registry = report_registry(session)
    spec = registry.formats.get(fmt)
    if spec is None:
        raise UsageError(f"--format {fmt}: expected one of {', '.join(registry.formats)} (the registered formats)")
    if table is not None and table not in registry.tables:
        raise UsageError(f"--table {table}: expected one of {', '.join(registry.tables)} (the registered tables)")
    if spec.one_table and table is None:
        options = " or ".join(f"--table {name}" for name in registry.tables)
        raise UsageError(f"--format {fmt} prints one table: add {options} "
                         "(every table is written under runs/<grid>/report/ as well)")
    grids = group_by_grid(session.runs_dir, specs)
    if not grids:
        session.console.print(f"no runs under {session.display_path(session.runs_dir)}", markup=False)
        return ExitCode.NO_CELLS
    for grid_dir, cells in grids.items():
        for directory in cells if cells is not None else st.cell_dirs(grid_dir):
            for line in file_warnings(st.view(directory), session.display_path):
                session.err_console.print(f"WARNING: {line}", markup=False)
        report = collect_report(grid_frames(grid_dir, cells, level), registry.tables, report_dir=grid_dir / REPORT_DIR,
                                shown=None if table is None else (table,))
        written = [path for name, other in registry.formats.items()
                   if other.write is not None and (other.always or name == fmt) for path in other.write(report)]
        if spec.show is not None:
            spec.show(report, session.console)
        shown = ", ".join(session.display_path(path) for path in written)
        if spec.data_only:  # data only on stdout
            session.err_console.print(f"wrote {shown}", markup=False)
        else:
            session.console.print(f"wrote {shown}", markup=False, style="dim")
    return ExitCode.OK
