"""``sweepkit.report.columns``: one spec per report column, and every table, renderer, suggest and
compare view derived from the specs (pinned here, so that a change to one shows as a diff)."""

from __future__ import annotations

import io
from pathlib import Path

import polars as pl
import pytest
from rich.console import Console

from sweepkit.errors import UsageError
from sweepkit.grid.cell import Cell, Target
from sweepkit.report import columns, compare, intervals, renderers, suggest, tables
from sweepkit.report.columns import COLUMNS, Interval, ReportColumn
from sweepkit.report.registry import GridReport, ReportRegistry, ReportTable, columns_of

THROUGHPUT = ("cell", "status", "seeds", "steps", "sec_per_step", "sec_per_step_lo", "sec_per_step_hi",
              "timed_steps", "warmup_steps", "delta_vs_base_pct", "delta_vs_base_lo", "delta_vs_base_hi", "verdict",
              "tok_per_s", "tok_per_s_lo", "tok_per_s_hi", "gen_frac", "train_frac", "sync_frac", "ref_frac",
              "teacher_frac", "bottleneck", "memory_peak_gb", "gpu_hours", "note", "diff", "failure")
ACCURACY = ("cell", "status", "seeds", "steps", "reward_first", "reward_last", "kl_first", "kl_last", "pass_at_1",
            "pass_at_k", "pass_at_k_lo", "pass_at_k_hi", "eval_k", "eval_prompts", "pass_at_k_vs_base",
            "pass_at_k_vs_base_lo", "pass_at_k_vs_base_hi", "pass_at_k_verdict", "pass_at_k_best",
            "pass_at_k_best_step", "pass_at_k_per_gpu_hour", "entropy_first", "entropy_last", "entropy_min",
            "entropy_collapse", "logratio_max", "grad_norm_max", "note", "diff", "failure")
# name -> (header, justify, floor, drop) on the terminal
SCREEN = {
    "cell": ("cell", "left", None, None), "status": ("status", "left", None, None),
    "seeds": ("seeds", "right", None, 2), "steps": ("steps", "right", None, 3),
    "sec_per_step": ("s/step", "right", None, None), "delta_vs_base_pct": ("vs base", "right", None, None),
    "verdict": ("verdict", "left", None, None), "tok_per_s": ("tok/s", "right", None, 7),
    "gen_frac": ("gen", "right", None, 6), "train_frac": ("train", "right", None, 5),
    "sync_frac": ("sync", "right", None, 2), "ref_frac": ("ref", "right", None, 1),
    "teacher_frac": ("teacher", "right", None, 6), "kl_first": ("kl first", "right", None, 6),
    "kl_last": ("kl last", "right", None, None), "memory_peak_gb": ("mem GB", "right", None, 3),
    "timed_steps": ("n", "right", None, 4), "warmup_steps": ("warm", "right", None, 1),
    "bottleneck": ("bound", "right", None, 8), "gpu_hours": ("GPU h", "right", None, 4),
    "note": ("note", "left", 16, 5), "pass_at_k_best": ("best@k", "right", None, 4),
    "pass_at_k_best_step": ("at", "right", None, 3), "pass_at_k_per_gpu_hour": ("@k/GPU h", "right", None, 3),
    "pass_at_k_vs_base": ("@k vs base", "right", None, 9), "pass_at_k_verdict": ("@k verdict", "left", None, None),
    "eval_prompts": ("prompts", "right", None, 2), "entropy_first": ("ent first", "right", None, 2),
    "entropy_last": ("ent last", "right", None, 4), "entropy_collapse": ("collapse", "right", None, None),
    "logratio_max": ("max logr", "right", None, 1), "reward_first": ("rew first", "right", None, 6),
    "reward_last": ("rew last", "right", None, None), "pass_at_1": ("pass@1", "right", None, 3),
    "pass_at_k": ("pass@k", "right", None, None), "eval_k": ("k", "right", None, 2),
    "entropy_min": ("min ent", "right", None, 5), "grad_norm_max": ("max grad", "right", None, 1),
    "diff": ("diff", "left", 16, 4), "failure": ("failure", "left", 16, None),
}
INTERVALS = {"sec_per_step": ("sec_per_step_lo", "sec_per_step_hi"), "tok_per_s": ("tok_per_s_lo", "tok_per_s_hi"),
             "pass_at_k": ("pass_at_k_lo", "pass_at_k_hi"),
             "delta_vs_base_pct": ("delta_vs_base_lo", "delta_vs_base_hi"),
             "pass_at_k_vs_base": ("pass_at_k_vs_base_lo", "pass_at_k_vs_base_hi")}
