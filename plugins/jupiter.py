"""JSC Jupiter (booster: 4 x GH200 a node): agentic SkyRL RL.

Rules, each refused before anything is submitted:

- ``num_nodes`` agrees with the GPU budget (policy + reference + inference engines x TP,
  / 4); a single-node allocation of a multi-node config fails fast with no clear error;
- the wall is 11:59:00; a longer cell chains with ``max_restarts`` (a link ending in
  TIMEOUT is the normal end of a healthy link);
- MoE: ``fsdp_size`` divides ``num_experts // ep_size``;
- vLLM data parallel > 1: the DP master address is never loopback (Ray registers the head
  under its real IPv4, so 127.0.0.1 fails with "DP master node missing or dead");
- a cell that targets a SkyRL entry point reaches it as Hydra ``++path=value`` overrides
  (:func:`hydra_overrides`); a bare top-level key, which Hydra rejects against the
  struct config, is refused.

At most 6 cells run on the cluster at once (``CLUSTER.max_running``, read by the SLURM
executor through :func:`sweepkit_plugins.clusters.concurrency_cap`): a job array of
equal cells carries ``%6``. Everything person-specific comes from the environment; the
values in the docs are examples:

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
import re
from collections.abc import Mapping
from typing import Any, Optional

from sweepkit.hookspec import hookimpl
from sweepkit_plugins import ckpt_guard, clusters, ray_cluster

CLUSTER = clusters.ClusterProfile(
    name="jupiter",
    gpus_per_node=4,
    accelerator="GH200-96GB",
    hostname_patterns=("jpbo-*", "*.jupiter.internal"),
    max_running=6,
    max_time_limit="11:59:00",
    default_time_limit="11:59:00",
    cpus_per_gpu=72,
    doc="JSC Jupiter booster: 4 x GH200 a node; at most 6 RL cells running",
)

# -- SkyRL's Hydra config ---------------------------------------------------------------------

#: The flat names grids use, and where SkyRL keeps them. A dotted key is a path already.
SKYRL_PATHS = {
    "model": "trainer.policy.model.path",
    "lr": "trainer.policy.optimizer_config.lr",
    "epochs": "trainer.epochs",
    "strategy": "trainer.strategy",
    "train_batch_size": "trainer.train_batch_size",
    "policy_mini_batch_size": "trainer.policy_mini_batch_size",
    "micro_train_batch_size_per_gpu": "trainer.micro_train_batch_size_per_gpu",
    "micro_forward_batch_size_per_gpu": "trainer.micro_forward_batch_size_per_gpu",
    "max_prompt_length": "trainer.max_prompt_length",
    "ckpt_interval": "trainer.ckpt_interval",
    "resume_mode": "trainer.resume_mode",
    "advantage_estimator": "trainer.algorithm.advantage_estimator",
    "use_kl_loss": "trainer.algorithm.use_kl_loss",
    "kl_loss_coef": "trainer.algorithm.kl_loss_coef",
    "eps_clip_high": "trainer.algorithm.eps_clip_high",
    "colocate_all": "trainer.placement.colocate_all",
    "n_samples_per_prompt": "generator.n_samples_per_prompt",
    "gpu_memory_utilization": "generator.gpu_memory_utilization",
    "enforce_eager": "generator.enforce_eager",
    "num_inference_engines": "generator.num_inference_engines",
    "inference_tp": "generator.inference_engine_tensor_parallel_size",
    "backend": "generator.backend",
    "max_generate_length": "generator.sampling_params.max_generate_length",
    "temperature": "generator.sampling_params.temperature",
    "env_class": "environment.env_class",
}
_PATH = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)+$")
_USER_OVERRIDE = re.compile(r"^\+\+(?P<key>[^=\s]+)=(?P<value>.*)$", re.DOTALL)
_PLAIN = re.compile(r"^[\w./:@+-]+$")


def targets_skyrl(cell) -> bool:
    """True when the cell's command runs a SkyRL entry point (``skyrl_train.entrypoints...``)."""
    return cell.target.name == "skyrl" or any("skyrl_train" in part for part in cell.target.argv)


def hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar: null, true/false, numbers, quoted strings, lists."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    text = str(value)
    if _PLAIN.match(text) and text not in ("null", "true", "false"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def hydra_path(key: str) -> str | None:
    """Where a cell key lives in SkyRL's config, or None for a bare key Hydra would reject."""
    if _PATH.match(key):
        return key
    return SKYRL_PATHS.get(key)


def _target_keys(cell, keys) -> list[str]:
    return [key for key in keys if key not in cell.launch_keys]


def hydra_override_errors(cell) -> list[str]:
    if not targets_skyrl(cell):
        return []
    errors = []
    for key in _target_keys(cell, cell.diff):
        if hydra_path(key) is None:
            errors.append(f"{key!r} is a bare top-level key: Hydra resolves it against the struct "
                          f"root and fails with ConfigKeyError; name its full path, e.g. "
                          f"'trainer.{key}' (known flat names: {', '.join(sorted(SKYRL_PATHS))})")
    for override in cell.launch().get("hydra_overrides") or ():
        match = _USER_OVERRIDE.match(str(override))
        if not match or not _PATH.match(match["key"]):
            errors.append(f"hydra_overrides: {override!r} is not a struct-safe override; write "
                          "'++section.key=value' with the full dotted path "
                          "(e.g. '++trainer.enable_db_registration=false')")
    return errors


def hydra_overrides(cell, *, resume: bool = False) -> list[str]:
    """The Hydra arguments of a SkyRL cell, appended after its entry point (last wins).

    The cell's diff against base (base = the recipe yaml), then the cell's own checkpoint
    and export paths and its resume mode (``latest`` for a resumed run or a chain link),
    then the ``hydra_overrides`` launch key verbatim. Empty for a cell that does not
    target SkyRL.
    """
    if not targets_skyrl(cell):
        return []
    out = [f"++{hydra_path(key)}={hydra_value(cell.config[key])}"
           for key in _target_keys(cell, cell.diff) if key in cell.config and hydra_path(key)]
    root = ckpt_guard.checkpoint_root(cell, os.environ)
    if root is not None:
        out.append(f"++trainer.ckpt_path={hydra_value(str(ckpt_guard.cell_ckpt_dir(cell, root)))}")
        out.append(f"++trainer.export_path={hydra_value(str(ckpt_guard.export_dir(cell, os.environ)))}")
    mode = "latest" if resume else ckpt_guard.resume_mode_of(cell)
    if mode is not ckpt_guard.MISSING:
        out.append(f"++trainer.resume_mode={hydra_value(mode)}")
    out += [str(override) for override in cell.launch().get("hydra_overrides") or ()]
    return out


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
    host = address.strip()
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


def data_parallel_errors(cell) -> list[str]:
    launch = cell.launch()
    if (launch.get("vllm_dp_size") or 1) <= 1:
        return []
    addresses = [("dp_master_address", launch.get("dp_master_address"))]
    for override in launch.get("hydra_overrides") or ():
        if "data_parallel_address" in str(override) or "data-parallel-address" in str(override):
            addresses.append(("hydra_overrides", str(override).split("=", 1)[-1]))
    for key, value in cell.config.items():
        if "data_parallel_address" in key:
            addresses.append((key, value))
    return [f"{where}={value!r} is loopback but vllm_dp_size={launch['vllm_dp_size']}: Ray registers "
            "the head only under its real IPv4 and vLLM fails with 'DP master node missing or dead'; "
            "leave it unset (the job uses $RAY_HEAD_IP) or give the head's real IPv4"
            for where, value in addresses if value and _is_loopback(str(value))]


@hookimpl
def sweep_validate_cell(cell, session):
    return (clusters.node_count_errors(cell, CLUSTER)
            + clusters.time_limit_errors(cell, CLUSTER.max_time_limit, "Jupiter's booster QOS")
            + moe_errors(cell) + data_parallel_errors(cell) + hydra_override_errors(cell))


# -- the job script ----------------------------------------------------------------------------


def container_of(cell, environ: Mapping[str, str], cell_dir=None) -> clusters.Container | None:
    """A SIF image (the MoE / Megatron arms) run with apptainer; ``$SWEEP_CONTAINER_BINDS``
    names what it sees (default: ``$WORK`` and ``$SCRATCH``)."""
    return clusters.container_of(cell, environ, cell_dir=cell_dir, binary="apptainer", no_home=False,
                                 default_binds=[environ.get(name, "") for name in ("WORK", "SCRATCH")])


def job_pieces(cell, environ: Mapping[str, str], cell_dir=None) -> clusters.JobPieces:
    nodes = clusters.cell_nodes(cell, CLUSTER)
    per_node = clusters.job_gpus_per_node(cell, CLUSTER)
    launch = cell.launch()
    container = container_of(cell, environ, cell_dir)
    venv = clusters.venv_of(cell, environ)
    env = {"RAY_USAGE_STATS_ENABLED": "0", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if (launch.get("vllm_dp_size") or 1) > 1:
        env["SWEEP_VLLM_DP_SIZE"] = str(launch["vllm_dp_size"])
    preamble = []
    if environ.get("SWEEP_RESERVATION"):
        preamble.append(f"#SBATCH --reservation={environ['SWEEP_RESERVATION']}")
    bringup = None
    if nodes > 1:
        prefix = container.argv_prefix() if container else ()
        tool = (lambda name: f"{venv}/bin/{name}") if venv else (lambda name: name)
        bringup = ray_cluster.render_bringup(ray_cluster.bringup_for(
            cell, environ, prefix=prefix, ray=tool("ray"), python=tool("python"), num_gpus=per_node))
    return clusters.JobPieces(
        cluster=CLUSTER.name, nodes=nodes, gpus_per_node=per_node,
        time_limit=clusters.job_time_limit(cell, CLUSTER),
        account=launch.get("account") or environ.get("SWEEP_ACCOUNT"),
        partition=launch.get("partition") or environ.get("SWEEP_PARTITION"),
        qos=launch.get("qos") or environ.get("SWEEP_QOS") or None,
        preamble=preamble, env=env,
        argv_prefix=container.argv_prefix() if container else (),
        python=clusters.python_of(cell, environ, container),
        ray_bringup=bringup,
    )


LAUNCH_KEYS = (
    ("num_experts", Optional[int], None, "experts of a MoE model (for the fsdp_size rule)"),
    ("ep_size", Optional[int], None, "expert-parallel size of a MoE policy"),
    ("fsdp_size", Optional[int], None, "FSDP shard group size of the policy"),
    ("vllm_dp_size", int, 1, "vLLM data-parallel size of an inference engine"),
    ("dp_master_address", Optional[str], None,
     "vLLM data-parallel master address (None: the Ray head's IPv4; never loopback)"),
    ("hydra_overrides", list[str], [], "extra '++path=value' Hydra overrides of a SkyRL cell, appended last"),
)


@hookimpl
def sweep_register_keys(register):
    for name, tp, default, doc in LAUNCH_KEYS:
        register(name, tp, default, doc)

