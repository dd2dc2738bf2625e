"""``sweepkit.report.compare``: two report tables cell by cell, Δ, Δ% and noise flags."""

from __future__ import annotations

import math

import polars as pl
import pytest
from test_run import cpu_sweeper, script_grid  # noqa: F401 - a fixture

from steadystate import Interval, difference
from sweepkit.report.compare import compare, format_compare, noise_from_repeats, noise_note
from sweepkit.errors import UsageError
from sweepkit.report.tables import grid_tables

A = pl.DataFrame({
    "cell": ["base", "fast", "acc", "gone", "dead"],
    "status": ["passed", "passed", "passed", "passed", "passed"],
    "steps": [10, 10, 10, 10, 10],
    "sec_per_step": [5.0, 4.0, 5.0, 5.0, 5.0],
    "pass_at_k": [0.50, 0.50, 0.50, None, None],
    "diff": ["", "x=1", "y=2", "z=3", "w=4"],
})
B = pl.DataFrame({
    "cell": ["base", "fast", "acc", "dead", "new"],
    "status": ["passed", "passed", "passed", "failed", "passed"],
    "steps": [10, 10, 11, 3, 10],
    "sec_per_step": [5.2, 3.0, 5.0, None, 1.0],
    "pass_at_k": [0.51, 0.50, 0.55, None, 0.9],
})


def row(frame: pl.DataFrame, cell: str) -> dict:
    return frame.filter(pl.col("cell") == cell).to_dicts()[0]


def test_delta_percent_and_default_noise_flags():
    frame = compare(A, B, columns=["sec_per_step", "pass_at_k", "steps"])
    base, fast, acc = row(frame, "base"), row(frame, "fast"), row(frame, "acc")
    assert base["sec_per_step_delta"] == pytest.approx(0.2)
    assert base["sec_per_step_delta_pct"] == pytest.approx(4.0)
    assert base["sec_per_step_noise"] == pytest.approx(0.25)  # 5 % of a
    assert base["sec_per_step_differs"] is False  # +4 %: within 5 %
    assert fast["sec_per_step_delta_pct"] == pytest.approx(-25.0) and fast["sec_per_step_differs"] is True
    assert base["pass_at_k_differs"] is False  # +0.01: within 0.02
    assert acc["pass_at_k_delta"] == pytest.approx(0.05) and acc["pass_at_k_differs"] is True
    assert acc["steps_differs"] is True and base["steps_differs"] is False  # steps: any change


def test_noise_given_per_column_replaces_the_default():
    frame = compare(A, B, columns=["sec_per_step", "pass_at_k"], noise={"sec_per_step": 1.5})
    assert row(frame, "fast")["sec_per_step_differs"] is False  # |-1.0| <= 1.5
    assert row(frame, "fast")["sec_per_step_noise"] == 1.5
    assert row(frame, "acc")["pass_at_k_differs"] is True  # still the default 0.02
    with pytest.raises(UsageError, match="noise for columns not compared: tok_per_s"):
        compare(A, B, columns=["sec_per_step"], noise={"tok_per_s": 1.0})
    with pytest.raises(UsageError, match="noise must be a number >= 0: sec_per_step"):
        compare(A, B, columns=["sec_per_step"], noise={"sec_per_step": -1.0})


def test_cells_on_one_side_and_values_on_one_side():
    frame = compare(A, B, columns=["sec_per_step", "pass_at_k"])
    assert frame["cell"].to_list() == ["base", "fast", "acc", "gone", "dead", "new"]
    assert dict(frame.select("cell", "present").iter_rows()) == {
        "base": "both", "fast": "both", "acc": "both", "gone": "a", "dead": "both", "new": "b"}
    gone, new, dead = row(frame, "gone"), row(frame, "new"), row(frame, "dead")
    assert gone["sec_per_step_a"] == 5.0 and gone["sec_per_step_b"] is None and gone["sec_per_step_differs"] is None
    assert new["sec_per_step_b"] == 1.0 and new["status_a"] is None and new["sec_per_step_differs"] is None
    # dead failed in b: its timing vanished (a difference); no pass_at_k on either side (unknown).
    assert dead["status_b"] == "failed"
    assert dead["sec_per_step_differs"] is True and dead["sec_per_step_delta"] is None
    assert dead["pass_at_k_differs"] is None


def test_nan_is_missing_and_a_zero_a_has_no_percent():
    a = pl.DataFrame({"cell": ["x", "y"], "reward_last": [0.0, math.nan]})
    b = pl.DataFrame({"cell": ["x", "y"], "reward_last": [0.3, math.nan]})
    frame = compare(a, b, columns=["reward_last"])
    x, y = row(frame, "x"), row(frame, "y")
    assert x["reward_last_delta"] == pytest.approx(0.3) and x["reward_last_delta_pct"] is None
    assert x["reward_last_differs"] is True
    assert y["reward_last_a"] is None and y["reward_last_differs"] is None
    assert frame["status_a"].to_list() == [None, None]  # tables without a status


def test_default_columns_are_the_numeric_ones_both_have():
    frame = compare(A, B)
    assert [name[:-len("_differs")] for name in frame.columns if name.endswith("_differs")] == [
        "steps", "sec_per_step", "pass_at_k"]


