"""``sweepkit.report.suggest``: winners per axis of real collected cells, the combo they make, and
the pasted code collected for real."""

from __future__ import annotations

import ast
import math

import polars as pl
import pytest

from test_run import cpu_sweeper, script_grid  # noqa: F401 - a fixture

from sweepkit.errors import UsageError
from sweepkit.report.tables import grid_tables
from sweepkit.report.suggest import format_suggestion, suggest

GRID = '''
import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
base = sk.base(tbs=32, pmbs=32, gmu=0.7, eager=True, engines=4, tp=1, colocate=True, micro=8)
tbs = sk.axis("tbs, pmbs", [(64, 64), (128, 128), (256, 256)], id="tbs{tbs}")
gmu = sk.axis("gmu", [0.8, 0.85], ids=["gmu080", "gmu085"])
cudagraph = sk.cell(eager=False)
layout = sk.axis("engines, tp", [(2, 2), (1, 4)], id="{engines}xTP{tp}")
disaggregated = sk.cell(colocate=False, engines=2)
micro = sk.cell(micro=16)
combo_B = sk.cell(on=cudagraph, tbs=128, pmbs=128)
'''
CELLS = ["base", "tbs64", "tbs128", "tbs256", "gmu080", "gmu085", "cudagraph", "2xTP2", "1xTP4",
         "disaggregated", "micro", "combo_B"]


def collect_cells(sweeper, name="g"):
    """The grid's cells as `sweep list` collects them (in this process)."""
    from sweepkit.cli import start_session
    from sweepkit.grid.collect import collect

    grid = sweeper.path / "grids" / f"{name}.py"
    session = start_session(["list", "--rootdir", str(sweeper.path), str(grid)])
    session.configure()
    return list(collect(session, [str(grid)]).cells)


def table(values: dict, status: dict | None = None, column: str = "sec_per_step", noise: float = 2.0,
          inert: tuple[str, ...] = ()) -> pl.DataFrame:
    """A report table of ``values``; for sec_per_step, with the report's Δ vs base, its
    interval (±``noise`` points, as a grid whose cells are all measured that well) and verdict."""
    names = list(values)
    status = status or {}
    frame = pl.DataFrame({"cell": names, "status": [status.get(n, "passed") for n in names],
                          column: [values[n] for n in names], "diff": [""] * len(names), "seeds": [1] * len(names),
                          "timed_steps": [20] * len(names)},
                         schema_overrides={column: pl.Float64})
    if column != "sec_per_step":
        return frame
    base = values.get("base")
    deltas, verdicts = [], []
    for name in names:
        value = values[name]
        missing = base is None or value is None or math.isnan(value) or name == "base"
        delta = None if missing else (value / base - 1) * 100
        deltas.append(delta)
        if delta is None:
            verdicts.append(None)
        elif name in inert:
            verdicts.append("inert")
        elif abs(delta) <= noise:
            verdicts.append("within noise")
        else:
            verdicts.append("faster" if delta < 0 else "slower")
    return frame.with_columns(
        pl.Series("delta_vs_base_pct", deltas, dtype=pl.Float64),
        pl.Series("delta_vs_base_lo", [d - noise if d is not None else None for d in deltas], dtype=pl.Float64),
        pl.Series("delta_vs_base_hi", [d + noise if d is not None else None for d in deltas], dtype=pl.Float64),
        pl.Series("verdict", verdicts, dtype=pl.String))


def changes_of(cell) -> dict:
    return {key: after for key, (_, after) in cell.diff.items()}


def collect_with(sweeper, code: str, name: str):
    """Append ``code`` to the grid file, collect for real, return the cell ``name``."""
    path = sweeper.path / "grids" / "g.py"
    path.write_text(path.read_text() + "\n" + code)
    cells = {cell.name: cell for cell in collect_cells(sweeper)}
    return cells[name]


