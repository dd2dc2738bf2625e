"""The grid's HTML page: self-contained, escaped, curves that match the data, Δ-vs-base
charts that tell a finding from noise, time curves scaled to the steady steps, and (where a
headless Chromium is on PATH) a page a browser actually draws."""

from __future__ import annotations

import math
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from html.parser import HTMLParser

import polars as pl
import pytest

from sweepkit.report.charts import (BOTTOM, GREY, LEFT, MAX_POINTS, MAX_WARMUP_MARKERS, PALETTE, RIGHT, TOP, svg_chart,
                                    thin)
from sweepkit.report.delta_chart import DELTA_CHARTS, ZEBRA, DeltaRow, svg_delta_chart
from sweepkit.report.html import CURVES, write_page
from sweepkit.report.tables import TABLES

ODD = "odd<&>\"name'"
VOID = {"meta", "br", "hr", "img", "input", "link", "area", "base", "col", "embed", "source", "track", "wbr"}
SEC_PER_STEP = "sec/step (timing/step)"
THROUGHPUT_DELTA, ACCURACY_DELTA = (spec.title for spec in DELTA_CHARTS)

# The columns the tables carry for the pictures (intervals, Δ vs base, verdicts), added to
# report.TABLES' where it does not list them (yet), so the page is tested on what it gets.
DECISION_COLUMNS = {
    "throughput": ("seeds", "sec_per_step", "sec_per_step_lo", "sec_per_step_hi", "timed_steps", "warmup_steps",
                   "delta_vs_base_pct", "delta_vs_base_lo", "delta_vs_base_hi", "verdict"),
    "accuracy": ("seeds", "pass_at_k", "pass_at_k_lo", "pass_at_k_hi", "pass_at_k_vs_base", "pass_at_k_vs_base_lo",
                 "pass_at_k_vs_base_hi", "pass_at_k_verdict"),
}
# Δ, low, high, verdict of the rows after base: a finding with both bounds, then a cell that
# makes no call with one bound unknown (None), then the same again.
DELTAS = {
    "throughput": ((-20.0, -25.0, -15.0, "faster"), (0.5, -2.0, None, "within noise")),
    "accuracy": ((0.05, 0.01, 0.09, "better"), (-0.01, None, 0.02, "inert")),
}
INTEGERS = ("steps", "eval_k", "seeds", "timed_steps", "warmup_steps")


def tables_for(cells: list[str]) -> dict[str, pl.DataFrame]:
    """The report's two frames with every column, some numbers filled in: base first (Δ 0,
    no verdict), then the rows of ``DELTAS`` in turn."""
    frames = {}
    for name, columns in TABLES.items():
        spec = next(spec for spec in DELTA_CHARTS if spec.table == name)
        data = {}
        for column in dict.fromkeys((*columns, *DECISION_COLUMNS[name])):
            if column in ("cell",):
                data[column] = cells
            elif column in ("status", "diff", "failure"):
                data[column] = [f"{column} of {cell}" for cell in cells]
            elif column in INTEGERS:
                data[column] = [len(cell) for cell in cells]
            elif column in (spec.value, spec.low, spec.high, spec.verdict):
                at = (spec.value, spec.low, spec.high, spec.verdict).index(column)
                data[column] = [None if index == 0 and at else 0.0 if index == 0 else
                                DELTAS[name][(index - 1) % 2][at] for index in range(len(cells))]
            elif column.endswith(("_lo", "_hi")):
                data[column] = [0.25 * index * (0.8 if column.endswith("_lo") else 1.2) for index in range(len(cells))]
            else:
                data[column] = [0.25 * index for index in range(len(cells))]
        frames[name] = pl.DataFrame(data)
    return frames


