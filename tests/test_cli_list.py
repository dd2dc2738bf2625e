"""`sweep list` on the project's own grids, and the command line itself."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
THROUGHPUT = ["base", "tbs64", "tbs128", "tbs256", "tbs512", "n8", "n16", "gmu080", "gmu085",
              "cudagraph", "2xTP2", "1xTP4", "micro", "reshard", "disaggregated",
              "combo_A", "combo_B", "combo_C"]


def sweep(*args, cwd=REPO):
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("SWEEPKIT_GSM8K", None)
    return subprocess.run([sys.executable, "-m", "sweepkit", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_lists_the_18_throughput_cells():
    result = sweep("list", "grids/gsm8k_throughput.py")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == \
        [f"grids/gsm8k_throughput.py::{name}" for name in THROUGHPUT]
    assert lines[-1] == "18 cells in 1 grid"
    assert "grids/gsm8k_throughput.py::cudagraph  enforce_eager=false" in result.stdout
    assert "grids/gsm8k_throughput.py::tbs512  train_batch_size=512 policy_mini_batch_size=512  " \
           "[gsm8k, throughput, slow]" in result.stdout


def test_list_with_profile_shows_what_it_shrank():
    result = sweep("list", "grids/gsm8k_throughput.py::tbs128", "--profile", "smoke")
    assert result.returncode == 0, result.stderr
    line = result.stdout.splitlines()[0]
    assert line.startswith("grids/gsm8k_throughput.py::tbs128  train_batch_size=128 "
                           "policy_mini_batch_size=128  [gsm8k, throughput]  | smoke: ")
    for change in ("model=tiny-random", "dataset=synthetic", "backend=hf", "device=cpu", "gpus=0",
                   "train_batch_size=8", "policy_mini_batch_size=8", "max_steps=2"):
        assert change in line


def test_unknown_profile_lists_registered_ones():
    result = sweep("list", "--profile", "smok")
    assert result.returncode == 4
    assert "--profile smok: no such profile (registered: gpu, smoke)" in result.stderr


def test_console_script_and_help():
    script = Path(sys.executable).with_name("sweep")
    result = subprocess.run([str(script), "run", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for option in ("--profile", "--executor", "--dry-run", "--detach", "--rerun", "--resume",
                   "--failed", "-k", "-m", "--runs-dir"):
        assert option in result.stdout
    assert "smoke" in result.stdout  # help for --profile comes from the registry


def test_missing_subcommand_is_a_usage_error():
    result = sweep()
    assert result.returncode == 4  # bad input; 2 means interrupted
    assert "ERROR: sweep: the following arguments are required: COMMAND" in result.stderr
    assert "usage: sweep" in result.stderr


def test_rerun_and_resume_exclude_each_other():
    result = sweep("run", "--rerun", "--resume")
    assert result.returncode == 4
    assert "ERROR: sweep run: argument --resume: not allowed with argument --rerun" in result.stderr


def test_a_bad_option_is_bad_input():
    for args, message in ((("run", "--no-such-option"), "sweep: unrecognized arguments: --no-such-option"),
                          (("run", "--max-parallel", "two"), "argument --max-parallel: invalid int value: 'two'"),
                          (("report", "--format", "xls"), "--format xls: expected one of table, csv, md, json, parquet, html"),
                          (("lsit",), "argument COMMAND: invalid choice: 'lsit'")):
        result = sweep(*args)
        assert result.returncode == 4, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_max_parallel_needs_at_least_one_cell(tmp_path):
    (tmp_path / "grids").mkdir()
    (tmp_path / "grids" / "g.py").write_text(
        'import sweepkit as sk\ntarget = sk.command("{python}", "-c", "pass")\nbase = sk.base(x=1)\n')
    for value in ("0", "-2"):
        result = sweep("run", "--max-parallel", value, cwd=tmp_path)
        assert result.returncode == 4, result.stderr
        assert f"--max-parallel {value}: expected a number of cells of at least 1" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_list_cuts_long_lines_on_a_terminal_only(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from sweepkit import commands
    from sweepkit.cli import start_session
    from sweepkit.errors import UsageError

    (tmp_path / "grids").mkdir()
    (tmp_path / "grids" / "g.py").write_text(
        'import sweepkit as sk\ntarget = sk.command("{python}", "-c", "pass")\nbase = sk.base(x=1, y="")\n'
        'a_cell_whose_name_is_long = sk.cell(x=2, y="a value long enough to run past the edge")\n')
    monkeypatch.chdir(tmp_path)
    session = start_session(["list"])
    out = io.StringIO()
    session.console = Console(file=out, force_terminal=True, width=50, color_system=None, soft_wrap=True)
    try:
        commands.cmd_list(session)
    except UsageError:
        pass  # a plugin's environment check (a cluster's $WORK); the lines are printed first
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("grids/g.py::a_cell_whose_name_is_long  x=2") and lines[1].endswith("…")
    assert all(len(line) <= 50 for line in lines[:2]), lines
    piped = sweep("list", cwd=tmp_path)
    assert 'y=a value long enough to run past the edge' in piped.stdout, piped
