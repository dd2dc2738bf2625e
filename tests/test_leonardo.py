"""Leonardo's rules through the real ``sweep`` command, and its job-script pieces."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import attrs
import pytest

from conftest import Sweeper
from sweepkit_plugins import clusters, leonardo, ray_cluster


# One cell per refusal; the run reports every cell's errors at once.
RULES_GRID = '''
import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
base = sk.base(model="Qwen/Qwen2.5-1.5B-Instruct", num_gpus=4, num_inference_engines=4,
               inference_tp=1, colocate_all=True, gpu_memory_utilization=0.70,
               time_limit="00:30:00")
debug_long = sk.cell(qos="boost_qos_dbg", time_limit="01:00:00")
debug_wide = sk.cell(qos="boost_qos_dbg", num_gpus=12, colocate_all=False, num_inference_engines=0)
normal_30h = sk.cell(time_limit="30:00:00")
gmu090 = sk.cell(gpu_memory_utilization=0.90)
gmu090_probe = sk.cell(gpu_memory_utilization=0.91, marks=sk.mark.xfail(reason="OOMs eval"))
dense32b = sk.cell(model="Qwen/Qwen2.5-32B-Instruct")
dense32b_probe = sk.cell(model="Qwen/Qwen3-32B", marks=sk.mark.xfail(reason="OOM"))
dense32b_2nodes = sk.cell(model="Qwen/Qwen2.5-32B-Instruct", policy_num_gpus=8, colocate_all=False,
                          num_inference_engines=0, num_gpus=0)
moe30b = sk.cell(model="Qwen/Qwen3-30B-A3B")
nodes_wrong = sk.cell(num_nodes=2)
scratch_export = sk.cell(export_path="$SCRATCH_FAST/exports/x")
elsewhere_export = sk.cell(export_path="/var/tmp/exports/x")
'''


@pytest.fixture(scope="module")
def rules_run(tmp_path_factory):
    sweeper = Sweeper.new(tmp_path_factory.mktemp("leonardo"))
    project = sweeper.path
    (project / "work").mkdir()
    (project / "scratch").mkdir()
    sweeper.grid("rules", RULES_GRID)
    env = {"WORK": str(project / "work"), "SCRATCH_FAST": str(project / "scratch")}
    result = sweeper.run("run", "--dry-run", "--executor", "debug", "--cluster", "leonardo",
                         "--runs-dir", str(project / "work" / "runs"), env=env)
    return result


def errors_of(result, cell: str) -> list[str]:
    return [line for line in result.output.splitlines() if re.search(rf"\b{re.escape(cell)}: ", line)]


@pytest.mark.parametrize("cell, expected", [
    ("debug_long", "exceeds QOS boost_qos_dbg's wall of 00:30:00"),
    ("debug_wide", "QOS boost_qos_dbg allows at most 2 nodes, the cell needs 3"),
    ("normal_30h", "set time_limit='23:59:00' and max_restarts=1"),
    ("gmu090", "gpu_memory_utilization=0.9 is over the A100-64GB ceiling of 0.85"),
    ("dense32b", "a 32B dense model OOMs on one 4 x A100-64GB node"),
    ("moe30b", "a 30B MoE model OOMs on one 4 x A100-64GB node"),
    ("nodes_wrong", "num_nodes=2 disagrees with the GPU budget: 4 GPUs"),
    ("scratch_export", "is on $SCRATCH_FAST"),
    ("elsewhere_export", "is not under $WORK"),
])
def test_each_rule_refuses_its_cell(rules_run, cell, expected):
    assert rules_run.ret != 0
    assert "nothing was run" in rules_run.output
    assert any(expected in line for line in errors_of(rules_run, cell)), rules_run


@pytest.mark.parametrize("cell", ["base", "gmu090_probe", "dense32b_probe", "dense32b_2nodes"])
def test_cells_within_the_rules_pass(rules_run, cell):
    assert "nothing was run" in rules_run.output  # validation ran over every cell
    assert errors_of(rules_run, cell) == [], rules_run


def test_work_must_be_set(sweeper):
    sweeper.grid("g", '''
        import sweepkit as sk
        target = sk.command("{python}", "-c", "pass")
        base = sk.base(lr=1.0)
    ''')
    result = sweeper.run("run", "--dry-run", "--executor", "debug", "--cluster", "leonardo",
                         env={"WORK": "", "SWEEP_CLUSTER": ""})
    assert result.ret != 0
    assert "WORK is not set" in result.output


def test_cell_process_gets_the_offline_environment(sweeper):
    sweeper.grid("env", '''
        import sweepkit as sk
        target = sk.command("{python}", "-c",
                            "import json, os; json.dump(dict(os.environ), open('env.json', 'w'))")
        base = sk.base(lr=1.0)
    ''')
    work = sweeper.path / "work"
    env = {"WORK": str(work), "SWEEP_GCC_BIN": "/opt/gcc/bin", "SWEEP_CONTAINER": ""}
    result = sweeper.run("run", "--executor", "debug", "--cluster", "leonardo",
                         "--runs-dir", str(work / "runs"), env=env)
    assert result.ret == 0, result
    seen = json.loads((work / "runs" / "env" / "base" / "env.json").read_text())
    assert seen["HF_HUB_OFFLINE"] == seen["TRANSFORMERS_OFFLINE"] == "1"
    assert seen["WANDB_MODE"] == "offline"
    assert seen["HF_HOME"] == f"{work}/data/hub"
    assert seen["HOME"] == f"{work}/.sweep_home"
    assert seen["XDG_CACHE_HOME"].startswith(seen["HOME"])
    assert seen["CC"] == "/opt/gcc/bin/gcc" and seen["CXX"] == "/opt/gcc/bin/g++"
    assert seen["PATH"].startswith("/opt/gcc/bin:")
    assert seen["RAY_USAGE_STATS_ENABLED"] == "0"
    assert seen["VLLM_NO_USAGE_STATS"] == seen["DO_NOT_TRACK"] == "1"


def test_jupiter_rules_are_inert_on_leonardo(sweeper):
    sweeper.grid("g", '''
        import sweepkit as sk
        target = sk.command("{python}", "-c", "pass")
        base = sk.base(lr=1.0, time_limit="20:00:00")
    ''')
    env = {"WORK": str(sweeper.path)}
    on_leonardo = sweeper.run("run", "--dry-run", "--executor", "debug", "--cluster", "leonardo", env=env)
    on_jupiter = sweeper.run("run", "--dry-run", "--executor", "debug", "--cluster", "jupiter", env=env)
    assert on_leonardo.ret == 0, on_leonardo
    assert "exceeds Jupiter's booster QOS's wall of 11:59:00" in on_jupiter.output


def test_container_wrapper_and_job_pieces(tmp_path):
    from sweepkit.grid.cell import Cell, Target

    launch_keys = {name: default for name, _, default, _ in
                   clusters.LAUNCH_KEYS + ray_cluster.LAUNCH_KEYS}
    launch_keys.update(account=None, partition=None, qos=None, time_limit=None, gpus=0)
    cell = Cell(grid="grids/g.py", grid_name="g", name="big", target=Target(name="t", argv=("{python}",)),
                config={"policy_num_gpus": 8, "num_inference_engines": 0}, location=("grids/g.py", 1),
                launch_keys=launch_keys)
    environ = {"WORK": "/w", "SCRATCH_FAST": "/s", "SWEEP_CONTAINER": "/s/sandbox",
               "SWEEP_VENV": "/s/venv", "SWEEP_CONTAINER_PWD": "/w/code/skyrl-train",
               "SWEEP_ACCOUNT": "ACCT_1"}
    pieces = leonardo.job_pieces(cell, environ, "/w/runs/g/big")
    wrapper = ["singularity", "exec", "--nv", "--no-home", "--bind", "/w,/s",
               "--pwd", "/w/code/skyrl-train", "/s/sandbox"]
    assert list(pieces.argv_prefix) == wrapper
    assert pieces.python == "/s/venv/bin/python"
    assert (pieces.nodes, pieces.gpus_per_node, pieces.time_limit) == (2, 4, "23:59:00")
    assert (pieces.account, pieces.partition) == ("ACCT_1", "boost_usr_prod")
    assert pieces.env["HF_HUB_OFFLINE"] == "1" and pieces.env["HOME"] == "/w/.sweep_home"
    # Ray starts inside the same container, pinned to ib0.
    assert " ".join(wrapper) + " /s/venv/bin/ray start --head" in pieces.ray_bringup
    assert "NCCL_SOCKET_IFNAME=ib0 GLOO_SOCKET_IFNAME=ib0" in pieces.ray_bringup
    one_node = leonardo.job_pieces(attrs.evolve(cell, config={"num_gpus": 4}), environ)
    assert (one_node.nodes, one_node.ray_bringup) == (1, None)


def test_a_cell_without_time_limit_gets_its_qos_wall(sweeper):
    from test_cluster_scripts import dry_run, ok

    sweeper.grid("walls", '''
        import sweepkit as sk
        target = sk.command("{python}", "-c", "pass")
        base = sk.base(gpus=1, resume_mode=None)
        debug = sk.cell(qos="boost_qos_dbg")
    ''')
    rendered = ok(dry_run(sweeper, "leonardo", "grids/walls.py"))
    debug = rendered.text("walls_debug.sbatch").splitlines()
    assert "#SBATCH --time=00:30:00" in debug and "#SBATCH --qos=boost_qos_dbg" in debug
    assert ("# --time=00:30:00: the cell sets no time_limit, so it gets the longest wall QOS boost_qos_dbg "
            "allows") in debug
    normal = rendered.text("walls_base.sbatch").splitlines()
    assert "#SBATCH --time=23:59:00" in normal and "#SBATCH --qos=normal" in normal


OFFLINE_GRID = '''
import sweepkit as sk
base = sk.base(model="Qwen/Qwen2.5-1.5B-Instruct", dataset="synthetic", backend="vllm", time_limit="00:30:00")
'''


def offline_run(sweeper, *args, hub=None):
    sweeper.grid("hub", OFFLINE_GRID)
    work = sweeper.path / "work"
    work.mkdir(exist_ok=True)
    if hub:
        (work / "data" / "hub" / hub / "snapshots" / "0123abc").mkdir(parents=True)
    env = {"WORK": str(work), "SCRATCH_FAST": str(sweeper.path / "scratch"), "SWEEP_CONTAINER": "", "SWEEP_VENV": "",
           "SWEEP_HF_HOME": "", "SWEEP_CLUSTER": "", "PATH": str(Path(sys.executable).parent)}
    return sweeper.run("run", "grids/hub.py", "--cluster", "leonardo", "--runs-dir", str(work / "runs"), *args,
                       env=env)


def test_a_hub_name_offline_is_a_warning_in_a_dry_run(sweeper):
    result = offline_run(sweeper, "--dry-run")
    assert result.ret == 0, result
    (model,) = [line for line in result.stderr.splitlines() if "model: 'Qwen/Qwen2.5-1.5B-Instruct'" in line]
    assert model.startswith("warning: grids/hub.py:2: base: model: 'Qwen/Qwen2.5-1.5B-Instruct' is a hub name")
    assert "HF_HUB_OFFLINE=1" in model and "hf download Qwen/Qwen2.5-1.5B-Instruct" in model
    assert "or set model to a local path" in model
    assert "job script:" in result.stdout


def test_a_hub_name_offline_is_refused_when_submitting(sweeper):
    result = offline_run(sweeper)
    assert result.ret == 4, result
    assert "base: model: 'Qwen/Qwen2.5-1.5B-Instruct' is a hub name" in result.output
    assert "nothing was run" in result.output


def test_a_pre_staged_hub_name_passes(sweeper):
    result = offline_run(sweeper, "--dry-run", hub="models--Qwen--Qwen2.5-1.5B-Instruct")
    assert result.ret == 0, result
    assert "is a hub name" not in result.output


def test_backend_vllm_is_a_warning(sweeper):
    result = offline_run(sweeper, "--dry-run")
    (vllm,) = [line for line in result.stderr.splitlines() if "backend: 'vllm'" in line]
    assert vllm.startswith("warning: grids/hub.py:2: base: backend: 'vllm' needs vllm installed in the cell's venv")
    assert "backend='static'" in vllm


def test_a_driver_interpreter_nodes_may_not_see_is_a_warning_in_a_dry_run(sweeper):
    # This interpreter is under none of Leonardo's shared file systems once HOME is elsewhere.
    sweeper.grid("g", '''
        import sweepkit as sk
        target = sk.command("{python}", "-c", "pass")
        base = sk.base(lr=1.0, time_limit="00:30:00")
    ''')
    work = sweeper.path / "work"
    env = {"WORK": str(work), "HOME": str(work), "SWEEP_CLUSTER": "", "PATH": str(Path(sys.executable).parent)}
    result = sweeper.run("run", "--cluster", "leonardo", "--dry-run", "--runs-dir", str(work / "runs"), env=env)
    assert result.ret == 0, result
    if any(Path(sys.prefix).absolute().is_relative_to(root) for root in leonardo.shared_filesystems(env)):
        pytest.skip(f"this interpreter's prefix {sys.prefix} is on a Leonardo file system")
    assert f"warning: srun starts this driver's interpreter {sys.executable}" in result.stderr, result
