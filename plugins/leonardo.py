"""CINECA Leonardo (booster: 4 x A100-64GB a node, no internet on compute nodes).

Rules, each refused before anything is submitted:

- write paths: checkpoints and exports must resolve under ``$WORK``; a path under the
  quota'd ``$SCRATCH_FAST`` fails mid-run with ``OSError: [Errno 122] Disk quota
  exceeded`` (it took down twelve cells on 2026-06-19);
- QOS: the debug QOS (``$SWEEP_DEBUG_QOS``, e.g. ``boost_qos_dbg``) allows 30 minutes and
  2 nodes; every other QOS 23:59:00, past which a cell chains with ``max_restarts``. A
  cell without ``time_limit`` gets its QOS's longest wall (00:30:00 under the debug QOS),
  and its job script says so;
- A100-64GB ceilings on one node: ``gpu_memory_utilization`` above 0.85 OOMs eval, and a
  dense model of 32B or more (a MoE of 30B or more) OOMs in backward / weight sync; both
  are accepted only on a cell marked ``xfail`` (a ceiling probe);
- ``num_nodes`` must agree with the GPU budget (:mod:`sweepkit_plugins.cluster_pieces`);
- offline compute nodes: a hub-name ``model`` / ``dataset`` with no snapshot in the
  pre-staged hub cache (an error when submitting, a warning in a dry run), and
  ``backend="vllm"`` (a warning: vllm must be in the cell's venv)
  (:func:`sweepkit_plugins.cluster_offline.offline_problems`).

The cluster (:data:`CLUSTER`, :func:`job_pieces`) is registered through
``sweep_register_clusters``; :mod:`sweepkit_plugins.clusters` makes it the active one on
its hosts, with ``--cluster leonardo`` or ``$SWEEP_CLUSTER``.

The cell's environment is offline (models and data pre-staged on the login node) with
HOME, caches and the Triton compiler pointed at writable places. Everything
person-specific comes from the environment; the values in the docs are examples:

=========================  ===============================================================
``WORK``                   the project's work dir, e.g. ``/leonardo_work/<ACCOUNT>/<user>``
``SCRATCH_FAST``           the fast scratch, e.g. ``/leonardo_scratch/fast/<ACCOUNT>/<user>``
``SWEEP_ACCOUNT``          SLURM account, e.g. ``AIFAC_5C0_290``
``SWEEP_PARTITION``        SLURM partition (default ``boost_usr_prod``)
``SWEEP_QOS``              SLURM QOS (default: the partition's; the debug one is ``boost_qos_dbg``)
``SWEEP_CONTAINER``        writable singularity sandbox dir (launch key ``container``)
``SWEEP_VENV``             uv venv whose python runs the cell (launch key ``venv``)
``SWEEP_CONTAINER_BINDS``  comma-separated bind paths (default: ``$WORK`` and ``$SCRATCH_FAST``)
``SWEEP_CONTAINER_PWD``    working dir inside the container (default: the cell dir)
``SWEEP_GCC_BIN``          dir with ``gcc`` / ``g++`` for Triton's JIT
``SWEEP_HOME``             writable HOME for the cell (default ``$WORK/.sweep_home``)
=========================  ===============================================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import attrs

from sweepkit.errors import UsageError
from sweepkit.hookspec import hookimpl
from sweepkit.run.executors.resources import JobResources
from sweepkit_plugins import ckpt_guard, cluster_offline, cluster_pieces, clusters, ray_cluster

#: The debug QOS (``$SWEEP_DEBUG_QOS`` names it where it is called otherwise).
DEBUG_QOS = clusters.QosLimit(name="boost_qos_dbg", max_time="00:30:00", max_nodes=2)

CLUSTER = clusters.ClusterProfile(
    name="leonardo",
    gpus_per_node=4,
    accelerator="A100-64GB",
    hostname_patterns=("login*.leonardo.local", "lrdn*"),
    max_running=None,
    max_time_limit="23:59:00",
    default_time_limit="23:59:00",
    cpus_per_gpu=8,
    partition="boost_usr_prod",
    qos_limits=(DEBUG_QOS,),
    doc="CINECA Leonardo booster: 4 x A100-64GB a node, no compute-node internet",
)

MAX_GPU_MEMORY_UTILIZATION = 0.85
DENSE_CEILING_B = 32.0
MOE_CEILING_B = 30.0


def qos_limit(qos: str | None, environ: Mapping[str, str]) -> clusters.QosLimit:
    debug = environ.get("SWEEP_DEBUG_QOS") or DEBUG_QOS.name
    if qos == debug:
        return attrs.evolve(DEBUG_QOS, name=debug)
    return clusters.QosLimit(name=qos or "normal", max_time=CLUSTER.max_time_limit)


# -- model size -------------------------------------------------------------------------------

_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[bB](?![a-zA-Z])")
_ACTIVE = re.compile(r"-A\d+(?:\.\d+)?B\b", re.IGNORECASE)


def model_size_b(cell) -> float | None:
    """Billions of parameters: ``model_params_b``, else the first ``<N>B`` of the model name."""
    explicit = cell.launch().get("model_params_b")
    if explicit is not None:
        return float(explicit)
    name = str(cluster_pieces.setting(cell, "model", "trainer.policy.model.path", default="") or "")
    match = _SIZE.search(name.rsplit("/", 1)[-1])
    return float(match[1]) if match else None


def is_moe(cell) -> bool:
    name = str(cluster_pieces.setting(cell, "model", "trainer.policy.model.path", default="") or "")
    return bool(cell.launch().get("num_experts")) or bool(_ACTIVE.search(name)) or "x7b" in name.lower()


# -- rules ----------------------------------------------------------------------------------


def _under(path: Path, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(Path(root).resolve())


def write_paths(cell, session, environ: Mapping[str, str]) -> dict[str, Path]:
    """The checkpoint and export paths the cell's process writes to."""
    ckpt = (ckpt_guard.ckpt_dir_of(cell, environ)
            or Path(session.runs_dir) / cell.grid_name / cell.name / "ckpt")
    paths = {"checkpoint": ckpt}
    export = ckpt_guard.export_dir(cell, environ)
    paths["export"] = export if export is not None else ckpt / "export"
    return paths


