"""``sweep report``: a throughput table and an accuracy table per grid, from disk alone.

Each cell's metrics are scanned lazily (``metrics.jsonl`` with ``scan_ndjson``; the
``WANDB_MIRROR`` lines of ``stdout.log`` when there is no such file), joined across cells
with ``concat(how="diagonal_relaxed")`` (cells log different metric sets), aggregated by
expressions built once, and collected only at the end. Every cell with a ``cell.json``
gets a row, also one that is still running, failed, or has no metrics yet; a cell whose
fresh attempt has not started yet (``--rerun`` mid-sweep) gets one with no numbers, since
the files it still holds are its earlier run's.

How the numbers are made (train steps of one cell, ordered by step, one record per step:
a step logged twice by a resumed run counts once, the later record):

- ``sec_per_step``: median of ``timing/step`` after warm-up; warm-up is the first 10% of
  the steps and at least the first step (none when there is only one step);
- ``tok_per_s``: median of ``throughput/tokens_per_s`` over the same steps;
- ``gen_frac`` / ``train_frac`` / ``sync_frac`` / ``ref_frac`` / ``teacher_frac``: mean of
  ``timing/generate`` / ``timing/policy_train`` / ``timing/sync_weights`` / ``timing/ref`` /
  ``timing/teacher`` (OPD's teacher scoring) divided by mean of ``timing/step``, over the
  same steps;
- ``delta_vs_base_pct``: ``sec_per_step`` against the grid's ``base`` cell, in percent
  (negative is faster);
- ``reward_first`` / ``reward_last``: mean ``reward/mean`` over the first / last 10% of the
  steps that report it, at least 1 and at most 10 steps;
- ``kl_first`` / ``kl_last``: the same windows of ``distill/token_kl_mean`` (OPD; it
  should fall);
- ``pass_at_1`` / ``pass_at_k`` / ``eval_k``: from the last eval record;
- ``entropy_min``: minimum of ``policy/entropy``; ``entropy_first`` / ``entropy_last``: its
  first / last windows as for the reward; ``entropy_collapse``: ``entropy_last`` below
  ``COLLAPSE_FRACTION`` (0.2) of ``entropy_first`` (the seeds' mandatory collapse guard);
  ``logratio_max``: maximum of ``policy/kl`` (the update's drift from the sampling
  policy); ``grad_norm_max``: maximum of ``policy/grad_norm``; ``memory_peak_gb``: maximum
  of ``memory/peak_gb``;
- ``timed_steps`` / ``sec_per_step_sd``: how many steps ``sec_per_step`` rests on and their
  standard deviation; ``note`` says when a vs-base figure rests on one timed step, and
  when a cell's diff touches only knobs its run reported as having no effect (the
  trainer's ``inert_knobs``);
- ``bottleneck``: the largest share of the timing split (generate-, train-, ref-,
  teacher- or sync-bound);
- ``gpu_hours``: the cell's GPUs x the wall time of its attempts (none on CPU);
  ``pass_at_k_per_gpu_hour``: the last ``pass_at_k`` over it; ``pass_at_k_best`` /
  ``pass_at_k_best_step``: the best eval and its step.

Each grid's tables are headed by the profile, model and device its runs used. Besides the
parquet, csv and markdown files, ``runs/<grid>/report/index.html`` is one self-contained
page (no script, no network: clusters are offline) with the tables, each cell's diff and
the reward, pass@k, entropy and sec/step curves of every cell (``sweepkit.html_report``).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl
from rich.text import Text

from sweepkit import failures, metrics
from sweepkit import state as st
from sweepkit.errors import UsageError
from sweepkit.html_report import CURVES, write_page
from sweepkit.progress import status_text
from sweepkit.session import ExitCode
from sweepkit.status import file_warnings, grid_order
from sweepkit.tables import Column, print_table

FORMATS = ("table", "csv", "md", "json", "parquet")
REPORT_DIR = "report"
BASE_CELL = "base"

THROUGHPUT = ("cell", "status", "steps", "sec_per_step", "timed_steps", "sec_per_step_sd", "delta_vs_base_pct",
              "tok_per_s", "gen_frac", "train_frac", "sync_frac", "ref_frac", "teacher_frac", "bottleneck",
              "memory_peak_gb", "gpu_hours", "note", "diff", "failure")
ACCURACY = ("cell", "status", "steps", "reward_first", "reward_last", "kl_first", "kl_last", "pass_at_1",
            "pass_at_k", "eval_k", "pass_at_k_best", "pass_at_k_best_step", "pass_at_k_per_gpu_hour",
            "entropy_first", "entropy_last", "entropy_min", "entropy_collapse", "logratio_max", "grad_norm_max",
            "diff", "failure")
# The timing split's columns and the label of the one that dominates a step.
BOTTLENECKS = {"gen_frac": "generate-bound", "train_frac": "train-bound", "ref_frac": "ref-bound",
               "teacher_frac": "teacher-bound", "sync_frac": "sync-bound"}
# Entropy collapse: the last steps' mean entropy below this share of the first steps'.
COLLAPSE_FRACTION = 0.2
# Columns only some runs have (OPD's teacher): left out of a printed table where every row is empty.
OPTIONAL = ("teacher_frac", "kl_first", "kl_last")
TABLES = {"throughput": THROUGHPUT, "accuracy": ACCURACY}

# What the HTML page draws, by step.
CURVE_METRICS = tuple(name for name, _ in CURVES)
# Every metric an expression below reads; a cell set that never logged one gets nulls.
USED_METRICS = ("timing/step", "timing/generate", "timing/policy_train", "timing/sync_weights", "timing/ref",
                "timing/teacher", "distill/token_kl_mean",
                "throughput/tokens_per_s", "reward/mean", "policy/entropy", "policy/grad_norm", "policy/kl",
                "memory/peak_gb", "eval/pass_at_1", "eval/pass_at_k", "eval/k")


def _by_step(column: str) -> pl.Expr:
    return pl.col(column).sort_by("step")


def _after_warmup(column: str) -> pl.Expr:
    n = pl.len()
    warmup = pl.when(n > 1).then(pl.max_horizontal(pl.lit(1), n // 10)).otherwise(0)
    return _by_step(column).slice(warmup)


def _window_mean(column: str, last: bool) -> pl.Expr:
    values = _by_step(column).drop_nulls()
    k = (values.len() // 10).clip(1, 10)
    return values.slice(values.len() - k, k).mean() if last else values.slice(0, k).mean()


def _frac(column: str) -> pl.Expr:
    return _after_warmup(column).mean() / _after_warmup("timing/step").mean()


TRAIN_AGGREGATES = (
    pl.col("step").max().alias("steps"),
    _after_warmup("timing/step").median().alias("sec_per_step"),
    _after_warmup("timing/step").drop_nulls().len().alias("timed_steps"),
    _after_warmup("timing/step").std().alias("sec_per_step_sd"),
    _after_warmup("throughput/tokens_per_s").median().alias("tok_per_s"),
    _frac("timing/generate").alias("gen_frac"),
    _frac("timing/policy_train").alias("train_frac"),
    _frac("timing/sync_weights").alias("sync_frac"),
    _frac("timing/ref").alias("ref_frac"),
    _frac("timing/teacher").alias("teacher_frac"),
    pl.col("memory/peak_gb").max().alias("memory_peak_gb"),
    _window_mean("reward/mean", last=False).alias("reward_first"),
    _window_mean("reward/mean", last=True).alias("reward_last"),
    _window_mean("distill/token_kl_mean", last=False).alias("kl_first"),
    _window_mean("distill/token_kl_mean", last=True).alias("kl_last"),
    _window_mean("policy/entropy", last=False).alias("entropy_first"),
    _window_mean("policy/entropy", last=True).alias("entropy_last"),
    pl.col("policy/entropy").min().alias("entropy_min"),
    pl.col("policy/kl").max().alias("logratio_max"),
    pl.col("policy/grad_norm").max().alias("grad_norm_max"),
)
EVAL_AGGREGATES = (
    _by_step("eval/pass_at_1").drop_nulls().last().alias("pass_at_1"),
    _by_step("eval/pass_at_k").drop_nulls().last().alias("pass_at_k"),
    _by_step("eval/k").drop_nulls().last().alias("eval_k"),
    pl.col("eval/pass_at_k").max().alias("pass_at_k_best"),
    pl.col("step").sort_by("eval/pass_at_k", descending=True, nulls_last=True).first().alias("pass_at_k_best_step"),
)
# The largest share of the step, named; none without a timing split.
BOTTLENECK = (
    pl.when(pl.max_horizontal(*BOTTLENECKS).is_not_null())
    .then(pl.concat_list([pl.col(c).fill_null(-1.0) for c in BOTTLENECKS]).list.arg_max()
          .replace_strict(dict(enumerate(BOTTLENECKS.values())), return_dtype=pl.String))
).alias("bottleneck")
COLLAPSE = (
    pl.when(pl.col("entropy_first").is_not_null() & pl.col("entropy_last").is_not_null())
    .then(pl.col("entropy_last") < COLLAPSE_FRACTION * pl.col("entropy_first"))
).alias("entropy_collapse")
PER_GPU_HOUR = (
    pl.when(pl.col("gpu_hours") > 0).then(pl.col("pass_at_k") / pl.col("gpu_hours"))
).alias("pass_at_k_per_gpu_hour")
# The base row is 0 by definition; computed, it can come out at -1e-14.
DELTA_VS_BASE = (
    pl.when(pl.col("cell") == BASE_CELL)
    .then(pl.when(pl.col("sec_per_step").is_not_null()).then(0.0))
    .otherwise((pl.col("sec_per_step") / pl.col("sec_per_step").filter(pl.col("cell") == BASE_CELL).first() - 1) * 100)
).alias("delta_vs_base_pct")


def scan_cell(directory: Path) -> pl.LazyFrame | None:
    """A cell's train and eval records as a LazyFrame (``kind``, ``step``, numeric metrics
    as Float64), one row per (kind, step), or None when it has no metrics yet."""
    found = metrics.source(directory)
    if found is None:
        return None
    kind, path = found
    frame = None
    if kind == "jsonl":
        frame = _scan_jsonl(path)
    if frame is None:  # stdout lines, or a metrics file polars cannot take as it is
        records = metrics.dedupe(metrics.PARSERS[kind](metrics.complete_text(path)[0].splitlines()))
        if not records:
            return None
        frame = pl.from_dicts(records, infer_schema_length=None).lazy()
    schema = frame.collect_schema()
    numeric = [name for name, dtype in schema.items() if dtype.is_numeric() and name != "step"]
    return (
        frame.filter(pl.col("kind").is_in(["train", "eval"]))
        .select(pl.col("kind"), pl.col("step").cast(pl.Int64), *(pl.col(name).cast(pl.Float64) for name in numeric))
        .unique(subset=["kind", "step"], keep="last", maintain_order=True)
    )


def _scan_jsonl(path: Path) -> pl.LazyFrame | None:
    with open(path, "rb") as handle:
        data = handle.read()
    if not data.strip():
        return None
    try:
        if data.endswith(b"\n"):
            frame = pl.scan_ndjson(path, infer_schema_length=None)
        else:  # the writer is mid-line: take the complete lines only
            frame = pl.read_ndjson(io.BytesIO(data[: data.rfind(b"\n") + 1]), infer_schema_length=None).lazy()
        schema = frame.collect_schema()
    except pl.exceptions.PolarsError:
        return None  # a damaged line in the middle: metrics.py's line-by-line reader skips it
    if "kind" not in schema or "step" not in schema:
        return None
    # A step that is not an integer on some line ("five") makes the column another type:
    # metrics.py's reader leaves that line out.
    return frame if schema["step"].is_integer() and schema["kind"] == pl.String else None


def _diff_text(record) -> str:
    diff = (record or {}).get("diff") or {}
    return " ".join(f"{key}={json.dumps(after)}" for key, (_, after) in diff.items())


def gpu_hours(view) -> float | None:
    """GPUs x the wall time of every attempt; None for a cell without GPUs or attempts."""
    gpus = ((view.record or {}).get("launch") or {}).get("gpus") or 0
    attempts = view.state.attempts if view.state else ()
    seconds = sum(a.ended - a.started for a in attempts if a.started and a.ended)
    return gpus * seconds / 3600 if gpus and seconds else None


def run_info(view) -> dict:
    """The trainer's ``info`` record of the cell's run (device, inert knobs), or {}."""
    path = view.directory / "metrics.jsonl"
    try:
        with open(path) as handle:
            for line in handle:
                record = json.loads(line)
                if record.get("kind") == "info":
                    return record
    except (OSError, ValueError):
        pass
    return {}


def cell_note(view, info: dict | None = None) -> str | None:
    """``inert: …`` for a cell whose diff touches only knobs its run reported as having no
    effect (``info``: its :func:`run_info`, read here when not given)."""
    diff = set(((view.record or {}).get("diff") or {}))
    inert = set((run_info(view) if info is None else info).get("inert_knobs") or ())
    if diff and diff <= inert:
        return "inert: " + ", ".join(sorted(diff)) + " had no effect in this run"
    return None


def _noise_note() -> pl.Expr:
    """A vs-base figure from one timed step (of the cell or of base) is noise: say so."""
    base_steps = pl.col("timed_steps").filter(pl.col("cell") == BASE_CELL).first()
    thin = (pl.col("timed_steps") < 2) | (base_steps < 2)
    noise = pl.when(thin & pl.col("delta_vs_base_pct").is_not_null() & (pl.col("cell") != BASE_CELL)).then(
        pl.lit("vs base rests on 1 timed step"))
    joined = pl.concat_str([pl.col("note"), noise], separator="; ", ignore_nulls=True)
    return pl.when(joined != "").then(joined).alias("note")


def grid_heading(views, infos: list[dict]) -> str:
    """``profile smoke · model tiny-random · device cpu``: what the grid's runs used."""
    profiles = sorted({(v.record or {}).get("profile") or "none" for v in views if v.record})
    models = sorted({str(((v.record or {}).get("config") or {}).get("model", "?")) for v in views if v.record})
    devices = sorted({str(info["device"]) for info in infos if info.get("device")})
    parts = [f"profile {', '.join(profiles)}", f"model {', '.join(models)}"]
    if devices:
        parts.append(f"device {', '.join(devices)}")
    return " · ".join(parts)


