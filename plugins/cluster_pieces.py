"""What a cluster's job pieces are made of: nodes and GPUs from the cell's GPU budget, the
wall, the container and interpreter the cell runs with, and the file systems its nodes see.

Cluster plugins build their :class:`~sweepkit.run.executors.resources.JobResources` and
their rules from these helpers (:mod:`sweepkit_plugins.clusters` re-exports them, so
``clusters.cell_nodes`` and the like keep working). Nothing here is a hook: the launch keys
the helpers read (:data:`LAUNCH_KEYS`) are registered by the clusters plugin.
"""

from __future__ import annotations

import importlib.util
import math
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import attrs

from sweepkit.run.launch import parse_time_limit
from sweepkit_plugins.skyrl_schema import MOVED_ENGINE_PATHS  # both SkyRL layouts' engine paths

if TYPE_CHECKING:
    from sweepkit_plugins.clusters import ClusterProfile


def _tuple(value) -> tuple:
    return tuple(value)


# -- node count from the GPU budget ---------------------------------------------------------

LAUNCH_KEYS = (
    ("num_nodes", Optional[int], None,
     "nodes of the cell's job (None: derived from the GPU budget); a value that disagrees "
     "with the budget is an error"),
    ("gpus_per_node", Optional[int], None, "GPUs a node has (None: the cluster's)"),
    ("policy_num_gpus", Optional[int], None,
     "GPUs of the policy (FSDP) workers (None: the target's num_gpus, else gpus)"),
    ("ref_num_gpus", int, 0, "GPUs of a reference/teacher model not colocated with the policy"),
    ("teacher_num_gpus", int, 0,
     "GPUs of a separately served OPD teacher (e.g. a 32B teacher at TP2 on its own node); "
     "never colocated, so added to the budget even under colocate_all"),
    ("model_params_b", Optional[float], None,
     "model size in billions of parameters (None: parsed from the model name, e.g. '32B')"),
    ("container", Optional[str], None, "container image or sandbox dir the cell runs in (None: $SWEEP_CONTAINER)"),
    ("venv", Optional[str], None, "venv whose bin/python runs the cell (None: $SWEEP_VENV)"),
)



def setting(cell, *names: str, default=None):
    """The first of ``names`` the cell's config sets (flat trainer name or a Hydra path)."""
    for name in names:
        if cell.config.get(name) is not None:
            return cell.config[name]
    return default


def target_default(cell, key: str, default=None):
    """The default the cell's target declares for ``key`` in its schema, else ``default``."""
    schema = cell.target.schema or {}
    return schema[key]["default"] if key in schema else default


def gpu_budget(cell) -> int:
    """GPUs the cell's layout occupies: policy + reference + inference engines x TP, plus
    a separately served teacher. Engines and TP are read from the flat names or from
    either SkyRL layout's dotted paths.

    With ``colocate_all`` everything but the teacher shares the policy's GPUs, so the
    budget is the largest of those three (plus the teacher's) instead of their sum. A
    cell that does not set it gets its target's default (the built-in trainer colocates:
    its ``num_gpus`` processes each run their own engine).
    """
    launch = cell.launch()
    policy = launch.get("policy_num_gpus")
    if policy is None:
        policy = setting(cell, "num_gpus", default=launch.get("gpus") or 0)
    engines = setting(cell, "num_inference_engines", *MOVED_ENGINE_PATHS["num_inference_engines"], default=0)
    tp = setting(cell, "inference_tp", *MOVED_ENGINE_PATHS["inference_tp"], default=1)
    ref = launch.get("ref_num_gpus") or 0
    teacher = int(launch.get("teacher_num_gpus") or 0)
    inference = int(engines) * int(tp)
    if setting(cell, "colocate_all", "trainer.placement.colocate_all",
               default=target_default(cell, "colocate_all", False)):
        return max(int(policy), int(ref), inference) + teacher
    return int(policy) + int(ref) + inference + teacher


def gpus_per_node(cell, profile: ClusterProfile) -> int:
    return cell.launch().get("gpus_per_node") or profile.gpus_per_node


def derived_nodes(cell, profile: ClusterProfile) -> int:
    return max(1, math.ceil(gpu_budget(cell) / gpus_per_node(cell, profile)))