@pytest.fixture
def grid(sweeper):
    sweeper.grid("g", GRID)
    cells = collect_cells(sweeper)
    assert [cell.name for cell in cells] == CELLS
    return sweeper, cells


TIMES = {"base": 5.0, "tbs64": 4.5, "tbs128": 4.0, "tbs256": 4.2, "gmu080": 5.2, "gmu085": 5.5,
         "cudagraph": 2.5, "2xTP2": 4.8, "1xTP4": 6.0, "disaggregated": 5.3, "micro": 5.0, "combo_B": 2.0}


def test_winner_per_axis_and_the_code_collects_as_exactly_the_winners_changes(grid):
    sweeper, cells = grid
    s = suggest(cells, table(TIMES), column="sec_per_step", lower_is_better=True)
    winners = {axis.name: axis.winner for axis in s.axes}
    # combo_B changes cudagraph's and tbs's keys: a measured combo, no axis of its own.
    assert winners == {"tbs": "tbs128", "gmu": "base", "cudagraph": "cudagraph", "layout": "2xTP2",
                       "disaggregated": "base", "micro": "base"}
    assert [o.cell for o in s.combos] == ["combo_B"]
    assert s.base_value == 5.0
    assert s.joined == ("tbs128", "cudagraph", "2xTP2")
    assert s.changes == {"tbs": 128, "pmbs": 128, "eager": False, "engines": 2, "tp": 2}
    code = format_suggestion(s)
    assert "#   tbs: tbs128 4 (-20.0% [-22.0, -18.0] vs base; 20 timed steps, base 20 timed steps)" in code
    assert "#   cudagraph: cudagraph 2.5 (-50.0% [-52.0, -48.0] vs base;" in code
    assert "#   gmu: no change beats base, base kept: gmu080 5.2 (+4.0% [+2.0, +6.0] vs base;" in code
    assert "#   micro: no winner (within noise), base kept: micro 5 (+0.0% [-2.0, +2.0]" in code
    ast.parse(code)
    cell = collect_with(sweeper, code, "combo_suggested")
    assert changes_of(cell) == s.changes


def test_higher_is_better_is_known_for_throughput_and_the_code_fits_one_line(grid):
    sweeper, cells = grid
    # tok_per_s has no Δ interval in the report: the default rule (5 % of base) decides.
    tokens = {name: 1000.0 for name in CELLS} | {"micro": 1100.0, "gmu080": 1060.0, "tbs64": 1040.0}
    s = suggest(cells, table(tokens, column="tok_per_s"), column="tok_per_s")  # direction from DIRECTIONS
    assert s.lower_is_better is False
    assert "tok_per_s has no interval in the report: a change counts beyond the default noise rule" in s.code
    assert {axis.name: axis.why for axis in s.axes}["tbs"] == "no winner (within noise)"  # +4 %
    assert s.changes == {"gmu": 0.8, "micro": 16}
    line = [line for line in s.code.splitlines() if not line.startswith("#")]
    assert line == ["combo_suggested = sk.cell(gmu=0.8, micro=16)  # tok_per_s: joins gmu080, micro"]
    assert changes_of(collect_with(sweeper, s.code, "combo_suggested")) == {"gmu": 0.8, "micro": 16}


def test_ties_go_to_base_then_to_the_first_cell_of_the_grid(grid):
    _, cells = grid
    times = TIMES | {"tbs64": 4.0, "tbs128": 4.0, "cudagraph": 5.0}
    s = suggest(cells, table(times), column="sec_per_step", lower_is_better=True)
    axes = {axis.name: axis for axis in s.axes}
    assert axes["tbs"].winner == "tbs64" and axes["tbs"].tied == ("tbs128",)
    assert axes["cudagraph"].winner == "base" and axes["cudagraph"].why == "no winner (within noise)"  # Δ 0
    assert "eager" not in s.changes
    assert "#   tbs: tbs64 4 (-20.0% [-22.0, -18.0] vs base; 20 timed steps, base 20 timed steps) " \
           "[tbs=64 pmbs=64], tied with tbs128" in s.code