def grid_tables(grid_dir: Path, cells: list[Path] | None = None) -> dict[str, pl.DataFrame]:
    """The two tables of one grid dir, optionally only for some of its cells."""
    return grid_frames(grid_dir, cells)[0]


def grid_frames(grid_dir: Path, cells: list[Path] | None = None) -> tuple[dict[str, pl.DataFrame], pl.DataFrame, str]:
    """The tables, the per-step frame they came from (``cell``, ``kind``, ``step`` and the
    metrics the curves of the HTML page draw) and the grid's heading, from one read of
    every cell."""
    views = [st.view(directory) for directory in (cells if cells is not None else st.cell_dirs(grid_dir))]
    job_states = failures.job_records(views)  # failure classes of SLURM attempts need their job states
    views.sort(key=grid_order)  # as `sweep list` shows them, not by name
    infos = [run_info(view) for view in views]
    cell_info = pl.LazyFrame(
        {
            "cell": [view.name for view in views],
            "status": [view.outcome for view in views],
            "diff": [_diff_text(view.record) for view in views],
            "failure": [None if view.waiting else failures.failure_text(view, job_states) for view in views],
            "gpu_hours": [gpu_hours(view) for view in views],
            "note": [cell_note(view, info) for view, info in zip(views, infos)],
        },
        schema={"cell": pl.String, "status": pl.String, "diff": pl.String, "failure": pl.String,
                "gpu_hours": pl.Float64, "note": pl.String},
    )
    # A cell waiting to start over keeps its earlier run's metrics until it starts: no
    # numbers of the attempt its row is about.
    frames = [frame.with_columns(pl.lit(view.name).alias("cell"))
              for view in views if not view.stale_files and (frame := scan_cell(view.directory)) is not None]
    if frames:
        records = pl.concat(frames, how="diagonal_relaxed")
        present = records.collect_schema().names()
        records = records.with_columns(
            pl.lit(None, dtype=pl.Float64).alias(name) for name in USED_METRICS if name not in present)
    else:
        records = pl.LazyFrame(schema={"cell": pl.String, "kind": pl.String, "step": pl.Int64,
                                       **{name: pl.Float64 for name in USED_METRICS}})
    # Read once: the tables and the curves all start from these rows (polars would otherwise
    # plan one scan of every cell's file per branch).
    records = records.collect().lazy()
    train = records.filter(pl.col("kind") == "train").group_by("cell").agg(TRAIN_AGGREGATES)
    evals = records.filter(pl.col("kind") == "eval").group_by("cell").agg(EVAL_AGGREGATES)
    joined = (cell_info.join(train, on="cell", how="left", maintain_order="left")
              .join(evals, on="cell", how="left", maintain_order="left")
              .with_columns(DELTA_VS_BASE, BOTTLENECK, COLLAPSE, PER_GPU_HOUR)
              .with_columns(_noise_note()))
    curves = records.select("cell", "kind", "step", *(name for name in CURVE_METRICS)).sort("cell", "step")
    *both, steps = pl.collect_all([*(joined.select(columns) for columns in TABLES.values()), curves])
    return dict(zip(TABLES, both)), steps, grid_heading(views, infos)


