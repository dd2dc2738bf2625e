"""Job scripts of the cluster plugins, rendered through the real ``sweep run --cluster NAME
--dry-run`` (the slurm executor, no ``--executor``), against golden files in tests/golden/
(regenerate on purpose with ``SWEEPKIT_REGEN_GOLDEN=1 python -m pytest
tests/test_cluster_scripts.py``); refusals on that same path; docs/clusters.md's plugin example.

The environment is a fixed fake one under the test's tmp dir, with the seeds' layout
(``$WORK``, ``$SCRATCH_FAST``, a sandbox and a venv on scratch, ...); the golden files show
the tmp dir as ``<tmp>``, this checkout as ``<repo>`` and the interpreter as ``<python>``.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from conftest import Sweeper
from test_sbatch import check_golden

REPO = Path(__file__).resolve().parents[1]
THROUGHPUT = REPO / "grids" / "gsm8k_throughput.py"
CLUSTERS_DOC = REPO / "docs" / "clusters.md"

#: Variables a developer's shell may carry that would change what the plugins render.
CLEARED = ("SWEEP_CLUSTER", "SWEEP_SLURM", "SWEEP_CONTAINER_PWD", "SWEEP_CONTAINER_BINDS", "SWEEP_HOME",
           "SWEEP_HF_HOME", "SWEEP_PARTITION", "SWEEP_RESERVATION", "SWEEP_SINGULARITY", "SWEEP_DEBUG_QOS",
           "SWEEP_RAY_IFNAME", "CLEAN_CKPT", "SWEEP_CONTAINER", "SWEEP_VENV", "SWEEP_GCC_BIN", "SWEEP_QOS",
           "SWEEP_ACCOUNT", "CHECKPOINTS_DIR", "SCRATCH", "SCRATCH_FAST", "WORK", "SLURM_JOB_ID")


def leonardo_env(root: Path) -> dict[str, str]:
    work, scratch = root / "leonardo_work" / "AIFAC_5C0_290" / "user", root / "leonardo_scratch" / "fast" / "user"
    return {"WORK": str(work), "SCRATCH_FAST": str(scratch), "CHECKPOINTS_DIR": str(work / "checkpoints"),
            "SWEEP_ACCOUNT": "AIFAC_5C0_290", "SWEEP_QOS": "normal",
            "SWEEP_CONTAINER": str(scratch / "marinskyrl_sandbox"), "SWEEP_VENV": str(scratch / "marin_venv"),
            "SWEEP_GCC_BIN": str(work / "miniforge3" / "envs" / "otagent" / "bin")}


def jupiter_env(root: Path) -> dict[str, str]:
    work = root / "e" / "scratch" / "jureap59" / "user"
    return {"WORK": str(work), "SCRATCH": str(work), "CHECKPOINTS_DIR": str(work / "checkpoints"),
            "SWEEP_ACCOUNT": "reformo", "SWEEP_RESERVATION": "reformo",
            "SWEEP_VENV": str(work / "OpenThoughts-Agent" / "envs" / "rl")}


ENVIRONMENTS = {"leonardo": leonardo_env, "jupiter": jupiter_env}

SKYRL = 'target = sk.command("{python}", "-m", "skyrl_train.entrypoints.main_base")'

# Qwen2.5-32B OOMs on one 4 x A100-64GB node: FSDP over 8 GPUs colocated with 8 vLLM
# engines, 2 nodes (the seed's 1.5B -> 32B saturation extension).
LEONARDO_32B = f'''
import sweepkit as sk
{SKYRL}
base = sk.base(model="Qwen/Qwen2.5-32B-Instruct", policy_num_gpus=8, num_inference_engines=8,
               inference_tp=1, colocate_all=True, gpu_memory_utilization=0.70,
               time_limit="04:00:00", resume_mode=None)
'''

# Qwen3-Coder-30B-A3B on Jupiter: EP=4 x FSDP=4 = 16 policy GPUs + 4 engines x TP2 = 24
# GPUs, 6 nodes; 11:59:00 links chained five times.
JUPITER_MOE = f'''
import sweepkit as sk
{SKYRL}
base = sk.base(model="Qwen/Qwen3-Coder-30B-A3B-Instruct", policy_num_gpus=16,
               num_inference_engines=4, inference_tp=2, num_experts=128, ep_size=4, fsdp_size=4,
               time_limit="11:59:00", max_restarts=5, resume_mode=None)
'''


class Rendered:
    """The output and job scripts of one dry run."""

    def __init__(self, result, root: Path):
        self.result = result
        self.root = root
        self.scripts = {Path(path).name: (root / "project" / path if not Path(path).is_absolute() else Path(path))
                        for path in re.findall(r"^job script: (\S+)$", result.stdout, re.MULTILINE)}

    def text(self, name: str) -> str:
        return self.scripts[name].read_text()

    def normalised(self, name: str) -> str:
        return (self.text(name).replace(shlex.quote(sys.executable), "<python>").replace(str(self.root), "<tmp>")
                .replace(str(REPO), "<repo>"))

    def argv(self, cell: str) -> list[str]:
        lines = self.result.stdout.splitlines()
        start = next(i for i, line in enumerate(lines) if re.match(rf"^[A-Z]+ +\S+::{re.escape(cell)}\b", line))
        return shlex.split(next(line for line in lines[start:] if line.startswith("  argv: "))[len("  argv: "):])


def dry_run(sweeper: Sweeper, cluster: str, spec: str, *extra: str, env: dict | None = None) -> Rendered:
    root = sweeper.path.parent
    environment = {name: "" for name in CLEARED} | ENVIRONMENTS[cluster](root) | (env or {})
    # No sbatch on PATH: a named cluster still renders its scripts (a laptop, a CI box).
    environment["PATH"] = str(Path(sys.executable).parent)
    runs = Path(environment["WORK"]) / "sweeps" / "runs"
    result = sweeper.run("run", spec, "--cluster", cluster, "--dry-run", "--runs-dir", str(runs), *extra,
                         env=environment)
    return Rendered(result, root)


def ok(rendered: Rendered) -> Rendered:
    assert rendered.result.ret == 0, rendered.result
    return rendered


# -- golden files ---------------------------------------------------------------------------


def test_leonardo_single_node_cell(sweeper):
    rendered = ok(dry_run(sweeper, "leonardo", f"{THROUGHPUT}::base"))
    assert list(rendered.scripts) == ["gsm8k_throughput_base.sbatch"]
    check_golden("leonardo_single.sbatch", rendered.normalised("gsm8k_throughput_base.sbatch"))
    text = rendered.text("gsm8k_throughput_base.sbatch")
    for line in ("#SBATCH --job-name=gsm8k_throughput_base", "#SBATCH --nodes=1", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --time=00:30:00", "#SBATCH --partition=boost_usr_prod",
                 "#SBATCH --account=AIFAC_5C0_290", "#SBATCH --qos=normal", "export HF_HUB_OFFLINE=1",
                 "export WANDB_MODE=offline"):
        assert line in text.splitlines()
    assert "ray start" not in text
    # The cell runs in the sandbox with the venv's python, in its own dir; the project root and
    # the trainer's source tree (this checkout) are bound, and that tree is the PYTHONPATH
    # inside, so `-m trainer` is found although the container's venv has no sweepkit.
    env = leonardo_env(rendered.root)
    cell_dir = f"{env['WORK']}/sweeps/runs/gsm8k_throughput/base"
    assert rendered.argv("base")[:14] == [
        "singularity", "exec", "--nv", "--no-home", "--bind",
        f"{env['WORK']},{env['SCRATCH_FAST']},{sweeper.path},{REPO}", "--pwd", cell_dir,
        "--env", f"PYTHONPATH={REPO}", env["SWEEP_CONTAINER"], f"{env['SWEEP_VENV']}/bin/python", "-m", "trainer"]


def test_leonardo_multi_node_cell(sweeper):
    sweeper.grid("gsm8k_32b", LEONARDO_32B)
    rendered = ok(dry_run(sweeper, "leonardo", "grids/gsm8k_32b.py"))
    check_golden("leonardo_multinode.sbatch", rendered.normalised("gsm8k_32b_base.sbatch"))
    text = rendered.text("gsm8k_32b_base.sbatch")
    env = leonardo_env(rendered.root)
    # A SkyRL cell's module is not the driver's to bind: only the project root is added.
    wrapper = shlex.join(["singularity", "exec", "--nv", "--no-home", "--bind",
                          f"{env['WORK']},{env['SCRATCH_FAST']},{sweeper.path}", "--pwd",
                          f"{env['WORK']}/sweeps/runs/gsm8k_32b/base", env["SWEEP_CONTAINER"]])
    assert "#SBATCH --nodes=2" in text.splitlines()
    assert f"{wrapper} {env['SWEEP_VENV']}/bin/ray start --head" in text
    assert "export NCCL_SOCKET_IFNAME=ib0 GLOO_SOCKET_IFNAME=ib0" in text
    assert 'export RAY_HEAD_IP RAY_ADDRESS="$RAY_HEAD_IP:6379"' in text
    assert '--temp-dir="/tmp/ray_${SLURM_JOB_ID}"' in text
    assert 'srun --nodes=1 --ntasks=1 --overlap -w "$RAY_NODE"' in text
    # Ray is up before the cell starts, and the cell's step shares node 0 with the head.
    assert text.index("ray start --head") < text.index("submitit.core._submit")
    assert "--overlap" in text.splitlines()[-1]
    # The SkyRL cell writes its checkpoints under $WORK, in its own dir.
    assert f"CKPT_DIR={env['CHECKPOINTS_DIR']}/gsm8k_32b/base" in rendered.result.stdout


def test_jupiter_single_node_cell(sweeper):
    rendered = ok(dry_run(sweeper, "jupiter", f"{THROUGHPUT}::base"))
    check_golden("jupiter_single.sbatch", rendered.normalised("gsm8k_throughput_base.sbatch"))
    text = rendered.text("gsm8k_throughput_base.sbatch").splitlines()
    assert {"#SBATCH --account=reformo", "#SBATCH --reservation=reformo", "#SBATCH --nodes=1"} <= set(text)
    assert rendered.argv("base")[0] == f"{jupiter_env(rendered.root)['SWEEP_VENV']}/bin/python"
    # No container: the venv's python finds the trainer through PYTHONPATH in the cell's environment.
    assert f"  env:  PYTHONPATH={REPO}" in rendered.result.stdout.splitlines()


def test_jupiter_multi_node_chain(sweeper):
    sweeper.grid("coder30b", JUPITER_MOE)
    rendered = ok(dry_run(sweeper, "jupiter", "grids/coder30b.py"))
    names = ["coder30b_base.sbatch"] + [f"coder30b_base.link{k}.sbatch" for k in range(1, 6)]
    assert sorted(rendered.scripts) == sorted(names)
    check_golden("jupiter_multinode.sbatch", rendered.normalised("coder30b_base.sbatch"))
    check_golden("jupiter_multinode.link1.sbatch", rendered.normalised("coder30b_base.link1.sbatch"))
    head = rendered.text("coder30b_base.sbatch").splitlines()
    assert {"#SBATCH --nodes=6", "#SBATCH --time=11:59:00", "#SBATCH --gpus-per-node=4"} <= set(head)
    assert not any(line.startswith("#SBATCH --dependency") for line in head)
    for name in names[1:]:
        assert "#SBATCH --dependency=afterany:PREVIOUS_LINK_JOB_ID" in rendered.text(name).splitlines()
    venv = jupiter_env(rendered.root)["SWEEP_VENV"]
    assert f"{venv}/bin/ray start --head" in rendered.text("coder30b_base.sbatch")


def test_jupiter_cap_shows_as_the_array_parallelism(sweeper):
    rendered = ok(dry_run(sweeper, "jupiter", str(THROUGHPUT)))
    (name,) = rendered.scripts
    assert "#SBATCH --array=0-17%6" in rendered.text(name).splitlines()
    leonardo = ok(dry_run(sweeper, "leonardo", str(THROUGHPUT)))
    assert "#SBATCH --array=0-17" in leonardo.text(name).splitlines()  # no cap there


def test_a_one_gpu_cell_does_not_hold_a_whole_node(sweeper):
    sweeper.grid("small", '''
        import sweepkit as sk
        target = sk.command("{python}", "-c", "pass")
        base = sk.base(gpus=1, resume_mode=None)
    ''')
    text = ok(dry_run(sweeper, "leonardo", "grids/small.py")).text("small_base.sbatch").splitlines()
    assert {"#SBATCH --gpus-per-node=1", "#SBATCH --cpus-per-task=8"} <= set(text)


# -- refusals on the slurm path -------------------------------------------------------------


def refused(rendered: Rendered, cell: str, message: str) -> None:
    result = rendered.result
    assert result.ret != 0 and "nothing was run" in result.output, result
    assert any(f"{cell}: " in line and message in line for line in result.output.splitlines()), result
    assert not rendered.scripts and "job script:" not in result.stdout


LEONARDO_BAD = f'''
import sweepkit as sk
{SKYRL}
base = sk.base(model="Qwen/Qwen2.5-1.5B-Instruct", num_gpus=4, time_limit="00:30:00", resume_mode=None)
no_resume_mode = sk.cell(resume_mode="sometimes")
long_ray_tmp = sk.cell(policy_num_gpus=8, ray_temp_dir="/leonardo_scratch/fast/AIFAC_5C0_290/someone/ray_tmp/x")
over_24h = sk.cell(time_limit="30:00:00")
'''


@pytest.mark.parametrize("cell, message", [
    ("no_resume_mode", "resume_mode='sometimes' is not a resume mode"),
    ("long_ray_tmp", "over the 107-byte AF_UNIX limit"),
    ("over_24h", "set time_limit='23:59:00' and max_restarts=1"),
])
def test_leonardo_refusals_before_any_script(sweeper, cell, message):
    sweeper.grid("bad", LEONARDO_BAD)
    refused(dry_run(sweeper, "leonardo", f"grids/bad.py::{cell}"), cell, message)


def test_an_unset_resume_mode_is_refused_before_any_script(sweeper):
    # A SkyRL cell keeps its checkpoints under $CHECKPOINTS_DIR: its resume mode must be explicit.
    sweeper.grid("unset", f"import sweepkit as sk\n{SKYRL}\nbase = sk.base(num_gpus=4)\n")
    for cluster in ("leonardo", "jupiter"):
        refused(dry_run(sweeper, cluster, "grids/unset.py"), "base", "resume mode is unset: set resume_mode=None")


def test_leonardo_refuses_a_runs_dir_on_scratch(sweeper):
    scratch = leonardo_env(sweeper.path.parent)["SCRATCH_FAST"]
    rendered = dry_run(sweeper, "leonardo", f"{THROUGHPUT}::base", "--runs-dir", f"{scratch}/runs")
    refused(rendered, "base", "is on $SCRATCH_FAST")
    assert "Disk quota exceeded" in rendered.result.output


def test_jupiter_refuses_a_node_count_against_the_budget(sweeper):
    sweeper.grid("coder30b", JUPITER_MOE + "one_node = sk.cell(num_nodes=1)\n")
    refused(dry_run(sweeper, "jupiter", "grids/coder30b.py::one_node"), "one_node",
            "num_nodes=1 disagrees with the GPU budget: 24 GPUs")


def test_a_real_run_without_sbatch_says_so(sweeper):
    sweeper.grid("gsm8k_32b", LEONARDO_32B)
    environment = {name: "" for name in CLEARED} | leonardo_env(sweeper.path.parent)
    environment["PATH"] = str(Path(sys.executable).parent)
    runs = Path(environment["WORK"]) / "sweeps" / "runs"
    result = sweeper.run("run", "grids/gsm8k_32b.py", "--cluster", "leonardo", "--runs-dir", str(runs),
                         env=environment)
    assert result.ret != 0 and "sbatch is not on PATH" in result.output, result


# -- docs/clusters.md's plugin example --------------------------------------------------------


def readme_plugin() -> str:
    """The ``acme_cluster.py`` block of docs/clusters.md's plugin section, verbatim."""
    section = CLUSTERS_DOC.read_text().split("## Writing a plugin for another cluster", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    (plugin,) = [block for block in blocks if block.startswith("# acme_cluster.py")]
    return plugin


def test_the_readme_plugin_example_works(sweeper):
    sweeper.write("acme_cluster.py", readme_plugin())
    sweeper.grid("wide", '''
        import sweepkit as sk
        target = sk.command("{python}", "-c", "pass")
        base = sk.base(gpus=8, policy_num_gpus=16, time_limit="24:00:00")
        one = sk.cell(policy_num_gpus=8)
        two = sk.cell(policy_num_gpus=8, lr=0.1)
        too_long = sk.cell(time_limit="72:00:00")
    ''')
    env = {name: "" for name in CLEARED} | {"ACME_ACCOUNT": "p123", "PATH": str(Path(sys.executable).parent)}
    result = sweeper.run("-p", "acme_cluster", "run", "grids/wide.py", "--cluster", "acme", "--dry-run", env=env)
    assert result.ret != 0
    assert "exceeds ACME's gpu partition's wall of 48:00:00; set time_limit='48:00:00' and max_restarts=1" \
        in result.output
    result = sweeper.run("-p", "acme_cluster", "run", "grids/wide.py", "-k", "not too_long", "--cluster", "acme",
                         "--dry-run", env=env)
    assert result.ret == 0, result
    scripts = sweeper.path / "runs" / ".dry-run" / "wide"
    base = (scripts / "wide_base.sbatch").read_text().splitlines()
    assert {"#SBATCH --nodes=2", "#SBATCH --gpus-per-node=8", "#SBATCH --account=p123", "#SBATCH --partition=gpu",
            "#SBATCH --cpus-per-task=96", "module load cuda/12.4", "export HF_HOME=/projects/acme/hf"} <= set(base)
    assert any("ray start --head" in line for line in base)
    # Two equal one-node cells share an array held to ACME's 4 running jobs.
    array = (scripts / "wide_one+1.sbatch").read_text().splitlines()
    assert {"#SBATCH --nodes=1", "#SBATCH --array=0-1%4"} <= set(array)
    missing = sweeper.run("-p", "acme_cluster", "run", "grids/wide.py", "--cluster", "acme", "--dry-run",
                          env={**env, "ACME_ACCOUNT": ""})
    assert "ACME_ACCOUNT is not set" in missing.output


def test_the_readme_plugin_loads_from_sweepconf(sweeper):
    sweeper.write("grids/sweepconf.py", readme_plugin())
    sweeper.grid("g", '''
        import sweepkit as sk
        target = sk.command("{python}", "-c", "pass")
        base = sk.base(gpus=8, policy_num_gpus=8)
    ''')
    env = {name: "" for name in CLEARED} | {"ACME_ACCOUNT": "p123", "PATH": str(Path(sys.executable).parent)}
    result = sweeper.run("run", "grids/g.py", "--cluster", "acme", "--dry-run", env=env)
    assert result.ret == 0, result
    assert "#SBATCH --gpus-per-node=8" in (sweeper.path / "runs" / ".dry-run" / "g" / "g_base.sbatch").read_text()