def job_gpus_per_node(cell, profile: ClusterProfile) -> int:
    """GPUs to ask of each node: all of them for a multi-node cell, else what the cell's
    budget (or its ``gpus``) needs, so a one-GPU cell does not hold a whole node."""
    per_node = gpus_per_node(cell, profile)
    if cell_nodes(cell, profile) > 1:
        return per_node
    return min(per_node, max(gpu_budget(cell), int(cell.launch().get("gpus") or 0)))


def cell_nodes(cell, profile: ClusterProfile | None) -> int:
    """Nodes the cell's job gets: the explicit ``num_nodes``, else derived from the budget."""
    explicit = cell.launch().get("num_nodes")
    if explicit is not None:
        return int(explicit)
    return derived_nodes(cell, profile) if profile else 1


def node_count_errors(cell, profile: ClusterProfile) -> list[str]:
    explicit = cell.launch().get("num_nodes")
    if explicit is None:
        return []
    budget, per_node = gpu_budget(cell), gpus_per_node(cell, profile)
    derived = derived_nodes(cell, profile)
    if explicit == derived:
        return []
    return [f"num_nodes={explicit} disagrees with the GPU budget: {budget} GPUs (policy + "
            f"reference + inference engines x TP) / {per_node} per node on {profile.name} = "
            f"{derived} node(s); set num_nodes={derived} or leave it unset to derive it "
            "(a job with too few nodes fails within minutes with no clear error)"]


# -- wall time -----------------------------------------------------------------------------


def time_limit_errors(cell, cap: str, where: str) -> list[str]:
    """A cell's wall over the cap: the message gives the chained form that fits."""
    value = cell.launch().get("time_limit")
    if value is None:
        return []
    try:
        seconds = parse_time_limit(value)
    except ValueError:
        return []  # the core's validation reports the malformed value
    cap_s = parse_time_limit(cap)
    if seconds <= cap_s:
        return []
    links = math.ceil(seconds / cap_s)
    restarts = max(links - 1, cell.launch().get("max_restarts") or 0)
    return [f"time_limit={value!r} exceeds {where}'s wall of {cap}; set time_limit={cap!r} "
            f"and max_restarts={restarts} so the run continues from its latest checkpoint "
            f"in {links} chained jobs (a TIMEOUT of a link is normal)"]


def job_time_limit(cell, profile: ClusterProfile) -> str:
    value = cell.launch().get("time_limit")
    if value is None:
        return profile.default_time_limit
    seconds = parse_time_limit(value)
    hours, rest = divmod(seconds, 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"


# -- container ----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Container:
    """``singularity exec`` (or ``apptainer exec``) of an image or sandbox dir, with a
    venv's python inside it; ``env`` is set inside with ``--env NAME=VALUE``."""

    image: str
    venv: Optional[str] = None
    binds: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    pwd: Optional[str] = None
    binary: str = "singularity"
    no_home: bool = True
    env: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_tuple)

    def argv_prefix(self) -> list[str]:
        argv = [self.binary, "exec", "--nv"] + (["--no-home"] if self.no_home else [])
        if self.binds:
            argv += ["--bind", ",".join(self.binds)]
        if self.pwd:
            argv += ["--pwd", self.pwd]
        for name, value in self.env:
            argv += ["--env", f"{name}={value}"]
        return argv + [self.image]

    def venv_bin(self, name: str) -> str:
        return f"{self.venv}/bin/{name}" if self.venv else name


#: Directory names of installed packages: a module imported from one of these is not a
#: source tree to bind and put on PYTHONPATH (that would shadow the venv's own packages).
_INSTALLED_DIRS = ("site-packages", "dist-packages")


def module_root(argv) -> str | None:
    """The source tree the driver imports a ``python -m MODULE`` target's top package from
    (the project checkout for the built-in ``-m trainer``), or None: no ``-m``, a module the
    driver cannot find (it lives only in the cell's venv, as SkyRL's does) or one installed
    in site-packages. Found with ``importlib.util.find_spec``, which does not import it."""
    argv = list(argv)
    if "-m" not in argv[:-1]:
        return None
    top = argv[argv.index("-m") + 1].split(".", 1)[0]
    if not top or top.startswith("{"):
        return None
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        location = Path(list(spec.submodule_search_locations)[0])
    elif spec.origin and spec.origin not in ("built-in", "frozen"):
        location = Path(spec.origin)
    else:
        return None
    root = location.resolve().parent
    if root.name in _INSTALLED_DIRS:
        return None
    return str(root)