def test_bad_columns_and_duplicate_cells_are_refused():
    with pytest.raises(UsageError, match="no column 'sec_per_stp'.*did you mean 'sec_per_step'"):
        compare(A, B, columns=["sec_per_stp"])
    with pytest.raises(UsageError, match="'diff' is not numeric"):
        compare(A, B, columns=["diff"])
    with pytest.raises(UsageError, match="table b has cells twice: base"):
        compare(A, pl.concat([B, B.head(1)]), columns=["steps"])


def test_noise_from_repeats_is_the_pooled_spread_of_a_difference():
    runs = [pl.DataFrame({"cell": ["p", "q"], "sec_per_step": [1.0 + d, 2.0 - d]}) for d in (0.0, 0.2)]
    # each cell's two runs differ by 0.2: variance 0.02, pooled sd sqrt(0.02)
    noise = noise_from_repeats(runs, columns=["sec_per_step"])
    assert noise["sec_per_step"] == pytest.approx(2.0 * math.sqrt(2) * math.sqrt(0.02))
    with pytest.raises(UsageError, match="at least two tables"):
        noise_from_repeats(runs[:1], columns=["sec_per_step"])


def test_intervals_on_both_sides_decide_by_the_interval_of_the_delta():
    a = pl.DataFrame({"cell": ["wide", "tight", "bare"], "sec_per_step": [1.0, 1.0, 1.0],
                      "sec_per_step_lo": [0.9, 0.99, None], "sec_per_step_hi": [1.1, 1.01, None]})
    b = pl.DataFrame({"cell": ["wide", "tight", "bare"], "sec_per_step": [1.12, 1.05, 1.2],
                      "sec_per_step_lo": [1.02, 1.04, None], "sec_per_step_hi": [1.22, 1.06, None]})
    frame = compare(a, b)
    assert [name for name in frame.columns if name.endswith("_differs")] == ["sec_per_step_differs"]  # no bounds
    wide, tight, bare = row(frame, "wide"), row(frame, "tight"), row(frame, "bare")
    # +12 %, beyond the default 5 % rule, but inside the noise both intervals show.
    assert wide["sec_per_step_differs"] is False and wide["sec_per_step_noise"] is None
    for name, side in (("wide", wide), ("tight", tight)):
        expected = difference(*(Interval(value=frame_row["sec_per_step"], low=frame_row["sec_per_step_lo"],
                                         high=frame_row["sec_per_step_hi"], level=0.95)
                                for frame_row in (row(a, name), row(b, name))))
        assert (side["sec_per_step_delta_lo"], side["sec_per_step_delta_hi"]) == pytest.approx(
            (expected.low, expected.high))
    assert wide["sec_per_step_delta_lo"] < 0 < wide["sec_per_step_delta_hi"]
    assert tight["sec_per_step_differs"] is True and tight["sec_per_step_delta_lo"] > 0  # +5 %, tightly measured
    # A row without an interval (one timed step) falls back on the default rule.
    assert bare["sec_per_step_differs"] is True and bare["sec_per_step_noise"] == pytest.approx(0.05)
    assert bare["sec_per_step_delta_lo"] is None
    text = format_compare(frame, noise_note(frame))
    assert "1 → 1.05 (+5.0%) Δ [+0.0359, +0.0641] *" in text
    assert text.splitlines()[-1].startswith("noise: sec_per_step: the interval of Δ from both rows' intervals")


def test_format_marks_differences_and_one_sided_cells():
    text = format_compare(compare(A, B, columns=["sec_per_step", "pass_at_k"]))
    lines = text.splitlines()
    assert lines[0].split() == ["cell", "status", "sec_per_step", "pass_at_k"]
    fast = next(line for line in lines if line.startswith("fast"))
    assert "4 → 3 (-25.0%) *" in fast
    assert "5 → 5.2 (+4.0%)" in next(line for line in lines if line.startswith("base"))
    assert "*" not in next(line for line in lines if line.startswith("base"))
    assert "passed → failed" in next(line for line in lines if line.startswith("dead"))
    assert "only in a" in next(line for line in lines if line.startswith("gone"))
    assert lines[-1] == ("3 of 4 cells differ beyond noise (*): fast (sec_per_step), acc (pass_at_k), "
                         "dead (sec_per_step); only in a: gone; only in b: new")


def test_two_real_reports_of_the_same_grid(cpu_sweeper):
    script_grid(cpu_sweeper, "g", """
        slow = sk.cell(t=2.0)
    """, steps=3, t=1.0, sleep=0.0)
    assert cpu_sweeper.run("run", "--executor", "debug").ret == 0
    first = grid_tables(cpu_sweeper.path / "runs" / "g")["throughput"]
    same = compare(first, first, columns=["sec_per_step", "tok_per_s", "steps"])
    assert not any(same[f"{name}_differs"].any() for name in ("sec_per_step", "tok_per_s", "steps"))
    # The grid rerun with slow's step time doubled: only slow moves, by +100 %.
    grid = cpu_sweeper.path / "grids" / "g.py"
    grid.write_text(grid.read_text().replace("slow = sk.cell(t=2.0)", "slow = sk.cell(t=4.0)"))
    assert cpu_sweeper.run("run", "--executor", "debug", "--rerun", "grids/g.py::slow").ret == 0
    second = grid_tables(cpu_sweeper.path / "runs" / "g")["throughput"]
    frame = compare(first, second, columns=["sec_per_step"])
    assert dict(frame.select("cell", "sec_per_step_differs").iter_rows()) == {"base": False, "slow": True}
    assert row(frame, "slow")["sec_per_step_delta_pct"] == pytest.approx(100.0)