def test_failed_missing_nan_and_unreported_cells_do_not_compete_and_are_named(grid):
    sweeper, cells = grid
    times = dict(TIMES) | {"tbs256": 1.0, "gmu080": None, "gmu085": math.nan, "cudagraph": 1.5, "1xTP4": 4.7}
    del times["micro"]
    status = {"tbs256": "failed", "cudagraph": "xpassed", "2xTP2": "running"}
    s = suggest(cells, table(times, status), column="sec_per_step", lower_is_better=True)
    axes = {axis.name: axis for axis in s.axes}
    excluded = {o.cell: o.excluded for axis in s.axes for o in axis.options if o.excluded}
    assert excluded == {"tbs256": "failed", "gmu080": "no sec_per_step", "gmu085": "no sec_per_step",
                        "2xTP2": "running", "micro": "not in the report"}
    assert axes["tbs"].winner == "tbs128"  # tbs256's 1.0 is a failed run's number
    assert axes["gmu"].winner == "base"  # nothing else competed: no change
    assert axes["cudagraph"].winner == "cudagraph"  # an xfail that passed ran to its end
    assert axes["layout"].winner == "1xTP4"  # 2xTP2, still running, would be faster
    assert axes["micro"].winner == "base"
    assert "excluded tbs256: failed" in s.code and "excluded micro: not in the report" in s.code
    assert changes_of(collect_with(sweeper, s.code, "combo_suggested")) == {
        "tbs": 128, "pmbs": 128, "eager": False, "engines": 1, "tp": 4}


def test_a_conflict_keeps_the_better_winner_and_says_so(grid):
    sweeper, cells = grid
    # 1xTP4 sets engines=1, disaggregated engines=2: disaggregated is faster and stays.
    times = TIMES | {"1xTP4": 4.4, "2xTP2": 5.1, "disaggregated": 3.0}
    s = suggest(cells, table(times), column="sec_per_step", lower_is_better=True)
    axes = {axis.name: axis for axis in s.axes}
    assert axes["layout"].winner == "1xTP4" and axes["layout"].dropped
    assert axes["disaggregated"].dropped is None
    assert s.notes == ("1xTP4 conflicts with disaggregated on engines=1 (not 2): kept disaggregated (3 vs 4.4)",)
    assert s.changes == {"tbs": 128, "pmbs": 128, "eager": False, "colocate": False, "engines": 2}
    assert "tp" not in s.changes  # the dropped axis's keys go together
    assert changes_of(collect_with(sweeper, s.code, "combo_suggested")) == s.changes


def test_two_winners_that_agree_on_a_key_are_no_conflict(grid):
    sweeper, cells = grid
    times = TIMES | {"2xTP2": 4.0, "disaggregated": 3.0, "tbs128": 6.0, "tbs64": 6.0, "tbs256": 6.0}
    s = suggest(cells, table(times), column="sec_per_step", lower_is_better=True)
    assert s.notes == ()
    assert s.changes == {"eager": False, "engines": 2, "tp": 2, "colocate": False}
    code = "\n".join(line.partition("#")[0] for line in s.code.splitlines())
    assert code.count("engines=2") == 1  # each keyword once, also on one line per winner
    assert changes_of(collect_with(sweeper, s.code, "combo_suggested")) == s.changes


def test_base_wins_everywhere_gives_comments_only(grid):
    _, cells = grid
    times = {name: 6.0 for name in CELLS} | {"base": 5.0}
    s = suggest(cells, table(times), column="sec_per_step", lower_is_better=True)
    assert s.changes == {} and s.joined == ()
    assert all(axis.winner == "base" for axis in s.axes)
    assert all(line.startswith("#") for line in s.code.splitlines())
    assert "no axis beats base" in s.code