def code_roots(cell) -> tuple[str | None, str | None]:
    """(the project root, the source tree of a ``-m`` target's module) of ``cell``: what
    its command reads besides its cell dir, so what a container must see."""
    root = cell.target.places.get("root")
    return (str(root) if root else None), module_root(cell.target.argv)


def _covered(path: str, roots) -> bool:
    return any(Path(path).is_relative_to(root) for root in roots if root)


def container_of(cell, environ: Mapping[str, str], *, cell_dir=None, default_binds=(),
                 binary: str = "singularity", no_home: bool = True) -> Container | None:
    """The cell's container: launch key ``container``, else ``$SWEEP_CONTAINER``.

    ``$SWEEP_CONTAINER_BINDS`` (comma-separated) replaces ``default_binds``;
    ``$SWEEP_CONTAINER_PWD`` replaces the cell dir as the working dir inside;
    ``$SWEEP_SINGULARITY`` replaces ``binary``.

    The project root and the source tree of a ``-m MODULE`` target (:func:`code_roots`) are
    bound too, unless a bind covers them already, and that source tree is the
    ``PYTHONPATH`` inside: the working dir is the cell dir, and the container's venv has
    no sweepkit installed, so ``python -m trainer`` would not find the trainer otherwise.
    """
    launch = cell.launch()
    image = launch.get("container") or environ.get("SWEEP_CONTAINER")
    if not image:
        return None
    binds = environ.get("SWEEP_CONTAINER_BINDS")
    bind_list = [b for b in binds.split(",") if b] if binds else [b for b in default_binds if b]
    project, module = code_roots(cell)
    for path in (project, module):
        if path and not _covered(path, bind_list):
            bind_list.append(path)
    pwd = environ.get("SWEEP_CONTAINER_PWD") or (str(cell_dir) if cell_dir is not None else None)
    return Container(image=image, venv=venv_of(cell, environ), binds=bind_list, pwd=pwd,
                     binary=environ.get("SWEEP_SINGULARITY") or binary, no_home=no_home,
                     env=[("PYTHONPATH", module)] if module else [])


def venv_of(cell, environ: Mapping[str, str]) -> str | None:
    return cell.launch().get("venv") or environ.get("SWEEP_VENV") or None


def python_of(cell, environ: Mapping[str, str], container: Container | None) -> str | None:
    """The interpreter that runs the cell: the venv's python (None: keep sweepkit's)."""
    venv = container.venv if container else venv_of(cell, environ)
    return f"{venv}/bin/python" if venv else None


def code_env(cell, environ: Mapping[str, str], container: Container | None) -> dict[str, str]:
    """``PYTHONPATH`` for a cell whose venv's python runs a ``-m`` target outside a
    container (inside one, :class:`Container` sets it): that venv has no sweepkit
    installed either."""
    module = code_roots(cell)[1]
    if container is not None or module is None or python_of(cell, environ, None) is None:
        return {}
    return {"PYTHONPATH": module}


def filesystems(environ: Mapping[str, str], names, fixed=()) -> tuple[str, ...]:
    """The values of the variables ``names`` that are set, then the ``fixed`` paths."""
    return tuple(dict.fromkeys([environ[name] for name in names if environ.get(name)] + list(fixed)))


#: Directories every node has its own of: nothing there is seen by another node.
NODE_LOCAL = ("/tmp", "/var/tmp", "/dev/shm", "/run")


def node_local(environ: Mapping[str, str]) -> tuple[str, ...]:
    return filesystems(environ, ("TMPDIR",), NODE_LOCAL)


def make_dirs_line(*paths: str) -> str:
    """A preamble line creating ``paths`` (quoted) before anything writes there."""
    return "mkdir -p " + " ".join(shlex.quote(path) for path in paths)
