"""`sweep suggest` and `sweep compare` on the command line, over real runs of a grid."""

from __future__ import annotations

import shutil

from test_run import script_grid


def _run_grid(sweeper):
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    script_grid(sweeper, "g", """
        fast = sk.axis("t", [0.5, 2.0], id="t{t}")
        short = sk.axis("steps", [2], id="steps{steps}")
    """, steps=4, t=1.0, sleep=0.0)
    result = sweeper.run("run", "--executor", "debug")
    assert result.ret == 0, result


def test_suggest_prints_the_winners_as_a_cell_to_paste(sweeper):
    _run_grid(sweeper)
    result = sweeper.run("suggest", "grids/g.py", "--by", "sec_per_step")
    assert result.ret == 0, result
    code = [line for line in result.stdout.splitlines() if line.startswith("combo_suggested = sk.cell(")]
    assert code and "t=0.5" in code[0]
    # pasted into the grid file, it collects as a cell
    grid = sweeper.path / "grids" / "g.py"
    grid.write_text(grid.read_text() + code[0] + "\n")
    listed = sweeper.run("list", "grids/g.py::combo_suggested")
    assert listed.ret in (0, 4), listed  # 4: it may equal a measured cell's config
    assert "combo_suggested" in listed.stdout + listed.stderr


def test_compare_flags_a_cell_that_got_slower(sweeper):
    _run_grid(sweeper)
    runs = sweeper.path / "runs" / "g"
    other = sweeper.path / "other" / "g"
    shutil.copytree(runs, other)
    metrics = other / "t0.5" / "metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('"timing/step": ', '"timing/step": 9'))  # 0.5 -> 90.5 s
    result = sweeper.run("compare", str(runs), str(other), "--columns", "sec_per_step")
    assert result.ret == 0, result
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.split()}
    assert "*" in lines["t0.5"] and "*" not in lines["base"]
    bad = sweeper.run("compare", str(runs), str(sweeper.path / "nowhere"))
    assert bad.ret == 4 and "not a grid's runs" in bad.stderr