def to_markdown(frame: pl.DataFrame) -> str:
    def cell(value) -> str:
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "|".join("---" for _ in frame.columns) + "|"]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in frame.iter_rows()]
    return "\n".join(lines) + "\n"


def write_tables(report_dir: Path, tables: dict[str, pl.DataFrame], fmt: str) -> list[Path]:
    """Write parquet, csv and markdown of each table (and json when asked for)."""
    report_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in tables.items():
        outputs = {"parquet": frame.write_parquet, "csv": frame.write_csv,
                   "md": lambda path, frame=frame: Path(path).write_text(to_markdown(frame))}
        if fmt == "json":
            outputs["json"] = frame.write_json
        for extension, write in outputs.items():
            path = report_dir / f"{name}.{extension}"
            temp = path.with_name(f".{path.name}.tmp")
            write(temp)
            temp.replace(path)
            written.append(path)
    return written


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


def make_report(session, specs, fmt: str = "table", table: str | None = None) -> int:
    """Build, print and write the tables of the grids (or cells) named by ``specs``.

    ``--format csv|json`` print data only, on stdout (what was written goes to stderr):
    csv one table (``--table``), json one document holding the tables asked for.
    """
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    if table is not None and table not in TABLES:
        raise UsageError(f"--table {table}: expected one of {', '.join(TABLES)}")
    if fmt == "csv" and table is None:
        raise UsageError("--format csv prints one table: add --table throughput or --table accuracy "
                         "(every table is written under runs/<grid>/report/ as well)")
    grids = group_by_grid(session.runs_dir, specs)
    if not grids:
        session.console.print(f"no runs under {session.display_path(session.runs_dir)}", markup=False)
        return ExitCode.NO_CELLS
    for grid_dir, cells in grids.items():
        for directory in cells if cells is not None else st.cell_dirs(grid_dir):
            for line in file_warnings(st.view(directory), session.display_path):
                session.err_console.print(f"WARNING: {line}", markup=False)
        tables, steps, heading = grid_frames(grid_dir, cells)
        written = write_tables(grid_dir / REPORT_DIR, tables, fmt)
        diffs = dict(zip(tables["throughput"]["cell"], tables["throughput"]["diff"]))
        written.append(write_page(grid_dir / REPORT_DIR / "index.html", grid=grid_dir.name, tables=tables,
                                  steps=steps, diffs=diffs, heading=heading))
        shown = {name: frame for name, frame in tables.items() if table in (None, name)}
        _print(session, grid_dir.name, heading, shown, fmt, written)
    return ExitCode.OK


