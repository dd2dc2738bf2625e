"""``sweep report``: tables from disk, in every format, with values recomputed here."""

from __future__ import annotations

import io
import json
import statistics

import polars as pl
import pytest

from cell_program import eval_record, record
from test_run import script_grid

CONFIGS = {
    "base": {"steps": 6, "t": 1.0},
    "faster": {"steps": 6, "t": 0.5},
    "mirror_only": {"steps": 4, "t": 1.0, "report": "stdout"},
    "broken": {"steps": 6, "t": 1.0, "fail_at": 3},
}


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """One grid run once (debug executor: in the driver, fast), then reported in each format."""
    from conftest import Sweeper

    sweeper = Sweeper.new(tmp_path_factory.mktemp("report"))
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    script_grid(sweeper, "g", """
        faster = sk.cell(t=0.5)
        mirror_only = sk.cell(steps=4, report="stdout")
        broken = sk.cell(fail_at=3)
    """, steps=6, t=1.0, sleep=0.0)
    run = sweeper.run("run", "--executor", "debug")
    assert run.ret == 1, run  # broken failed
    outputs = {fmt: sweeper.run("report", "--format", fmt) for fmt in ("table", "md", "json", "parquet")}
    outputs["csv"] = sweeper.run("report", "--format", "csv", "--table", "throughput")
    outputs["csv-both"] = sweeper.run("report", "--format", "csv")
    return sweeper, outputs


def expected_row(name: str) -> dict:
    config = CONFIGS[name]
    last = config.get("fail_at", config["steps"])
    train = [record(config, step) for step in range(1, last + 1)]
    after_warmup = train[1:]  # step 1 is 4x the others: the warm-up its data shows
    mean = lambda key: statistics.mean(r[key] for r in after_warmup)  # noqa: E731
    finished = "fail_at" not in config
    return {
        "steps": last,
        "seeds": 1,
        "warmup_steps": 1,
        "timed_steps": len(after_warmup),
        "sec_per_step": mean("timing/step"),
        "tok_per_s": mean("throughput/tokens_per_s"),
        "gen_frac": mean("timing/generate") / mean("timing/step"),
        "train_frac": mean("timing/policy_train") / mean("timing/step"),
        "sync_frac": mean("timing/sync_weights") / mean("timing/step"),
        # window of max(1, steps // 10) = 1 step at each end for these short runs
        "reward_first": train[0]["reward/mean"],
        "reward_last": train[-1]["reward/mean"],
        "entropy_min": min(r["policy/entropy"] for r in train),
        "pass_at_k": eval_record(config)["eval/pass_at_k"] if finished else None,
    }


def test_report_files_hold_the_values_recomputed_from_the_metrics(reported):
    sweeper, outputs = reported
    assert outputs["table"].ret == 0, outputs["table"]
    report_dir = sweeper.path / "runs" / "g" / "report"
    throughput = pl.read_parquet(report_dir / "throughput.parquet")
    accuracy = pl.read_parquet(report_dir / "accuracy.parquet")
    assert throughput["cell"].to_list() == ["base", "faster", "mirror_only", "broken"]
    rows = {row["cell"]: {**row, **accuracy.row(i, named=True)} for i, row in enumerate(throughput.iter_rows(named=True))}
    for name in CONFIGS:
        for key, value in expected_row(name).items():
            assert rows[name][key] == pytest.approx(value), (name, key)
    base = rows["base"]["sec_per_step"]
    assert rows["faster"]["delta_vs_base_pct"] == pytest.approx((rows["faster"]["sec_per_step"] / base - 1) * 100)
    assert rows["faster"]["delta_vs_base_pct"] == pytest.approx(-50.0)
    assert rows["base"]["delta_vs_base_pct"] == 0.0
    # Each measure inside its interval; faster's Δ (at the level of 3 comparisons at once) excludes 0.
    for name in ("base", "faster"):
        for key in ("sec_per_step", "tok_per_s"):
            assert rows[name][f"{key}_lo"] < rows[name][key] < rows[name][f"{key}_hi"], (name, key)
    assert rows["faster"]["delta_vs_base_hi"] < 0 and rows["faster"]["verdict"] == "faster"
    assert rows["base"]["verdict"] is None
    assert [rows[name]["status"] for name in CONFIGS] == ["passed", "passed", "passed", "failed"]
    assert "RuntimeError: boom at step 3" in rows["broken"]["failure"]
    assert rows["faster"]["diff"] == "t=0.5"


