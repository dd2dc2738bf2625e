"""One self-contained HTML page per grid: what each cell changed against base, the curves, and the tables.

The page has no script, no stylesheet or font to fetch and no image file: clusters are
offline, and the page must open from a copied ``report/`` folder. Every chart is inline SVG
drawn here (matplotlib is not a dependency), and each cell keeps one colour on every chart.

The page is built so that a reader can decide from the pictures, not only look at them:

- **Against base** (``delta_chart.svg_delta_chart``, one per table of ``DELTA_CHARTS`` that
  has the columns): a row per cell other than base, in the tables' order, with a dot at its Δ
  and a whisker over its interval, against a line at 0. A cell whose verdict is a finding
  ("faster", "slower", "better", "worse") is drawn filled, in its colour; one whose
  verdict makes no call ("within noise", "inert", "too few steps", "1 seed") is drawn
  hollow and grey, so that a Δ that is only noise cannot pass for a result. The verdict
  is written at the row's end. A bound the report could not give (null: unbounded or
  unknown) is drawn as a dashed half-whisker to the axis' edge, ending in an arrow, and a
  runaway bound is cut at the edge with an arrow too, rather than squashing every other
  row to a dot.
- **Curves** (``charts.svg_chart``): one chart per metric, one line per cell, NaN and missing
  values left out, a cell with a single point drawn as a dot. On a time chart
  (``timing/*``) the steps the report flagged as warm-up (``warmup``: compile, CUDA-graph
  capture, the first length buckets) are drawn apart, as hollow markers, and the y axis
  is scaled to the steady steps: an 82 s compile step would otherwise make every cell's
  steady state a flat line at the bottom. A warm-up step above the axis is marked at the
  top edge and labelled with its value ("warm-up, off scale: 82 s"). A curve of more than
  ``charts.MAX_POINTS`` points is thinned (``charts.thin``: the first and last point, and
  the lowest and highest of each bucket of steps), so that a page of 100 cells x 10,000 steps
  stays a few MB and every spike shows.
- **Tables**: a value with an interval (``x`` with ``x_lo`` / ``x_hi``, or ``x_pct`` with
  ``x_lo`` / ``x_hi``) reads ``1.234 [1.20, 1.27]`` in one cell, its bound columns left
  out; a verdict that makes no call is grey and italic.

A column the frames lack (an older report, a plugin's table) leaves its chart or marking
out, and a note on the page says so. The charts are drawn by ``sweepkit.report.charts``
(the axes and the curves) and ``sweepkit.report.delta_chart``; this module lays out the page.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

import polars as pl

from sweepkit.report.charts import GREY, MAX_WARMUP_MARKERS, PALETTE, finite, svg_chart, thin
from sweepkit.report.delta_chart import DELTA_CHARTS, FINDINGS, NO_CALL, DeltaRow, svg_delta_chart
from sweepkit.state.files import write_atomic

# (column of the per-step frame, chart title)
CURVES = (
    ("reward/mean", "reward (reward/mean)"),
    ("eval/pass_at_k", "pass@k (eval/pass_at_k)"),
    ("policy/entropy", "entropy (policy/entropy)"),
    ("timing/step", "sec/step (timing/step)"),
)
# The per-step frame's flag of a train step the report left out as warm-up.
WARMUP = "warmup"

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; margin-bottom: 0.2em; }
.heading { color: #555; margin-top: 0; }
.charts { display: flex; flex-wrap: wrap; gap: 1em; }
.wide { overflow-x: auto; }
.note { color: #777; font-style: italic; }
table { border-collapse: collapse; margin-bottom: 1.5em; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.number { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td .interval { color: #666; }
td.verdict { white-space: nowrap; }
td.verdict.finding { font-weight: 600; }
td.verdict.no-call { color: #888; font-style: italic; }
code { font-size: 12px; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
"""


def _cell_order(tables: dict[str, pl.DataFrame], steps: pl.DataFrame, diffs: dict[str, str]) -> list[str]:
    """The tables' order (as ``sweep list`` shows cells), then any cell only the steps or diffs name."""
    names: dict[str, None] = {}
    for frame in tables.values():
        if "cell" in frame.columns:
            names.update(dict.fromkeys(frame["cell"].to_list()))
    if "cell" in steps.columns:
        names.update(dict.fromkeys(steps["cell"].unique(maintain_order=True).to_list()))
    names.update(dict.fromkeys(diffs))
    return list(names)


