"""pytest's words on ``sweep run``: --co, --lf, -x / --maxfail, -q, and the short summary."""

from __future__ import annotations

import pytest

from test_run import script_grid, started  # noqa: F401 (fixtures come from conftest)


@pytest.fixture
def cpu_sweeper(sweeper):
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""  # one cell at a time, in grid order
    return sweeper


def test_collect_only_lists_and_runs_nothing(cpu_sweeper):
    script_grid(cpu_sweeper, "g", "other = sk.cell(steps=2)")
    for flag in ("--co", "--collect-only"):
        result = cpu_sweeper.run("run", flag)
        assert result.ret == 0, result
        assert "grids/g.py::other" in result.stdout and "2 cells in 1 grid" in result.stdout
    assert started(cpu_sweeper) == []
    assert not (cpu_sweeper.path / "runs" / "g").exists()


def test_short_summary_names_each_failure_and_why(cpu_sweeper):
    script_grid(cpu_sweeper, "g", """
        broken = sk.cell(steps=4, fail_at=2)
        fine = sk.cell(steps=1)
    """)
    result = cpu_sweeper.run("run")
    assert result.ret != 0
    lines = result.stdout.splitlines()
    summary = lines[lines.index("==== short summary ====") + 1:]
    assert summary[0].startswith("FAILED grids/g.py::broken - exit code 1: RuntimeError: boom at step 2")
    assert "runs/g/broken/stderr.log" in summary[0]
    assert not any("::fine" in line or "::base" in line for line in summary)
    assert "1 failed, 2 passed" in summary[-1]


def test_exitfirst_starts_no_cell_after_the_first_failure_and_lf_runs_the_rest(cpu_sweeper):
    script_grid(cpu_sweeper, "g", """
        broken = sk.cell(steps=3, fail_at=1)
        later = sk.cell(steps=2)
        last = sk.cell(steps=3)
    """, steps=1)
    result = cpu_sweeper.run("run", "-x")
    assert result.ret != 0, result
    assert started(cpu_sweeper) == ["base", "broken"]
    assert "stopping after 1 failure (--maxfail=1): 2 cells not started" in result.stdout
    assert "1 failed, 2 cancelled, 1 passed" in result.stdout
    # --lf takes the failed cell and the two it never started (cancelled counts as not passed)
    again = cpu_sweeper.run("run", "--lf", "--co")
    listed = [line.split()[0] for line in again.stdout.splitlines() if line.startswith("grids/")]
    assert listed == ["grids/g.py::broken", "grids/g.py::later", "grids/g.py::last"], again
    # the failed cell left checkpoints: the listing says it needs --resume or --rerun
    assert again.ret == 4 and "--rerun to delete them and start over" in again.stderr


def test_maxfail_counts_failures(cpu_sweeper):
    script_grid(cpu_sweeper, "g", """
        one = sk.cell(fail_at=1)
        two = sk.cell(fail_at=1, steps=2)
        three = sk.cell(fail_at=1, steps=3)
    """, steps=1)
    result = cpu_sweeper.run("run", "--maxfail", "2")
    assert started(cpu_sweeper) == ["base", "one", "two"]
    assert "2 failed, 1 cancelled, 1 passed" in result.stdout


def test_quiet_display_prints_no_progress_lines():
    import io

    from rich.console import Console

    from sweepkit.state.metrics import Summary
    from sweepkit.run.progress import RunDisplay

    printed = {}
    for quiet in (False, True):
        out = io.StringIO()
        display = RunDisplay(Console(file=out, width=100), ["g.py::a"], quiet=quiet)
        display.rows["g.py::a"].last_plain = 0.0  # the last progress line was long ago
        display.update("g.py::a", status="running", summary=Summary(step=3, sec_per_step=0.5))
        display.event("passed", "g.py::a", "step 3")
        printed[quiet] = out.getvalue().splitlines()
    assert printed[False] == ["              g.py::a  step 3  0.5 s/step", "PASSED        g.py::a  step 3"]
    assert printed[True] == ["PASSED        g.py::a  step 3"]


def test_dry_run_previews_a_cell_a_real_run_refuses(cpu_sweeper):
    """A --cluster dry run after a local smoke run must still show every job: the
    refusal a real run would give becomes the preview's note."""
    grid = script_grid(cpu_sweeper, "g", "", steps=1)
    assert cpu_sweeper.run("run").ret == 0
    grid.write_text(grid.read_text().replace("steps=1", "steps=2"))  # the completed run is now stale
    refused = cpu_sweeper.run("run")
    assert refused.ret == 4 and "--rerun" in refused.stderr, refused
    preview = cpu_sweeper.run("run", "--dry-run")
    assert preview.ret == 0, preview
    assert "previewed; a real run refuses it" in preview.stdout
    assert "would run 1 fresh" in preview.stdout


def test_list_quiet_prints_node_ids_and_verbose_each_config(cpu_sweeper):
    script_grid(cpu_sweeper, "g", "other = sk.cell(steps=2)")
    quiet = cpu_sweeper.run("list", "-q")
    assert quiet.ret == 0, quiet
    assert quiet.stdout.splitlines() == ["grids/g.py::base", "grids/g.py::other", "2 cells in 1 grid"]
    verbose = cpu_sweeper.run("list", "grids/g.py::other", "-v")
    lines = verbose.stdout.splitlines()
    assert lines[0].startswith("grids/g.py::other  steps=2")
    assert "    steps = 2" in lines and "    sleep = 0.1" in lines


def test_the_live_table_is_one_line_a_row_at_100_columns():
    import io

    from rich.console import Console

    from sweepkit.state.metrics import Summary
    from sweepkit.run.progress import RunDisplay

    out = io.StringIO()
    console = Console(file=out, width=100)
    nodeids = ["grids/gsm8k_throughput.py::combo_C", "grids/gsm8k_throughput.py::tbs128"]
    display = RunDisplay(console, nodeids)
    display.update(nodeids[1], status="running", attempt=1, summary=Summary(step=3, sec_per_step=1.5, reward=0.25),
                   note="a long note about what the cell is doing right now, longer than the terminal is wide")
    console.print(display._table())
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and all(len(line.rstrip()) <= 100 for line in lines)
    assert lines[2].startswith(nodeids[1]) and lines[2].rstrip().endswith("…")