def test_every_format_is_written_and_parses_back(reported):
    sweeper, outputs = reported
    report_dir = sweeper.path / "runs" / "g" / "report"
    parquet = pl.read_parquet(report_dir / "throughput.parquet")
    csv = pl.read_csv(report_dir / "throughput.csv")
    assert csv["cell"].to_list() == parquet["cell"].to_list()
    assert csv["sec_per_step"].to_list() == pytest.approx(parquet["sec_per_step"].to_list())
    assert pl.read_json(report_dir / "accuracy.json")["reward_last"].to_list() == pytest.approx(
        pl.read_parquet(report_dir / "accuracy.parquet")["reward_last"].to_list())
    markdown = (report_dir / "accuracy.md").read_text().splitlines()
    assert markdown[0].startswith("| cell | status | seeds | steps | reward_first |")
    assert markdown[2].startswith("| base | passed | 1 | 6 |")
    # An interval reads beside its value, not in columns of its own.
    throughput_md = (report_dir / "throughput.md").read_text()
    assert "sec_per_step_lo" not in throughput_md and "| faster within" not in throughput_md
    faster = next(line for line in throughput_md.splitlines() if line.startswith("| faster |"))
    assert "-50.0% [" in faster and "| faster |" in faster and " ±" in faster

    # machine formats print data only: stdout parses as it is, what was written goes to stderr
    printed_csv = pl.read_csv(io.StringIO(outputs["csv"].stdout))
    assert printed_csv["cell"].to_list() == parquet["cell"].to_list()
    assert "wrote " in outputs["csv"].stderr and "wrote " not in outputs["csv"].stdout
    assert outputs["csv-both"].ret == 4 and "--format csv prints one table" in outputs["csv-both"].stderr
    printed = json.loads(outputs["json"].stdout)
    assert printed["grid"] == "g" and set(printed["tables"]) == {"throughput", "accuracy"}
    assert [row["cell"] for row in printed["tables"]["accuracy"]] == parquet["cell"].to_list()
    assert "| faster | passed |" in outputs["md"].stdout
    assert "throughput.parquet" in outputs["parquet"].stdout
    table = outputs["table"].stdout
    assert "g: throughput" in table and "FAILED" in table and "-50.0%" in table


def test_report_of_an_unknown_grid_is_an_error(reported):
    sweeper, _ = reported
    result = sweeper.run("report", "grids/nothing.py")
    assert result.ret != 0
    assert "nothing" in result.stderr


def test_bare_report_covers_the_grids_that_ran_and_skips_the_others(reported):
    # The README's main job: `sweep run grids/one.py && sweep report`, with other grids
    # in grids/ that never ran.
    sweeper, _ = reported
    sweeper.grid("never_run", "import sweepkit as sk\ntarget = sk.command('true')\nbase = sk.base(x=1)\n")
    result = sweeper.run("report", "--format", "md")
    assert result.ret == 0, result
    assert "## g: throughput" in result.stdout and "never_run" not in result.stdout + result.stderr


ORDERED_GRID = """
    tbs = sk.axis("tbs", [512, 64, 128], id="tbs{tbs}")
    sweep = sk.product(lr=[0.3, 0.03], batch=[10, 2], id="lr{lr}_s{batch}")
    a_cell_with_a_name_long_enough_to_take_room = sk.cell(fail_at=2, note="a value long enough to crowd the diff column")
"""
GRID_ORDER = ["base", "tbs512", "tbs64", "tbs128", "lr0.3_s10", "lr0.3_s2", "lr3e-2_s10", "lr3e-2_s2",
              "a_cell_with_a_name_long_enough_to_take_room"]


@pytest.fixture(scope="module")
def ordered(tmp_path_factory):
    """A grid whose axis and product values are in no sorted order, run once."""
    from conftest import Sweeper

    sweeper = Sweeper.new(tmp_path_factory.mktemp("ordered"))
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    script_grid(sweeper, "g", ORDERED_GRID, steps=3, sleep=0.0, tbs=32, lr=0.1, batch=0, note="")
    sweeper.grid("a_second", "import sweepkit as sk\ntarget = sk.command('{python}', '-c', 'pass')\n"
                             "base = sk.base(x=1)\nx = sk.axis('x', [30, 4])\n")
    listed = sweeper.run("list", "grids/g.py")
    assert [line.split()[0] for line in listed.stdout.splitlines()[:-1]] == [f"grids/g.py::{n}" for n in GRID_ORDER]
    run = sweeper.run("run", "--executor", "debug")
    assert run.ret == 1, run  # the long-named cell fails
    return sweeper


