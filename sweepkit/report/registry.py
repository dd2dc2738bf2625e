"""The report's registrations: what a table and a format are, and the registry of them.

A table is a polars query over a grid's frames (:class:`sweepkit.report.tables.GridFrames`);
a format writes files under ``runs/<grid>/report/`` and prints on stdout. Both are
registered through hooks (:func:`sweepkit.hookspec.sweep_register_report_tables`,
:func:`sweepkit.hookspec.sweep_register_report_formats`), as executors are;
``sweepkit.report.builtin`` registers the built-in ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console

from sweepkit.errors import UsageError

STASH_KEY = "report.registry"


@attrs.frozen(kw_only=True)
class ReportTable:
    """``build(frames)`` returns a LazyFrame with a ``cell`` column, a row a cell, from a
    :class:`sweepkit.report.tables.GridFrames`; the report collects every table at once."""

    build: Callable[[Any], Any]
    doc: str = ""

    @classmethod
    def of_columns(cls, columns: tuple[str, ...], doc: str = "") -> "ReportTable":
        """A table of columns of the per-cell frame (:attr:`GridFrames.cells`)."""
        return cls(build=lambda frames: frames.cells.select(columns), doc=doc)


@attrs.frozen(kw_only=True)
class GridReport:
    """One grid's report as the formats get it: ``tables`` every registered table (polars
    DataFrames, by name), ``shown`` the names ``--table`` asked for (all by default),
    ``steps`` the per-step frame of the curves (``cell``, ``kind``, ``step`` and the
    metrics of ``sweepkit.report.html.CURVES``), ``diffs`` cell -> its diff against base."""

    grid: str
    heading: str
    tables: Mapping[str, Any]
    shown: tuple[str, ...]
    steps: Any
    diffs: Mapping[str, str]
    report_dir: Path

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
        self.tables[name] = table

    def register_format(self, name: str, fmt: ReportFormat) -> None:
        _check("report format", name, fmt, ReportFormat, self.formats)
        self.formats[name] = fmt


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
