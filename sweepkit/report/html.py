"""One self-contained HTML page per grid: what each cell changed against base, the curves, and the tables.

The page has no script, no stylesheet or font to fetch and no image file: clusters are
offline, and the page must open from a copied ``report/`` folder. Every chart is inline SVG
drawn here (matplotlib is not a dependency), and each cell keeps one colour on every chart.

The page is built so that a reader can decide from the pictures, not only look at them:

- **Against base** (:func:`svg_delta_chart`, one per table of :data:`DELTA_CHARTS` that has
  the columns): a row per cell other than base, in the tables' order, with a dot at its Δ
  and a whisker over its interval, against a line at 0. A cell whose verdict is a finding
  ("faster", "slower", "better", "worse") is drawn filled, in its colour; one whose
  verdict makes no call ("within noise", "inert", "too few steps", "1 seed") is drawn
  hollow and grey, so that a Δ that is only noise cannot pass for a result. The verdict
  is written at the row's end. A bound the report could not give (null: unbounded or
  unknown) is drawn as a dashed half-whisker to the axis' edge, ending in an arrow, and a
  runaway bound is cut at the edge with an arrow too, rather than squashing every other
  row to a dot.
- **Curves** (:func:`svg_chart`): one chart per metric, one line per cell, NaN and missing
  values left out, a cell with a single point drawn as a dot. On a time chart
  (``timing/*``) the steps the report flagged as warm-up (``warmup``: compile, CUDA-graph
  capture, the first length buckets) are drawn apart, as hollow markers, and the y axis
  is scaled to the steady steps: an 82 s compile step would otherwise make every cell's
  steady state a flat line at the bottom. A warm-up step above the axis is marked at the
  top edge and labelled with its value ("warm-up, off scale: 82 s"). A curve of more than
  :data:`MAX_POINTS` points is thinned (:func:`thin`: the first and last point, and the
  lowest and highest of each bucket of steps), so that a page of 100 cells x 10,000 steps
  stays a few MB and every spike shows.
- **Tables**: a value with an interval (``x`` with ``x_lo`` / ``x_hi``, or ``x_pct`` with
  ``x_lo`` / ``x_hi``) reads ``1.234 [1.20, 1.27]`` in one cell, its bound columns left
  out; a verdict that makes no call is grey and italic.

A column the frames lack (an older report, a plugin's table) leaves its chart or marking
out, and a note on the page says so.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

import attrs
import polars as pl

from sweepkit.report.renderers import write_atomic

# (column of the per-step frame, chart title)
CURVES = (
    ("reward/mean", "reward (reward/mean)"),
    ("eval/pass_at_k", "pass@k (eval/pass_at_k)"),
    ("policy/entropy", "entropy (policy/entropy)"),
    ("timing/step", "sec/step (timing/step)"),
)
# The per-step frame's flag of a train step the report left out as warm-up.
WARMUP = "warmup"
# Okabe-Ito, then Tableau: told apart also by most colour-blind readers.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#f0e442", "#000000",
           "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f")
# What makes no call: drawn grey and hollow, never in a cell's colour.
GREY = "#8a8a8a"
# Every other row of a Δ chart, so that the eye follows a row from its name to its verdict.
ZEBRA = "#edf2f9"
# Inline, since the page's ``svg text`` rule would win over presentation attributes.
NO_CALL_TEXT = f"fill: {GREY}; font-style: italic"
# A white edge round a label drawn over the curves, so that it stays readable.
HALO = "paint-order: stroke; stroke: #fff; stroke-width: 3px; stroke-linejoin: round"

# Points drawn per curve at most: a chart is 412 units wide, so more would not show.
MAX_POINTS = 500
# Warm-up markers per cell at most: hollow circles, so a couple of dozen already fill a chart
# (a long warm-up is thinned as a curve is: its first and last step and its extremes stay).
MAX_WARMUP_MARKERS = 24

# Room around the plot area, in SVG units: tick labels left and below, the title above.
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 24, 34
LEGEND_ROW = 16
CHAR_WIDTH = 6.5  # of the 11px legend font, roughly: enough to wrap the legend's rows
LEGEND_NAME_MAX = 28
# A Δ chart: the cells' names left of the plot, the verdicts right of it, a row a cell.
DELTA_NAME_WIDTH, DELTA_VERDICT_WIDTH, DELTA_ROW = 124, 86, 20
DELTA_NAME_MAX = 18
# An interval that would widen the Δ axis more than this many times is cut at its edges.
DELTA_SQUASH = 3


@attrs.frozen(kw_only=True)
class DeltaChart:
    """Where a Δ-vs-base chart reads its numbers: a table of the report and its columns."""

    table: str
    value: str
    low: str
    high: str
    verdict: str
    title: str
    axis: str  # the x axis' label: what the Δ is and which side is good
    percent: bool  # the Δ is in percent (else in the metric's own unit)


DELTA_CHARTS = (
    DeltaChart(table="throughput", value="delta_vs_base_pct", low="delta_vs_base_lo", high="delta_vs_base_hi",
               verdict="verdict", title="sec/step vs base (%)", axis="Δ sec/step, % (negative is faster)",
               percent=True),
    DeltaChart(table="accuracy", value="pass_at_k_vs_base", low="pass_at_k_vs_base_lo",
               high="pass_at_k_vs_base_hi", verdict="pass_at_k_verdict", title="pass@k vs base",
               axis="Δ pass@k (positive is better)", percent=False),
)
# Verdicts that are a result; the others the report gives make no call.
FINDINGS = frozenset({"faster", "slower", "better", "worse"})
NO_CALL = frozenset({"within noise", "inert", "too few steps", "1 seed"})


@attrs.frozen(kw_only=True)
class DeltaRow:
    """One cell's row of a Δ chart; a bound or Δ the report could not give is None."""

    cell: str
    colour: str
    delta: float | None
    low: float | None
    high: float | None
    verdict: str | None


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


