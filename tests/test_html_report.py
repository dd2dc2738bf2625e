"""The grid's HTML page: self-contained, escaped, curves that match the data, and (where a
headless Chromium is on PATH) a page a browser actually draws."""

from __future__ import annotations

import math
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser

import polars as pl
import pytest

from sweepkit.html_report import BOTTOM, CURVES, LEFT, MAX_POINTS, PALETTE, RIGHT, TOP, svg_chart, thin, write_page
from sweepkit.report import TABLES

ODD = "odd<&>\"name'"
VOID = {"meta", "br", "hr", "img", "input", "link", "area", "base", "col", "embed", "source", "track", "wbr"}


def tables_for(cells: list[str]) -> dict[str, pl.DataFrame]:
    """The report's two frames with every column, some numbers filled in."""
    frames = {}
    for name, columns in TABLES.items():
        data = {}
        for column in columns:
            if column in ("cell",):
                data[column] = cells
            elif column in ("status", "diff", "failure"):
                data[column] = [f"{column} of {cell}" for cell in cells]
            elif column in ("steps", "eval_k"):
                data[column] = [len(cell) for cell in cells]
            else:
                data[column] = [0.25 * index for index in range(len(cells))]
        frames[name] = pl.DataFrame(data)
    return frames


def steps_frame(drop: tuple[str, ...] = ()) -> pl.DataFrame:
    """base: 5 steps, a NaN reward at step 3 and a null at step 4; fast: 3 steps;
    ODD: one step (drawn as a dot). pass@k only at eval steps (null elsewhere)."""
    rows = []
    for cell, count in (("base", 5), ("fast", 3), (ODD, 1)):
        for step in range(1, count + 1):
            reward = 0.1 * step + (0.05 if cell == "fast" else 0.0)
            rows.append({"cell": cell, "step": step,
                         "reward/mean": math.nan if (cell, step) == ("base", 3) else
                         None if (cell, step) == ("base", 4) else reward,
                         "eval/pass_at_k": 0.5 + 0.1 * step if step % 2 else None,
                         "policy/entropy": 2.0 - 0.1 * step,
                         "timing/step": 1.0 if cell == "base" else 0.5})
    frame = pl.DataFrame(rows, schema={"cell": pl.String, "step": pl.Int64, **{c: pl.Float64 for c, _ in CURVES}})
    return frame.drop(drop)


DIFFS = {"base": "", "fast": 'lr=0.001 prompt="<b>&amp;"', ODD: "k=8"}


class Page(HTMLParser):
    """Tags (checked to nest and close), their attributes, the page's text, and the SVGs."""

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
            self.svgs.append({"viewBox": attributes["viewbox"], "polylines": {}, "circles": {}, "text": []})
        elif tag == "polyline":
            self.svgs[-1]["polylines"][attributes["data-cell"]] = attributes["points"]
        elif tag == "circle":
            self.svgs[-1]["circles"][attributes["data-cell"]] = (float(attributes["cx"]), float(attributes["cy"]))
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
    style = text[text.index("<style>"):text.index("</style>")]
    assert "url(" not in style and "@import" not in style
    assert not list(page.parent.glob(".*.tmp"))  # written via a temp file, which is gone


def test_page_shows_every_cell_table_header_and_diff(page):
    parsed = Page(page.read_text(encoding="utf-8"))
    text = "".join(parsed.text)
    headers = [attrs for tag, attrs in parsed.tags if tag == "th"]
    assert len(headers) == sum(len(columns) for columns in TABLES.values()) + 2  # + the diff table's
    for name, columns in TABLES.items():
        assert name in text
        for column in columns:
            assert f"<th>{column}</th>" in page.read_text(encoding="utf-8")
    for cell, diff in DIFFS.items():
        assert cell in text
        assert diff in text
    assert "profile smoke · model tiny-random · device cpu" in text
    assert "+0.5%" in text  # delta_vs_base_pct of the third row, formatted as a percentage
    assert "25%" in text  # a *_frac column of the second row


def test_text_is_escaped(page):
    raw = page.read_text(encoding="utf-8")
    assert ODD not in raw and "<&>" not in raw and '"<b>' not in raw
    assert "odd&lt;&amp;&gt;&quot;name&#x27;" in raw
    assert "&lt;b&gt;&amp;amp;" in raw  # the diff's own "&amp;" is text, escaped once more
    parsed = Page(raw)  # the attribute (data-cell, <title>) decodes back to the name
    assert parsed.svgs[0]["circles"][ODD]