def test_report_rows_follow_the_grid_file_and_grids_the_order_given(ordered):
    result = ordered.run("report", "grids/g.py", "grids/a_second.py", "--format", "json")
    assert result.ret == 0, result
    documents = [json.loads(line) for line in result.stdout.splitlines()]  # JSON Lines: one a grid
    assert [(d["grid"], list(d["tables"])) for d in documents] == [("g", ["throughput", "accuracy"]),
                                                                   ("a_second", ["throughput", "accuracy"])]
    assert [row["cell"] for row in documents[0]["tables"]["throughput"]] == GRID_ORDER
    assert [row["cell"] for row in documents[1]["tables"]["throughput"]] == ["base", "x30", "x4"]  # not x4, x30
    other_way = ordered.run("report", "grids/a_second.py", "grids/g.py", "--format", "json")
    assert [json.loads(line)["grid"] for line in other_way.stdout.splitlines()] == ["a_second", "g"]
    files = pl.read_parquet(ordered.path / "runs" / "g" / "report" / "accuracy.parquet")
    assert files["cell"].to_list() == GRID_ORDER


def test_status_rows_follow_the_grid_file_also_when_found_on_disk(ordered):
    from sweepkit.report.status import status_rows

    result = ordered.run("status", "grids/g.py")
    assert [line.split()[0] for line in result.stdout.splitlines() if "::" in line] == \
        [f"grids/g.py::{name}" for name in GRID_ORDER]
    rows = status_rows(ordered.path / "runs", ["grids/g.py"])
    assert [row["cell"] for row in rows] == [f"grids/g.py::{name}" for name in GRID_ORDER]


def table_lines(output: str) -> list[str]:
    """The header and row lines of the printed tables (not the titles, notes and file list)."""
    return [line for line in output.splitlines()
            if line.split()[:2] == ["cell", "status"] or "::" in line or line.split()[:1] and
            line.split()[0] in GRID_ORDER]


def test_report_and_status_fit_a_100_column_terminal(ordered):
    for args in (("report", "grids/g.py"), ("status", "grids/g.py")):
        result = ordered.run(*args, env={"COLUMNS": "100"})
        assert result.ret == 0, result
        lines = table_lines(result.stdout)
        assert len(lines) >= len(GRID_ORDER) + 1, result.stdout
        assert all(len(line.rstrip()) <= 100 for line in lines), "\n".join(lines)
        failed = next(line for line in lines if "a_cell_with_a_name_long_enough_to_take_room" in line)
        # The id whole, the failure there but cut where it does not fit.
        assert failed.split()[0] in ("a_cell_with_a_name_long_enough_to_take_room",
                                     "grids/g.py::a_cell_with_a_name_long_enough_to_take_room")
        assert "EXCEPTION" in failed and failed.rstrip().endswith("…"), failed
    wide = ordered.run("report", "grids/g.py", env={"COLUMNS": "300"})
    assert "RuntimeError: boom at step 2" in wide.stdout and "note=" in wide.stdout, wide.stdout


def test_labels_that_decide_bottleneck_collapse_and_how_many_steps(reported):
    sweeper, outputs = reported
    report_dir = sweeper.path / "runs" / "g" / "report"
    throughput = pl.read_parquet(report_dir / "throughput.parquet")
    accuracy = pl.read_parquet(report_dir / "accuracy.parquet")
    rows = {row["cell"]: row for row in throughput.iter_rows(named=True)}
    # cell_program's split: generate 50 %, train 30 %, sync 10 % of each step
    assert {rows[name]["bottleneck"] for name in ("base", "faster")} == {"generate-bound"}
    assert (rows["base"]["timed_steps"], rows["base"]["warmup_steps"]) == (5, 1)  # 6 steps, 1 warm-up
    assert rows["base"]["gpu_hours"] is None  # a CPU cell
    # its entropy is 1/step: from 1 to 1/6, below COLLAPSE_FRACTION of where it began
    collapse = dict(zip(accuracy["cell"], accuracy["entropy_collapse"]))
    assert collapse["base"] is True
    assert outputs["table"].stdout.splitlines()[0].startswith("g: profile none · model ")
    assert "COLLAPSED" in outputs["table"].stdout