SPREAD = {"sec_per_step": ("±", 9), "tok_per_s": ("±", 3), "delta_vs_base_pct": ("Δ interval", 8),
          "pass_at_k": ("interval", 5), "pass_at_k_vs_base": ("Δ interval", 9)}
DIRECTIONS = {"sec_per_step": True, "delta_vs_base_pct": True, "tok_per_s": False, "memory_peak_gb": True,
              "reward_last": False, "pass_at_1": False, "pass_at_k": False, "kl_last": True}
# name -> (absolute, relative): |Δ| above max(absolute, relative * |a|) differs
DEFAULT_NOISE = {
    "sec_per_step": (0.0, 0.05), "tok_per_s": (0.0, 0.05), "memory_peak_gb": (0.0, 0.05),
    "gen_frac": (0.02, 0.0), "train_frac": (0.02, 0.0), "sync_frac": (0.02, 0.0), "ref_frac": (0.02, 0.0),
    "teacher_frac": (0.02, 0.0), "reward_first": (0.02, 0.0), "reward_last": (0.02, 0.0), "pass_at_1": (0.02, 0.0),
    "pass_at_k": (0.02, 0.0), "delta_vs_base_pct": (5.0, 0.0), "steps": (0.0, 0.0), "eval_k": (0.0, 0.0),
}
FOLDS = {**dict.fromkeys(("gen_frac", "train_frac", "sync_frac", "ref_frac", "teacher_frac", "reward_first",
                          "reward_last", "kl_first", "kl_last", "pass_at_1", "entropy_first", "entropy_last",
                          "pass_at_k_per_gpu_hour"), "mean"),
         **dict.fromkeys(("steps", "memory_peak_gb", "logratio_max", "grad_norm_max", "pass_at_k_best"), "max"),
         "entropy_min": "min", "gpu_hours": "sum", "eval_k": "first", "eval_prompts": "first",
         "entropy_collapse": "any"}
TEXT = {"cell", "status", "verdict", "pass_at_k_verdict", "bottleneck", "note", "diff", "failure"}
INTEGERS = {"seeds", "steps", "timed_steps", "warmup_steps", "eval_k", "eval_prompts", "pass_at_k_best_step"}
USED_METRICS = {"timing/step", "timing/generate", "timing/policy_train", "timing/sync_weights", "timing/ref",
                "timing/teacher", "distill/token_kl_mean", "throughput/tokens_per_s", "reward/mean", "policy/entropy",
                "policy/grad_norm", "policy/kl", "memory/peak_gb", "eval/pass_at_1", "eval/pass_at_k", "eval/k",
                "eval/prompts"}


def test_every_column_of_the_builtin_tables_has_exactly_one_spec():
    claimed = columns.owners(COLUMNS)
    for table in tables.TABLES.values():
        for name in table:
            assert len(claimed.get(name, ())) == 1, (name, claimed.get(name))
    in_tables = {name for table in tables.TABLES.values() for name in table}
    assert set(claimed) == in_tables  # no spec of a column no table holds
    assert len({spec.name for spec in COLUMNS}) == len(COLUMNS)
    assert all(spec.doc for spec in COLUMNS)


