"""The report's registrations: what a table and a format are, and the registry of them.

A table is a polars query over a grid's frames (:class:`sweepkit.report.tables.GridFrames`);
a format writes files under ``runs/<grid>/report/`` and prints on stdout. Both are
registered through hooks (:func:`sweepkit.hookspec.sweep_register_report_tables`,
:func:`sweepkit.hookspec.sweep_register_report_formats`), as executors are;
``sweepkit.report.builtin`` registers the built-in ones. A table may bring the specs of its
own columns (:class:`sweepkit.report.columns.ReportColumn`: header, interval, direction,
noise), merged with the built-in ones for the renderers, ``suggest`` and ``compare``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console

from sweepkit.errors import UsageError
from sweepkit.report.columns import BY_NAME, ReportColumn, merge

STASH_KEY = "report.registry"


@attrs.frozen(kw_only=True)
class ReportTable:
    """``build(frames)`` returns a LazyFrame with a ``cell`` column, a row a cell, from a
    :class:`sweepkit.report.tables.GridFrames`; the report collects every table at once.
    ``columns``: the specs of the columns it adds to the built-in ones (how they show, their
    intervals, which direction is better, their noise rule); a column without one shows
    under its name and needs ``--lower`` / ``--higher`` in ``sweep suggest``."""

    build: Callable[[Any], Any]
    doc: str = ""
    columns: tuple[ReportColumn, ...] = attrs.field(default=(), converter=tuple)

    @classmethod
    def of_columns(cls, columns: tuple[str, ...], doc: str = "") -> "ReportTable":
        """A table of columns of the per-cell frame (:attr:`GridFrames.cells`)."""
        return cls(build=lambda frames: frames.cells.select(columns), doc=doc)


@attrs.frozen(kw_only=True)
class GridReport:
    """One grid's report as the formats get it: ``tables`` every registered table (polars
    DataFrames, by name), ``shown`` the names ``--table`` asked for (all by default),
    ``steps`` the per-step frame of the curves (``cell``, ``kind``, ``step`` and the
    metrics of ``sweepkit.report.html.CURVES``), ``diffs`` cell -> its diff against base,
    ``columns`` the specs of the columns by name (the built-in ones and the tables')."""

    grid: str
    heading: str
    tables: Mapping[str, Any]
    shown: tuple[str, ...]
    steps: Any
    diffs: Mapping[str, str]
    report_dir: Path
    columns: Mapping[str, ReportColumn] = BY_NAME

    def shown_tables(self) -> dict[str, Any]:
        return {name: self.tables[name] for name in self.shown}


@attrs.frozen(kw_only=True)
class ReportFormat:
    """``write(report)`` writes its files into ``report.report_dir`` and returns their paths;
    ``show(report, console)`` prints the format on stdout. ``always``: the files are written
    on every report, not only under ``--format`` this one. ``data_only``: stdout holds data
    alone (what was written is said on stderr). ``one_table``: it prints one table, so
    ``--table`` is needed."""

    write: Callable[[GridReport], list[Path]] | None = None
    show: Callable[[GridReport, Console], None] | None = None
    always: bool = True
    data_only: bool = False
    one_table: bool = False
    doc: str = ""


@attrs.define
class ReportRegistry:
    tables: dict[str, ReportTable] = attrs.field(factory=dict)
    formats: dict[str, ReportFormat] = attrs.field(factory=dict)

    def register_table(self, name: str, table: ReportTable) -> None:
        _check("report table", name, table, ReportTable, self.tables)
        columns_of({**self.tables, name: table})  # its columns clash with none: said at registration
        self.tables[name] = table

    def register_format(self, name: str, fmt: ReportFormat) -> None:
        _check("report format", name, fmt, ReportFormat, self.formats)
        self.formats[name] = fmt

    def columns(self) -> dict[str, ReportColumn]:
        """The specs of every column, by name: the built-in ones, then the tables'."""
        return columns_of(self.tables)


def columns_of(tables: Mapping[str, ReportTable]) -> dict[str, ReportColumn]:
    """The built-in columns' specs and those ``tables`` bring, by name; a column two of them
    define differently is a UsageError naming the table."""
    merged = dict(BY_NAME)
    for name, table in tables.items():
        merged = merge(merged.values(), table.columns, where=f" (report table {name!r})")
    return merged


def _check(kind: str, name: str, value, expected: type, known: dict) -> None:
    if name in known:
        raise UsageError(f"{kind} {name!r} is registered twice")
    if not isinstance(value, expected):
        raise UsageError(f"{kind} {name!r}: expected a sweepkit.report.registry.{expected.__name__}, got {value!r}")


def report_registry(session) -> ReportRegistry:
    """The tables and formats every plugin registered, asked for once a session."""
    registry = session.stash.get(STASH_KEY)
    if registry is None:
        registry = session.stash[STASH_KEY] = ReportRegistry()
        hook = session.pm.hook
        hook.sweep_register_report_tables.call_historic(kwargs={"register": registry.register_table})
        hook.sweep_register_report_formats.call_historic(kwargs={"register": registry.register_format})
    return registry
