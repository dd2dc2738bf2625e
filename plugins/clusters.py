"""Which cluster a sweep runs on, and what the cluster plugins share.

A cluster plugin is a module with a ``CLUSTER`` :class:`ClusterProfile`, hook
implementations for its rules, and a ``job_pieces(cell, environ, cell_dir)`` function that returns
the :class:`JobPieces` a job script for that cluster is assembled from.

Every cluster plugin is registered, but only the active cluster's stays registered: at
``sweep_configure`` this plugin unregisters the others, so their rules never fire and
``sweep plugins`` lists only the active cluster. The active cluster is, in order:

1. ``--cluster NAME`` (``--cluster none``: no cluster, whatever the environment says);
2. ``$SWEEP_CLUSTER``;
3. the first cluster whose hostname patterns match this host (fnmatch), e.g. Leonardo's
   ``login*.leonardo.local`` / ``lrdn*`` or Jupiter's ``jpbo-*``: examples, kept in each
   plugin's profile; set ``SWEEP_CLUSTER`` where they do not fit.

When a cluster is active, cells run as SLURM jobs (``sweep_choose_executor`` answers
``slurm``, also for ``--dry-run`` on a machine without ``sbatch``), and this plugin answers
the SLURM executor's questions for it: ``sweep_job_resources`` with the active cluster's
``job_pieces``, ``sweep_job_concurrency_cap`` with its ``max_running``, and
``sweep_job_sbatch_options`` with the CPUs that go with the GPUs.

The launch keys every cluster reads (node count, the GPU budget, a container and a venv)
are registered here, once, so a grid that sets them loads whatever cluster is active.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import math
import os
import shlex
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import attrs

from sweepkit.errors import UsageError
from sweepkit.hookspec import hookimpl
from sweepkit.run.launch import parse_time_limit
from sweepkit.state.records import cell_dir as cell_dir_of
from sweepkit_plugins.skyrl_schema import MOVED_ENGINE_PATHS  # both SkyRL layouts' engine paths

CLUSTER_ENV = "SWEEP_CLUSTER"
NO_CLUSTER = "none"
OPTION_COMMANDS = ("list", "run", "status", "report", "plugins")
STASH_KEY = "clusters.active"


def _tuple(value) -> tuple:
    return tuple(value)


@attrs.frozen(kw_only=True)
class ClusterProfile:
    """The facts about a cluster that its rules and its job scripts depend on.

    ``max_running``: how many cells may run on the cluster at once (None: no cap);
    ``max_time_limit``: the longest wall a job gets (longer cells chain with
    ``max_restarts``); ``default_time_limit``: the wall of a cell that sets none;
    ``cpus_per_gpu``: CPU cores a job gets per GPU it asks for (None: SLURM's default,
    which is one core per task: too few for a trainer and its rollout engines).
    """

    name: str
    gpus_per_node: int
    accelerator: str
    hostname_patterns: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    max_running: Optional[int] = None
    max_time_limit: str
    default_time_limit: str
    cpus_per_gpu: Optional[int] = None
    doc: str = ""


@attrs.frozen(kw_only=True)
class JobPieces:
    """What a job script of one cell is assembled from (the SLURM executor renders it).

    ``preamble``: shell lines run before anything else (module loads);
    ``env``: variables to export; ``argv_prefix``: the container wrapper the cell's command
    runs inside (empty: none); ``python``: the interpreter that replaces ``{python}`` in
    the target's argv (None: keep sweepkit's); ``ray_bringup``: a bash fragment that starts
    a Ray cluster over the job's nodes (None for a one-node cell);
    ``shared_filesystems``: the directories every compute node sees (the interpreter
    ``srun`` starts for submitit, the driver's own, must live under one);
    ``node_local_filesystems``: those each node has its own of (``/tmp``): an interpreter
    there is refused. The SLURM executor checks both before it submits
    (:func:`sweepkit.run.executors.slurm.interpreter_problem`).
    """

    cluster: str
    nodes: int
    gpus_per_node: int
    time_limit: str
    account: Optional[str] = None
    partition: Optional[str] = None
    qos: Optional[str] = None
    preamble: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    env: Mapping[str, str] = attrs.field(factory=dict, converter=dict)
    argv_prefix: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    python: Optional[str] = None
    ray_bringup: Optional[str] = None
    shared_filesystems: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    node_local_filesystems: tuple[str, ...] = attrs.field(default=(), converter=_tuple)


# -- selection ------------------------------------------------------------------------


@hookimpl
def sweep_addoption(parser):
    parser.addoption("--cluster", commands=OPTION_COMMANDS, metavar="NAME", default=None,
                     help=f"apply a cluster plugin's rules (default: ${CLUSTER_ENV}, else "
                          f"detected from the hostname; '{NO_CLUSTER}' for no cluster)")


def cluster_plugins(pm) -> dict[str, Any]:
    """The registered cluster plugins by cluster name."""
    return {profile.name: plugin for plugin in pm.get_plugins()
            if isinstance(profile := getattr(plugin, "CLUSTER", None), ClusterProfile)}


def select_cluster(requested: str | None, profiles: list[ClusterProfile],
                   environ: Mapping[str, str], hostname: str) -> str | None:
    """The active cluster's name, or None; UsageError for a name no plugin knows."""
    names = [profile.name for profile in profiles]
    for source, value in (("--cluster", requested), (f"${CLUSTER_ENV}", environ.get(CLUSTER_ENV))):
        if value:
            if value == NO_CLUSTER:
                return None
            if value not in names:
                known = ", ".join(sorted(names)) or "none are loaded"
                raise UsageError(f"{source} {value}: no cluster plugin of that name "
                                 f"(known clusters: {known}; load one with -p MODULE)")
            return value
    for profile in profiles:
        if any(fnmatch.fnmatch(hostname, pattern) for pattern in profile.hostname_patterns):
            return profile.name
    return None


def _hostname() -> str:
    return socket.getfqdn()


def active_cluster(session) -> str | None:
    """The active cluster's name; decided once per session (the hostname lookup can be slow)."""
    if STASH_KEY not in session.stash:
        plugins = cluster_plugins(session.pm)
        session.stash[STASH_KEY] = select_cluster(
            getattr(session.options, "cluster", None), [plugin.CLUSTER for plugin in plugins.values()],
            os.environ, _hostname())
    return session.stash[STASH_KEY]


def active_plugin(session):
    name = active_cluster(session)
    return cluster_plugins(session.pm)[name] if name else None


def active_profile(session) -> ClusterProfile | None:
    plugin = active_plugin(session)
    return plugin.CLUSTER if plugin else None


@hookimpl
def sweep_configure(session):
    active = active_cluster(session)
    for name, plugin in cluster_plugins(session.pm).items():
        if name != active:
            session.pm.unregister(plugin)


# -- what the SLURM executor asks -------------------------------------------------------


@hookimpl
def sweep_choose_executor(session):
    # A cluster's cells are SLURM jobs, wherever the command is typed: on a machine without
    # sbatch a dry run still renders their job scripts and a real run says sbatch is missing,
    # rather than starting a 4-GPU cell on the login node.
    return "slurm" if active_cluster(session) else None


def concurrency_cap(session) -> int | None:
    """How many cells may run at once on the active cluster (None: no cap).

    The SLURM executor keeps at most this many of the runs dir's jobs in the queue
    (:mod:`sweepkit.run.executors.slurm_jobs`, under its submit lock). A pending job counts:
    SLURM starts it without asking anyone, so the cap on running cells holds only if no
    more are queued. A chain counts once, however many of its links wait on a dependency
    (those are the seed's "pending restart links", which do not count).
    """
    profile = active_profile(session)
    return profile.max_running if profile else None


@hookimpl
def sweep_job_concurrency_cap(session):
    return concurrency_cap(session)


def job_pieces(cell, session) -> JobPieces | None:
    """The active cluster's pieces of ``cell``'s job script (None: no cluster active).

    Calls the cluster plugin's ``job_pieces(cell, environ, cell_dir)``.
    """
    plugin = active_plugin(session)
    if plugin is None:
        return None
    return plugin.job_pieces(cell, os.environ, cell_dir_of(session.runs_dir, cell))


@hookimpl
def sweep_job_resources(cell, session):
    return job_pieces(cell, session)


@hookimpl
def sweep_job_sbatch_options(cell, session):
    profile = active_profile(session)
    launch = cell.launch()
    if profile is None or profile.cpus_per_gpu is None or launch.get("cpus") is not None:
        return {}
    gpus = job_gpus_per_node(cell, profile)
    return {"cpus-per-task": str(profile.cpus_per_gpu * gpus)} if gpus else {}


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


@hookimpl
def sweep_register_keys(register):
    for name, tp, default, doc in LAUNCH_KEYS:
        register(name, tp, default, doc)


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


# -- offline compute nodes ----------------------------------------------------------------

#: Values of the trainer's path keys that are built locally, never downloaded
#: (``trainer/models.py``, ``trainer/data.py``).
LOCAL_NAMES = ("tiny-random", "synthetic")
LOCAL_PREFIXES = ("random:",)
WARNED_KEY = "clusters.warned"


def hub_names(cell) -> list[tuple[str, str]]:
    """``(key, value)`` of the cell's path keys (the target's schema marks them) whose value
    is a hub name: not a path (collection made every existing relative one absolute), not
    one of the names the trainer builds locally."""
    schema = cell.target.schema or {}
    found = []
    for key, spec in schema.items():
        value = cell.config.get(key)
        if not spec.get("path") or not isinstance(value, str) or not value:
            continue
        if os.path.isabs(value) or value.startswith((".", "~", "$")) or value in LOCAL_NAMES \
                or value.startswith(LOCAL_PREFIXES):
            continue
        found.append((key, value))
    return found


def in_hub_cache(cache: str, value: str) -> bool:
    """Whether ``huggingface_hub``'s cache dir ``cache`` holds a snapshot of repo ``value``
    (``models--org--name`` or ``datasets--org--name``, as ``hf download`` leaves it)."""
    name = value.replace("/", "--")
    return any(any((Path(cache) / f"{kind}--{name}" / "snapshots").glob("*"))
               for kind in ("models", "datasets") if (Path(cache) / f"{kind}--{name}" / "snapshots").is_dir())


def warn(session, cell, key: str, message: str) -> None:
    """Print a warning once per message (the message names the key and value, so every
    cell with that value shares it), with where the first such cell set the key."""
    warned = session.stash.setdefault(WARNED_KEY, set())
    if message in warned:
        return
    warned.add(message)
    file, line = cell.location_of(key)
    session.err_console.print(f"warning: {file}:{line}: {cell.name}: {message}", markup=False, highlight=False)


def submits(session) -> bool:
    """Whether this command submits (``sweep run`` without ``--dry-run``): what a job would
    only find out on a compute node is an error then, and a warning in a preview."""
    options = session.options
    return getattr(options, "command", None) == "run" and not getattr(options, "dry_run", False)


def offline_problems(cell, session, *, hub_cache: str, venv: str | None, cluster: str) -> list[str]:
    """What fails on a cluster whose jobs run offline (``HF_HUB_OFFLINE=1``, no internet).

    - A hub name (``model="Qwen/Qwen2.5-1.5B-Instruct"``, ``dataset="gsm8k"``) with no
      snapshot in the pre-staged cache ``hub_cache``: the job would fail at its first line,
      after its wait in the queue. An error when submitting; in a dry run (or ``list``),
      which is often typed where the cache is not, a warning.
    - ``backend="vllm"``: a warning, always. sweepkit cannot see into the cell's venv; the
      trainer's vLLM engine needs vllm installed there.
    """
    errors = []
    for key, value in hub_names(cell):
        if in_hub_cache(hub_cache, value):
            continue
        message = (f"{key}: {value!r} is a hub name, and {cluster}'s jobs run offline (HF_HUB_OFFLINE=1, "
                   f"no internet on compute nodes) with no snapshot of it in the hub cache {hub_cache}; "
                   f"pre-stage it on the login node (HF_HUB_CACHE={hub_cache} hf download {value}"
                   + (" --repo-type dataset" if key == "dataset" else "")
                   + f") or set {key} to a local path")
        if submits(session):
            errors.append(message)
        else:
            warn(session, cell, key, message + " (an error when submitting)")
    if cell.config.get("backend") == "vllm":
        warn(session, cell, "backend",
             f"backend: 'vllm' needs vllm installed in the cell's venv ({venv or 'none set: $SWEEP_VENV'}); "
             "sweepkit cannot check inside the container, and the trainer's vLLM engine has not been run on any "
             "tested machine; a venv without vllm fails at the first rollout (for the seeds' Leonardo venv: "
             "uv sync --extra vllm); backend='static' runs the trainer's own engine")
    return errors
