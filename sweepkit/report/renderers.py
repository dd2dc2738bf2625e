"""How the report's tables read: files (markdown, CSV, JSON, parquet) and the terminal.

Each table is written as it is, a column a number, to the machine formats; markdown and the
terminal show an interval beside its value, and the terminal fits the table to its width,
never leaving out a verdict (:data:`SCREEN`). ``sweepkit.report.builtin`` registers these
as the built-in formats. polars is imported only by the functions that run while a report is
made: this module is loaded by every ``sweep`` command.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from sweepkit.run.progress import status_text
from sweepkit.report.registry import GridReport
from sweepkit.screen import Column, print_table

# -- files ------------------------------------------------------------------------------


def write_atomic(path: Path, write: Callable[[Path], Any]) -> Path:
    """``write(temp)``, then the temp file renamed to ``path``: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    write(temp)
    temp.replace(path)
    return path


def table_files(extension: str, write: Callable[[Any, Path], Any]) -> Callable[[GridReport], list[Path]]:
    """A ``write`` of one file per table: ``<table>.<extension>``."""
    def write_all(report: GridReport) -> list[Path]:
        return [write_atomic(report.report_dir / f"{name}.{extension}", lambda path, frame=frame: write(frame, path))
                for name, frame in report.tables.items()]
    return write_all


def to_markdown(frame) -> str:
    """A markdown table; an interval shows in its value's cell (``1.234 ±1.8%``), not in
    columns of its own."""
    def cell(column: str, value, row: dict) -> str:
        if column in INTERVALS:
            low, high = INTERVALS[column]
            return interval_text(column, value, row.get(low), row.get(high))
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value).replace("|", "\\|")

    names = [name for name in frame.columns if name not in BOUNDS]
    lines = ["| " + " | ".join(names) + " |", "|" + "|".join("---" for _ in names) + "|"]
    lines += ["| " + " | ".join(cell(name, row[name], row) for name in names) + " |"
              for row in frame.iter_rows(named=True)]
    return "\n".join(lines) + "\n"


# -- stdout -----------------------------------------------------------------------------


def show_json(report: GridReport, console: Console) -> None:
    console.print(json.dumps({"grid": report.grid, "heading": report.heading,
                              "tables": {name: frame.to_dicts() for name, frame in report.shown_tables().items()}}),
                  markup=False, soft_wrap=True)


def show_csv(report: GridReport, console: Console) -> None:
    for frame in report.shown_tables().values():
        console.print(frame.write_csv(), markup=False, end="", soft_wrap=True)


def show_markdown(report: GridReport, console: Console) -> None:
    console.print(f"{report.grid}: {report.heading}", markup=False)
    for name, frame in report.shown_tables().items():
        console.print(f"## {report.grid}: {name}\n", markup=False)
        console.print(to_markdown(frame), markup=False)


def show_screen(report: GridReport, console: Console) -> None:
    console.print(f"{report.grid}: {report.heading}", markup=False, style="bold")
    for name, frame in report.shown_tables().items():
        # Columns no cell has a value in (no eval, no timing breakdown) are left out on
        # screen; the files keep every column.
        shown = frame.select(column for column in frame.columns
                             if column in ("cell", "status") or frame[column].null_count() < frame.height)
        print_screen_table(console, f"{report.grid}: {name}", shown)


