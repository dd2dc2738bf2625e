"""JSC Jupiter (booster: 4 x GH200 a node): agentic SkyRL RL.

Rules, each refused before anything is submitted:

- ``num_nodes`` agrees with the GPU budget (policy + reference + inference engines x TP,
  / 4); a single-node allocation of a multi-node config fails fast with no clear error;
- the wall is 11:59:00; a longer cell chains with ``max_restarts`` (a link ending in
  TIMEOUT is the normal end of a healthy link);
- MoE: ``fsdp_size`` divides ``num_experts // ep_size``;
- vLLM data parallel: a DP master address the cell gives is never loopback (Ray registers
  the head under its real IPv4, so 127.0.0.1 fails with "DP master node missing or dead").
  The address is best left unset: the engines derive it from the Ray cluster (the seed's
  launcher injects the head IP itself). Where a cell does give one, it reaches the job the
  way the cell wrote it (a config key or Hydra override on the SkyRL command line, or
  ``VLLM_DP_MASTER_IP`` in its ``env``), and that value is what is checked;
- a cell that targets a SkyRL entry point reaches it as Hydra ``++path=value`` overrides
  (:func:`hydra_overrides`); a bare top-level key, which Hydra rejects against the
  struct config, is refused.

At most 6 cells of a user run on the cluster at once, from all of the user's runs dirs
(``CLUSTER.max_running``, read by the SLURM executor through
:func:`sweepkit_plugins.clusters.concurrency_cap`; the seeds' "Daytona RL concurrency <= 6
RUNNING per cluster, pending restart links don't count"): a job array of equal cells
carries at most ``%6``. RL jobs launched outside sweepkit (the seeds' ``hpc.launch``)
are named by their ``--job_name``, which follows no fixed pattern, so none are counted
unless a run names them: ``sweep run --cap-count-pattern REGEX``. The cluster (:data:`CLUSTER`, :func:`job_pieces`) is
registered through ``sweep_register_clusters``.

Everything person-specific comes from the environment; the values in the docs are examples:

=========================  ===============================================================
``SWEEP_ACCOUNT``          SLURM account, e.g. ``reformo``
``SWEEP_PARTITION``        SLURM partition (default: the account's)
``SWEEP_QOS``              SLURM QOS (default: the account's)
``SWEEP_RESERVATION``      reservation the jobs run in, e.g. ``reformo``
``SWEEP_VENV``             venv whose python runs the cell (launch key ``venv``), e.g. the RL venv
                           ``$WORKDIR/envs/rl``
``SWEEP_CONTAINER``        SIF image run with ``apptainer exec --nv`` (launch key ``container``)
``SWEEP_CONTAINER_BINDS``  comma-separated bind paths (default: ``$WORK`` and ``$SCRATCH``)
``SWEEP_RAY_IFNAME``       interface of NCCL/Gloo and the Ray head IP (default ``ib0``)
=========================  ===============================================================
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from typing import Optional

from sweepkit.hookspec import hookimpl
from sweepkit.run.executors.resources import JobResources
from sweepkit_plugins import cluster_pieces, clusters, ray_cluster

CLUSTER = clusters.ClusterProfile(
    name="jupiter",
    gpus_per_node=4,
    accelerator="GH200-96GB",
    hostname_patterns=("jpbo-*", "*.jupiter.internal"),
    max_running=6,
    foreign_job_pattern=None,  # hpc.launch's job names follow no pattern: --cap-count-pattern per run
    max_time_limit="11:59:00",
    default_time_limit="11:59:00",
    cpus_per_gpu=72,
    doc="JSC Jupiter booster: 4 x GH200 a node; at most 6 RL cells running",
)

# -- rules --------------------------------------------------------------------------------------


def moe_errors(cell) -> list[str]:
    launch = cell.launch()
    experts, ep, fsdp = launch.get("num_experts"), launch.get("ep_size") or 1, launch.get("fsdp_size")
    if not experts or not fsdp:
        return []
    if experts % ep:
        return [f"ep_size={ep} does not divide num_experts={experts}; pick an ep_size that divides it"]
    per_rank = experts // ep
    if per_rank % fsdp:
        fits = [n for n in range(1, per_rank + 1) if per_rank % n == 0]
        return [f"fsdp_size={fsdp} does not divide num_experts // ep_size = {experts} // {ep} = "
                f"{per_rank}; use an fsdp_size among {fits} (or change ep_size)"]
    return []


def _is_loopback(address: str) -> bool:
    host = address.strip().strip("'\"")
    if host.startswith("["):  # [::1]:port
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:  # host:port
        host = host.split(":", 1)[0]
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: Where a cell can give vLLM's data-parallel master address: vLLM's engine argument (a
#: config key or Hydra override path ending in one of these) and its environment variable.
DP_ADDRESS_KEYS = ("data_parallel_address", "data_parallel_master_ip", "data-parallel-address")
DP_ADDRESS_ENV = "VLLM_DP_MASTER_IP"


def dp_addresses(cell) -> list[tuple[str, str]]:
    """``(where, value)`` of every DP master address the cell's job will get."""
    launch = cell.launch()
    found = [(key, str(value)) for key, value in cell.config.items()
             if value is not None and any(name in key for name in DP_ADDRESS_KEYS)]
    for override in launch.get("hydra_overrides") or ():
        key, _, value = str(override).partition("=")
        if any(name in key for name in DP_ADDRESS_KEYS):
            found.append((f"hydra_overrides {key}", value))
    env = launch.get("env") or {}
    if env.get(DP_ADDRESS_ENV):
        found.append((f"env {DP_ADDRESS_ENV}", str(env[DP_ADDRESS_ENV])))
    return found