def _short(name: str, most: int = LEGEND_NAME_MAX) -> str:
    return name if len(name) <= most else name[: most - 1] + "…"


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _clean(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return sorted((float(x), float(y)) for x, y in points if _finite(x) and _finite(y))


def _value_range(values: list[float], unit: str) -> str:
    low, high = min(values), max(values)
    return f"{low:.3g}{unit}" if f"{low:.3g}" == f"{high:.3g}" else f"{low:.3g}–{high:.3g}{unit}"


def svg_chart(title: str, series: dict[str, list[tuple[float, float]]], *,
              warmup: dict[str, list[tuple[float, float]]] | None = None, unit: str = "", width: int = 480,
              height: int = 240) -> str:
    """An inline SVG line chart: one coloured polyline per series (``(x, y)`` points,
    non-finite ones left out; one point: a dot), axes with a few ticks, and a legend under
    the plot. The series' order picks their colours, so pass every chart the same names in
    the same order; a series with no points stays in the legend, marked "no data".

    ``warmup``: per series, points drawn apart as hollow markers that do not set the y
    axis (unless no series has another point); one past the axis is marked at the plot's
    edge, and a label gives the values off scale, in ``unit``.

    ``width`` x ``height`` is the plot with its axes and title; the legend's rows add to
    the height of the viewBox.
    """
    clean = {name: _clean(points) for name, points in series.items()}
    warm = {name: _clean((warmup or {}).get(name, [])) for name in series}
    xs = [x for points in (*clean.values(), *warm.values()) for x, _ in points]
    ys = [y for points in clean.values() for _, y in points] or [y for points in warm.values() for _, y in points]
    plot_width, plot_height = width - LEFT - RIGHT, height - TOP - BOTTOM
    bottom = TOP + plot_height

    legend_labels = [_short(name) + ("" if clean[name] else " (warm-up only)" if warm[name] else " (no data)")
                     for name in clean]
    any_warm = any(warm.values())
    legend = _legend_positions(legend_labels + (["warm-up step"] if any_warm else []), width, top=height + 6)
    total_height = max([y for _, y in legend], default=height - LEGEND_ROW) + LEGEND_ROW

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {total_height}" '
             f'width="{width}" height="{total_height}" role="img" aria-label="{escape(title)}">',
             f"<title>{escape(title)}</title>",
             f'<rect x="{LEFT}" y="{TOP}" width="{plot_width}" height="{plot_height}" fill="#fff" stroke="#999"/>',
             f'<text x="{LEFT}" y="{TOP - 8}" style="font-weight: bold">{escape(title)}</text>']
    if xs:
        x_low, x_high = _span(xs)
        y_low, y_high = _span(ys, rounded=True)

        def to_x(x: float) -> float:
            return round(LEFT + (x - x_low) / (x_high - x_low) * plot_width, 1)

        def to_y(y: float) -> float:
            return round(TOP + plot_height - (y - y_low) / (y_high - y_low) * plot_height, 1)

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

    above: list[tuple[float, float]] = []  # (x on the chart, value) of warm-up steps off scale
    below: list[tuple[float, float]] = []
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
        for x, y in warm[name]:
            tip = f"<title>{label}: step {x:g}, {y:.4g}{escape(unit)} (warm-up)</title>"
            data = f'data-cell="{label}" data-step="{x:g}" data-value="{y:.6g}"'
            if y_low <= y <= y_high:
                parts.append(f'<circle class="warmup" cx="{to_x(x)}" cy="{to_y(y)}" r="3.5" fill="#fff" '
                             f'stroke="{colour}" stroke-width="1.5" {data}>{tip}</circle>')
                continue
            # off scale: a hollow triangle at the edge it is past, pointing the way out
            edge, sign = (TOP, -1) if y > y_high else (bottom, 1)
            (above if y > y_high else below).append((to_x(x), y))
            cx = to_x(x)
            tip_y, base_y = edge, edge - sign * 8
            parts.append(f'<polygon class="warmup off-scale" points="{cx},{tip_y} {cx - 5},{base_y} {cx + 5},{base_y}" '
                         f'fill="#fff" stroke="{colour}" stroke-width="1.5" {data}>{tip}</polygon>')
    for off, y, side in ((above, TOP + 20, "above"), (below, bottom - 12, "below")):
        if off:
            x = min(cx for cx, _ in off) + 9
            anchor = "start" if x < LEFT + plot_width * 0.6 else "end"
            x = x if anchor == "start" else max(cx for cx, _ in off) - 9
            text = f"warm-up, off scale: {_value_range([value for _, value in off], unit)}"
            parts.append(f'<text class="off-scale-label" data-side="{side}" x="{x}" y="{y}" '
                         f'text-anchor="{anchor}" style="{HALO}; font-style: italic">{escape(text)}</text>')

    for index, name in enumerate(clean):
        colour = PALETTE[index % len(PALETTE)]
        legend_x, legend_y = legend[index]
        parts.append(f'<line x1="{legend_x}" y1="{legend_y}" x2="{legend_x + 16}" y2="{legend_y}" '
                     f'stroke="{colour}" stroke-width="3"/>')
        parts.append(f'<text x="{legend_x + 20}" y="{legend_y + 4}"><title>{escape(name)}</title>'
                     f"{escape(legend_labels[index])}</text>")
    if any_warm:
        legend_x, legend_y = legend[-1]
        parts.append(f'<circle cx="{legend_x + 8}" cy="{legend_y}" r="3.5" fill="#fff" stroke="{GREY}" '
                     f'stroke-width="1.5"/>')
        parts.append(f'<text x="{legend_x + 20}" y="{legend_y + 4}">warm-up step</text>')
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


