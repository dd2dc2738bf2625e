"""Which cluster a sweep runs on, and the SLURM executor's questions answered for it.

A cluster plugin registers a :class:`Cluster` through the ``sweep_register_clusters``
hook: its :class:`ClusterProfile` (name, hostname patterns, GPUs a node, walls, default
partition, QOS limits, the cap on running cells) and its ``job_pieces(cell, environ,
cell_dir)`` function, which returns the
:class:`~sweepkit.run.executors.resources.JobResources` a job script for that cluster is
assembled from. Its rules are its own hook implementations (``sweep_validate_cell``,
``sweep_cell_env``, ...). A module that defines a profile or a ``job_pieces`` function but
registers no cluster is not a cluster.

Every cluster plugin is registered, but only the active cluster's stays registered: at
``sweep_configure`` this plugin asks each plugin for its clusters (so it knows whose they
are), picks the active one and unregisters the other clusters' plugins, so their rules
never fire and ``sweep plugins`` lists only the active cluster. The active cluster is, in
order:

1. ``--cluster NAME`` (``--cluster none``: no cluster, whatever the environment says);
2. ``$SWEEP_CLUSTER``;
3. the first registered cluster whose hostname patterns match this host (fnmatch), e.g.
   Leonardo's ``login*.leonardo.local`` / ``lrdn*`` or Jupiter's ``jpbo-*``: examples, kept
   in each plugin's profile; set ``SWEEP_CLUSTER`` where they do not fit.

When a cluster is active, cells run as SLURM jobs (``sweep_choose_executor`` answers
``slurm``, also for ``--dry-run`` on a machine without ``sbatch``; the core itself only
answers ``$SWEEP_SLURM=1``), and this plugin answers the SLURM executor's questions for it:
``sweep_job_resources`` with the active cluster's ``job_pieces``,
``sweep_job_concurrency_cap`` with its ``max_running`` as a cap per user and cluster
(:class:`~sweepkit.run.executors.cluster_cap.ClusterCap`, counted across every runs dir),
and ``sweep_job_sbatch_options`` with the CPUs that go with the GPUs.

The launch keys every cluster reads (node count, the GPU budget, a container and a venv)
are registered here, once, so a grid that sets them loads whatever cluster is active. What
a job's pieces are made of is :mod:`sweepkit_plugins.cluster_pieces`, the checks of an
offline cluster :mod:`sweepkit_plugins.cluster_offline`; their helpers are re-exported here
for the plugins written against this module (``clusters.cell_nodes`` and the like).
"""

from __future__ import annotations

import fnmatch
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any, Optional

import attrs

from sweepkit.errors import UsageError
from sweepkit.hookspec import hookimpl
from sweepkit.run.executors.cluster_cap import ClusterCap, pattern_problem
from sweepkit.run.executors.resources import JobResources
from sweepkit.state.records import cell_dir as cell_dir_of
from sweepkit_plugins.cluster_offline import offline_problems  # noqa: F401 (re-exported)
from sweepkit_plugins.cluster_pieces import (  # noqa: F401 (re-exported: what cluster plugins build with)
    LAUNCH_KEYS,
    NODE_LOCAL,
    Container,
    cell_nodes,
    code_env,
    code_roots,
    container_of,
    derived_nodes,
    filesystems,
    gpu_budget,
    gpus_per_node,
    job_gpus_per_node,
    job_time_limit,
    make_dirs_line,
    module_root,
    node_count_errors,
    node_local,
    python_of,
    setting,
    target_default,
    time_limit_errors,
    venv_of,
)

CLUSTER_ENV = "SWEEP_CLUSTER"
NO_CLUSTER = "none"
OPTION_COMMANDS = ("list", "run", "status", "report", "plugins")
STASH_KEY = "clusters.active"
REGISTRY_KEY = "clusters.registered"


def _tuple(value) -> tuple:
    return tuple(value)


def _job_name_pattern(instance, attribute, value) -> None:
    problem = pattern_problem(value)
    if problem:
        raise ValueError(f"ClusterProfile.{attribute.name}: {problem}")


# -- the values a cluster plugin registers ---------------------------------------------


@attrs.frozen(kw_only=True)
class QosLimit:
    """A QOS whose limits are tighter than the cluster's: its longest wall, its most nodes."""

    name: str
    max_time: str
    max_nodes: Optional[int] = None


