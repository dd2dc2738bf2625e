"""One self-contained HTML page per grid: the report's tables, each cell's diff, and curves.

The page has no script, no stylesheet or font to fetch and no image file: clusters are
offline, and the page must open from a copied ``report/`` folder. Curves are inline SVG
drawn here (matplotlib is not a dependency): one chart per metric, one line per cell in a
colour the cell keeps on every chart, NaN and missing values left out, a cell with a
single point drawn as a dot. A curve of more than :data:`MAX_POINTS` points is thinned
(:func:`thin`: the first and last point, and the lowest and highest of each bucket of
steps), so that a page of 100 cells x 10,000 steps stays a few MB and every spike shows.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

import polars as pl

from sweepkit.renderers import write_atomic

# (column of the per-step frame, chart title)
CURVES = (
    ("reward/mean", "reward (reward/mean)"),
    ("eval/pass_at_k", "pass@k (eval/pass_at_k)"),
    ("policy/entropy", "entropy (policy/entropy)"),
    ("timing/step", "sec/step (timing/step)"),
)
# Okabe-Ito, then Tableau: told apart also by most colour-blind readers.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#f0e442", "#000000",
           "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f")

# Points drawn per curve at most: a chart is 412 units wide, so more would not show.
MAX_POINTS = 500

# Room around the plot area, in SVG units: tick labels left and below, the title above.
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 24, 34
LEGEND_ROW = 16
CHAR_WIDTH = 6.5  # of the 11px legend font, roughly: enough to wrap the legend's rows
LEGEND_NAME_MAX = 28

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
td.number { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 12px; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
"""


def _tick_step(low: float, high: float, count: int = 5) -> float:
    """1, 2 or 5 times a power of ten: about ``count`` ticks over [low, high]."""
    raw = (high - low) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


def _nice_ticks(low: float, high: float) -> list[float]:
    """Round tick values inside [low, high]."""
    step = _tick_step(low, high)
    first = math.ceil(low / step - 1e-9)
    ticks = []
    while (value := (first + len(ticks)) * step) <= high + step * 1e-9:
        ticks.append(0.0 if abs(value) < step * 1e-9 else value)
    return ticks


def _span(values: list[float], *, rounded: bool = False) -> tuple[float, float]:
    """The axis' range: the values', or (``rounded``) widened out to the ticks around
    them, so that both ends carry a label."""
    low, high = min(values), max(values)
    if low == high:  # one value: give it room so it sits mid-axis
        pad = abs(low) * 0.1 or 0.5
        low, high = low - pad, high + pad
    if rounded:
        step = _tick_step(low, high)
        low, high = math.floor(low / step + 1e-9) * step, math.ceil(high / step - 1e-9) * step
    return low, high


def _tick_label(value: float) -> str:
    return f"{value:.4g}"


def _short(name: str) -> str:
    return name if len(name) <= LEGEND_NAME_MAX else name[: LEGEND_NAME_MAX - 1] + "…"


def svg_chart(title: str, series: dict[str, list[tuple[float, float]]], *, width: int = 480,
              height: int = 240) -> str:
    """An inline SVG line chart: one coloured polyline per series (``(x, y)`` points,
    non-finite ones left out; one point: a dot), axes with a few ticks, and a legend under
    the plot. The series' order picks their colours, so pass every chart the same names in
    the same order; a series with no points stays in the legend, marked "no data".

    ``width`` x ``height`` is the plot with its axes and title; the legend's rows add to
    the height of the viewBox.
    """
    clean = {name: sorted((float(x), float(y)) for x, y in points if math.isfinite(x) and math.isfinite(y))
             for name, points in series.items()}
    xs = [x for points in clean.values() for x, _ in points]
    ys = [y for points in clean.values() for _, y in points]
    plot_width, plot_height = width - LEFT - RIGHT, height - TOP - BOTTOM

    legend_labels = [_short(name) + ("" if points else " (no data)") for name, points in clean.items()]
    legend = _legend_positions(legend_labels, width, top=height + 6)
    total_height = max([y for _, y in legend], default=height - LEGEND_ROW) + LEGEND_ROW

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {total_height}" '
             f'width="{width}" height="{total_height}" role="img" aria-label="{escape(title)}">',
             f"<title>{escape(title)}</title>",
             f'<rect x="{LEFT}" y="{TOP}" width="{plot_width}" height="{plot_height}" fill="#fff" stroke="#999"/>',
             f'<text x="{LEFT}" y="{TOP - 8}" font-weight="bold">{escape(title)}</text>']
    if xs:
        x_low, x_high = _span(xs)
        y_low, y_high = _span(ys, rounded=True)

        def to_x(x: float) -> float:
            return round(LEFT + (x - x_low) / (x_high - x_low) * plot_width, 1)

        def to_y(y: float) -> float:
            return round(TOP + plot_height - (y - y_low) / (y_high - y_low) * plot_height, 1)

        bottom = TOP + plot_height
        for tick in _nice_ticks(x_low, x_high):
            x = to_x(tick)
            parts.append(f'<line x1="{x}" y1="{bottom}" x2="{x}" y2="{bottom + 4}" stroke="#999"/>')
            parts.append(f'<text x="{x}" y="{bottom + 16}" text-anchor="middle">{_tick_label(tick)}</text>')
        for tick in _nice_ticks(y_low, y_high):
            y = to_y(tick)
            parts.append(f'<line x1="{LEFT}" y1="{y}" x2="{LEFT + plot_width}" y2="{y}" stroke="#eee"/>')
            parts.append(f'<text x="{LEFT - 6}" y="{y + 4}" text-anchor="end">{_tick_label(tick)}</text>')
        parts.append(f'<text x="{LEFT + plot_width / 2}" y="{height - 4}" text-anchor="middle">step</text>')
    else:
        parts.append(f'<text x="{LEFT + plot_width / 2}" y="{TOP + plot_height / 2}" '
                     f'text-anchor="middle">no data</text>')

    for index, (name, points) in enumerate(clean.items()):
        colour = PALETTE[index % len(PALETTE)]
        label = escape(name)
        if len(points) == 1:
            x, y = points[0]
            parts.append(f'<circle cx="{to_x(x)}" cy="{to_y(y)}" r="3" fill="{colour}" '
                         f'data-cell="{label}"><title>{label}</title></circle>')
        elif points:
            coordinates = " ".join(f"{to_x(x)},{to_y(y)}" for x, y in points)
            parts.append(f'<polyline points="{coordinates}" fill="none" stroke="{colour}" stroke-width="1.8" '
                         f'stroke-linejoin="round" data-cell="{label}"><title>{label}</title></polyline>')
        legend_x, legend_y = legend[index]
        parts.append(f'<line x1="{legend_x}" y1="{legend_y}" x2="{legend_x + 16}" y2="{legend_y}" '
                     f'stroke="{colour}" stroke-width="3"/>')
        parts.append(f'<text x="{legend_x + 20}" y="{legend_y + 4}"><title>{label}</title>'
                     f"{escape(legend_labels[index])}</text>")
    parts.append("</svg>")
    return "\n".join(parts)