def steps_frame(drop: tuple[str, ...] = ()) -> pl.DataFrame:
    """base: 5 steps, a NaN reward at step 3 and a null at step 4; fast: 3 steps;
    ODD: one step (drawn as a dot). pass@k only at eval steps (null elsewhere).
    ``warmup``: base's first step, a 100 s compile against about 1 s after it; ODD's one
    step (a cell with nothing but warm-up); fast has none (False, and null at step 2)."""
    timing = {"base": (100.0, 1.0, 1.4, 1.0, 1.2), "fast": (0.5, 0.6, 0.55), ODD: (0.5,)}
    rows = []
    for cell, count in (("base", 5), ("fast", 3), (ODD, 1)):
        for step in range(1, count + 1):
            reward = 0.1 * step + (0.05 if cell == "fast" else 0.0)
            rows.append({"cell": cell, "step": step,
                         "reward/mean": math.nan if (cell, step) == ("base", 3) else
                         None if (cell, step) == ("base", 4) else reward,
                         "eval/pass_at_k": 0.5 + 0.1 * step if step % 2 else None,
                         "policy/entropy": 2.0 - 0.1 * step,
                         "timing/step": timing[cell][step - 1],
                         "warmup": None if (cell, step) == ("fast", 2) else (cell, step) in (("base", 1), (ODD, 1))})
    frame = pl.DataFrame(rows, schema={"cell": pl.String, "step": pl.Int64, **{c: pl.Float64 for c, _ in CURVES},
                                       "warmup": pl.Boolean})
    return frame.drop(drop)


DIFFS = {"base": "", "fast": 'lr=0.001 prompt="<b>&amp;"', ODD: "k=8"}


