"""Jupiter's rules through the real ``sweep`` command (with the SkyRL plugin's override checks);
cluster selection."""

from __future__ import annotations

import shlex

import pytest

from conftest import Sweeper
from sweepkit.run.executors.cluster_cap import ClusterCap
from sweepkit_plugins import clusters, jupiter, leonardo
from test_leonardo import errors_of


SKYRL = 'target = sk.command("{python}", "-m", "skyrl_train.entrypoints.main_base")'

RULES_GRID = f'''
import sweepkit as sk
{SKYRL}
# Qwen3-Coder-30B-A3B: EP=4 x FSDP=4 = 16 policy GPUs + 4 engines x TP2 = 24 GPUs, 6 nodes.
base = sk.base(model="Qwen/Qwen3-Coder-30B-A3B-Instruct", policy_num_gpus=16,
               num_inference_engines=4, inference_tp=2, num_experts=128, ep_size=4, fsdp_size=4,
               num_nodes=6, time_limit="11:59:00", max_restarts=5, resume_mode=None)
one_node = sk.cell(num_nodes=1)
long_wall = sk.cell(time_limit="24:00:00", max_restarts=0)
moe_bad = sk.cell(fsdp_size=3)
dp_loopback = sk.cell(**{{"generator.engine_init_kwargs.data_parallel_address": "127.0.0.1"}})
dp_loopback_override = sk.cell(hydra_overrides=["++generator.engine_init_kwargs.data_parallel_address='[::1]'"])
dp_loopback_env = sk.cell(env={{"VLLM_DP_MASTER_IP": "localhost"}})
dp_dead_knob = sk.cell(dp_master_address="10.1.2.3")  # no longer a launch key: it reached nothing
dp_real = sk.cell(**{{"generator.engine_init_kwargs.data_parallel_address": "10.1.2.3"}},
                  env={{"VLLM_DP_MASTER_IP": "10.1.2.3"}})
bare_key = sk.cell(enable_db_registration=False)
bare_override = sk.cell(hydra_overrides=["enable_db_registration=false"])
dotted = sk.cell(**{{"trainer.enable_db_registration": False, "generator.sampling_params.temperature": 1.0}},
                 hydra_overrides=["++generator.engine_init_kwargs.max_model_len=65536"])
'''


@pytest.fixture(scope="module")
def rules_run(tmp_path_factory):
    sweeper = Sweeper.new(tmp_path_factory.mktemp("jupiter"))
    sweeper.grid("rules", RULES_GRID)
    return sweeper.run("run", "--dry-run", "--executor", "debug", "--cluster", "jupiter")


@pytest.mark.parametrize("cell, expected", [
    ("one_node", "num_nodes=1 disagrees with the GPU budget: 24 GPUs"),
    ("long_wall", "set time_limit='11:59:00' and max_restarts=2"),
    ("moe_bad", "fsdp_size=3 does not divide num_experts // ep_size = 128 // 4 = 32"),
    ("dp_loopback", "generator.engine_init_kwargs.data_parallel_address='127.0.0.1' is a loopback address"),
    ("dp_loopback_override", "hydra_overrides ++generator.engine_init_kwargs.data_parallel_address=\"'[::1]'\" "
                             "is a loopback address"),
    ("dp_loopback_env", "env VLLM_DP_MASTER_IP='localhost' is a loopback address"),
    ("dp_dead_knob", "'dp_master_address' is a bare top-level key"),
    ("bare_key", "'enable_db_registration' is a bare top-level key"),
    ("bare_override", "'enable_db_registration=false' is not a struct-safe override"),
])
def test_each_rule_refuses_its_cell(rules_run, cell, expected):
    assert "nothing was run" in rules_run.output, rules_run
    assert any(expected in line for line in errors_of(rules_run, cell)), rules_run


@pytest.mark.parametrize("cell", ["base", "dp_real", "dotted"])
def test_cells_within_the_rules_pass(rules_run, cell):
    assert "nothing was run" in rules_run.output
    assert errors_of(rules_run, cell) == [], rules_run


def collected_cells(sweeper: Sweeper, key=lambda cell: cell.name):
    """The collected cells of the grid, through the real collection and plugins, by ``key``."""
    from sweepkit.cli import start_session
    from sweepkit.grid.collect import collect

    session = start_session(["list", "--cluster", "jupiter", "--rootdir", str(sweeper.path),
                             str(sweeper.path / "grids")])
    session.configure()
    return session, {key(cell): cell for cell in collect(session, [str(sweeper.path / "grids")]).cells}