def _format_delta(value: float, percent: bool) -> str:
    return f"{value:+.1f}%" if percent else f"{value:+.3f}"


def _delta_span(rows: list[DeltaRow]) -> tuple[float, float]:
    """The Δ axis' range: 0 and every Δ, then the rows' intervals, narrowest first, up to
    one that would widen it more than :data:`DELTA_SQUASH` times: a runaway interval ends
    in arrows at the edges rather than squashing every other row to a dot."""
    drawn = [row for row in rows if _finite(row.delta)]
    values = [0.0] + [row.delta for row in drawn]
    low, high = min(values), max(values)
    intervals = [[row.delta] + [bound for bound in (row.low, row.high) if _finite(bound)] for row in drawn]
    for interval in sorted(intervals, key=lambda values: max(values) - min(values)):
        wider = min(low, *interval), max(high, *interval)
        if high > low and wider[1] - wider[0] > DELTA_SQUASH * (high - low):
            break
        low, high = wider
    return low, high


def svg_delta_chart(title: str, rows: list[DeltaRow], *, axis: str, percent: bool, intervals: bool = True,
                    width: int = 480) -> str:
    """An inline SVG chart of each cell's Δ against base: a row a cell, a dot at the Δ, a
    whisker from its low to its high bound, a line at 0, and the verdict at the row's end.
    A finding (:data:`FINDINGS`) is filled in the cell's colour; any other verdict is
    hollow and grey. A bound past the axis ends in an arrow at the edge, and so does one
    that is None (unbounded or unknown), its half of the whisker dashed. ``intervals``
    False (the table has no bounds): dots only."""
    left, right = DELTA_NAME_WIDTH + 8, width - DELTA_VERDICT_WIDTH
    plot_width, plot_height = right - left, len(rows) * DELTA_ROW
    bottom = TOP + plot_height
    height = bottom + 54  # tick labels, the axis' label and the key below it

    x_low, x_high = _span(list(_delta_span(rows)), rounded=True)

    def to_x(value: float) -> float:
        return round(left + (value - x_low) / (x_high - x_low) * plot_width, 1)

    def tick_label(value: float) -> str:
        return ("+" if value > 0 else "") + _tick_label(value) + ("%" if percent else "")

    summary = "; ".join(_row_text(row, percent=percent, intervals=intervals) for row in rows)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img" aria-label="{escape(title)}" class="delta-chart">',
             f"<title>{escape(title)}</title>",
             f"<desc>{escape(summary)}</desc>",
             f'<text x="8" y="{TOP - 8}" style="font-weight: bold">{escape(title)}</text>']
    for index in range(0, len(rows), 2):
        parts.append(f'<rect x="4" y="{TOP + index * DELTA_ROW}" width="{width - 8}" height="{DELTA_ROW}" '
                     f'fill="{ZEBRA}"/>')
    for tick in _nice_ticks(x_low, x_high):
        x = to_x(tick)
        parts.append(f'<line x1="{x}" y1="{TOP}" x2="{x}" y2="{bottom + 4}" stroke="#d8d8d8"/>')
        parts.append(f'<text x="{x}" y="{bottom + 16}" text-anchor="middle">{tick_label(tick)}</text>')
    zero = to_x(0.0)
    parts.append(f'<line class="zero" x1="{zero}" y1="{TOP - 2}" x2="{zero}" y2="{bottom + 2}" stroke="#333" '
                 f'stroke-width="1.2"/>')
    parts.append(f'<text x="{left + plot_width / 2}" y="{bottom + 30}" text-anchor="middle">{escape(axis)}</text>')

    for index, row in enumerate(rows):
        parts.extend(_delta_row(row, TOP + (index + 0.5) * DELTA_ROW, to_x, left, right, percent=percent,
                                intervals=intervals))

    # the key: what filled, hollow and an arrow mean
    key_y = bottom + 46
    parts += [f'<circle cx="14" cy="{key_y - 4}" r="4" fill="#555" stroke="#555"/>',
              f'<text x="22" y="{key_y}">finding</text>',
              f'<circle cx="82" cy="{key_y - 4}" r="4" fill="#fff" stroke="{GREY}" stroke-width="1.5"/>',
              f'<text x="90" y="{key_y}">no call (noise, inert, too few)</text>',
              f'<polygon points="293,{key_y - 8} 300,{key_y - 4} 293,{key_y}" fill="#555"/>',
              f'<text x="306" y="{key_y}">open: off axis / unknown</text>']
    parts.append("</svg>")
    return "\n".join(parts)


