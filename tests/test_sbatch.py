"""Rendered job scripts against golden files in tests/golden/ (regenerate on purpose with
``SWEEPKIT_REGEN_GOLDEN=1 python -m pytest tests/test_sbatch.py``), and the request checks."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from sweepkit.executors import sbatch as sb

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


def test_single_node_cell_script():
    check_golden("single_node.sbatch", sb.render(cluster_request(), folder=FOLDER, python=PYTHON))


def test_array_of_equal_cells_script():
    request = sb.JobRequest(name=sb.job_name("g", "tbs64+3"), cpus=1, mem_gb=0.5, time_limit="00:30:00")
    check_golden("array.sbatch", sb.render(request, folder=FOLDER, python=PYTHON, array=(4, 2)))


def test_chain_link_script_depends_on_the_previous_link():
    request = cluster_request(chain=3, options={}, preamble=(), env={})
    text = sb.render(request, folder=FOLDER, python=PYTHON, dependency=sb.dependency_after(["4180233"]))
    check_golden("chain_link.sbatch", text)


def test_values_reach_the_script_quoted_as_data():
    text = sb.render(cluster_request(), folder=FOLDER, python=PYTHON)
    exports = [line for line in text.splitlines() if line.startswith("export ODD=")]
    assert exports == ["export ODD=" + shlex.quote("$(id); rm -rf ~")]
    assert shlex.split(exports[0].removeprefix("export "))[0] == "ODD=$(id); rm -rf ~"
    # The cluster's own #SBATCH line is in the header, before the first command.
    lines = text.splitlines()
    assert lines.index("#SBATCH --reservation=reformo") < lines.index("module load cuda/12.4")


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