def test_job_pieces_of_a_multi_node_cell(sweeper):
    sweeper.grid("rules", RULES_GRID)
    session, cells = collected_cells(sweeper)
    pieces = clusters.job_pieces(cells["base"], session)
    assert (pieces.cluster, pieces.nodes, pieces.time_limit) == ("jupiter", 6, "11:59:00")
    assert "sweep_node_0" in pieces.ray_bringup
    # Six of the user's cells on the cluster, from any runs dir; foreign jobs only when a run names them.
    assert clusters.concurrency_cap(session) == ClusterCap(limit=6, cluster="jupiter")


def active_plugins(stdout: str) -> set[str]:
    """The first column of `sweep plugins`' table."""
    return {line.split("│")[1].strip() for line in stdout.splitlines() if line.startswith("│ ")}


def test_only_the_selected_cluster_is_active(sweeper):
    shown = sweeper.run("plugins", "--cluster", "jupiter")
    assert shown.ret == 0, shown
    assert "jupiter" in active_plugins(shown.stdout) and "leonardo" not in active_plugins(shown.stdout)
    by_env = sweeper.run("plugins", env={"SWEEP_CLUSTER": "leonardo"})
    assert "leonardo" in active_plugins(by_env.stdout) and "jupiter" not in active_plugins(by_env.stdout)
    none = sweeper.run("plugins", "--cluster", "none", env={"SWEEP_CLUSTER": "leonardo"})
    assert not {"leonardo", "jupiter"} & active_plugins(none.stdout)
    unknown = sweeper.run("plugins", "--cluster", "perlmutter")
    assert unknown.ret != 0 and "known clusters: jupiter, leonardo" in unknown.output


def test_hostname_detection():
    profiles = [jupiter.CLUSTER, leonardo.CLUSTER]
    assert clusters.select_cluster(None, profiles, {}, "lrdn0421.leonardo.local") == "leonardo"
    assert clusters.select_cluster(None, profiles, {}, "jpbo-012-07") == "jupiter"
    assert clusters.select_cluster(None, profiles, {}, "laptop") is None
    assert clusters.select_cluster(None, profiles, {"SWEEP_CLUSTER": "jupiter"}, "lrdn0001") == "jupiter"


def listed_command_and_env(script: str) -> tuple[list[str], list[str]]:
    """The command line and the env lines a job script lists for its (one) cell."""
    lines = script.splitlines()
    (command,) = [line for line in lines if line.startswith("#   command: ")]
    return shlex.split(command.removeprefix("#   command: ")), [line for line in lines if line.startswith("#   env:")]


def test_a_dp_master_address_the_cell_gives_reaches_the_job(sweeper):
    from test_cluster_scripts import dry_run, ok

    sweeper.grid("rules", RULES_GRID)
    rendered = ok(dry_run(sweeper, "jupiter", "grids/rules.py::dp_real"))
    script = rendered.text("rules_dp_real.sbatch")
    command, env = listed_command_and_env(script)
    assert "++generator.engine_init_kwargs.data_parallel_address=10.1.2.3" in command
    assert "#   env:     VLLM_DP_MASTER_IP=10.1.2.3" in env
    assert "SWEEP_VLLM_DP_SIZE" not in script


@pytest.mark.parametrize("reservation, line", [
    ("reformo", "#SBATCH --reservation=reformo"),
    ("res; touch /tmp/pwned", "#SBATCH --reservation='res; touch /tmp/pwned'"),
])
def test_the_reservation_reaches_the_header_quoted(sweeper, reservation, line):
    from test_cluster_scripts import dry_run, ok

    sweeper.grid("rules", RULES_GRID)
    rendered = ok(dry_run(sweeper, "jupiter", "grids/rules.py::base", env={"SWEEP_RESERVATION": reservation}))
    header = [text for text in rendered.text("rules_base.sbatch").splitlines() if text.startswith("#SBATCH")]
    assert [text for text in header if text.startswith("#SBATCH --reservation")] == [line]


def test_a_reservation_with_a_line_break_is_refused(sweeper):
    from test_cluster_scripts import dry_run

    sweeper.grid("rules", RULES_GRID)
    rendered = dry_run(sweeper, "jupiter", "grids/rules.py::base", env={"SWEEP_RESERVATION": "res\nrm -rf ~"})
    assert rendered.result.ret != 0 and not rendered.scripts, rendered.result
    assert "sbatch option reservation: 'res\\nrm -rf ~' has a line break" in rendered.result.output