class Page(HTMLParser):
    """Tags (checked to nest and close), their attributes, the page's text, and the SVGs:
    each one's title, its curves (polylines and dots by cell), every element, and the rows
    (``<g>``) of a Δ chart with their elements and text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.svgs: list[dict] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if tag == "svg":
            self.svgs.append({"viewBox": attributes["viewbox"], "title": attributes["aria-label"], "polylines": {},
                              "circles": {}, "elements": [], "rows": [], "text": []})
        elif "svg" in self.open:
            svg = self.svgs[-1]
            svg["elements"].append((tag, attributes))
            if tag == "g":
                svg["rows"].append({**attributes, "elements": [], "text": []})
            elif "g" in self.open:
                svg["rows"][-1]["elements"].append((tag, attributes))
            if "class" not in attributes and "data-cell" in attributes:  # a curve: a line, or one point
                if tag == "polyline":
                    svg["polylines"][attributes["data-cell"]] = attributes["points"]
                elif tag == "circle":
                    svg["circles"][attributes["data-cell"]] = (float(attributes["cx"]), float(attributes["cy"]))
        if tag not in VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.open.pop()

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data):
        self.text.append(data)
        if "svg" in self.open:
            self.svgs[-1]["text"].append(data)
            if "g" in self.open:
                self.svgs[-1]["rows"][-1]["text"].append(data)

    def chart(self, title: str) -> dict:
        (found,) = [svg for svg in self.svgs if svg["title"] == title]
        return found


def marks(svg_or_row: dict, tag: str, css_class: str) -> list[dict[str, str]]:
    """The attributes of the elements ``tag`` whose class list holds ``css_class``."""
    return [attributes for name, attributes in svg_or_row["elements"]
            if name == tag and css_class in attributes.get("class", "").split()]


def pairs(points: str) -> list[tuple[float, float]]:
    return [tuple(map(float, pair.split(","))) for pair in points.split()]


@pytest.fixture
def page(tmp_path):
    cells = ["base", "fast", ODD]
    path = write_page(tmp_path / "runs" / "g" / "report" / "index.html", grid="g", tables=tables_for(cells),
                      steps=steps_frame(), diffs=DIFFS, heading="profile smoke · model tiny-random · device cpu")
    return path


def test_page_is_valid_self_contained_html(page):
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    parsed = Page(text)
    assert parsed.open == [], f"left open: {parsed.open}"
    tags = [tag for tag, _ in parsed.tags]
    assert tags[0] == "html" and "head" in tags and "body" in tags
    assert not {"script", "link", "img", "iframe", "object", "embed"} & set(tags)
    for tag, attributes in parsed.tags:
        assert "src" not in attributes, (tag, attributes)
        assert "href" not in attributes, (tag, attributes)
        assert not any(name.startswith("on") for name in attributes), (tag, attributes)
        assert "url(" not in attributes.get("style", ""), (tag, attributes)
    style = text[text.index("<style>"):text.index("</style>")]
    assert "url(" not in style and "@import" not in style
    assert not list(page.parent.glob(".*.tmp"))  # written via a temp file, which is gone


def test_page_shows_every_cell_table_header_and_diff(page):
    raw = page.read_text(encoding="utf-8")
    parsed = Page(raw)
    text = "".join(parsed.text)
    headers = [attrs for tag, attrs in parsed.tags if tag == "th"]
    tables = tables_for(["base"])
    shown = {name: [column for column in frame.columns if not column.endswith(("_lo", "_hi"))]
             for name, frame in tables.items()}
    assert len(headers) == sum(len(columns) for columns in shown.values()) + 2  # + the diff table's
    for name, columns in shown.items():
        assert name in text
        for column in columns:
            assert f"<th>{column}</th>" in raw
    for cell, diff in DIFFS.items():
        assert cell in text
        assert diff in text
    assert "profile smoke · model tiny-random · device cpu" in text
    assert "25%" in text  # a *_frac column of the second row


def test_a_value_reads_with_its_interval_and_a_verdict_that_makes_no_call_is_set_apart(page):
    raw = page.read_text(encoding="utf-8")
    parsed = Page(raw)
    # the bound columns are not columns of the page: they are in their value's cell
    for bound in ("sec_per_step_lo", "delta_vs_base_hi", "pass_at_k_lo", "pass_at_k_vs_base_hi"):
        assert f"<th>{bound}</th>" not in raw
    assert '0.25 <span class="interval">[0.2, 0.3]</span>' in raw
    text = "".join(parsed.text)
    assert "-20.0% [-25.0%, -15.0%]" in text  # fast's Δ: a percentage, both bounds
    assert "+0.5% [-2.0%, …]" in text  # ODD's: its unknown high bound reads as open
    assert "+0.050 [+0.01, +0.09]" not in text and "+0.05 [+0.01, +0.09]" in text  # Δ pass@k, signed
    verdicts = {attrs.get("class") for tag, attrs in parsed.tags if tag == "td" and "verdict" in attrs.get("class", "")}
    assert verdicts == {"verdict", "verdict finding", "verdict no-call"}
    assert '<td class="verdict finding">faster</td>' in raw
    assert '<td class="verdict no-call">within noise</td>' in raw
    assert '<td class="verdict no-call">inert</td>' in raw


def test_text_is_escaped(page):
    raw = page.read_text(encoding="utf-8")
    assert ODD not in raw and "<&>" not in raw and '"<b>' not in raw
    assert "odd&lt;&amp;&gt;&quot;name&#x27;" in raw
    assert "&lt;b&gt;&amp;amp;" in raw  # the diff's own "&amp;" is text, escaped once more
    parsed = Page(raw)  # the attribute (data-cell, <title>) decodes back to the name
    assert parsed.chart("reward (reward/mean)")["circles"][ODD]
    assert [row["data-cell"] for row in parsed.chart(THROUGHPUT_DELTA)["rows"]] == ["fast", ODD]


def test_polylines_match_the_data_and_fit_the_viewbox(page):
    parsed = Page(page.read_text(encoding="utf-8"))
    assert len(parsed.svgs) == len(CURVES) + len(DELTA_CHARTS)
    reward, pass_at_k = parsed.chart("reward (reward/mean)"), parsed.chart("pass@k (eval/pass_at_k)")
    points = {cell: pairs(value) for cell, value in reward["polylines"].items()}
    # base: step 3 is NaN and step 4 null, both left out; ODD's single step is a dot
    assert {cell: len(pairs) for cell, pairs in points.items()} == {"base": 3, "fast": 3}
    assert set(reward["circles"]) == {ODD}
    assert [round(x) for x, _ in points["fast"]] == sorted(round(x) for x, _ in points["fast"])
    _, _, width, height = map(float, reward["viewBox"].split())
    every = [xy for pairs in points.values() for xy in pairs] + list(reward["circles"].values())
    assert all(0 <= x <= width and 0 <= y <= height for x, y in every)
    # higher is up: the largest reward (base, step 5) is at the plot's top edge, the smallest
    # (step 1 of base and of ODD, 0.1) at its bottom edge
    ys = {(cell, index): y for cell, pairs in points.items() for index, (_, y) in enumerate(pairs)}
    assert min(ys, key=ys.get) == ("base", 2) and max(ys, key=ys.get) == ("base", 0)
    assert ys["base", 2] == TOP and ys["base", 0] == reward["circles"][ODD][1] == 240 - BOTTOM
    assert points["base"][0][0] == LEFT and points["base"][-1][0] == 480 - RIGHT
    # the same step lands at the same x on every line
    assert points["base"][0][0] == points["fast"][0][0]
    # pass@k only at odd (eval) steps: base 1,3,5 ; fast 1,3 ; ODD 1 (a dot)
    assert {cell: len(value.split()) for cell, value in pass_at_k["polylines"].items()} == {"base": 3, "fast": 2}
    # every cell is in each curve's legend, in the same colour on every chart
    for title, _ in ((title, column) for column, title in CURVES):
        legend = "".join(parsed.chart(title)["text"])
        assert "base" in legend and "fast" in legend and ODD in legend


def test_delta_charts_draw_a_row_per_cell_but_base_with_its_verdict(page):
    parsed = Page(page.read_text(encoding="utf-8"))
    for spec in DELTA_CHARTS:
        chart = parsed.chart(spec.title)
        assert ("title", {}) in chart["elements"] and spec.title in chart["text"]  # named for a screen reader
        rows = chart["rows"]
        assert [row["data-cell"] for row in rows] == ["fast", ODD]  # the tables' order, base left out
        for row, (_, _, _, verdict) in zip(rows, DELTAS[spec.table]):
            assert row["data-verdict"] == verdict
            assert verdict in row["text"]  # written out at the row's end
        # a finding is filled in the cell's colour (fast's: PALETTE[1]); a verdict that makes
        # no call is hollow and grey, its whisker too
        finding, no_call = rows
        assert "finding" in finding["class"].split() and "no-call" in no_call["class"].split()
        (dot,) = marks(finding, "circle", "delta")
        (hollow,) = marks(no_call, "circle", "delta")
        assert dot["fill"] == dot["stroke"] == PALETTE[1]
        assert hollow["fill"] == "#fff" and hollow["stroke"] == GREY
        assert {line["stroke"] for line in marks(finding, "line", "whisker")} == {PALETTE[1]}
        assert {line["stroke"] for line in marks(no_call, "line", "whisker")} == {GREY}


def test_delta_chart_puts_zero_between_faster_and_slower_and_opens_a_whisker_with_no_bound(page):
    chart = Page(page.read_text(encoding="utf-8")).chart(THROUGHPUT_DELTA)
    (zero,) = marks(chart, "line", "zero")
    fast, odd = chart["rows"]
    ends = {(row["data-cell"], line["data-side"]): line
            for row in (fast, odd) for line in marks(row, "line", "whisker")}
    dot = {row["data-cell"]: float(marks(row, "circle", "delta")[0]["cx"]) for row in (fast, odd)}
    assert dot["fast"] < float(zero["x1"]) < dot[ODD]  # -20 % left of 0, +0.5 % right of it
    assert float(ends["fast", "low"]["x2"]) < dot["fast"] < float(ends["fast", "high"]["x2"])
    # fast: both bounds known, closed by caps; ODD: its high bound is None, so that half of
    # its whisker is open (dashed, to the plot's right edge, ending in an arrow)
    assert not marks(fast, "polygon", "open-end") and len(marks(fast, "line", "cap")) == 2
    assert ends[ODD, "low"]["data-open"] == "false" and "stroke-dasharray" not in ends[ODD, "low"]
    high = ends[ODD, "high"]
    assert high["data-open"] == "true" and "stroke-dasharray" in high
    (arrow,) = marks(odd, "polygon", "open-end")
    assert arrow["data-side"] == "high"
    assert float(high["x2"]) == max(float(line["x2"]) for line in ends.values())  # the edge, past every bound
    # the accuracy chart: ODD's low bound is the open one
    accuracy = Page(page.read_text(encoding="utf-8")).chart(ACCURACY_DELTA)
    assert [arrow["data-side"] for arrow in marks(accuracy["rows"][1], "polygon", "open-end")] == ["low"]


def test_a_runaway_interval_is_cut_at_the_edges_instead_of_squashing_the_other_rows():
    rows = [DeltaRow(cell="a", colour=PALETTE[0], delta=-10.0, low=-12.0, high=-8.0, verdict="faster"),
            DeltaRow(cell="b", colour=PALETTE[1], delta=1.0, low=-3.0, high=5.0, verdict="within noise"),
            DeltaRow(cell="c", colour=PALETTE[2], delta=0.5, low=-400.0, high=600.0, verdict="too few steps"),
            DeltaRow(cell="d", colour=PALETTE[3], delta=None, low=None, high=None, verdict=None)]
    chart = Page(svg_delta_chart("t", rows, axis="Δ", percent=True)).chart("t")
    a, b, c, d = chart["rows"]
    whisker = [float(line["x2"]) for line in marks(a, "line", "whisker")]
    assert max(whisker) - min(whisker) > 30  # a's 4 points of interval are still wide on screen
    assert sorted(arrow["data-side"] for arrow in marks(c, "polygon", "open-end")) == ["high", "low"]
    assert not marks(a, "polygon", "open-end") and not marks(b, "polygon", "open-end")
    assert d["data-verdict"] == "" and "no data" in d["text"] and not marks(d, "circle", "delta")
    assert "c: +0.5% [-400.0%, +600.0%], too few steps" in "".join(chart["text"])  # the numbers, for a reader


def test_the_time_chart_scales_to_the_steady_steps_and_marks_warmup_off_scale(page):
    chart = Page(page.read_text(encoding="utf-8")).chart(SEC_PER_STEP)
    plot_height = 240 - TOP - BOTTOM
    steady = {cell: pairs(points) for cell, points in chart["polylines"].items()}
    assert {cell: len(points) for cell, points in steady.items()} == {"base": 4, "fast": 3}  # warm-up not in the line
    ys = [y for points in steady.values() for _, y in points]
    assert max(ys) - min(ys) > 0.8 * plot_height  # the steady steps fill the plot, not a flat line at the bottom
    base_ys = [y for _, y in steady["base"]]
    assert max(base_ys) - min(base_ys) > 0.3 * plot_height  # base's 1.0-1.4 s reads as a change
    labels = [float(text) for text in chart["text"] if text.replace(".", "", 1).isdigit()]
    assert max(labels) < 10  # no tick near the 100 s compile
    # base's 100 s warm-up step: a marker at the top edge, labelled with its value
    (off_scale,) = marks(chart, "polygon", "off-scale")
    assert off_scale["data-cell"] == "base" and off_scale["data-step"] == "1" and off_scale["data-value"] == "100"
    assert min(float(pair.split(",")[1]) for pair in off_scale["points"].split()) == TOP
    assert "warm-up, off scale: 100 s" in chart["text"]
    # ODD has nothing but one warm-up step (0.5 s, on scale): a hollow marker, not "no data"
    (warm,) = [marker for marker in marks(chart, "circle", "warmup") if marker["data-cell"] == ODD]
    assert warm["fill"] == "#fff" and TOP <= float(warm["cy"]) <= 240 - BOTTOM
    legend = "".join(chart["text"])
    assert "(warm-up only)" in legend and "(no data)" not in legend and "warm-up step" in legend
    # a chart that is not a time chart draws every step in its line
    entropy = Page(page.read_text(encoding="utf-8")).chart("entropy (policy/entropy)")
    assert len(pairs(entropy["polylines"]["base"])) == 5 and not marks(entropy, "circle", "warmup")


def test_long_curves_are_thinned_to_a_small_page_that_keeps_the_last_point_and_the_max(tmp_path):
    cells, steps = 100, 10_000
    # a slow wave; in cell c7 one spike at step 6,543 that a plain every-20th-point sample
    # would miss; every last step sits below its neighbours
    long = pl.DataFrame({"cell": [f"c{index}" for index in range(cells)]}).join(
        pl.DataFrame({"step": pl.int_range(1, steps + 1, eager=True)}), how="cross")
    wave = (pl.col("step") * 0.001 + pl.col("cell").str.slice(1).cast(pl.Int64)).sin() * 0.1 + 0.5
    long = long.with_columns(
        pl.when((pl.col("cell") == "c7") & (pl.col("step") == 6543)).then(1.0)
        .when(pl.col("step") == steps).then(0.3).otherwise(wave).alias("reward/mean"),
        (2.0 - pl.col("step") / steps).alias("policy/entropy"), pl.lit(1.0).alias("timing/step"),
        pl.lit(None, dtype=pl.Float64).alias("eval/pass_at_k"), (pl.col("step") <= 1000).alias("warmup"))
    names = [f"c{index}" for index in range(cells)]
    path = write_page(tmp_path / "index.html", grid="g", tables=tables_for(names), steps=long,
                      diffs=dict.fromkeys(names, ""), base="c0")
    # unthinned, the three charts' 3 x 100 x 10,000 points would take some 30 MB
    assert path.stat().st_size < 2_500_000
    parsed = Page(path.read_text(encoding="utf-8"))
    reward = parsed.chart("reward (reward/mean)")
    spiked = pairs(reward["polylines"]["c7"])
    assert len(spiked) <= MAX_POINTS
    assert spiked[-1][0] == 480 - RIGHT  # the last step is drawn, at the right edge
    assert min(y for _, y in spiked) == TOP  # the spike (1.0), the chart's max, is drawn at the top
    # 1,000 warm-up steps a cell are thinned too: a few dozen markers, not 100,000
    assert len(marks(parsed.chart(SEC_PER_STEP), "circle", "warmup")) <= cells * MAX_WARMUP_MARKERS
    kept = thin(long.filter(pl.col("cell") == "c7"), "reward/mean")
    assert kept.height <= MAX_POINTS and kept["step"].is_sorted()
    assert kept.row(-1) == ("c7", steps, 0.3) and (6543, 1.0) in kept.select("step", "reward/mean").rows()
    assert kept["reward/mean"].min() == long.filter(pl.col("cell") == "c7")["reward/mean"].min()
    short = steps_frame()
    assert thin(short, "reward/mean").height == short.filter(pl.col("reward/mean").is_finite()).height
    assert len(parsed.chart(THROUGHPUT_DELTA)["rows"]) == cells - 1  # every cell but base (c0 here)


def test_a_missing_metric_leaves_its_chart_out_with_a_note(tmp_path):
    path = write_page(tmp_path / "index.html", grid="g", tables=tables_for(["base"]),
                      steps=steps_frame(drop=("policy/entropy",)), diffs={"base": ""})
    parsed = Page(path.read_text(encoding="utf-8"))
    titles = [svg["title"] for svg in parsed.svgs]
    assert len(parsed.svgs) == len(CURVES) - 1  # and no Δ chart: base has nothing to be set against
    assert not any("policy/entropy" in title for title in titles)
    text = "".join(parsed.text)
    assert "entropy (policy/entropy): chart left out, no cell logged policy/entropy." in text
    assert f"{THROUGHPUT_DELTA} (throughput): no cell besides base to set against it." in text


def test_steps_without_warmup_still_draw_the_time_chart_with_a_note(tmp_path):
    path = write_page(tmp_path / "index.html", grid="g", tables=tables_for(["base", "fast", ODD]),
                      steps=steps_frame(drop=("warmup",)), diffs=DIFFS)
    parsed = Page(path.read_text(encoding="utf-8"))
    chart = parsed.chart(SEC_PER_STEP)
    assert len(pairs(chart["polylines"]["base"])) == 5 and not marks(chart, "circle", "warmup")
    assert (f"{SEC_PER_STEP}: the steps have no warmup column, so warm-up steps are drawn as the others "
            "and may stretch the axis.") in "".join(parsed.text)


def test_tables_without_the_delta_columns_still_render_with_a_note(tmp_path):
    cells = ["base", "fast", ODD]
    tables = tables_for(cells)
    old = {"throughput": tables["throughput"].drop("delta_vs_base_pct", "delta_vs_base_lo", "delta_vs_base_hi",
                                                    "verdict"),
           "accuracy": tables["accuracy"].drop("pass_at_k_vs_base_lo", "pass_at_k_vs_base_hi", "pass_at_k_verdict")}
    path = write_page(tmp_path / "index.html", grid="g", tables=old, steps=steps_frame(), diffs=DIFFS)
    parsed = Page(path.read_text(encoding="utf-8"))
    text = "".join(parsed.text)
    assert not [svg for svg in parsed.svgs if svg["title"] == THROUGHPUT_DELTA]
    assert f"{THROUGHPUT_DELTA} (throughput): chart left out, the table has no delta_vs_base_pct column." in text
    # Δ pass@k without bounds or verdict: dots only, none drawn as a finding, two notes
    accuracy = parsed.chart(ACCURACY_DELTA)
    assert len(accuracy["rows"]) == 2 and not marks(accuracy, "line", "whisker")
    assert not marks(accuracy, "circle", "finding") and len(marks(accuracy, "circle", "no-call")) == 2
    assert f"{ACCURACY_DELTA} (accuracy): drawn without intervals" in text
    assert f"{ACCURACY_DELTA} (accuracy): the table has no pass_at_k_verdict column" in text
    # and a plugin's table of neither kind is only a table
    plugin = {"plugin": pl.DataFrame({"cell": cells, "x": [1, 2, 3]})}
    path = write_page(tmp_path / "plugin.html", grid="g", tables=plugin, steps=steps_frame(), diffs=DIFFS)
    text = "".join(Page(path.read_text(encoding="utf-8")).text)
    assert f"{THROUGHPUT_DELTA} (throughput): chart left out, the report has no throughput table." in text


def test_svg_chart_edge_cases():
    empty = svg_chart("nothing", {"a": [], "b": [(1.0, math.nan)]})
    assert "no data" in empty and "<polyline" not in empty and "<circle" not in empty
    flat = svg_chart("flat", {"a": [(1, 3.0), (2, 3.0)], "b": [(5, 3.0)]})  # one y value: no division by zero
    assert flat.count("<polyline") == 1 and flat.count("<circle") == 1
    assert PALETTE[0] in flat and PALETTE[1] in flat
    many = svg_chart("many", {f"cell{index}": [(0, index), (1, index + 1)] for index in range(20)}, width=300)
    _, _, _, height = map(float, Page(many).svgs[0]["viewBox"].split())
    assert height > 240  # the legend's rows grow the chart rather than spill out of it
    # nothing but warm-up: the axis is the warm-up steps', so they are on it, none off scale
    warm_only = Page(svg_chart("w", {"a": []}, warmup={"a": [(1, 80.0), (2, 3.0)]}, unit=" s")).chart("w")
    assert len(marks(warm_only, "circle", "warmup")) == 2 and not marks(warm_only, "polygon", "off-scale")
    # a warm-up step below the steady ones is marked at the bottom edge
    below = Page(svg_chart("b", {"a": [(2, 5.0), (3, 6.0)]}, warmup={"a": [(1, 0.01)]}, unit=" s")).chart("b")
    (marker,) = marks(below, "polygon", "off-scale")
    assert max(float(pair.split(",")[1]) for pair in marker["points"].split()) == 240 - BOTTOM
    assert "warm-up, off scale: 0.01 s" in below["text"]


def browser() -> str | None:
    return next((found for name in ("chromium", "chromium-browser", "google-chrome")
                 if (found := shutil.which(name))), None)


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and rows of RGB(A) pixels of an 8-bit PNG, unfiltered."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, idat, header = 8, b"", None
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        chunk = data[offset + 8:offset + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        offset += 12 + length
    width, height, depth, colour_type, *_ = header
    assert depth == 8 and colour_type in (2, 6), header
    channels = 3 if colour_type == 2 else 4
    raw, stride, rows, previous = zlib.decompress(idat), width * channels, [], bytes(width * channels)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, up_left = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                guess = left + up - up_left
                # Paeth: the neighbour nearest the guess, ties to left, then up
                nearest = min((abs(guess - left), 0, left), (abs(guess - up), 1, up),
                              (abs(guess - up_left), 2, up_left))
                line[i] = (line[i] + nearest[2]) & 255
        rows.append(bytes(line))
        previous = line
    return width, height, [bytes(row[i:i + 3]) for row in rows for i in range(0, stride, channels)]


def screenshot(page, tmp_path) -> tuple[int, int, list[bytes]]:
    """The page as a headless Chromium draws it, 1200 x 1600: width, height, pixels."""
    shot = tmp_path / "page.png"
    command = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
               "--window-size=1200,1600", page.as_uri()]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert shot.exists(), result.stderr[-2000:]
    return png_pixels(shot.read_bytes())


def near(pixel: bytes, colour: str, tolerance: int = 40) -> bool:
    return sum(abs(a - b) for a, b in zip(pixel, bytes.fromhex(colour[1:]))) < tolerance


def blend_of(pixel: bytes, colour: str, least: float = 0.4) -> bool:
    """``pixel`` is ``colour`` over white at ``least`` opacity or more: the anti-aliased
    pixels of a thin slanted line, which seldom have its exact colour."""
    target = bytes.fromhex(colour[1:])
    alpha = sum(255 - p for p in pixel) / sum(255 - c for c in target)
    return alpha >= least and all(abs(255 - alpha * (255 - c) - p) < 16 for p, c in zip(pixel, target))


needs_browser = pytest.mark.skipif(browser() is None,
                                   reason="no headless browser (chromium, chromium-browser, google-chrome) on PATH")


@pytest.mark.slow
@needs_browser
def test_a_browser_draws_the_page(page, tmp_path):
    width, height, pixels = screenshot(page, tmp_path)
    assert (width, height) == (1200, 1600)
    assert len(set(pixels)) > 20  # not one colour: text, axes, lines
    # the first two cells' line colours are on screen: the SVG was drawn, not just the text
    for colour in PALETTE[:2]:
        count = sum(1 for pixel in pixels if near(pixel, colour))
        assert count > 100, (colour, count)


@pytest.mark.slow
@needs_browser
def test_a_browser_draws_the_delta_chart_and_a_steady_curve_that_is_not_flat(tmp_path):
    # of the curves only sec/step, so that base's colour (base has no Δ row) is that chart's alone
    path = write_page(tmp_path / "index.html", grid="g", tables=tables_for(["base", "fast", ODD]),
                      steps=steps_frame(drop=("reward/mean", "eval/pass_at_k", "policy/entropy")), diffs=DIFFS)
    width, _, pixels = screenshot(path, tmp_path)
    at = [(index % width, index // width) for index in range(len(pixels))]
    # the Δ charts' region: the rows of pixels their zebra bands fill (a wide run of that
    # colour; a faint anti-aliased edge of a curve may have it too, but only a pixel or two)
    zebra = [xy for xy, pixel in zip(at, pixels) if near(pixel, ZEBRA, 2)]
    banded = {y for y, count in Counter(y for _, y in zebra).items() if count > 200}
    assert banded, "no Δ chart on screen"
    top, bottom = min(banded), max(banded)
    left, right = min(x for x, y in zebra if y in banded), max(x for x, y in zebra if y in banded)
    inside = [pixel for (x, y), pixel in zip(at, pixels) if left <= x <= right and top <= y <= bottom]
    # fast's finding (its whisker and filled dot) in its colour, ODD's no call in grey
    assert sum(near(pixel, PALETTE[1]) for pixel in inside) > 60
    assert sum(near(pixel, GREY, 30) for pixel in inside) > 30
    # under them, base's sec/step curve (base has no Δ row: its colour is this chart's). Right
    # of the middle of what it draws (its legend swatch at the left edge, its 100 s warm-up
    # step 1, its steps 2-5) lie steps 3-5: their 1.4, 1.0 and 1.2 s climb and fall over
    # many rows of pixels, where on an axis stretched to 100 s they would lie on two or three
    base = [(x, y) for (x, y), pixel in zip(at, pixels) if y > bottom and blend_of(pixel, PALETTE[0])]
    middle = (min(x for x, _ in base) + max(x for x, _ in base)) / 2
    rows = {y for x, y in base if x > middle}
    assert len(rows) > 40, sorted(rows)
