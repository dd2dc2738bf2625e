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


def test_compare_takes_its_noise_from_seed_repeats_and_reads_committed_reports(sweeper):
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    script_grid(sweeper, "g", """
        seeds = sk.axis("seed", [1, 2], id="seed{seed}")
        fast = sk.axis("t", [0.5, 2.0], id="t{t}")
    """, steps=4, t=1.0, seed=0, sleep=0.0)
    assert sweeper.run("run", "--executor", "debug").ret == 0
    runs, other = sweeper.path / "runs" / "g", sweeper.path / "other" / "g"
    shutil.copytree(runs, other)
    for side in (runs, other):  # the repeats of base spread by 10 %: sd of sec_per_step about 0.06
        _scale_step_times(side / "seed1", 1.1)
    for cell in ("t0.5", "t2.0"):  # both 20 % slower: 0.10 s for t0.5, 0.41 s for t2.0
        _scale_step_times(other / cell, 1.2)
    result = sweeper.run("compare", str(runs), str(other), "--columns", "sec_per_step")
    assert result.ret == 0, result
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.split()}
    # the noise the repeats give (about 0.17 s) hides t0.5's move, not t2.0's
    assert "*" in lines["t2.0"] and "*" not in lines["t0.5"] and "*" not in lines["seed1"]
    assert lines["noise"].startswith("noise from repeats: 2 group(s) of cells that differ only in seed, 6 finished "
                                     "runs (a: base, seed1, seed2; b: base, seed1, seed2)")

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