def _print(session, grid: str, heading: str, tables: dict[str, pl.DataFrame], fmt: str,
           written: list[Path]) -> None:
    console = session.console
    if fmt == "json":
        console.print(json.dumps({"grid": grid, "heading": heading,
                                  "tables": {name: frame.to_dicts() for name, frame in tables.items()}}),
                      markup=False, soft_wrap=True)
    if fmt in ("table", "md"):
        console.print(f"{grid}: {heading}", markup=False, style="bold" if fmt == "table" else None)
    for name, frame in tables.items():
        if fmt == "table":
            # Columns no cell has a value in (no eval, no timing breakdown) are left out on
            # screen; the files keep every column.
            shown = frame.select(column for column in frame.columns
                                 if column in ("cell", "status") or frame[column].null_count() < frame.height)
            _print_table(console, f"{grid}: {name}", shown)
        elif fmt == "csv":
            console.print(frame.write_csv(), markup=False, end="", soft_wrap=True)
        elif fmt == "md":
            console.print(f"## {grid}: {name}\n", markup=False)
            console.print(to_markdown(frame), markup=False)
    shown = ", ".join(session.display_path(path) for path in written)
    if fmt in ("csv", "json"):  # data only on stdout
        session.err_console.print(f"wrote {shown}", markup=False)
    else:
        console.print(f"wrote {shown}", markup=False, style="dim" if fmt == "table" else None)