def _row_text(row: DeltaRow, *, percent: bool, intervals: bool) -> str:
    """A row of a Δ chart in words, for its tooltip and for a screen reader: ``cell: -3.1%
    [-5.0%, …], faster`` (an unknown bound reads ``…``)."""
    if not _finite(row.delta):
        return f"{row.cell}: no data"
    text = f"{row.cell}: {_format_delta(row.delta, percent)}"
    if intervals:
        low, high = ("…" if not _finite(value) else _format_delta(value, percent) for value in (row.low, row.high))
        text += f" [{low}, {high}]"
    return text + (f", {row.verdict}" if row.verdict else "")


def _delta_row(row: DeltaRow, y: float, to_x, left: float, right: float, *, percent: bool,
               intervals: bool) -> list[str]:
    """One row of a Δ chart: the cell's name, its whisker and dot, and its verdict."""
    name = escape(row.cell)
    if not _finite(row.delta):
        return [f'<g class="delta-row no-data" data-cell="{name}" data-verdict="">',
                f"<title>{escape(_row_text(row, percent=percent, intervals=intervals))}</title>",
                f'<text x="{left - 8}" y="{y + 4}" text-anchor="end">{escape(_short(row.cell, DELTA_NAME_MAX))}</text>',
                f'<text class="verdict" x="{right + 8}" y="{y + 4}" style="{NO_CALL_TEXT}">no data</text>',
                "</g>"]
    finding = row.verdict in FINDINGS
    kind = "finding" if finding else "no-call"
    colour = row.colour if finding else GREY
    verdict = escape(row.verdict or "")
    parts = [f'<g class="delta-row {kind}" data-cell="{name}" data-verdict="{verdict}">',
             f"<title>{escape(_row_text(row, percent=percent, intervals=intervals))}</title>",
             f'<text x="{left - 8}" y="{y + 4}" text-anchor="end">{escape(_short(row.cell, DELTA_NAME_MAX))}</text>']
    if intervals:
        centre = to_x(row.delta)
        for value, edge, side, outward in ((row.low, left, "low", -1), (row.high, right, "high", 1)):
            # a half whisker from the dot to the bound; one past the axis, or unbounded or
            # unknown (None: dashed), runs to the edge and ends in an arrow
            inside = _finite(value) and left <= to_x(value) <= right
            end = to_x(value) if inside else edge
            dashed = "" if _finite(value) else ' stroke-dasharray="3 2"'
            parts.append(f'<line class="whisker" data-side="{side}" data-open="{str(not inside).lower()}" '
                         f'x1="{centre}" y1="{y}" x2="{end}" y2="{y}" stroke="{colour}" '
                         f'stroke-width="{2 if finding else 1.5}"{dashed}/>')
            if inside:
                parts.append(f'<line class="cap" x1="{end}" y1="{y - 4}" x2="{end}" y2="{y + 4}" '
                             f'stroke="{colour}" stroke-width="1.5"/>')
            else:
                back = end - outward * 7
                parts.append(f'<polygon class="open-end" data-side="{side}" '
                             f'points="{end},{y} {back},{y - 4} {back},{y + 4}" fill="{colour}"/>')
    parts.append(f'<circle class="delta {kind}" cx="{to_x(row.delta)}" cy="{y}" r="4.5" '
                 f'fill="{row.colour if finding else "#fff"}" stroke="{colour}" stroke-width="1.5"/>')
    label_style = "font-weight: bold" if finding else NO_CALL_TEXT
    parts.append(f'<text class="verdict {kind}" x="{right + 8}" y="{y + 4}" style="{label_style}">{verdict}</text>')
    parts.append("</g>")
    return parts


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


def thin(steps: pl.DataFrame | pl.LazyFrame, column: str, max_points: int = MAX_POINTS) -> pl.DataFrame:
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
            if column in intervals and text and any(_finite(row[bound]) for bound in intervals[column]):
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