def _by_cell(points: pl.DataFrame, column: str, cells: list[str]) -> dict[str, list[tuple[float, float]]]:
    frames = points.partition_by("cell", as_dict=True) if points.height else {}
    return {cell: [] if (frame := frames.get((cell,))) is None else frame.select("step", column).rows()
            for cell in cells}


def _curves(steps: pl.DataFrame, cells: list[str]) -> tuple[list[str], list[str]]:
    """One chart per metric of ``CURVES`` that ``steps`` has, and a note for each it lacks.
    A time chart draws the warm-up steps apart and scales to the rest, where ``steps``
    says which they are."""
    charts, notes = [], []
    is_warmup = pl.col(WARMUP).eq(True).fill_null(False)  # null (an eval step, an older run) is steady
    for column, title in CURVES:
        if column not in steps.columns:
            notes.append(f'<p class="note">{escape(title)}: chart left out, no cell logged '
                         f"<code>{escape(column)}</code>.</p>")
            continue
        if not column.startswith("timing/"):
            charts.append(svg_chart(title, _by_cell(thin(steps, column), column, cells)))
        elif WARMUP in steps.columns:
            steady = _by_cell(thin(steps.lazy().filter(~is_warmup), column), column, cells)
            warm = _by_cell(thin(steps.lazy().filter(is_warmup), column, MAX_WARMUP_MARKERS), column, cells)
            charts.append(svg_chart(title, steady, warmup=warm, unit=" s"))
        else:
            charts.append(svg_chart(title, _by_cell(thin(steps, column), column, cells)))
            notes.append(f'<p class="note">{escape(title)}: the steps have no <code>{WARMUP}</code> column, so '
                         "warm-up steps are drawn as the others and may stretch the axis.</p>")
    return charts, notes


def _delta_charts(tables: dict[str, pl.DataFrame], colours: dict[str, str], base: str) -> tuple[list[str], list[str]]:
    """A Δ-vs-base chart per entry of :data:`DELTA_CHARTS` whose table has the columns, and a
    note for each left out or drawn without its intervals or verdicts."""
    charts, notes = [], []
    for spec in DELTA_CHARTS:
        frame = tables.get(spec.table)
        what = f"{escape(spec.title)} ({escape(spec.table)})"
        if frame is None:
            notes.append(f'<p class="note">{what}: chart left out, the report has no {escape(spec.table)} table.</p>')
            continue
        missing = [column for column in ("cell", spec.value) if column not in frame.columns]
        if missing:
            notes.append(f'<p class="note">{what}: chart left out, the table has no '
                         f"{' or '.join(f'<code>{escape(column)}</code>' for column in missing)} column.</p>")
            continue
        intervals = spec.low in frame.columns and spec.high in frame.columns
        if not intervals:
            notes.append(f'<p class="note">{what}: drawn without intervals, the table has no '
                         f"<code>{escape(spec.low)}</code> / <code>{escape(spec.high)}</code> columns.</p>")
        if spec.verdict not in frame.columns:
            notes.append(f'<p class="note">{what}: the table has no <code>{escape(spec.verdict)}</code> column, '
                         "so no Δ is drawn as a finding.</p>")
        rows = [DeltaRow(cell=row["cell"], colour=colours.get(row["cell"], GREY), delta=row[spec.value],
                         low=row.get(spec.low), high=row.get(spec.high), verdict=row.get(spec.verdict))
                for row in frame.iter_rows(named=True) if row["cell"] != base]
        if not rows:
            notes.append(f'<p class="note">{what}: no cell besides {escape(base)} to set against it.</p>')
            continue
        charts.append(svg_delta_chart(spec.title, rows, axis=spec.axis, percent=spec.percent, intervals=intervals))
    return charts, notes