def test_the_derived_structures_are_what_they_were():
    assert tables.THROUGHPUT == THROUGHPUT and tables.ACCURACY == ACCURACY
    assert tables.TABLES == {"throughput": THROUGHPUT, "accuracy": ACCURACY}
    assert {name: (c.header, c.justify, c.floor, c.drop) for name, c in renderers.SCREEN.items()} == SCREEN
    assert renderers.INTERVALS == INTERVALS == compare.INTERVALS
    assert renderers.BOUNDS == {bound for pair in INTERVALS.values() for bound in pair} == compare.BOUNDS
    assert renderers.SPREAD == SPREAD
    assert renderers.FRACTIONS == ("gen_frac", "train_frac", "sync_frac", "ref_frac", "teacher_frac")
    assert suggest.DIRECTIONS == DIRECTIONS
    assert {name: (n.absolute, n.relative) for name, n in compare.DEFAULT_NOISE.items()} == DEFAULT_NOISE
    assert compare.OTHER == compare.TIMING
    assert {name: how for name, how in columns.folds(COLUMNS).items()} == FOLDS
    assert set(intervals.FOLDS) == set(FOLDS)
    assert list(tables.ROW_SCHEMA) == list(dict.fromkeys(THROUGHPUT + ACCURACY))
    assert {name for name, dtype in tables.ROW_SCHEMA.items() if dtype == pl.String} == TEXT
    assert {name for name, dtype in tables.ROW_SCHEMA.items() if dtype == pl.Int64} == INTEGERS
    assert {name for name, dtype in tables.ROW_SCHEMA.items() if dtype == pl.Boolean} == {"entropy_collapse"}
    assert set(tables.USED_METRICS) == USED_METRICS
    signals = {name: (s.verdict, s.lower, s.higher, s.delta, s.percent) for name, s in suggest.SIGNALS.items()}
    assert signals == {
        "sec_per_step": ("verdict", "faster", "slower",
                         ("delta_vs_base_pct", "delta_vs_base_lo", "delta_vs_base_hi"), True),
        "delta_vs_base_pct": ("verdict", "faster", "slower",
                              ("delta_vs_base_pct", "delta_vs_base_lo", "delta_vs_base_hi"), True),
        "pass_at_k": ("pass_at_k_verdict", "worse", "better",
                      ("pass_at_k_vs_base", "pass_at_k_vs_base_lo", "pass_at_k_vs_base_hi"), False),
    }


def test_each_polars_column_has_its_expression_and_runs_at_its_stage():
    made_by_polars = {spec.name for spec in COLUMNS if spec.made in columns.EXPRESSION_STAGES}
    assert set(tables.AGGREGATES) == made_by_polars
    assert [e.meta.output_name() for e in tables.TRAIN_AGGREGATES] == [
        "steps", "gen_frac", "train_frac", "sync_frac", "ref_frac", "teacher_frac", "memory_peak_gb", "reward_first",
        "reward_last", "kl_first", "kl_last", "entropy_first", "entropy_last", "entropy_min", "logratio_max",
        "grad_norm_max"]
    assert [e.meta.output_name() for e in tables.EVAL_AGGREGATES] == [
        "pass_at_1", "pass_at_k", "eval_k", "eval_prompts", "pass_at_k_best", "pass_at_k_best_step"]
    assert {e.meta.output_name() for e in tables.RUN_EXPRESSIONS} == {"entropy_collapse", "pass_at_k_per_gpu_hour"}
    assert [e.meta.output_name() for e in tables.ROW_EXPRESSIONS] == ["bottleneck"]


def test_the_column_documentation_is_rendered_from_the_specs_not_copied():
    listing = columns.column_docs(COLUMNS)
    assert tables.__doc__.endswith(listing + "\n")
    for spec in COLUMNS:
        assert f"- ``{spec.name}`` (" in listing
    source = Path(tables.__file__).read_text()
    assert not any(f"- ``{spec.name}``" in source or spec.doc in source for spec in COLUMNS)
    # a spec's change shows in the documentation
    changed = [ReportColumn(name="x", tables=("t",), made="table", doc="made up", better="higher", noise="rate",
                            interval=Interval(style="rate"))]
    assert columns.column_docs(changed, width=200) == (
        "- ``x`` (t; its table's query; higher is better; ``x_lo`` / ``x_hi``): made up. Noise: 0.02 absolute.")


def test_a_verdict_is_never_left_out_to_fit():
    assert all(spec.drop is None for spec in COLUMNS if spec.shows == "verdict")
    with pytest.raises(ValueError, match="never left out"):
        ReportColumn(name="my_verdict", tables=("t",), made="table", dtype="text", shows="verdict", drop=3)
    with pytest.raises(ValueError, match="expected one of"):
        ReportColumn(name="x", tables=("t",), made="table", noise="loud")


# -- a plugin's column ----------------------------------------------------------------------