# How each column of the tables shows on screen (the files keep the full names): a short
# header, and at a narrow width the diff and failure cut, then the columns of least use
# left out, lowest ``drop`` first (the diff before the timing split: a cell's id mostly
# says what it changes). The verdicts are never left out: a number within the noise must
# read as such at any width. A column not named here (a plugin's table) shows under its name.
SCREEN = {
    "cell": Column(header="cell"),
    "status": Column(header="status"),
    "seeds": Column(header="seeds", justify="right", drop=2),
    "steps": Column(header="steps", justify="right", drop=3),
    "sec_per_step": Column(header="s/step", justify="right"),
    "delta_vs_base_pct": Column(header="vs base", justify="right"),
    "verdict": Column(header="verdict"),
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
    "warmup_steps": Column(header="warm", justify="right", drop=1),
    "bottleneck": Column(header="bound", justify="right", drop=8),
    "gpu_hours": Column(header="GPU h", justify="right", drop=4),
    "note": Column(header="note", floor=16, drop=5),
    "pass_at_k_best": Column(header="best@k", justify="right", drop=4),
    "pass_at_k_best_step": Column(header="at", justify="right", drop=3),
    "pass_at_k_per_gpu_hour": Column(header="@k/GPU h", justify="right", drop=3),
    "pass_at_k_vs_base": Column(header="@k vs base", justify="right", drop=9),
    "pass_at_k_verdict": Column(header="@k verdict"),
    "eval_prompts": Column(header="prompts", justify="right", drop=2),
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
# Columns whose interval is shown beside them, in their own cell: value -> (low, high).
INTERVALS = {name: (f"{name}_lo", f"{name}_hi") for name in ("sec_per_step", "tok_per_s", "pass_at_k")}
INTERVALS.update({"delta_vs_base_pct": ("delta_vs_base_lo", "delta_vs_base_hi"),
                  "pass_at_k_vs_base": ("pass_at_k_vs_base_lo", "pass_at_k_vs_base_hi")})
BOUNDS = frozenset(bound for pair in INTERVALS.values() for bound in pair)
# Verdicts that are findings, and their colours; every other verdict reads dim.
FINDINGS = {"faster": "green", "better": "green", "slower": "red", "worse": "red"}


def _bound(value, fmt: str) -> str:
    return "?" if value is None else format(value, fmt)


def interval_text(column: str, value, low, high) -> str:
    """A value with its interval, as a person reads it: ``1.234 ±1.8%`` for a measure,
    ``-12.3% [-15.0, -9.4]`` for a Δ in percent, ``0.78 [0.74, 0.82]`` for a rate."""
    if value is None:
        return ""
    if column == "delta_vs_base_pct":
        text = f"{value:+.1f}%"
        return text if low is None and high is None else f"{text} [{_bound(low, '+.1f')}, {_bound(high, '+.1f')}]"
    if column == "pass_at_k_vs_base":
        text = f"{value:+.3f}"
        return text if low is None and high is None else f"{text} [{_bound(low, '+.3f')}, {_bound(high, '+.3f')}]"
    if column == "pass_at_k":
        text = f"{value:.3g}"
        return text if low is None or high is None else f"{text} [{low:.3g}, {high:.3g}]"
    text = f"{value:.4g}"
    if low is None or high is None or value == 0:
        return text
    return f"{text} ±{(high - low) / 2 / abs(value):.1%}"


def verdict_text(value) -> Text:
    if value is None:
        return Text("")
    return Text(value, style=f"bold {FINDINGS[value]}" if value in FINDINGS else "dim")


def spread_text(column: str, row: dict) -> str:
    """The interval of ``column`` in ``row`` on its own: ``±1.8%`` for a measure, the bounds
    of a Δ or a rate (``[-15.0, -9.4]``); empty without one."""
    text = interval_text(column, row.get(column), *(row.get(bound) for bound in INTERVALS[column]))
    value = interval_text(column, row.get(column), None, None)
    return text[len(value):].strip()


# The screen column of an interval, after its value's: (header, drop rank). The bounds go
# before the verdict and the values: a narrow terminal still says within noise.
SPREAD = {"sec_per_step": ("±", 9), "tok_per_s": ("±", 3), "delta_vs_base_pct": ("Δ interval", 8),
          "pass_at_k": ("interval", 5), "pass_at_k_vs_base": ("Δ interval", 9)}


def _screen_value(column: str, value) -> Text:
    if column in INTERVALS:
        return Text(interval_text(column, value, None, None))
    if value is None:
        return Text("")
    if column == "status":
        return status_text(value)
    if column in ("verdict", "pass_at_k_verdict"):
        return verdict_text(value)
    if column == "entropy_collapse":
        return Text("COLLAPSED", style="bold red") if value else Text("no")
    if column == "bottleneck":
        return Text(value.removesuffix("-bound"))
    if column in FRACTIONS:
        return Text(f"{value:.0%}")
    if isinstance(value, float):
        return Text(f"{value:.4g}")
    return Text(str(value))


def print_screen_table(console: Console, title: str, frame) -> None:
    """One report table fitted to the console (``sweepkit.screen``), a line a cell; an
    interval shows in a column after its value's (:data:`SPREAD`), not as two bounds."""
    columns, cells = [], []  # a screen column and how it reads a row
    for name in frame.columns:
        if name in BOUNDS:
            continue
        columns.append(SCREEN.get(name, Column(header=name)))
        cells.append(lambda row, name=name: _screen_value(name, row[name]))
        if name in SPREAD and any(bound in frame.columns for bound in INTERVALS[name]):
            header, rank = SPREAD[name]
            columns.append(Column(header=header, justify="right", drop=rank))
            cells.append(lambda row, name=name: Text(spread_text(name, row)))
    rows = [[cell(row) for cell in cells] for row in frame.iter_rows(named=True)]
    dropped = print_table(console, columns, rows, title=title)
    if dropped:
        console.print(f"left out to fit {console.width} columns: {', '.join(dropped)} (the files written have them)",
                      style="dim", markup=False)