def _legend_positions(labels: list[str], width: int, *, top: float) -> list[tuple[float, float]]:
    """Where each legend entry (a colour swatch, then its label) starts: left to right,
    wrapping to a new row at the chart's right edge."""
    positions, x, y = [], LEFT, top
    for label in labels:
        entry = 28 + CHAR_WIDTH * len(label)
        if x > LEFT and x + entry > width - RIGHT:
            x, y = LEFT, y + LEGEND_ROW
        positions.append((x, y))
        x += entry
    return positions


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


def thin(steps: pl.DataFrame, column: str, max_points: int = MAX_POINTS) -> pl.DataFrame:
    """``cell``, ``step`` and ``column`` of the rows with a finite value, at most
    ``max_points`` a cell, in step order: a cell with more keeps its first and last point
    and, of each of ``(max_points - 2) // 2`` buckets of consecutive points, the lowest and
    the highest (a min/max decimation: the curve's envelope, its extremes and its end stay)."""
    buckets = max((max_points - 2) // 2, 1)
    points = (steps.lazy().select("cell", "step", column).filter(pl.col(column).is_finite())
              .sort("cell", "step")
              .with_columns(pl.int_range(pl.len()).over("cell").alias("_index"), pl.len().over("cell").alias("_count"))
              .with_columns((pl.col("_index") * buckets // pl.col("_count")).alias("_bucket")))
    within = pl.int_range(pl.len()).over("cell", "_bucket")
    keep = ((pl.col("_count") <= max_points) | (pl.col("_index") == 0) | (pl.col("_index") == pl.col("_count") - 1)
            | (within == pl.col(column).arg_min().over("cell", "_bucket"))
            | (within == pl.col(column).arg_max().over("cell", "_bucket")))
    return points.filter(keep).select("cell", "step", column).collect()


def _curves(steps: pl.DataFrame, cells: list[str]) -> tuple[list[str], list[str]]:
    """One chart per metric of ``CURVES`` that ``steps`` has, and a note for each it lacks."""
    charts, notes = [], []
    for column, title in CURVES:
        if column not in steps.columns:
            notes.append(f'<p class="note">{escape(title)}: chart left out, no cell logged '
                         f"<code>{escape(column)}</code>.</p>")
            continue
        points = thin(steps, column)
        by_cell = points.partition_by("cell", as_dict=True) if points.height else {}
        series = {}
        for cell in cells:
            frame = by_cell.get((cell,))
            series[cell] = [] if frame is None else frame.select("step", column).rows()
        charts.append(svg_chart(title, series))
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
        return f"{value:.4g}"
    return str(value)


NUMBER = ' class="number"'


def _table(name: str, frame: pl.DataFrame) -> str:
    numeric = {column for column, dtype in frame.schema.items() if dtype.is_numeric()}
    header = "".join(f"<th>{escape(column)}</th>" for column in frame.columns)
    rows = []
    for row in frame.iter_rows(named=True):
        cells = "".join(f"<td{NUMBER if column in numeric else ''}>{escape(_format(column, value))}</td>"
                        for column, value in row.items())
        rows.append(f"<tr>{cells}</tr>")
    body = "\n".join(rows)
    return (f"<h3>{escape(name)}</h3>\n<div class='wide'><table>\n<thead><tr>{header}</tr></thead>\n"
            f"<tbody>\n{body}\n</tbody>\n</table></div>")


def write_page(path: Path, *, grid: str, tables: dict[str, pl.DataFrame], steps: pl.DataFrame,
               diffs: dict[str, str], heading: str = "") -> Path:
    """Write the grid's report page to ``path`` (via a temp file, so a reader never sees half
    a page) and return ``path``.

    :param grid: the grid's name, the page's title.
    :param tables: the report's frames by name, as ``report.grid_tables`` returns them.
    :param steps: one row per cell and step: ``cell``, ``step`` and any of the columns in
        ``CURVES``; a column it lacks leaves its chart out, with a note saying so.
    :param diffs: cell name -> what it changes against the base cell.
    :param heading: one line under the title (profile, model, device).
    """
    cells = _cell_order(tables, steps, diffs)
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
