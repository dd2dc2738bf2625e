"""The clusters plugin: a cluster is what a plugin registers through ``sweep_register_clusters``
(and nothing else), the active one is picked from those, and it, not the core, picks the
SLURM executor for ``--cluster`` / ``$SWEEP_CLUSTER``."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import attrs
import pytest

from sweepkit import hookimpl, plugin
from sweepkit.errors import UsageError
from sweepkit.run.executors.cluster_cap import ClusterCap
from sweepkit.run.executors.resources import JobResources
from sweepkit_plugins import clusters, jupiter, leonardo
from test_cluster_scripts import CLEARED
from test_jupiter import active_plugins

#: A cluster plugin's values, as a module defines them; registered only with REGISTERS.
ACME = '''
from sweepkit import hookimpl
from sweepkit.run.executors.resources import JobResources
from sweepkit_plugins import clusters

CLUSTER = clusters.ClusterProfile(
    name="acme", gpus_per_node=8, accelerator="H100-80GB", hostname_patterns=("login*.acme.example",),
    max_running=4, max_time_limit="48:00:00", default_time_limit="12:00:00", partition="acme-gpu")


def job_pieces(cell, environ, cell_dir):
    return JobResources(
        cluster=CLUSTER.name, nodes=clusters.cell_nodes(cell, CLUSTER),
        gpus_per_node=clusters.job_gpus_per_node(cell, CLUSTER),
        time_limit=clusters.job_time_limit(cell, CLUSTER), partition=CLUSTER.partition,
        preamble=["echo acme-preamble"])
'''

REGISTERS = '''

@hookimpl
def sweep_register_clusters(register):
    register(clusters.Cluster(profile=CLUSTER, job_pieces=job_pieces))
'''

# Two equal one-node cells: one job array, held to the cluster's cap.
GRID = '''
import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
base = sk.base(gpus=8, policy_num_gpus=8)
other = sk.cell(lr=0.1)
'''

#: No cluster from the developer's shell, and no sbatch: only a cluster plugin picks slurm.
ENV = {name: "" for name in CLEARED} | {"PATH": str(Path(sys.executable).parent)}


@pytest.fixture
def configured(sweeper, monkeypatch):
    """``configured(MODULE)``: a configured in-process session of ``sweep -p MODULE list`` in
    the sweeper's project, no cluster in the environment; the modules these sessions import
    and the project dir they put on ``sys.path`` are forgotten afterwards."""
    from sweepkit.cli import start_session

    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    modules = []

    def configure(module: str):
        modules.append(module)
        session = start_session(["-p", module, "list", "--rootdir", str(sweeper.path), str(sweeper.path / "grids")])
        session.configure()
        return session

    yield configure
    for module in modules:
        sys.modules.pop(module, None)


def test_a_registered_cluster_is_selected_and_builds_the_job_scripts(sweeper):
    sweeper.write("acme_cluster.py", ACME + REGISTERS)
    sweeper.grid("wide", GRID)
    shown = sweeper.run("-p", "acme_cluster", "plugins", "--cluster", "acme", env=ENV)
    assert shown.ret == 0, shown
    assert "acme_cluster" in active_plugins(shown.stdout)
    assert not {"leonardo", "jupiter"} & active_plugins(shown.stdout)
    result = sweeper.run("-p", "acme_cluster", "run", "grids/wide.py", "--dry-run",
                         env={**ENV, "SWEEP_CLUSTER": "acme"})
    assert result.ret == 0, result
    script = set((sweeper.path / "runs" / ".dry-run" / "wide" / "wide_base+1.sbatch").read_text().splitlines())
    assert {"#SBATCH --partition=acme-gpu", "#SBATCH --gpus-per-node=8", "#SBATCH --array=0-1%4",
            "echo acme-preamble"} <= script


def test_the_hostname_picks_a_registered_cluster_and_the_others_plugins_go(sweeper, monkeypatch, configured):
    from sweepkit.grid.collect import collect

    sweeper.write("acme_detected.py", ACME + REGISTERS)
    sweeper.grid("wide", GRID)
    monkeypatch.setattr(clusters, "_hostname", lambda: "login02.acme.example")
    session = configured("acme_detected")
    assert set(clusters.clusters_of(session)) == {"leonardo", "jupiter", "acme"}
    assert clusters.active_cluster(session) == "acme"
    assert clusters.clusters_of(session)["acme"].plugin_name == "acme_detected"
    assert session.pm.get_plugin("acme_detected") is not None
    assert not session.pm.is_registered(leonardo) and not session.pm.is_registered(jupiter)
    assert session.hook.sweep_choose_executor(session=session) == "slurm"
    assert session.hook.sweep_job_concurrency_cap(session=session) == ClusterCap(limit=4, cluster="acme")
    cell = collect(session, [str(sweeper.path / "grids")]).cells[0]
    pieces = session.hook.sweep_job_resources(cell=cell, session=session)
    assert isinstance(pieces, JobResources)
    assert (pieces.cluster, pieces.partition, pieces.gpus_per_node) == ("acme", "acme-gpu", 8)


def test_a_module_level_cluster_without_registration_is_not_a_cluster(sweeper, monkeypatch, configured):
    # CLUSTER and job_pieces as a cluster plugin defines them, but no sweep_register_clusters:
    # on a host its patterns match it would have been the active cluster by its CLUSTER alone.
    sweeper.write("acme_unregistered.py", ACME)
    sweeper.grid("wide", GRID)
    monkeypatch.setattr(clusters, "_hostname", lambda: "login02.acme.example")
    session = configured("acme_unregistered")
    assert set(clusters.clusters_of(session)) == {"leonardo", "jupiter"}
    assert clusters.active_cluster(session) is None
    assert session.hook.sweep_choose_executor(session=session) == "local"
    assert session.hook.sweep_job_concurrency_cap(session=session) is None
    assert session.pm.get_plugin("acme_unregistered") is not None  # a plugin still, just no cluster
    # Naming it is an error, not a silent run without its rules.
    for args, env in ((("--cluster", "acme"), ENV), ((), {**ENV, "SWEEP_CLUSTER": "acme"})):
        named = sweeper.run("-p", "acme_unregistered", "run", "grids/wide.py", "--dry-run", *args, env=env)
        assert named.ret == 4, named
        assert "acme: no cluster plugin of that name (known clusters: jupiter, leonardo" in named.stderr
        assert not (sweeper.path / "runs" / ".dry-run").exists()


@pytest.mark.parametrize("command", [("plugins",), ("list",), ("run", "--dry-run", "--cluster", "acme")])
def test_a_misspelt_registration_hook_fails_at_start_up(sweeper, command):
    sweeper.write("acme_typo.py", ACME + REGISTERS.replace("sweep_register_clusters", "sweep_register_cluster"))
    sweeper.grid("wide", GRID)
    result = sweeper.run("-p", "acme_typo", *command, env=ENV)
    assert result.ret == 4, result
    assert "sweep_register_cluster" in result.stderr and "no such hook" in result.stderr
    assert "wide" not in result.stdout


def test_cluster_option_and_env_pick_the_slurm_executor_through_the_plugin(sweeper):
    # GPUs for the cluster's job (policy_num_gpus), none asked of this machine (gpus).
    sweeper.grid("g", 'import sweepkit as sk\ntarget = sk.command("{python}", "-c", "pass")\n'
                      'base = sk.base(policy_num_gpus=4)\n')
    written = "job script: runs/.dry-run/g/g_base.sbatch"
    by_option = sweeper.run("run", "--dry-run", "--cluster", "jupiter", env=ENV)
    assert by_option.ret == 0 and written in by_option.stdout, by_option
    by_env = sweeper.run("run", "--dry-run", env={**ENV, "SWEEP_CLUSTER": "jupiter"})
    assert by_env.ret == 0 and written in by_env.stdout, by_env
    none = sweeper.run("run", "--dry-run", "--cluster", "none", env={**ENV, "SWEEP_CLUSTER": "jupiter"})
    assert none.ret == 0 and "job script" not in none.stdout, none


def test_the_core_picks_slurm_only_for_sweep_slurm(monkeypatch):
    from sweepkit.run.executors import slurm

    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setenv("SWEEP_CLUSTER", "jupiter")
    monkeypatch.delenv("SWEEP_SLURM", raising=False)
    session = SimpleNamespace(options=SimpleNamespace(cluster="jupiter"), stash={})
    assert slurm.sweep_choose_executor(session) is None  # a cluster is the clusters plugin's to see
    monkeypatch.setenv("SWEEP_SLURM", "1")
    assert slurm.sweep_choose_executor(session) == "slurm"
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)
    assert slurm.sweep_choose_executor(session) is None


class Registers:
    """A plugin object registering the given values."""

    def __init__(self, *values):
        self.values = values

    @hookimpl
    def sweep_register_clusters(self, register):
        for value in self.values:
            register(value)


def leonardo_as(name: str) -> clusters.Cluster:
    return clusters.Cluster(profile=attrs.evolve(leonardo.CLUSTER, name=name), job_pieces=leonardo.job_pieces)


def test_a_name_registered_twice_or_a_value_that_is_no_cluster_is_refused():
    pm = plugin.make_plugin_manager()
    pm.register(leonardo, name="leonardo")
    pm.register(Registers(leonardo_as("leonardo")), name="copy")
    with pytest.raises(UsageError, match="cluster 'leonardo' is registered twice: "
                                         "by plugin leonardo and by plugin copy"):
        clusters.registered_clusters(pm)
    pm = plugin.make_plugin_manager()
    pm.register(Registers(leonardo.CLUSTER), name="profile_only")
    with pytest.raises(UsageError, match="plugin profile_only: sweep_register_clusters registered ClusterProfile"
                                         r"\(name='leonardo'.*not a sweepkit_plugins.clusters.Cluster"):
        clusters.registered_clusters(pm)
    with pytest.raises(TypeError):
        clusters.Cluster(profile=leonardo.CLUSTER, job_pieces="leonardo.job_pieces")


def test_a_plugin_of_several_clusters_stays_while_one_of_them_is_active():
    pm = plugin.make_plugin_manager()
    both = Registers(leonardo_as("booster"), leonardo_as("dcgp"))
    pm.register(both, name="both")
    pm.register(jupiter, name="jupiter")
    session = SimpleNamespace(pm=pm, stash={}, options=SimpleNamespace(cluster="dcgp"))
    clusters.sweep_configure(session)
    assert clusters.active_cluster(session) == "dcgp"
    assert pm.is_registered(both) and not pm.is_registered(jupiter)
