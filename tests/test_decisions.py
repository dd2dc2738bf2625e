"""The deciding layer on simulated sweeps: a real grid, collected and run, whose cells' metrics
are then replaced by step times with known true effects and noise (a compile step,
first-bucket steps, autocorrelated noise). Over many simulated sweeps, the report's
intervals cover the truth at about their level, and ``suggest`` picks the true winner and
never a knob that does nothing or that its run reported inert."""

from __future__ import annotations

import json
import random

import pytest
from test_steadystate import simulated_run
from test_suggest import collect_cells

from sweepkit.report.tables import grid_tables, wide_table
from sweepkit.report.suggest import suggest

GRID = """
import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
base = sk.base(batch=32, gmu=0.7, eager=True, width=1)
batch = sk.axis("batch", [64, 128], id="batch{batch}")
gmu = sk.axis("gmu", [0.8, 0.85], ids=["gmu080", "gmu085"])
eager = sk.cell(eager=False)
width = sk.axis("width", [2, 4], id="width{width}")
"""
# The true sec/step of each cell: batch128 is the true winner; gmu does nothing and its runs
# say so (inert); eager does nothing and its run does not know it; width costs time.
TRUTH = {"base": 2.0, "batch64": 1.7, "batch128": 1.5, "gmu080": 2.0, "gmu085": 2.0, "eager": 2.0,
         "width2": 2.2, "width4": 2.4}
INERT = ("gmu080", "gmu085")
SWEEPS = 40


def write_run(cell_dir, times: list[float], *, inert: bool) -> None:
    info = {"kind": "info", "step": 0, "device": "cuda",
            "inert_knobs": {"gmu": {"value": 0.8, "reason": "no KV cache to size"}} if inert else {}}
    steps = [{"kind": "train", "step": step, "timing/step": time, "throughput/tokens_per_s": 1000.0 / time}
             for step, time in enumerate(times, 1)]
    (cell_dir / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in [info, *steps]))


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """The report's table and suggest's answer for each of SWEEPS simulated sweeps."""
    from conftest import Sweeper

    sweeper = Sweeper.new(tmp_path_factory.mktemp("decisions"))
    sweeper.grid("g", GRID)
    assert sweeper.run("run", "--executor", "debug").ret == 0
    cells = collect_cells(sweeper)
    grid_dir = sweeper.path / "runs" / "g"
    rng = random.Random(11)
    results = []
    for _ in range(SWEEPS):
        for name, mean in TRUTH.items():
            write_run(grid_dir / name, simulated_run(rng, mean, 20, 0.3), inert=name in INERT)
        table = wide_table(grid_tables(grid_dir))
        results.append((table, suggest(cells, table, column="sec_per_step")))
    return results


def test_each_cells_interval_covers_its_true_sec_per_step(sweeps):
    covered = total = 0
    for table, _ in sweeps:
        for row in table.iter_rows(named=True):
            covered += row["sec_per_step_lo"] <= TRUTH[row["cell"]] <= row["sec_per_step_hi"]
            total += 1
    assert total == SWEEPS * len(TRUTH)
    assert 0.88 <= covered / total <= 1.0, covered / total


def test_the_delta_intervals_cover_every_true_change_together(sweeps):
    # Simultaneous intervals: in about 95 % of the sweeps or more, every cell's covers its truth.
    all_covered = 0
    for table, _ in sweeps:
        rows = [row for row in table.iter_rows(named=True) if row["cell"] != "base"]
        all_covered += all(row["delta_vs_base_lo"] <= (TRUTH[row["cell"]] / TRUTH["base"] - 1) * 100
                           <= row["delta_vs_base_hi"] for row in rows)
    assert all_covered / SWEEPS >= 0.9, all_covered


