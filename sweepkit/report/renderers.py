"""How the report's tables read: files (markdown, CSV, JSON, parquet) and the terminal.

Each table is written as it is, a column a number, to the machine formats; markdown and the
terminal show an interval beside its value, and the terminal fits the table to its width,
never leaving out a verdict (:data:`SCREEN`). How a column reads (its header, drop rank,
interval) is its spec's (``sweepkit.report.columns``): the built-in ones, and those a
plugin's table brings (``GridReport.columns``). ``sweepkit.report.builtin`` registers these
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

from sweepkit.report import columns as report_columns
from sweepkit.report.columns import BY_NAME, COLUMNS, ReportColumn
from sweepkit.report.registry import GridReport
from sweepkit.run.progress import status_text
from sweepkit.screen import Column, print_table
from sweepkit.state.files import write_atomic

# -- files ------------------------------------------------------------------------------


def table_files(extension: str, write: Callable[[Any, Path], Any]) -> Callable[[GridReport], list[Path]]:
    """A ``write`` of one file per table: ``<table>.<extension>``."""
    def write_all(report: GridReport) -> list[Path]:
        return [write_atomic(report.report_dir / f"{name}.{extension}", lambda path, frame=frame: write(frame, path))
                for name, frame in report.tables.items()]
    return write_all


def to_markdown(frame, columns: Mapping[str, ReportColumn] = BY_NAME) -> str:
    """A markdown table; an interval shows in its value's cell (``1.234 ±1.8%``), not in
    columns of its own (``columns``: the specs that say which columns have one)."""
    intervals = report_columns.interval_bounds(columns.values())
    styles = report_columns.interval_styles(columns.values())

    def cell(column: str, value, row: dict) -> str:
        if column in intervals:
            low, high = intervals[column]
            return interval_text(column, value, row.get(low), row.get(high), style=styles[column])
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value).replace("|", "\\|")

    bounds = report_columns.bound_names(columns.values())
    names = [name for name in frame.columns if name not in bounds]
    lines = ["| " + " | ".join(names) + " |", "|" + "|".join("---" for _ in names) + "|"]
    lines += ["| " + " | ".join(cell(name, row[name], row) for name in names) + " |"
              for row in frame.iter_rows(named=True)]
    return "\n".join(lines) + "\n"


def markdown_files(report: GridReport) -> list[Path]:
    """``<table>.md`` per table, its intervals read by the report's column specs."""
    return table_files("md", lambda frame, path: Path(path).write_text(to_markdown(frame, report.columns)))(report)


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
        console.print(to_markdown(frame, report.columns), markup=False)


def show_screen(report: GridReport, console: Console) -> None:
    console.print(f"{report.grid}: {report.heading}", markup=False, style="bold")
    for name, frame in report.shown_tables().items():
        # Columns no cell has a value in (no eval, no timing breakdown) are left out on
        # screen; the files keep every column.
        shown = frame.select(column for column in frame.columns
                             if column in ("cell", "status") or frame[column].null_count() < frame.height)
        print_screen_table(console, f"{report.grid}: {name}", shown, report.columns)


# How each column of the tables shows on screen (the files keep the full names), from the
# columns' specs (sweepkit.report.columns): a short header, and at a narrow width the diff
# and failure cut, then the columns of least use left out, lowest ``drop`` first (the diff
# before the timing split: a cell's id mostly says what it changes). The verdicts are never
# left out: a number within the noise must read as such at any width. A column no spec
# names (a plugin's table that brings none) shows under its name.
SCREEN = report_columns.screen_columns(COLUMNS)
# Shares of the step's time, shown as percentages.
FRACTIONS = report_columns.shown_as(COLUMNS, "percent")
# Columns whose interval is shown beside them, in their own cell: value -> (low, high).
INTERVALS = report_columns.interval_bounds(COLUMNS)
BOUNDS = report_columns.bound_names(COLUMNS)
# How an interval reads beside its value, by column.
STYLES = report_columns.interval_styles(COLUMNS)
# The screen column of an interval, after its value's: (header, drop rank). The bounds go
# before the verdict and the values: a narrow terminal still says within noise.
SPREAD = report_columns.spreads(COLUMNS)
# Verdicts that are findings, and their colours; every other verdict reads dim.
FINDINGS = {"faster": "green", "better": "green", "slower": "red", "worse": "red"}