@attrs.frozen(kw_only=True)
class ClusterProfile:
    """The facts about a cluster that its rules and its job scripts depend on.

    ``hostname_patterns``: fnmatch patterns of the hosts the cluster is detected on;
    ``max_running``: how many cells one user may run on the cluster at once, from any runs
    dir (None: no cap); ``foreign_job_pattern``: a regular expression searched in the names
    of the user's jobs launched outside sweepkit, which then take slots of that cap too
    (None: only sweepkit's jobs count; ``--cap-count-pattern`` sets it for one run);
    ``max_time_limit``: the longest wall a job gets (longer cells chain with
    ``max_restarts``); ``default_time_limit``: the wall of a cell that sets none;
    ``cpus_per_gpu``: CPU cores a job gets per GPU it asks for (None: SLURM's default,
    which is one core per task: too few for a trainer and its rollout engines);
    ``partition``: the partition of a job that names none (None: the account's default);
    ``qos_limits``: the QOS whose limits are tighter than ``max_time_limit`` (a debug QOS).
    """

    name: str
    gpus_per_node: int
    accelerator: str
    hostname_patterns: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    max_running: Optional[int] = None
    foreign_job_pattern: Optional[str] = attrs.field(default=None, validator=_job_name_pattern)
    max_time_limit: str
    default_time_limit: str
    cpus_per_gpu: Optional[int] = None
    partition: Optional[str] = None
    qos_limits: tuple[QosLimit, ...] = attrs.field(default=(), converter=_tuple)
    doc: str = ""


#: The name plugins written before the SLURM executor had its own value (docs/clusters.md's
#: example) build their pieces with: that value itself, so what they return is what it reads.
JobPieces = JobResources


#: ``job_pieces(cell, environ, cell_dir)``: ``environ`` is the driver's environment,
#: ``cell_dir`` the cell's directory (None where there is none yet).
JobPiecesFunction = Callable[[Any, Mapping[str, str], Any], JobResources]


@attrs.frozen(kw_only=True)
class Cluster:
    """A cluster as its plugin registers it through ``sweep_register_clusters``: its
    profile (its name and how it is detected among the facts) and the function that makes
    a cell's :class:`~sweepkit.run.executors.resources.JobResources`."""

    profile: ClusterProfile = attrs.field(validator=attrs.validators.instance_of(ClusterProfile))
    job_pieces: JobPiecesFunction = attrs.field(validator=attrs.validators.is_callable())

    @property
    def name(self) -> str:
        return self.profile.name


@attrs.frozen(kw_only=True)
class Registration:
    """A registered cluster, and the plugin that registered it: the plugin whose rules apply
    while the cluster is active, and that is unregistered while another one is."""

    cluster: Cluster
    plugin: Any
    plugin_name: str


def registered_clusters(pm) -> dict[str, Registration]:
    """The clusters the plugins register through ``sweep_register_clusters``, by name, in
    registration order.

    Each plugin's implementation is called on its own, with a ``register`` that knows the
    plugin: one historic call would hand every plugin the same ``register``, and a cluster
    could not be told from another's rules. A value that is not a :class:`Cluster`, and a
    name registered twice, are usage errors naming the plugins.
    """
    found: dict[str, Registration] = {}
    for impl in pm.hook.sweep_register_clusters.get_hookimpls():
        plugin_name = pm.get_name(impl.plugin) or repr(impl.plugin)

        def register(cluster, *, plugin=impl.plugin, plugin_name=plugin_name) -> None:
            if not isinstance(cluster, Cluster):
                raise UsageError(f"plugin {plugin_name}: sweep_register_clusters registered {cluster!r}, "
                                 "not a sweepkit_plugins.clusters.Cluster")
            if cluster.name in found:
                raise UsageError(f"cluster {cluster.name!r} is registered twice: by plugin "
                                 f"{found[cluster.name].plugin_name} and by plugin {plugin_name}")
            found[cluster.name] = Registration(cluster=cluster, plugin=plugin, plugin_name=plugin_name)

        impl.function(*[{"register": register}[name] for name in impl.argnames])
    return found


# -- selection ------------------------------------------------------------------------