def test_polylines_match_the_data_and_fit_the_viewbox(page):
    svgs = Page(page.read_text(encoding="utf-8")).svgs
    assert len(svgs) == len(CURVES)
    reward, pass_at_k = svgs[0], svgs[1]
    points = {cell: [tuple(map(float, pair.split(","))) for pair in value.split()]
              for cell, value in reward["polylines"].items()}
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
    # every cell is in each legend, in the same colour on every chart
    for svg in svgs:
        legend = "".join(svg["text"])
        assert "base" in legend and "fast" in legend and ODD in legend


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
        pl.lit(None, dtype=pl.Float64).alias("eval/pass_at_k"))
    names = [f"c{index}" for index in range(cells)]
    path = write_page(tmp_path / "index.html", grid="g", tables=tables_for(names), steps=long,
                      diffs=dict.fromkeys(names, ""))
    # unthinned, the three charts' 3 x 100 x 10,000 points would take some 30 MB
    assert path.stat().st_size < 2_500_000
    reward = Page(path.read_text(encoding="utf-8")).svgs[0]
    spiked = [tuple(map(float, pair.split(","))) for pair in reward["polylines"]["c7"].split()]
    assert len(spiked) <= MAX_POINTS
    assert spiked[-1][0] == 480 - RIGHT  # the last step is drawn, at the right edge
    assert min(y for _, y in spiked) == TOP  # the spike (1.0), the chart's max, is drawn at the top
    kept = thin(long.filter(pl.col("cell") == "c7"), "reward/mean")
    assert kept.height <= MAX_POINTS and kept["step"].is_sorted()
    assert kept.row(-1) == ("c7", steps, 0.3) and (6543, 1.0) in kept.select("step", "reward/mean").rows()
    assert kept["reward/mean"].min() == long.filter(pl.col("cell") == "c7")["reward/mean"].min()
    short = steps_frame()
    assert thin(short, "reward/mean").height == short.filter(pl.col("reward/mean").is_finite()).height


def test_a_missing_metric_leaves_its_chart_out_with_a_note(tmp_path):
    path = write_page(tmp_path / "index.html", grid="g", tables=tables_for(["base"]),
                      steps=steps_frame(drop=("policy/entropy",)), diffs={"base": ""})
    parsed = Page(path.read_text(encoding="utf-8"))
    titles = [text for svg in parsed.svgs for text in svg["text"] if "(" in text and "/" in text]
    assert len(parsed.svgs) == len(CURVES) - 1
    assert not any("policy/entropy" in title for title in titles)
    assert "entropy (policy/entropy): chart left out, no cell logged policy/entropy." in "".join(parsed.text)


def test_svg_chart_edge_cases():
    empty = svg_chart("nothing", {"a": [], "b": [(1.0, math.nan)]})
    assert "no data" in empty and "<polyline" not in empty and "<circle" not in empty
    flat = svg_chart("flat", {"a": [(1, 3.0), (2, 3.0)], "b": [(5, 3.0)]})  # one y value: no division by zero
    assert flat.count("<polyline") == 1 and flat.count("<circle") == 1
    assert PALETTE[0] in flat and PALETTE[1] in flat
    many = svg_chart("many", {f"cell{index}": [(0, index), (1, index + 1)] for index in range(20)}, width=300)
    _, _, _, height = map(float, Page(many).svgs[0]["viewBox"].split())
    assert height > 240  # the legend's rows grow the chart rather than spill out of it


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


@pytest.mark.slow
@pytest.mark.skipif(browser() is None, reason="no headless browser (chromium, chromium-browser, google-chrome) on PATH")
def test_a_browser_draws_the_page(page, tmp_path):
    screenshot = tmp_path / "page.png"
    command = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={screenshot}",
               "--window-size=1200,1600", page.as_uri()]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert screenshot.exists(), result.stderr[-2000:]
    width, height, pixels = png_pixels(screenshot.read_bytes())
    assert (width, height) == (1200, 1600)
    assert len(set(pixels)) > 20  # not one colour: text, axes, lines
    # the first two cells' line colours are on screen: the SVG was drawn, not just the text
    for colour in PALETTE[:2]:
        target = bytes.fromhex(colour[1:])
        near = sum(1 for pixel in pixels if sum(abs(a - b) for a, b in zip(pixel, target)) < 40)
        assert near > 100, (colour, near)