def write_path_errors(cell, session, environ: Mapping[str, str]) -> list[str]:
    work, scratch = environ.get("WORK"), environ.get("SCRATCH_FAST")
    if not work:
        return ["WORK is not set: Leonardo's checkpoints must live on $WORK; "
                "export WORK=/leonardo_work/<ACCOUNT>/<user> before running"]
    errors = []
    for what, path in write_paths(cell, session, environ).items():
        if scratch and _under(path, scratch):
            errors.append(f"{what} path {path} is on $SCRATCH_FAST ({scratch}), whose quota fills "
                          "mid-run (OSError [Errno 122] Disk quota exceeded, 2026-06-19); put it under "
                          f"$WORK ({work}): set ckpt_root / export_path / --runs-dir there")
        elif not _under(path, work):
            errors.append(f"{what} path {path} is not under $WORK ({work}); set ckpt_root / "
                          "export_path / --runs-dir to a directory under $WORK")
    return errors


def qos_errors(cell, environ: Mapping[str, str]) -> list[str]:
    limit = qos_limit(job_qos(cell, environ), environ)
    errors = cluster_pieces.time_limit_errors(cell, limit.max_time, f"QOS {limit.name}")
    nodes = cluster_pieces.cell_nodes(cell, CLUSTER)
    if limit.max_nodes is not None and nodes > limit.max_nodes:
        errors.append(f"QOS {limit.name} allows at most {limit.max_nodes} nodes, the cell needs "
                      f"{nodes}; use qos=None (the normal QOS) for it")
    return errors