def data_parallel_errors(cell) -> list[str]:
    return [f"{where}={value!r} is a loopback address: with vLLM data parallel > 1 Ray registers the "
            "head only under its real IPv4 and vLLM fails with 'DP master node missing or dead'; "
            "leave the address unset (it is derived from the Ray cluster) or give the head's real IPv4"
            for where, value in dp_addresses(cell) if _is_loopback(value)]


@hookimpl
def sweep_validate_cell(cell, session):
    return (cluster_pieces.node_count_errors(cell, CLUSTER)
            + cluster_pieces.time_limit_errors(cell, CLUSTER.max_time_limit, "Jupiter's booster QOS")
            + moe_errors(cell) + data_parallel_errors(cell))


# -- the job script ----------------------------------------------------------------------------


def container_of(cell, environ: Mapping[str, str], cell_dir=None) -> cluster_pieces.Container | None:
    """A SIF image (the MoE / Megatron arms) run with apptainer; ``$SWEEP_CONTAINER_BINDS``
    names what it sees (default: ``$WORK`` and ``$SCRATCH``)."""
    return cluster_pieces.container_of(cell, environ, cell_dir=cell_dir, binary="apptainer", no_home=False,
                                 default_binds=[environ.get(name, "") for name in ("WORK", "SCRATCH")])


def job_pieces(cell, environ: Mapping[str, str], cell_dir=None) -> JobResources:
    nodes = cluster_pieces.cell_nodes(cell, CLUSTER)
    per_node = cluster_pieces.job_gpus_per_node(cell, CLUSTER)
    launch = cell.launch()
    container = container_of(cell, environ, cell_dir)
    venv = cluster_pieces.venv_of(cell, environ)
    env = {"RAY_USAGE_STATS_ENABLED": "0", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    bringup = None
    if nodes > 1:
        prefix = container.argv_prefix() if container else ()
        tool = (lambda name: f"{venv}/bin/{name}") if venv else (lambda name: name)
        bringup = ray_cluster.render_bringup(ray_cluster.bringup_for(
            cell, environ, prefix=prefix, ray=tool("ray"), python=tool("python"), num_gpus=per_node))
    return JobResources(
        cluster=CLUSTER.name, nodes=nodes, gpus_per_node=per_node,
        time_limit=cluster_pieces.job_time_limit(cell, CLUSTER),
        account=launch.get("account") or environ.get("SWEEP_ACCOUNT"),
        partition=launch.get("partition") or environ.get("SWEEP_PARTITION") or CLUSTER.partition,
        qos=launch.get("qos") or environ.get("SWEEP_QOS") or None,
        env=env,
        argv_prefix=container.argv_prefix() if container else (),
        python=cluster_pieces.python_of(cell, environ, container),
        ray_bringup=bringup,
        shared_filesystems=shared_filesystems(environ),
        node_local_filesystems=cluster_pieces.node_local(environ),
    )


def shared_filesystems(environ: Mapping[str, str]) -> tuple[str, ...]:
    """What every Jupiter node sees: ``$WORK``, ``$SCRATCH``, ``$HOME``, ``$PROJECT`` and
    the ``/e`` (scratch, data) and ``/p`` (home, project) file systems."""
    return cluster_pieces.filesystems(environ, ("WORK", "SCRATCH", "HOME", "PROJECT", "DATA"), ("/e", "/p"))


@hookimpl
def sweep_cell_env(cell, session):
    return cluster_pieces.code_env(cell, os.environ, container_of(cell, os.environ))


LAUNCH_KEYS = (
    ("num_experts", Optional[int], None, "experts of a MoE model (for the fsdp_size rule)"),
    ("ep_size", Optional[int], None, "expert-parallel size of a MoE policy"),
    ("fsdp_size", Optional[int], None, "FSDP shard group size of the policy"),
)


@hookimpl
def sweep_register_keys(register):
    for name, tp, default, doc in LAUNCH_KEYS:
        register(name, tp, default, doc)


@hookimpl
def sweep_register_clusters(register):
    register(clusters.Cluster(profile=CLUSTER, job_pieces=job_pieces))


@hookimpl
def sweep_job_sbatch_options(cell, session):
    # An sbatch option, not a preamble line: the renderer quotes it and refuses a line break.
    reservation = os.environ.get("SWEEP_RESERVATION")
    return {"reservation": reservation} if reservation else {}