def _format(column: str, value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if column.endswith("_pct"):
            return f"{value:+.1f}%"
        if column.endswith("_frac"):
            return f"{value:.0%}"
        if column.endswith("_vs_base"):
            return f"{value:+.4g}"
        return f"{value:.4g}"
    return str(value)


def _interval_columns(columns: list[str]) -> dict[str, tuple[str, str]]:
    """Value column -> its (low, high) bound columns: ``x`` with ``x_lo`` and ``x_hi``, or
    a percentage ``x_pct`` with ``x_lo`` and ``x_hi``."""
    present, pairs, taken = set(columns), {}, set()
    for column in columns:
        stem = column.removesuffix("_pct")
        low, high = f"{stem}_lo", f"{stem}_hi"
        if low in present and high in present and column not in taken and low not in taken:
            pairs[column] = (low, high)
            taken |= {low, high}
    return pairs


def _verdict_class(column: str, value) -> str:
    if column != "verdict" and not column.endswith("_verdict"):
        return ""
    return "verdict finding" if value in FINDINGS else "verdict no-call" if value in NO_CALL else "verdict"


def _table(name: str, frame: pl.DataFrame) -> str:
    """A table of the report: a value with bounds reads ``value [low, high]`` in one cell,
    the bounds' columns left out; a verdict cell carries its kind as a class."""
    numeric = {column for column, dtype in frame.schema.items() if dtype.is_numeric()}
    intervals = _interval_columns(frame.columns)
    bounds = {bound for pair in intervals.values() for bound in pair}
    shown = [column for column in frame.columns if column not in bounds]
    header = "".join(f"<th>{escape(column)}</th>" for column in shown)
    rows = []
    for row in frame.iter_rows(named=True):
        cells = []
        for column in shown:
            value = row[column]
            text = escape(_format(column, value))
            if column in intervals and text and any(finite(row[bound]) for bound in intervals[column]):
                low, high = (escape(_format(column, row[bound])) or "…" for bound in intervals[column])
                text += f' <span class="interval">[{low}, {high}]</span>'
            classes = " ".join(filter(None, ("number" if column in numeric else "", _verdict_class(column, value))))
            cells.append(f'<td class="{classes}">{text}</td>' if classes else f"<td>{text}</td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    body = "\n".join(rows)
    return (f"<h3>{escape(name)}</h3>\n<div class='wide'><table>\n<thead><tr>{header}</tr></thead>\n"
            f"<tbody>\n{body}\n</tbody>\n</table></div>")


def write_page(path: Path, *, grid: str, tables: dict[str, pl.DataFrame], steps: pl.DataFrame,
               diffs: dict[str, str], heading: str = "", base: str = "base") -> Path:
    """Write the grid's report page to ``path`` (via a temp file, so a reader never sees half
    a page) and return ``path``.

    :param grid: the grid's name, the page's title.
    :param tables: the report's frames by name, as ``report.grid_tables`` returns them; a
        table of :data:`DELTA_CHARTS` with its Δ columns gets a Δ-vs-base chart.
    :param steps: one row per cell and step: ``cell``, ``step``, any of the columns in
        ``CURVES`` and ``warmup``; a metric it lacks leaves its chart out, and no
        ``warmup`` leaves the time charts' warm-up unmarked, each with a note saying so.
    :param diffs: cell name -> what it changes against the base cell.
    :param heading: one line under the title (profile, model, device).
    :param base: the cell the others are set against, which gets no row in a Δ chart.
    """
    cells = _cell_order(tables, steps, diffs)
    colours = {cell: PALETTE[index % len(PALETTE)] for index, cell in enumerate(cells)}
    delta_charts, delta_notes = _delta_charts(tables, colours, base)
    charts, notes = _curves(steps, cells)
    diff_rows = "\n".join(f"<tr><td>{escape(cell)}</td><td><code>{escape(diffs.get(cell) or '')}</code></td></tr>"
                          for cell in cells)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        '<head>\n<meta charset="utf-8">',
        f"<title>sweep report: {escape(grid)}</title>",
        f"<style>{STYLE}</style>",
        "</head>",
        "<body>",
        f"<h1>{escape(grid)}</h1>",
        f'<p class="heading">{escape(heading)}</p>' if heading else "",
        "<h2>Against base</h2>",
        '<div class="charts">', *delta_charts, "</div>", *delta_notes,
        "<h2>Curves</h2>",
        '<div class="charts">', *charts, "</div>", *notes,
        "<h2>Tables</h2>",
        *(_table(name, frame) for name, frame in tables.items()),
        "<h2>Diff against base</h2>",
        f"<table>\n<thead><tr><th>cell</th><th>diff</th></tr></thead>\n<tbody>\n{diff_rows}\n</tbody>\n</table>",
        "</body>",
        "</html>",
    ]
    text = "\n".join(part for part in parts if part) + "\n"
    return write_atomic(path, lambda temp: temp.write_text(text, encoding="utf-8"))