def test_a_diff_of_inert_knobs_only_and_too_few_steps_are_no_finding(tmp_path):
    from sweepkit.state import records as st
    from sweepkit.report.tables import cell_note, grid_tables

    grid = tmp_path / "g"
    changes = {"base": {}, "gmu085": {"gpu_memory_utilization": [0.7, 0.85]}, "tbs64": {"train_batch_size": [32, 64]}}
    for name, diff in changes.items():
        cell = grid / name
        cell.mkdir(parents=True)
        (cell / "cell.json").write_text(json.dumps({"nodeid": f"grids/g.py::{name}", "name": name, "diff": diff,
                                                    "config": {"model": "tiny-random"}, "profile": "smoke"}))
        info = {"kind": "info", "step": 0, "device": "cpu",
                "inert_knobs": {"gpu_memory_utilization": {"value": 0.85, "changed": True, "reason": "cpu"}}}
        # Two steps: the first 10x (warm-up), so one timed step: no interval.
        steps = [{"kind": "train", "step": s, "timing/step": 10.0 / s ** 3.3, "timing/generate": 0.5} for s in (1, 2)]
        (cell / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [info, *steps]))
    assert cell_note(st.view(grid / "gmu085")) == "inert: gpu_memory_utilization had no effect in this run"
    assert cell_note(st.view(grid / "base")) is None
    throughput = grid_tables(grid)["throughput"]
    rows = {row["cell"]: row for row in throughput.iter_rows(named=True)}
    assert rows["gmu085"]["note"] == "inert: gpu_memory_utilization had no effect in this run"
    assert (rows["gmu085"]["verdict"], rows["tbs64"]["verdict"], rows["base"]["verdict"]) == (
        "inert", "too few steps", None)
    assert rows["tbs64"]["timed_steps"] == 1 and rows["tbs64"]["sec_per_step_lo"] is None


def test_the_report_writes_one_html_page_with_the_curves(reported):
    sweeper, outputs = reported
    page = (sweeper.path / "runs" / "g" / "report" / "index.html").read_text()
    assert "index.html" in outputs["table"].stdout
    # Δ vs base for sec/step and pass@k, then the curves: reward, pass@k, entropy, sec/step
    assert page.count("<svg") == 6
    assert "sec/step vs base (%)" in page and "faster" in page  # faster's -50 % is a finding
    for cell in ("base", "faster", "mirror_only", "broken"):
        assert cell in page
    assert "<script" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")


PLUGIN = '''
import polars as pl
import sweepkit as sk
from sweepkit.report.registry import ReportFormat, ReportTable


def _fastest(frames):
    train = frames.steps.filter(pl.col("kind") == "train")
    best = train.group_by("cell").agg(pl.col("timing/step").min().alias("fastest_step_s"))
    return frames.cells.select("cell").join(best, on="cell", how="left", maintain_order="left")


def _write_ssv(report):
    path = report.report_dir / "fastest.ssv"
    path.write_text(report.tables["fastest"].write_csv(separator=";"))
    return [path]


def _show_ssv(report, console):
    for name, frame in report.shown_tables().items():
        console.print(f"# {name}", markup=False)
        console.print(frame.write_csv(separator=";"), markup=False, end="")


@sk.hookimpl
def sweep_register_report_tables(register):
    register("fastest", ReportTable(build=_fastest, doc="each cell's fastest step"))


@sk.hookimpl
def sweep_register_report_formats(register):
    register("ssv", ReportFormat(write=_write_ssv, show=_show_ssv, always=False, doc="semicolon-separated"))
'''


def test_a_plugin_adds_a_table_and_a_format(reported):
    sweeper, _ = reported
    sweeper.write("fastest_plugin.py", PLUGIN)
    result = sweeper.run("-p", "fastest_plugin", "report", "--format", "ssv", "--table", "fastest")
    assert result.ret == 0, result
    lines = result.stdout.splitlines()
    assert lines[0] == "# fastest" and lines[1] == "cell;fastest_step_s"
    # cell_program's steps take t x (1 + 0.01 step) after a 4 t first one: the fastest is step 2
    fastest = {line.split(";")[0]: float(line.split(";")[1]) for line in lines[2:6]}
    assert fastest == pytest.approx({"base": 1.02, "faster": 0.51, "mirror_only": 1.02, "broken": 1.02})
    report_dir = sweeper.path / "runs" / "g" / "report"
    assert (report_dir / "fastest.ssv").read_text().startswith("cell;fastest_step_s\nbase;1.02")
    # every format shows every table: the plugin's table is a file and a section of the page
    assert pl.read_parquet(report_dir / "fastest.parquet")["cell"].to_list() == ["base", "faster", "mirror_only",
                                                                                "broken"]
    assert "<h3>fastest</h3>" in (report_dir / "index.html").read_text()
    unknown = sweeper.run("-p", "fastest_plugin", "report", "--format", "xlsx")
    assert unknown.ret == 4
    assert "--format xlsx: expected one of table, csv, md, json, parquet, html, ssv" in unknown.stderr
    assert "--table nope: expected one of throughput, accuracy, fastest" in sweeper.run(
        "-p", "fastest_plugin", "report", "--table", "nope").stderr
    # without the plugin its format is not known, and its files are not written again
    assert "expected one of table, csv, md, json, parquet, html (" in sweeper.run("report", "--format", "ssv").stderr