def _bound(value, fmt: str) -> str:
    return "?" if value is None else format(value, fmt)


def interval_text(column: str, value, low, high, *, style: str | None = None) -> str:
    """A value with its interval, as a person reads it (``style``, by default the built-in
    column's, ``sweepkit.report.columns.INTERVAL_STYLES``): ``1.234 ±1.8%`` for a measure,
    ``-12.3% [-15.0, -9.4]`` for a Δ in percent, ``0.78 [0.74, 0.82]`` for a rate."""
    if value is None:
        return ""
    style = style or STYLES.get(column, "relative")
    if style == "delta_percent":
        text = f"{value:+.1f}%"
        return text if low is None and high is None else f"{text} [{_bound(low, '+.1f')}, {_bound(high, '+.1f')}]"
    if style == "delta":
        text = f"{value:+.3f}"
        return text if low is None and high is None else f"{text} [{_bound(low, '+.3f')}, {_bound(high, '+.3f')}]"
    if style == "rate":
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


def spread_text(column: str, row: dict, spec: ReportColumn | None = None) -> str:
    """The interval of ``column`` in ``row`` on its own: ``±1.8%`` for a measure, the bounds
    of a Δ or a rate (``[-15.0, -9.4]``); empty without one (``spec``: the column's, by
    default the built-in one)."""
    spec = spec or BY_NAME[column]
    style = spec.interval.style
    text = interval_text(column, row.get(column), *(row.get(bound) for bound in spec.bounds), style=style)
    value = interval_text(column, row.get(column), None, None, style=style)
    return text[len(value):].strip()


def _screen_value(spec: ReportColumn | None, value) -> Text:
    if spec is not None and spec.interval is not None:
        return Text(interval_text(spec.name, value, None, None, style=spec.interval.style))
    if value is None:
        return Text("")
    shows = spec.shows if spec is not None else "number"
    if shows == "status":
        return status_text(value)
    if shows == "verdict":
        return verdict_text(value)
    if shows == "collapse":
        return Text("COLLAPSED", style="bold red") if value else Text("no")
    if shows == "bottleneck":
        return Text(value.removesuffix("-bound"))
    if shows == "percent":
        return Text(f"{value:.0%}")
    if isinstance(value, float):
        return Text(f"{value:.4g}")
    return Text(str(value))


def print_screen_table(console: Console, title: str, frame, columns: Mapping[str, ReportColumn] = BY_NAME) -> None:
    """One report table fitted to the console (``sweepkit.screen``), a line a cell; an
    interval shows in a column after its value's (its spec's ``interval``), not as two
    bounds. ``columns``: the specs of the columns, by name (a column without one shows
    under its name, as a number or text)."""
    bounds = report_columns.bound_names(columns.values())
    screen, cells = [], []  # a screen column and how it reads a row
    for name in frame.columns:
        if name in bounds:
            continue
        spec = columns.get(name)
        screen.append(spec.screen if spec is not None else Column(header=name))
        cells.append(lambda row, name=name, spec=spec: _screen_value(spec, row[name]))
        if spec is not None and spec.interval is not None and any(bound in frame.columns for bound in spec.bounds):
            screen.append(Column(header=spec.interval.header, justify="right", drop=spec.interval.drop))
            cells.append(lambda row, name=name, spec=spec: Text(spread_text(name, row, spec)))
    rows = [[cell(row) for cell in cells] for row in frame.iter_rows(named=True)]
    dropped = print_table(console, screen, rows, title=title)
    if dropped:
        console.print(f"left out to fit {console.width} columns: {', '.join(dropped)} (the files written have them)",
                      style="dim", markup=False)