def ceiling_errors(cell) -> list[str]:
    if cell.xfail is not None:
        return []  # a ceiling probe: its failure is the expected result
    errors = []
    gmu = cluster_pieces.setting(cell, "gpu_memory_utilization", "generator.gpu_memory_utilization")
    if gmu is not None and float(gmu) > MAX_GPU_MEMORY_UTILIZATION:
        errors.append(f"gpu_memory_utilization={gmu} is over the A100-64GB ceiling of "
                      f"{MAX_GPU_MEMORY_UTILIZATION} (0.90 OOMs eval); lower it, or mark the cell "
                      "sk.mark.xfail(reason=...) to keep it as a ceiling probe")
    size = model_size_b(cell)
    if size is not None and cluster_pieces.cell_nodes(cell, CLUSTER) == 1:
        moe = is_moe(cell)
        ceiling = MOE_CEILING_B if moe else DENSE_CEILING_B
        if size >= ceiling:
            kind = "MoE" if moe else "dense"
            errors.append(f"a {size:g}B {kind} model OOMs on one 4 x A100-64GB node (FSDP backward / "
                          "weight-sync broadcast); give it more nodes (policy_num_gpus / num_nodes), "
                          "or mark the cell sk.mark.xfail(reason=...) as a ceiling probe")
    return errors


@hookimpl
def sweep_validate_cell(cell, session):
    environ = os.environ
    offline = cluster_offline.offline_problems(
        cell, session, hub_cache=offline_env(environ, in_container=False)["HF_HUB_CACHE"],
        venv=cluster_pieces.venv_of(cell, environ), cluster=CLUSTER.name)
    return (write_path_errors(cell, session, environ) + qos_errors(cell, environ)
            + ceiling_errors(cell) + cluster_pieces.node_count_errors(cell, CLUSTER) + offline)


# -- the cell's environment and job script ---------------------------------------------------


def cell_home(environ: Mapping[str, str]) -> str:
    return environ.get("SWEEP_HOME") or f"{environ.get('WORK', '')}/.sweep_home"


def offline_env(environ: Mapping[str, str], *, in_container: bool) -> dict[str, str]:
    """No internet on compute nodes: everything offline, every write somewhere writable."""
    work = environ.get("WORK", "")
    home = cell_home(environ)
    hub = environ.get("SWEEP_HF_HOME") or f"{work}/data/hub"
    env = {
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
        "HF_HOME": hub, "HF_HUB_CACHE": hub,
        # HOME is read-only inside the container (--no-home); trainers default caches there.
        "HOME": home, "XDG_CACHE_HOME": f"{home}/.cache", "XDG_CONFIG_HOME": f"{home}/.config",
        "RAY_USAGE_STATS_ENABLED": "0", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    }
    gcc = environ.get("SWEEP_GCC_BIN")
    if gcc:
        # The container image has no compiler; Triton JIT-compiles kernels at first use.
        env.update(CC=f"{gcc}/gcc", CXX=f"{gcc}/g++")
        if in_container:  # singularity resets PATH inside; these prepend to it there
            env.update(SINGULARITYENV_PREPEND_PATH=gcc, APPTAINERENV_PREPEND_PATH=gcc)
        else:
            env["PATH"] = f"{gcc}{os.pathsep}{environ.get('PATH', '')}"
    return env


def container_of(cell, environ: Mapping[str, str], cell_dir=None) -> cluster_pieces.Container | None:
    """The writable sandbox dir the cell runs in, with ``$WORK`` and ``$SCRATCH_FAST`` bound
    and the cell dir as its working dir (``--no-home``: the sandbox's home is read-only)."""
    return cluster_pieces.container_of(cell, environ, cell_dir=cell_dir,
                                 default_binds=[environ.get(name, "") for name in ("WORK", "SCRATCH_FAST")])


def job_qos(cell, environ: Mapping[str, str]) -> str | None:
    return cell.launch().get("qos") or environ.get("SWEEP_QOS") or None