FASTEST = ReportColumn(name="fastest_step_s", tables=("fastest",), made="table", header="fastest", drop=2,
                       better="lower", noise="share", interval=Interval(style="relative", header="±", drop=1),
                       doc="each cell's fastest train step")
FASTEST_TABLE = ReportTable(build=lambda frames: frames.cells.select("cell"), doc="fastest step",
                            columns=(FASTEST,))


def test_a_plugins_column_spec_reaches_the_screen_suggest_and_compare_views():
    specs = columns_of({**tables.BUILTIN_TABLES, "fastest": FASTEST_TABLE})
    assert list(specs)[: len(COLUMNS)] == [spec.name for spec in COLUMNS] and specs["fastest_step_s"] == FASTEST
    assert columns.screen_columns(specs.values())["fastest_step_s"].header == "fastest"
    assert columns.interval_bounds(specs.values())["fastest_step_s"] == ("fastest_step_s_lo", "fastest_step_s_hi")
    assert columns.directions(specs.values())["fastest_step_s"] is True
    assert compare.default_noise(specs.values())["fastest_step_s"] == compare.SHARE

    frame = pl.DataFrame({"cell": ["base", "fast"], "status": ["passed", "passed"],
                          "fastest_step_s": [1.0, 0.5], "fastest_step_s_lo": [0.9, 0.45],
                          "fastest_step_s_hi": [1.1, 0.55]})
    # the terminal: its header, its interval in a column of its own, no bound columns
    console = Console(file=io.StringIO(), width=120, color_system=None)
    report = GridReport(grid="g", heading="h", tables={"fastest": frame}, shown=("fastest",), steps=None, diffs={},
                        report_dir=Path("."), columns=specs)
    renderers.show_screen(report, console)
    header = next(line for line in console.file.getvalue().splitlines() if line.startswith("cell"))
    assert header.split() == ["cell", "status", "fastest", "±"]
    assert "fastest_step_s_lo" not in console.file.getvalue() and "±10.0%" in console.file.getvalue()
    assert "| 1 ±10.0% |" in renderers.to_markdown(frame, specs)
    assert "fastest_step_s_lo" in renderers.to_markdown(frame)  # the built-in specs alone do not know it

    # suggest: its direction is known; compare: its bounds go with it, its interval decides
    cells = [Cell(grid="g.py", grid_name="g", name=name, config={}, target=Target(name="t", argv=("x",)),
                  location=("g.py", 1), index=index, diff={} if name == "base" else {"lr": (1, 2)})
             for index, name in enumerate(("base", "fast"))]
    chosen = suggest.suggest(cells, frame, column="fastest_step_s", specs=specs.values())
    assert chosen.lower_is_better and chosen.changes == {"lr": 2}  # 0.5 s beyond the 0.02 s noise rule
    with pytest.raises(UsageError, match="say whether lower or higher fastest_step_s is better"):
        suggest.suggest(cells, frame, column="fastest_step_s")
    moved = compare.compare(frame, frame.with_columns(pl.col("^fastest_step_s.*$") * 2), specs=specs.values())
    assert "fastest_step_s_lo_a" not in moved.columns
    assert moved["fastest_step_s_delta_lo"].to_list()[0] is not None
    assert moved["fastest_step_s_differs"].to_list() == [True, True]


def test_a_table_that_redefines_a_column_is_refused_at_registration():
    registry = ReportRegistry()
    for name, table in tables.BUILTIN_TABLES.items():
        registry.register_table(name, table)
    registry.register_table("fastest", FASTEST_TABLE)
    assert registry.columns()["fastest_step_s"] == FASTEST
    other = ReportColumn(name="sec_per_step", tables=("mine",), made="table")
    with pytest.raises(UsageError, match="'sec_per_step' .*defined twice"):
        registry.register_table("mine", ReportTable(build=lambda frames: frames.cells, columns=(other,)))
    bound = ReportColumn(name="tok_per_s_lo", tables=("mine",), made="table")  # a bound of the built-in tok_per_s
    with pytest.raises(UsageError, match="claimed by"):
        registry.register_table("mine", ReportTable(build=lambda frames: frames.cells, columns=(bound,)))
    assert "mine" not in registry.tables
