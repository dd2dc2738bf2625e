"""The Δ-vs-base chart of the report's page (:func:`svg_delta_chart`, see
``sweepkit.report.html`` for what it shows and why): a row per cell other than base, a dot at
its Δ and a whisker over its interval against a line at 0, a finding filled in the cell's
colour, a Δ that makes no call hollow and grey, the verdict at the row's end.
"""

from __future__ import annotations

from html import escape

import attrs

from sweepkit.report.charts import GREY, TOP, axis_span, finite, nice_ticks, shorten, tick_text

# Every other row of a Δ chart, so that the eye follows a row from its name to its verdict.
ZEBRA = "#edf2f9"
# Inline, since the page's ``svg text`` rule would win over presentation attributes.
NO_CALL_TEXT = f"fill: {GREY}; font-style: italic"
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


def _format_delta(value: float, percent: bool) -> str:
    return f"{value:+.1f}%" if percent else f"{value:+.3f}"


def _delta_span(rows: list[DeltaRow]) -> tuple[float, float]:
    """The Δ axis' range: 0 and every Δ, then the rows' intervals, narrowest first, up to
    one that would widen it more than :data:`DELTA_SQUASH` times: a runaway interval ends
    in arrows at the edges rather than squashing every other row to a dot."""
    drawn = [row for row in rows if finite(row.delta)]
    values = [0.0] + [row.delta for row in drawn]
    low, high = min(values), max(values)
    intervals = [[row.delta] + [bound for bound in (row.low, row.high) if finite(bound)] for row in drawn]
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

    x_low, x_high = axis_span(list(_delta_span(rows)), rounded=True)

    def to_x(value: float) -> float:
        return round(left + (value - x_low) / (x_high - x_low) * plot_width, 1)

    def tick_label(value: float) -> str:
        return ("+" if value > 0 else "") + tick_text(value) + ("%" if percent else "")

    summary = "; ".join(_row_text(row, percent=percent, intervals=intervals) for row in rows)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img" aria-label="{escape(title)}" class="delta-chart">',
             f"<title>{escape(title)}</title>",
             f"<desc>{escape(summary)}</desc>",
             f'<text x="8" y="{TOP - 8}" style="font-weight: bold">{escape(title)}</text>']
    for index in range(0, len(rows), 2):
        parts.append(f'<rect x="4" y="{TOP + index * DELTA_ROW}" width="{width - 8}" height="{DELTA_ROW}" '
                     f'fill="{ZEBRA}"/>')
    for tick in nice_ticks(x_low, x_high):
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
    if not finite(row.delta):
        return f"{row.cell}: no data"
    text = f"{row.cell}: {_format_delta(row.delta, percent)}"
    if intervals:
        low, high = ("…" if not finite(value) else _format_delta(value, percent) for value in (row.low, row.high))
        text += f" [{low}, {high}]"
    return text + (f", {row.verdict}" if row.verdict else "")


def _delta_row(row: DeltaRow, y: float, to_x, left: float, right: float, *, percent: bool,
               intervals: bool) -> list[str]:
    """One row of a Δ chart: the cell's name, its whisker and dot, and its verdict."""
    name = escape(row.cell)
    if not finite(row.delta):
        label = escape(shorten(row.cell, DELTA_NAME_MAX))
        return [f'<g class="delta-row no-data" data-cell="{name}" data-verdict="">',
                f"<title>{escape(_row_text(row, percent=percent, intervals=intervals))}</title>",
                f'<text x="{left - 8}" y="{y + 4}" text-anchor="end">{label}</text>',
                f'<text class="verdict" x="{right + 8}" y="{y + 4}" style="{NO_CALL_TEXT}">no data</text>',
                "</g>"]
    finding = row.verdict in FINDINGS
    kind = "finding" if finding else "no-call"
    colour = row.colour if finding else GREY
    verdict = escape(row.verdict or "")
    parts = [f'<g class="delta-row {kind}" data-cell="{name}" data-verdict="{verdict}">',
             f"<title>{escape(_row_text(row, percent=percent, intervals=intervals))}</title>",
             f'<text x="{left - 8}" y="{y + 4}" text-anchor="end">{escape(shorten(row.cell, DELTA_NAME_MAX))}</text>']
    if intervals:
        centre = to_x(row.delta)
        for value, edge, side, outward in ((row.low, left, "low", -1), (row.high, right, "high", 1)):
            # a half whisker from the dot to the bound; one past the axis, or unbounded or
            # unknown (None: dashed), runs to the edge and ends in an arrow
            inside = finite(value) and left <= to_x(value) <= right
            end = to_x(value) if inside else edge
            dashed = "" if finite(value) else ' stroke-dasharray="3 2"'
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
