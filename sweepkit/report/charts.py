"""Inline SVG charts for the report's page, drawn here (matplotlib is not a dependency): what
every chart shares (the palette, the margins, round ticks and the axes' spans) and the curve
chart, :func:`svg_chart` (see ``sweepkit.report.html`` for what it shows and why), with
:func:`thin`, which keeps a long curve's envelope in a few hundred points.
"""

from __future__ import annotations

import math
from html import escape

import polars as pl

# Okabe-Ito, then Tableau: told apart also by most colour-blind readers.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#f0e442", "#000000",
           "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f")
# What makes no call: drawn grey and hollow, never in a cell's colour.
GREY = "#8a8a8a"
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


def _tick_step(low: float, high: float, count: int = 5) -> float:
    """1, 2 or 5 times a power of ten: about ``count`` ticks over [low, high]."""
    raw = (high - low) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


def nice_ticks(low: float, high: float) -> list[float]:
    """Round tick values inside [low, high]."""
    step = _tick_step(low, high)
    first = math.ceil(low / step - 1e-9)
    ticks = []
    while (value := (first + len(ticks)) * step) <= high + step * 1e-9:
        ticks.append(0.0 if abs(value) < step * 1e-9 else value)
    return ticks


def axis_span(values: list[float], *, rounded: bool = False) -> tuple[float, float]:
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


def tick_text(value: float) -> str:
    return f"{value:.4g}"


def shorten(name: str, most: int = LEGEND_NAME_MAX) -> str:
    return name if len(name) <= most else name[: most - 1] + "…"


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _clean(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return sorted((float(x), float(y)) for x, y in points if finite(x) and finite(y))


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

    legend_labels = [shorten(name) + ("" if clean[name] else " (warm-up only)" if warm[name] else " (no data)")
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
        x_low, x_high = axis_span(xs)
        y_low, y_high = axis_span(ys, rounded=True)

        def to_x(x: float) -> float:
            return round(LEFT + (x - x_low) / (x_high - x_low) * plot_width, 1)

        def to_y(y: float) -> float:
            return round(TOP + plot_height - (y - y_low) / (y_high - y_low) * plot_height, 1)

        for tick in nice_ticks(x_low, x_high):
            x = to_x(tick)
            parts.append(f'<line x1="{x}" y1="{bottom}" x2="{x}" y2="{bottom + 4}" stroke="#999"/>')
            parts.append(f'<text x="{x}" y="{bottom + 16}" text-anchor="middle">{tick_text(tick)}</text>')
        for tick in nice_ticks(y_low, y_high):
            y = to_y(tick)
            parts.append(f'<line x1="{LEFT}" y1="{y}" x2="{LEFT + plot_width}" y2="{y}" stroke="#eee"/>')
            parts.append(f'<text x="{LEFT - 6}" y="{y + 4}" text-anchor="end">{tick_text(tick)}</text>')
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
