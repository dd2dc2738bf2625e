"""Rendered job scripts against golden files in tests/golden/ (regenerate on purpose with
``SWEEPKIT_REGEN_GOLDEN=1 python -m pytest tests/test_sbatch.py``), and the request checks."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from sweepkit.run.executors import sbatch as sb

GOLDEN = Path(__file__).parent / "golden"
FOLDER = "/project/runs/g/.slurm"
PYTHON = "/usr/bin/python3"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("SWEEPKIT_REGEN_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"{path} is missing; create it with SWEEPKIT_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from the golden file (SWEEPKIT_REGEN_GOLDEN=1 to accept)"


def cluster_request(**changes) -> sb.JobRequest:
    values = dict(
        name=sb.job_name("g", "base"), cpus=8, gpus_per_node=4, mem_gb=64, time_limit="23:59:00",
        partition="boost_usr_prod", account="AIFAC_5C0_290", qos="normal",
        options={"constraint": "a100", "exclusive": ""},
        preamble=["module load cuda/12.4", "#SBATCH --reservation=reformo"],
        env={"HF_HOME": "/leonardo_work/AIFAC/hf cache", "WANDB_MODE": "offline", "ODD": "$(id); rm -rf ~"},
    )
    values.update(changes)
    return sb.JobRequest(**values)


HOSTILE = ('$(id)', '"; rm -rf ~"', "`reboot`; echo 'x'")


def script_cell(name: str, *args: str, **env: str) -> sb.ScriptCell:
    cell_dir = f"/project/runs/g/{name}"
    return sb.ScriptCell(nodeid=f"grids/g.py::{name}", cell_dir=cell_dir,
                         argv=[PYTHON, "-m", "skyrl_train.entrypoints.main_base", *args],
                         env={"SWEEP_CELL": f"grids/g.py::{name}", "SWEEP_CELL_DIR": cell_dir, **env})


def test_single_node_cell_script():
    cell = script_cell("base", "++trainer.epochs=1", f"++trainer.run_name={HOSTILE[1]}", ODD=HOSTILE[0])
    check_golden("single_node.sbatch", sb.render(cluster_request(), folder=FOLDER, python=PYTHON, cells=[cell]))


def test_array_of_equal_cells_script():
    request = sb.JobRequest(name=sb.job_name("g", "tbs64+3"), cpus=1, mem_gb=0.5, time_limit="00:30:00")
    cells = [script_cell(f"tbs{size}", f"++trainer.train_batch_size={size}") for size in (64, 128, 256, 512)]
    check_golden("array.sbatch", sb.render(request, folder=FOLDER, python=PYTHON, array=(4, 2), cells=cells))


def test_chain_link_script_depends_on_the_previous_link():
    request = cluster_request(chain=3, options={}, preamble=(), env={})
    cell = script_cell("base", "++trainer.resume_mode=latest", SWEEP_RESUME="1")
    text = sb.render(request, folder=FOLDER, python=PYTHON, dependency=sb.dependency_after(["4180233"]),
                     cells=[cell])
    check_golden("chain_link.sbatch", text)


def commented(text: str) -> list[str]:
    """The lines of the comment block that lists what runs."""
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("# command: submitit runs"))
    return lines[start:lines.index("export SUBMITIT_EXECUTOR=slurm")]


def test_values_reach_the_script_quoted_as_data(tmp_path):
    cell = script_cell("base", *(f"++trainer.note={value}" for value in HOSTILE),
                       **{f"HOSTILE_{n}": value for n, value in enumerate(HOSTILE)})
    text = sb.render(cluster_request(), folder=FOLDER, python=PYTHON, cells=[cell])
    exports = [line for line in text.splitlines() if line.startswith("export ODD=")]
    assert exports == ["export ODD=" + shlex.quote("$(id); rm -rf ~")]
    assert shlex.split(exports[0].removeprefix("export "))[0] == "ODD=$(id); rm -rf ~"
    # The cluster's own #SBATCH line is in the header, before the first command.
    lines = text.splitlines()
    assert lines.index("#SBATCH --reservation=reformo") < lines.index("module load cuda/12.4")
    # The listed command and env are comments, and paste back to exactly what runs.
    block = commented(text)
    assert all(line.startswith("#") for line in block)
    (command,) = [line for line in block if line.startswith("#   command: ")]
    assert shlex.split(command.removeprefix("#   command: ")) == list(cell.argv)
    listed = dict(line.removeprefix("#   env:     ").split("=", 1) for line in block if line.startswith("#   env:"))
    assert {name: shlex.split(value)[0] for name, value in listed.items()} == dict(cell.env)
    # bash runs the script's commands and nothing from the comments: with sbatch, srun and
    # the job runner's python stubbed, the only commands that run are the script's own.
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("sbatch", "srun", "module", "id", "reboot", "rm", "echo"):
        (stubs / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/ran\n')
        (stubs / name).chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    run = subprocess.run([shutil.which("bash"), str(script)], env={"PATH": str(stubs), "HOME": str(tmp_path / "home")},
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    ran = (tmp_path / "ran").read_text().splitlines()
    assert [line.split()[0] for line in ran] == ["module", "srun"]
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(("field", "value"), [
    ("argv", [PYTHON, "++trainer.run_name=a\nrm -rf ~"]),
    ("env", {"NOTE": "$(id)\rrm -rf ~"}),
    ("cell_dir", "/runs/g/x\nreboot"),
])
def test_a_listed_value_with_a_line_break_is_refused(field, value):
    values = {"nodeid": "grids/g.py::base", "cell_dir": "/runs/g/base", "argv": [PYTHON], "env": {}, field: value}
    with pytest.raises(sb.RequestError, match="line break"):
        sb.ScriptCell(**values)


@pytest.mark.parametrize(("changes", "message"), [
    ({"partition": "debug\nrm -rf ~"}, "partition: "),
    ({"options": {"comment": "a\nb"}}, "sbatch option comment"),
    ({"options": {"--exclusive": ""}}, "not an option name"),
    ({"env": {"BAD NAME": "x"}}, "not a shell variable name"),
    ({"preamble": ["module load x\rmore"]}, "preamble line"),
])
def test_a_value_that_would_break_out_of_the_header_is_refused(changes, message):
    with pytest.raises(sb.RequestError, match=message):
        cluster_request(**changes)


def test_job_names_are_sanitised():
    assert sb.job_name("gsm8k_throughput", "lr1e-05_n4") == "gsm8k_throughput_lr1e-05_n4"
    assert sb.job_name("g", "a b;$(id)") == "g_a_b_id_"
    assert sb.time_text(90_061) == "1-01:01:01"


# -- GPUs of a cell no cluster plugin sizes: `gpus` is the total, spread over the nodes ----------

SPREAD_GRID = '''
import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
base = sk.base(gpus=2)
two_nodes = sk.cell(gpus=8, num_nodes=2)
by_node_size = sk.cell(gpus=12, gpus_per_node=4)
whole_nodes = sk.cell(gpus=0, num_nodes=2, gpus_per_node=4)
uneven = sk.cell(gpus=6, num_nodes=4)
too_many = sk.cell(gpus=8, num_nodes=1, gpus_per_node=4)
'''


def no_cluster_dry_run(sweeper, spec: str):
    sweeper.grid("spread", SPREAD_GRID)
    return sweeper.run("run", f"grids/spread.py{spec}", "--executor", "slurm", "--cluster", "none", "--dry-run",
                       env={"SWEEP_CLUSTER": "", "CHECKPOINTS_DIR": ""})


@pytest.mark.parametrize("cell, nodes, per_node", [
    ("base", 1, 2), ("two_nodes", 2, 4), ("by_node_size", 3, 4), ("whole_nodes", 2, 4),
])
def test_gpus_are_the_cells_total_spread_over_its_nodes(sweeper, cell, nodes, per_node):
    result = no_cluster_dry_run(sweeper, f"::{cell}")
    assert result.ret == 0, result
    script = (sweeper.path / "runs" / ".dry-run" / "spread" / f"spread_{cell}.sbatch").read_text().splitlines()
    assert f"#SBATCH --nodes={nodes}" in script and f"#SBATCH --gpus-per-node={per_node}" in script


@pytest.mark.parametrize("cell, message", [
    ("uneven", "uneven: cannot make its SLURM job: gpus=6 (the GPUs the cell needs, in all) cannot be spread "
               "evenly over num_nodes=4; set gpus to a multiple of 4"),
    ("too_many", "too_many: cannot make its SLURM job: gpus=8 over num_nodes=1 is 8 GPUs a node, more than "
                 "gpus_per_node=4; set num_nodes=2"),
])
def test_gpus_that_do_not_spread_are_refused(sweeper, cell, message):
    result = no_cluster_dry_run(sweeper, f"::{cell}")
    assert result.ret != 0 and message in result.output, result
    assert not (sweeper.path / "runs" / ".dry-run").exists()


def test_every_cell_whose_job_cannot_be_made_is_reported_at_once(sweeper):
    result = no_cluster_dry_run(sweeper, "")
    assert result.ret != 0, result
    assert "uneven: cannot make its SLURM job" in result.output and "too_many: cannot make its SLURM job" in result.output
    assert "2 errors found; nothing was run" in result.output
    assert not (sweeper.path / "runs" / ".dry-run").exists()


def test_sweepkits_comment_follows_a_cells_own_and_is_no_array_key():
    request = sb.JobRequest(name="g_a", comment="sweepkit cells g/a in /runs")
    assert "#SBATCH --comment='sweepkit cells g/a in /runs'" in sb.header(request, folder=FOLDER)
    own = sb.JobRequest(name="g_a", comment=request.comment, options={"comment": "budget 7"})
    lines = sb.header(own, folder=FOLDER)
    assert [line for line in lines if "--comment" in line] == [
        "#SBATCH --comment='budget 7; sweepkit cells g/a in /runs'"]
    other = sb.JobRequest(name="g_b", comment="sweepkit cells g/b in /runs")
    assert request.array_key() == other.array_key()  # cells of one array differ in name and comment


def test_an_arrays_common_environment_is_listed_once():
    # Every task gets SHARED and the setup's WANDB_MODE; only SWEEP_CELL* differ per task.
    request = cluster_request(env={"WANDB_MODE": "offline"})
    cells = [script_cell(f"tbs{size}", SHARED="same", WANDB_MODE="offline") for size in (64, 128, 256)]
    lines = sb.render(request, folder=FOLDER, python=PYTHON, array=(3, None), cells=cells).splitlines()
    assert lines.count("#   env:     SHARED=same") == 1
    assert lines.index("# every task:") < lines.index("#   env:     SHARED=same") < lines.index(
        "# task 0: cell grids/g.py::tbs64")
    assert "export WANDB_MODE=offline" in lines
    assert not any(line.startswith("#   env:     WANDB_MODE=") for line in lines)  # the setup exports it
    for size in (64, 128, 256):
        assert lines.count(f"#   env:     SWEEP_CELL=grids/g.py::tbs{size}") == 1
    # A task whose value differs from the others lists its own.
    cells[1] = script_cell("tbs128", SHARED="other", WANDB_MODE="offline")
    lines = sb.render(request, folder=FOLDER, python=PYTHON, array=(3, None), cells=cells).splitlines()
    assert "# every task:" not in lines
    assert lines.count("#   env:     SHARED=same") == 2 and lines.count("#   env:     SHARED=other") == 1


def test_the_cluster_array_script_is_short(sweeper):
    """The 18-cell throughput grid as one Leonardo array: what every task shares is listed
    once (545 lines before, 20 variables repeated for every task)."""
    from test_cluster_scripts import THROUGHPUT, dry_run

    rendered = dry_run(sweeper, "leonardo", str(THROUGHPUT))
    assert rendered.result.ret == 0, rendered.result
    text = rendered.text("gsm8k_throughput_base+17.sbatch")
    assert len(text.splitlines()) < 250
    assert text.count("HF_HUB_OFFLINE=1") == 1  # exported once, never listed per task
    assert text.count("#   env:     PYTHONUNBUFFERED=1") == 1
    assert text.count("# task ") == 18