@hookimpl
def sweep_addoption(parser):
    parser.addoption("--cluster", commands=OPTION_COMMANDS, metavar="NAME", default=None,
                     help=f"apply a cluster plugin's rules (default: ${CLUSTER_ENV}, else "
                          f"detected from the hostname; '{NO_CLUSTER}' for no cluster)")


def select_cluster(requested: str | None, profiles: list[ClusterProfile],
                   environ: Mapping[str, str], hostname: str) -> str | None:
    """The active cluster's name, or None; UsageError for a name no plugin registers."""
    names = [profile.name for profile in profiles]
    for source, value in (("--cluster", requested), (f"${CLUSTER_ENV}", environ.get(CLUSTER_ENV))):
        if value:
            if value == NO_CLUSTER:
                return None
            if value not in names:
                known = ", ".join(sorted(names)) or "none are loaded"
                raise UsageError(f"{source} {value}: no cluster plugin of that name "
                                 f"(known clusters: {known}; load one with -p MODULE, whose "
                                 "sweep_register_clusters registers it)")
            return value
    for profile in profiles:
        if any(fnmatch.fnmatch(hostname, pattern) for pattern in profile.hostname_patterns):
            return profile.name
    return None


def _hostname() -> str:
    return socket.getfqdn()


def clusters_of(session) -> dict[str, Registration]:
    """The registered clusters; asked once per session, before the inactive ones' plugins
    are unregistered."""
    if REGISTRY_KEY not in session.stash:
        session.stash[REGISTRY_KEY] = registered_clusters(session.pm)
    return session.stash[REGISTRY_KEY]


def active_cluster(session) -> str | None:
    """The active cluster's name; decided once per session (the hostname lookup can be slow)."""
    if STASH_KEY not in session.stash:
        profiles = [registration.cluster.profile for registration in clusters_of(session).values()]
        session.stash[STASH_KEY] = select_cluster(
            getattr(session.options, "cluster", None), profiles, os.environ, _hostname())
    return session.stash[STASH_KEY]


def active_registration(session) -> Registration | None:
    name = active_cluster(session)
    return clusters_of(session)[name] if name else None


def active_profile(session) -> ClusterProfile | None:
    registration = active_registration(session)
    return registration.cluster.profile if registration else None


@hookimpl
def sweep_configure(session):
    active = active_registration(session)
    for registration in clusters_of(session).values():
        # A plugin may register several clusters: it stays if one of them is active.
        if active is not None and registration.plugin is active.plugin:
            continue
        if session.pm.is_registered(registration.plugin):
            session.pm.unregister(registration.plugin)


# -- what the SLURM executor asks -------------------------------------------------------


@hookimpl
def sweep_choose_executor(session):
    # A cluster's cells are SLURM jobs, wherever the command is typed: on a machine without
    # sbatch a dry run still renders their job scripts and a real run says sbatch is missing,
    # rather than starting a 4-GPU cell on the login node.
    return "slurm" if active_cluster(session) else None


def concurrency_cap(session) -> ClusterCap | None:
    """How many cells the user may run at once on the active cluster (None: no cap).

    The SLURM executor keeps at most this many of the user's jobs in the cluster's queue,
    sweepkit's from every runs dir and the foreign ones ``foreign_job_pattern`` names
    (:mod:`sweepkit.run.executors.cluster_cap`, under a per-user lock of the cluster). A
    pending job counts: SLURM starts it without asking anyone, so the cap on running cells
    holds only if no more are queued. A chain counts once: a link waiting on the link
    before it does not (the seed's "pending restart links", which do not count).
    """
    profile = active_profile(session)
    if profile is None or profile.max_running is None:
        return None
    return ClusterCap(limit=profile.max_running, cluster=profile.name, foreign_job_pattern=profile.foreign_job_pattern)


@hookimpl
def sweep_job_concurrency_cap(session):
    return concurrency_cap(session)


def job_pieces(cell, session) -> JobResources | None:
    """The active cluster's pieces of ``cell``'s job script (None: no cluster active), from
    its registered ``job_pieces(cell, environ, cell_dir)``."""
    registration = active_registration(session)
    if registration is None:
        return None
    return registration.cluster.job_pieces(cell, os.environ, cell_dir_of(session.runs_dir, cell))


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


@hookimpl
def sweep_register_keys(register):
    for name, tp, default, doc in LAUNCH_KEYS:
        register(name, tp, default, doc)