def test_suggest_picks_the_true_winner_and_never_a_knob_that_does_nothing(sweeps):
    winners = [{axis.name: axis.winner for axis in suggestion.axes} for _, suggestion in sweeps]
    assert sum(w["batch"] == "batch128" for w in winners) >= 0.9 * SWEEPS
    assert all(w["gmu"] == "base" for w in winners)  # inert: never, whatever the noise did
    assert all(w["width"] == "base" for w in winners)  # slower
    assert sum(w["eager"] != "base" for w in winners) <= 0.05 * SWEEPS  # no effect: within noise
    for table, suggestion in sweeps:
        verdicts = dict(table.select("cell", "verdict").iter_rows())
        assert verdicts["gmu080"] == verdicts["gmu085"] == "inert"
        assert set(suggestion.changes) <= {"batch", "eager"}
        gmu = next(axis for axis in suggestion.axes if axis.name == "gmu")
        assert gmu.why == "inert here" and "gmu: inert here, base kept" in suggestion.code
    # What a winner rests on is said beside it: its Δ interval and the steps of both sides.
    code = sweeps[0][1].code
    line = next(line for line in code.splitlines() if line.startswith("#   batch: batch128"))
    assert "] vs base; 19 timed steps, base 19 timed steps) [batch=128]" in line


ACCURACY_GRID = """
import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
base = sk.base(lr=1e-6, kl=0.0, seed=1, seeds=5)
lr = sk.axis("lr", [1e-5], id="lr1e-5")
kl = sk.axis("kl", [0.1], id="kl0.1")
"""
# True pass@k: lr1e-5 is better by 0.2 (the seeds' lr knee moved pass@k more than that); kl0.1
# does nothing. Seeds move pass@k by sd 0.03; base's five seeds measure it on 4 degrees of freedom.
PASS_AT_K = {"base": 0.60, "lr1e-5": 0.80, "kl0.1": 0.60}


def write_eval(cell_dir, pass_at_k: float) -> None:
    records = [{"kind": "info", "step": 0, "device": "cuda"},
               {"kind": "train", "step": 1, "timing/step": 1.0},
               {"kind": "eval", "step": 1, "eval/pass_at_k": pass_at_k, "eval/k": 8, "eval/prompts": 1319}]
    (cell_dir / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))


def test_a_seed_spread_measured_on_base_decides_pass_at_k_for_single_seed_cells(sweeper):
    sweeper.grid("g", ACCURACY_GRID)
    assert sweeper.run("run", "--executor", "debug").ret == 0
    cells = collect_cells(sweeper)
    assert [cell.name for cell in cells] == ["base", *(f"base-seed{n}" for n in range(2, 6)), "lr1e-5", "kl0.1"]
    grid_dir = sweeper.path / "runs" / "g"
    rng = random.Random(5)
    winners = []
    for _ in range(SWEEPS):
        for cell in cells:
            write_eval(grid_dir / cell.name, PASS_AT_K[cell.group] + rng.gauss(0.0, 0.03))
        accuracy = grid_tables(grid_dir)["accuracy"]
        rows = {row["cell"]: row for row in accuracy.iter_rows(named=True)}
        assert list(rows) == ["base", "lr1e-5", "kl0.1"] and rows["base"]["seeds"] == 5
        assert rows["base"]["pass_at_k_lo"] < rows["base"]["pass_at_k"] < rows["base"]["pass_at_k_hi"]
        suggestion = suggest(cells, wide_table(grid_tables(grid_dir)), column="pass_at_k")
        winners.append({axis.name: axis.winner for axis in suggestion.axes})
    assert sum(w["lr"] == "lr1e-5" for w in winners) >= 0.9 * SWEEPS
    assert sum(w["kl"] != "base" for w in winners) <= 0.05 * SWEEPS
    # Without the repeats, one seed each: no seed spread, no finding, whatever the numbers.
    for name in (f"base-seed{n}" for n in range(2, 6)):
        __import__("shutil").rmtree(grid_dir / name)
    accuracy = grid_tables(grid_dir)["accuracy"]
    assert dict(accuracy.select("cell", "pass_at_k_verdict").iter_rows()) == {
        "base": None, "lr1e-5": "1 seed", "kl0.1": "1 seed"}
    suggestion = suggest(cells, wide_table(grid_tables(grid_dir)), column="pass_at_k")
    assert suggestion.changes == {} and "1 seed: no seed spread measured (give base seeds=3)" in suggestion.code