def job_time_limit(cell, environ: Mapping[str, str]) -> tuple[str, list[str]]:
    """The job's wall, and the script's comment lines when it is not the cell's own: a cell
    without ``time_limit`` gets the longest its QOS allows (the debug QOS refuses more)."""
    if cell.launch().get("time_limit") is not None:
        return cluster_pieces.job_time_limit(cell, CLUSTER), []
    limit = qos_limit(job_qos(cell, environ), environ)
    return limit.max_time, [f"# --time={limit.max_time}: the cell sets no time_limit, so it gets the "
                            f"longest wall QOS {limit.name} allows"]


def job_pieces(cell, environ: Mapping[str, str], cell_dir=None) -> JobResources:
    container = container_of(cell, environ, cell_dir)
    nodes = cluster_pieces.cell_nodes(cell, CLUSTER)
    per_node = cluster_pieces.job_gpus_per_node(cell, CLUSTER)
    launch = cell.launch()
    bringup = None
    if nodes > 1:
        prefix = container.argv_prefix() if container else ()
        spec = ray_cluster.bringup_for(
            cell, environ, prefix=prefix, num_gpus=per_node,
            ray=container.venv_bin("ray") if container else "ray",
            python=container.venv_bin("python") if container else "python")
        bringup = ray_cluster.render_bringup(spec)
    env = offline_env(environ, in_container=container is not None)
    time_limit, time_note = job_time_limit(cell, environ)
    return JobResources(
        cluster=CLUSTER.name, nodes=nodes, gpus_per_node=per_node,
        time_limit=time_limit,
        account=launch.get("account") or environ.get("SWEEP_ACCOUNT"),
        partition=launch.get("partition") or environ.get("SWEEP_PARTITION") or CLUSTER.partition,
        qos=job_qos(cell, environ),
        # The writable HOME and caches must exist before Ray or the trainer write there.
        preamble=[*time_note, cluster_pieces.make_dirs_line(env["XDG_CACHE_HOME"], env["XDG_CONFIG_HOME"])],
        env=env,
        argv_prefix=container.argv_prefix() if container else (),
        python=cluster_pieces.python_of(cell, environ, container),
        ray_bringup=bringup,
        shared_filesystems=shared_filesystems(environ),
        node_local_filesystems=cluster_pieces.node_local(environ),
    )


def shared_filesystems(environ: Mapping[str, str]) -> tuple[str, ...]:
    """What every Leonardo node sees: ``$WORK``, the scratches, ``$HOME`` (read-only inside
    the container, but the driver's interpreter runs outside it) and the GPFS roots."""
    return cluster_pieces.filesystems(environ, ("WORK", "SCRATCH_FAST", "SCRATCH", "CINECA_SCRATCH", "HOME"),
                                ("/leonardo", "/leonardo_work", "/leonardo_scratch", "/cineca"))


@hookimpl
def sweep_cell_env(cell, session):
    container = container_of(cell, os.environ)
    return {**offline_env(os.environ, in_container=container is not None),
            **cluster_pieces.code_env(cell, os.environ, container)}


@hookimpl
def sweep_register_clusters(register):
    register(clusters.Cluster(profile=CLUSTER, job_pieces=job_pieces))


EXPORT_SUBDIR = "sweepkit-exports"


def export_dir(environ: Mapping[str, str]) -> Path:
    """Where ``sweep export`` writes on Leonardo: ``$WORK/sweepkit-exports``, never a scratch
    (``$CINECA_SCRATCH`` and ``$SCRATCH_FAST`` are purged and quota'd); a UsageError without $WORK."""
    work = environ.get("WORK")
    if not work:
        raise UsageError("WORK is not set: on Leonardo sweep export writes under $WORK/sweepkit-exports (never a "
                         "scratch); export WORK=/leonardo_work/<ACCOUNT>/<user>, or pass --to DIR")
    return Path(work) / EXPORT_SUBDIR


@hookimpl
def sweep_export_dir(session):
    return export_dir(os.environ)
