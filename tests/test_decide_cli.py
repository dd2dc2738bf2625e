"""`sweep suggest` and `sweep compare` on the command line, over real runs of a grid."""

from __future__ import annotations

import json
import shutil
import subprocess

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


def _scale_step_times(cell_dir, factor: float) -> None:
    path = cell_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        if "timing/step" in record:
            record["timing/step"] *= factor
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def test_compare_takes_its_noise_from_the_seeds_and_reads_committed_reports(sweeper):
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    script_grid(sweeper, "g", """
        seeds = 3
        fast = sk.axis("t", [0.5, 2.0], id="t{t}")
    """, steps=4, t=1.0, seed=0, sleep=0.0)
    assert sweeper.run("run", "--executor", "debug").ret == 0
    runs, other = sweeper.path / "runs" / "g", sweeper.path / "other" / "g"
    assert sorted(path.name for path in runs.iterdir() if (path / "cell.json").exists()) == [
        "base", "base-seed1", "base-seed2", "t0.5", "t0.5-seed1", "t0.5-seed2", "t2.0", "t2.0-seed1", "t2.0-seed2"]
    shutil.copytree(runs, other)
    for side in (runs, other):  # each setting's seeds spread by 3 %
        for cell in ("base-seed1", "t0.5-seed1", "t2.0-seed1"):
            _scale_step_times(side / cell, 1.03)
    for cell, factor in (("t0.5", 1.02), ("t2.0", 1.3)):  # t0.5's seeds 2 % slower, t2.0's 30 %
        for repeat in ("", "-seed1", "-seed2"):
            _scale_step_times(other / f"{cell}{repeat}", factor)
    result = sweeper.run("compare", str(runs), str(other), "--columns", "sec_per_step")
    assert result.ret == 0, result
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.split()}
    # One row a setting; the seeds' spread (about ±4 % with 3 seeds) hides t0.5's move, not t2.0's.
    assert not any(name.endswith(("-seed1", "-seed2")) for name in lines)
    assert "*" in lines["t2.0"] and "*" not in lines["t0.5"] and "*" not in lines["base"]
    assert "Δ [" in lines["t0.5"]
    assert lines["noise:"].startswith("noise: sec_per_step: the interval of Δ from both rows' intervals (the seeds' "
                                      "spread where a row has seeds")
    table = sweeper.run("report", "--format", "csv", "--table", "throughput")
    rows = {row["cell"]: row for row in __import__("csv").DictReader(table.stdout.splitlines())}
    assert rows["t2.0"]["seeds"] == "3" and float(rows["t2.0"]["sec_per_step_lo"]) < float(rows["t2.0"]["sec_per_step"])

    # the same two runs' reports, committed: REV:PATH reads them from git
    git = ["git", "-C", str(sweeper.path), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    for runs_dir, message in (("runs", "first"), ("other", "second")):
        assert sweeper.run("--runs-dir", runs_dir, "report", "--format", "parquet").ret == 0
        subprocess.run([*git, "add", f"{runs_dir}/g/report"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", message], check=True)
    committed = sweeper.run("compare", "HEAD~1:runs/g", "HEAD:other/g", "--columns", "sec_per_step")
    assert committed.ret == 0, committed
    assert committed.stdout == result.stdout
    missing = sweeper.run("compare", "HEAD:runs/nothing", "HEAD:other/g")
    assert missing.ret == 4 and "HEAD:runs/nothing: no report tables committed there" in missing.stderr
    assert "'nope' is no commit" in sweeper.run("compare", "nope:runs/g", "HEAD:other/g").stderr


def test_a_level_outside_0_1_is_refused_naming_the_option_and_nothing_is_written(sweeper):
    _run_grid(sweeper)
    report_dir = sweeper.path / "runs" / "g" / "report"
    assert not report_dir.exists()
    for args in (("report", "--level", "1.5"), ("report", "--level", "abc"),
                 ("suggest", "grids/g.py", "--level", "0"),
                 ("compare", "runs/g", "runs/g", "--level", "95")):
        result = sweeper.run(*args)
        assert result.ret == 4, result
        assert "--level: must be a number in (0, 1)" in result.stderr, result.stderr
    assert not report_dir.exists()  # refused before any table was made
    assert sweeper.run("report", "--level", "0.9").ret == 0 and report_dir.is_dir()