# How each column of the tables shows on screen (the files keep the full names): a short
# header, and at a narrow width the diff and failure cut, then the columns of least use
# left out, lowest ``drop`` first (the diff before the timing split: a cell's id mostly
# says what it changes).
SCREEN = {
    "cell": Column(header="cell"),
    "status": Column(header="status"),
    "steps": Column(header="steps", justify="right"),
    "sec_per_step": Column(header="s/step", justify="right"),
    "delta_vs_base_pct": Column(header="vs base", justify="right"),
    "tok_per_s": Column(header="tok/s", justify="right", drop=7),
    "gen_frac": Column(header="gen", justify="right", drop=6),
    "train_frac": Column(header="train", justify="right", drop=5),
    "sync_frac": Column(header="sync", justify="right", drop=2),
    "ref_frac": Column(header="ref", justify="right", drop=1),
    "teacher_frac": Column(header="teacher", justify="right", drop=6),
    "kl_first": Column(header="kl first", justify="right", drop=6),
    "kl_last": Column(header="kl last", justify="right"),
    "memory_peak_gb": Column(header="mem GB", justify="right", drop=3),
    "timed_steps": Column(header="n", justify="right", drop=4),
    "sec_per_step_sd": Column(header="±sd", justify="right", drop=3),
    "bottleneck": Column(header="bound", justify="right"),
    "gpu_hours": Column(header="GPU h", justify="right", drop=4),
    "note": Column(header="note", floor=16, drop=5),
    "pass_at_k_best": Column(header="best@k", justify="right", drop=4),
    "pass_at_k_best_step": Column(header="at", justify="right", drop=3),
    "pass_at_k_per_gpu_hour": Column(header="@k/GPU h", justify="right", drop=3),
    "entropy_first": Column(header="ent first", justify="right", drop=2),
    "entropy_last": Column(header="ent last", justify="right", drop=4),
    "entropy_collapse": Column(header="collapse", justify="right"),
    "logratio_max": Column(header="max logr", justify="right", drop=1),
    "reward_first": Column(header="rew first", justify="right", drop=6),
    "reward_last": Column(header="rew last", justify="right"),
    "pass_at_1": Column(header="pass@1", justify="right", drop=3),
    "pass_at_k": Column(header="pass@k", justify="right"),
    "eval_k": Column(header="k", justify="right", drop=2),
    "entropy_min": Column(header="min ent", justify="right", drop=5),
    "grad_norm_max": Column(header="max grad", justify="right", drop=1),
    "diff": Column(header="diff", floor=16, drop=4),
    "failure": Column(header="failure", floor=16),
}
# Shares of the step's time, shown as percentages.
FRACTIONS = ("gen_frac", "train_frac", "sync_frac", "ref_frac", "teacher_frac")


def _screen_value(column: str, value) -> Text:
    if value is None:
        return Text("")
    if column == "status":
        return status_text(value)
    if column == "delta_vs_base_pct":
        return Text(f"{value:+.1f}%")
    if column == "entropy_collapse":
        return Text("COLLAPSED", style="bold red") if value else Text("no")
    if column == "bottleneck":
        return Text(value.removesuffix("-bound"))
    if column in FRACTIONS:
        return Text(f"{value:.0%}")
    if isinstance(value, float):
        return Text(f"{value:.4g}")
    return Text(str(value))


def _print_table(console, title: str, frame: pl.DataFrame) -> None:
    frame = frame.drop([name for name in OPTIONAL if name in frame.columns and frame[name].is_null().all()])
    columns = [SCREEN.get(name, Column(header=name)) for name in frame.columns]
    rows = [[_screen_value(column, value) for column, value in row.items()] for row in frame.iter_rows(named=True)]
    dropped = print_table(console, columns, rows, title=title)
    if dropped:
        console.print(f"left out to fit {console.width} columns: {', '.join(dropped)} (the files written have them)",
                      style="dim", markup=False)
