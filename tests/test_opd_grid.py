"""grids/opd_qwen3.py: the seed's OPD sweep, its 2-node Leonardo jobs, and a smoke run whose
report shows the teacher's share of the step and the KL."""

from __future__ import annotations

from test_math_grid import leonardo_dry_run, project_with_grids

GRID = "grids/opd_qwen3.py"


def test_the_grid_is_top_k_by_lr_plus_the_production_cell(sweeper):
    result = project_with_grids(sweeper).run("list", GRID)
    assert result.ret == 0, result
    assert "13 cells in 1 grid" in result.stdout
    for top_k in (16, 32, 64):
        for lr in ("1e-5", "3e-5", "1e-4"):
            assert f"{GRID}::topk{top_k}_lr{lr} " in result.stdout
    assert f"{GRID}::topk128_lr1e-5 " in result.stdout and f"{GRID}::prod  teacher_top_k=64" in result.stdout


def test_on_leonardo_every_cell_is_a_two_node_job(sweeper):
    result = leonardo_dry_run(project_with_grids(sweeper), GRID)
    work = sweeper.path / "work"
    assert result.ret == 0, result
    # offline compute nodes: the hub-name teacher is flagged like the student
    assert "teacher_model: 'Qwen/Qwen3-32B' is a hub name" in result.output
    scripts = sorted((work / "runs" / ".dry-run" / "opd_qwen3").glob("*.sbatch"))
    # the 12 cells of one shape go as one array job, prod (a longer time limit) alone
    assert len(scripts) == 2
    assert sum("#SBATCH --array=0-11" in script.read_text() for script in scripts) == 1
    for script in scripts:
        text = script.read_text()
        assert "#SBATCH --nodes=2\n" in text and "ray start --head" in text, script.name


def test_smoke_run_reports_the_teacher_share_and_the_kl(sweeper):
    project = project_with_grids(sweeper)
    result = project.run("run", f"{GRID}::topk16_lr1e-4", "--profile", "smoke")
    assert result.ret == 0, result
    report = project.run("report", GRID, "--format", "csv", "--table", "accuracy")
    assert report.ret == 0, report
    header, *rows = (sweeper.path / "runs" / "opd_qwen3" / "report" / "accuracy.csv").read_text().splitlines()
    columns = header.split(",")
    row = dict(zip(columns, rows[0].split(",")))
    assert row["cell"] == "topk16_lr1e-4" and float(row["kl_first"]) > 0 and float(row["kl_last"]) > 0
    throughput = (sweeper.path / "runs" / "opd_qwen3" / "report" / "throughput.csv").read_text().splitlines()
    row = dict(zip(throughput[0].split(","), throughput[1].split(",")))
    assert 0 < float(row["teacher_frac"]) < 1