def test_without_a_base_value_nothing_wins(grid):
    _, cells = grid
    s = suggest(cells, table(TIMES, {"base": "failed"}), column="sec_per_step", lower_is_better=True)
    assert s.base_value is None and s.changes == {}
    assert s.notes[0] == ("base has no sec_per_step to compare with (failed): no change can be told from the "
                          "noise, so no axis has a winner")
    assert {axis.why for axis in s.axes} == {"no base value to compare with (failed)"}


def test_only_findings_win_and_an_inert_knob_never(grid):
    _, cells = grid
    # cudagraph's -50 % was measured on a run that reported enforce_eager as inert: noise by definition.
    times = TIMES | {"2xTP2": 4.95, "1xTP4": 5.05}
    s = suggest(cells, table(times, inert=("cudagraph",)), column="sec_per_step", lower_is_better=True)
    axes = {axis.name: axis for axis in s.axes}
    assert axes["cudagraph"].winner == "base" and axes["cudagraph"].why == "inert here"
    assert axes["layout"].winner == "base" and axes["layout"].why == "no winner (within noise)"
    assert s.changes == {"tbs": 128, "pmbs": 128}
    assert "#   cudagraph: inert here, base kept: cudagraph 2.5 (-50.0% [-52.0, -48.0] vs base; " in s.code
    assert "inert" in s.code.splitlines()[2 + [a.name for a in s.axes].index("cudagraph")]


def test_a_measured_combo_with_the_same_changes_and_a_taken_name(sweeper):
    sweeper.grid("g", GRID + "combo_suggested = sk.cell(micro=32)\n")
    cells = collect_cells(sweeper)
    times = TIMES | {"2xTP2": 6.0, "combo_suggested": 6.0}
    s = suggest(cells, table(times), column="sec_per_step", lower_is_better=True)
    assert s.changes == {"tbs": 128, "pmbs": 128, "eager": False}
    assert s.same_as == "combo_B"
    assert "# combo_B already has exactly these changes" in s.code
    assert s.name == "combo_suggested_2"


def test_columns_are_checked(grid):
    _, cells = grid
    frame = table(TIMES).with_columns(pl.col("sec_per_step").alias("grad_norm_max"))
    with pytest.raises(UsageError, match="--by grad_norm_max: say whether lower or higher grad_norm_max is better "
                                         r"\(--lower or --higher"):
        suggest(cells, frame, column="grad_norm_max")
    assert suggest(cells, frame, column="grad_norm_max", lower_is_better=True).changes  # any numeric column
    with pytest.raises(UsageError, match="--by sec_per_stp: no such column in the report.*did you mean 'sec_per_step'"):
        suggest(cells, frame, column="sec_per_stp")
    with pytest.raises(UsageError, match="--by diff: the column is not numeric"):
        suggest(cells, frame, column="diff", lower_is_better=True)


def test_on_the_report_of_a_real_run(cpu_sweeper):
    # The tables `sweep report` builds: real statuses, steady means, intervals and verdicts.
    script_grid(cpu_sweeper, "g", """
        t = sk.axis("t", [0.5, 2.0])
        steps = sk.axis("steps", [2, 4])  # 1 and 3 timed steps against base's 7: no finding
        broken = sk.cell(t=0.1, fail_at=2)
    """, steps=8, t=1.0, sleep=0.0)
    assert cpu_sweeper.run("run", "--executor", "debug").ret == 1  # broken fails
    throughput = grid_tables(cpu_sweeper.path / "runs" / "g")["throughput"]
    s = suggest(collect_cells(cpu_sweeper), throughput, column="sec_per_step")
    axes = {axis.name: axis for axis in s.axes}
    assert axes["t"].winner == "t0.5"
    assert [(o.cell, o.excluded) for o in axes["broken"].options] == [("base", None), ("broken", "failed")]
    assert axes["steps"].winner == "base" and axes["steps"].why in ("too few steps", "no winner (within noise)")
    assert s.changes == {"t": 0.5} and s.same_as == "t0.5"
    assert "# t0.5 already has exactly these changes" in s.code
