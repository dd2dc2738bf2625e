"""The core's report plugin: the built-in tables and formats, registered.

- tables ``throughput`` and ``accuracy`` (``sweepkit.report.tables`` says how each number is made);
- formats ``table`` (fitted to the terminal; prints only), ``md`` (markdown), ``csv`` (one
  table, ``--table``, on stdout), ``json`` (one document a grid; its files are written only
  when asked for), ``parquet`` and ``html`` (one self-contained page, ``sweepkit.report.html``).
  Every format's files but json's are written on every report; ``--format`` picks what is printed.

polars is imported only by the functions that run while a report is made: this module is
loaded by every ``sweep`` command.
"""

from __future__ import annotations

from pathlib import Path

from sweepkit.hookspec import hookimpl
from sweepkit.report.registry import GridReport, ReportFormat
from sweepkit.report.renderers import markdown_files, show_csv, show_json, show_markdown, show_screen, table_files


def _write_page(report: GridReport) -> list[Path]:
    from sweepkit.report.html import write_page

    return [write_page(report.report_dir / "index.html", grid=report.grid, tables=report.tables,
                       steps=report.steps, diffs=report.diffs, heading=report.heading)]


# tryfirst: the built-in ones come first in the tables' and the formats' order.
@hookimpl(tryfirst=True)
def sweep_register_report_tables(register):
    from sweepkit.report.tables import BUILTIN_TABLES

    for name, table in BUILTIN_TABLES.items():
        register(name, table)


@hookimpl(tryfirst=True)
def sweep_register_report_formats(register):
    register("table", ReportFormat(show=show_screen, doc="the tables fitted to the terminal (prints only)"))
    register("csv", ReportFormat(write=table_files("csv", lambda frame, path: frame.write_csv(path)),
                                 show=show_csv, data_only=True, one_table=True, doc="one table as CSV (--table)"))
    register("md", ReportFormat(write=markdown_files, show=show_markdown, doc="markdown tables"))
    register("json", ReportFormat(write=table_files("json", lambda frame, path: frame.write_json(path)),
                                  show=show_json, always=False, data_only=True,
                                  doc="one JSON document a grid (its files only when asked for)"))
    register("parquet", ReportFormat(write=table_files("parquet", lambda frame, path: frame.write_parquet(path)),
                                     doc="parquet files (prints what was written)"))
    register("html", ReportFormat(write=_write_page, doc="one self-contained page with the curves (index.html)"))
