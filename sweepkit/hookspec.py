"""Every hook sweepkit calls, grouped by the phase that calls it.

Plugins implement these with ``@sweepkit.hookimpl``. The names follow pytest's
where the meaning is the same. A hook that takes a decision is
``firstresult=True`` (the first non-None answer wins); a registration hook is
``historic``, so a plugin registered late (a ``sweepconf.py`` found while
collecting) still gets the call and its registrations.

Order of a ``sweep run``:

1. start-up: :func:`sweep_addoption`, the five ``sweep_register_*`` hooks (keys,
   targets, executors, profiles; clusters, asked by the clusters plugin at its
   configure), :func:`sweep_configure`;
2. collection, once per grid file: :func:`sweep_collect_file`, and for every
   axis or product cell without an explicit id :func:`sweep_make_cell_id`;
3. :func:`sweep_collection_modifyitems`, then :func:`sweep_deselected` with the
   cells that ``-k`` / ``-m`` / ``::CELL`` / ``--failed`` left out;
4. :func:`sweep_validate_cell` for every selected cell (the run's plan of each cell,
   made once for the command, asks :func:`sweep_cell_ckpt_dir` where its checkpoints
   are and :func:`sweep_cell_checkpoints` which entries there are checkpoints); any
   error stops here;
5. :func:`sweep_choose_executor` unless ``--executor`` names one (asked once);
6. per cell: :func:`sweep_cell_gpus` (a cell with no ``gpus`` key), :func:`sweep_cell_env`,
   :func:`sweep_cell_args` and
   :func:`sweep_cell_start_config` (once with the run's resume flag, once with
   ``resume=True`` for a chain link), for a cluster executor
   :func:`sweep_job_resources` and :func:`sweep_job_sbatch_options` (each once;
   :func:`sweep_job_concurrency_cap` once per run), :func:`sweep_prepare_cell_dir` (and
   :func:`sweep_cell_checkpoints` for each dir it names), :func:`sweep_cell_started`,
   :func:`sweep_watch_cell` as its metric records arrive, then :func:`sweep_cell_finished`;
7. :func:`sweep_unconfigure`.

``sweep report`` asks :func:`sweep_register_report_tables` and then
:func:`sweep_register_report_formats` once, before it reads the first grid.

``sweep export`` asks :func:`sweep_cell_ckpt_dir` and :func:`sweep_cell_checkpoints` for each
selected cell, :func:`sweep_export_dir` once (without ``--to``), then
:func:`sweep_export_checkpoint` for each cell's chosen step; ``sweep clean`` asks the first two
and :func:`sweep_checkpoint_pointer` for each checkpoint entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:
    from pathlib import Path

    from sweepkit.grid.cell import Cell, Target
    from sweepkit.run.executors.cluster_cap import ClusterCap
    from sweepkit.run.executors.resources import JobResources

    # The session object every hook gets: sweepkit.session.Session (not imported here, which
    # would tie the hook specs, imported by every plugin, to the session that loads them).
    Session = Any

hookspec = pluggy.HookspecMarker("sweepkit")
hookimpl = pluggy.HookimplMarker("sweepkit")


# -- start-up ---------------------------------------------------------------------


@hookspec(historic=True)
def sweep_addoption(parser) -> None:
    """Add command-line options.

    :param parser: a :class:`sweepkit.cli.OptionParser`; call
        ``parser.addoption("--flag", commands=("run",), **argparse_kwargs)``.
        ``commands`` names the subcommands that take the option.

    Only plugins known before the command line is parsed can add options: the
    default plugins, entry points, ``-p`` modules and the ``sweepconf.py`` files
    next to the grids named on the command line (or ``grids/``).
    """


@hookspec(historic=True)
def sweep_register_keys(register: Callable[..., None]) -> None:
    """Register launch keys: settings that shape how a cell is started, not what it computes.

    :param register: ``register(name, type, default, doc)``; ``type`` is a
        typing annotation (``int``, ``str | None``, ``dict[str, str]``).

    Launch keys are checked against their type, stay out of ``config.json``, and
    reach executors through :meth:`sweepkit.grid.cell.Cell.launch`.
    """


@hookspec(historic=True)
def sweep_register_targets(register: Callable[[str, "Target"], None]) -> None:
    """Register named targets a grid can choose with ``target = "<name>"``.

    :param register: ``register(name, target)`` with a :class:`sweepkit.grid.cell.Target`.
    """


@hookspec(historic=True)
def sweep_register_executors(register: Callable[..., None]) -> None:
    """Register executors selectable with ``--executor``.

    :param register: ``register(name, factory, doc)``; ``factory(session)``
        returns the executor object.
    """


@hookspec(historic=True)
def sweep_register_profiles(register: Callable[..., None]) -> None:
    """Register config profiles selectable with ``--profile``.

    :param register: ``register(name, fn, doc)``;
        ``fn(config: dict, target_name: str) -> dict`` returns only the keys it
        changes (an empty dict for targets it does not know). Several plugins may
        register the same name; their changes apply in registration order.
    """


@hookspec(historic=True)
def sweep_register_clusters(register: Callable[[Any], None]) -> None:
    """Register the cluster a plugin's rules and job scripts are for.

    :param register: ``register(cluster)`` with a :class:`sweepkit_plugins.clusters.Cluster`
        (defined with the clusters plugin that asks for it; the core never imports plugins):
        its ``profile`` (name, hostname patterns it is detected by, GPUs a node, walls,
        default partition, QOS limits, the cap on running cells) and its
        ``job_pieces(cell, environ, cell_dir)`` function, which returns the cell's
        :class:`sweepkit.run.executors.resources.JobResources` (the clusters plugin's
        answer to :func:`sweep_job_resources` while the cluster is active).

    Asked by the clusters plugin (``sweepkit_plugins.clusters``) at its
    :func:`sweep_configure`, each implementing plugin on its own so that a cluster's plugin
    is known: of the registered clusters it picks the active one (``--cluster``,
    ``$SWEEP_CLUSTER``, the hostname) and unregisters the other clusters' plugins. A plugin
    registered after that (a ``sweepconf.py`` found while collecting) is too late to be a
    cluster, and a module that defines a cluster's values but implements no
    ``sweep_register_clusters`` is none.
    """


@hookspec(historic=True)
def sweep_configure(session: "Session") -> None:
    """Called once the command line is parsed and every initial plugin is registered.

    :param session: the :class:`sweepkit.session.Session`.
    """


@hookspec
def sweep_unconfigure(session: "Session") -> None:
    """Called before the process exits, also after an error."""


# -- collection ----------------------------------------------------------------------


@hookspec(firstresult=True)
def sweep_collect_file(path: "Path", session: "Session") -> "list[Cell] | None":
    """Turn one grid file into cells (before any profile).

    :param path: the absolute path of the grid file.
    :return: the file's cells, or None to leave the file to other plugins.

    ``firstresult``: the first plugin that returns a list wins. The default
    implementation executes ``*.py`` grid files written with ``sweepkit``'s grid API.
    """


@hookspec(firstresult=True)
def sweep_make_cell_id(axis_name: str, keys: "tuple[str, ...]", values: "tuple[Any, ...]",
                       session: "Session") -> "str | None":
    """Name a cell of an axis or product that has no explicit ``id``/``ids``/``param(id=)``.

    :param axis_name: the module variable the axis is assigned to (``n``).
    :param keys: the config keys the axis sets.
    :param values: this cell's values of those keys.
    :return: the id, or None to let the next plugin decide.
    """


@hookspec
def sweep_collection_modifyitems(session: "Session", cells: "list[Cell]") -> None:
    """Reorder or filter the collected (and profiled) cells in place, before selection."""


@hookspec
def sweep_deselected(cells: "list[Cell]") -> None:
    """Called with the cells that selection (-k, -m, ::CELL, --failed) left out."""


# -- validation ----------------------------------------------------------------------


@hookspec
def sweep_validate_cell(cell: "Cell", session: "Session") -> "list[str]":
    """Check one selected cell's resolved config.

    :return: error messages (empty when fine). The messages of every plugin for
        every cell are reported together, with the cell id and the file:line of
        its declaration; if there is any, nothing runs.

    Under ``--profile`` it is called twice per cell: first for the cell as its grid wrote
    it (``cell.profile`` None; every implementation but the runner's check of the run
    state on disk, which is about the cells that run), then for the profiled cell, whose
    new messages about keys the profile set say so.
    """


# -- execution ----------------------------------------------------------------------


@hookspec(firstresult=True)
def sweep_choose_executor(session: "Session") -> "str | None":
    """Pick the executor when ``--executor`` is not given; first answer wins."""


@hookspec(firstresult=True)
def sweep_cell_ckpt_dir(cell: "Cell", session: "Session") -> "Path | None":
    """Where the cell's checkpoints live when a plugin keeps them outside its cell dir.

    :return: the directory (it may not exist yet), or None for the cell dir's ``ckpt/``.

    The plan (:mod:`sweepkit.run.plan`) looks there, as well as in ``ckpt/``, to decide whether
    a cell has checkpoints: a rerun of such a cell stops unless ``--resume`` or ``--rerun``
    says what to do with them, and ``--resume`` resumes from them. A plugin that deletes
    a fresh cell's old checkpoints must answer here with the same directory.
    """


@hookspec(firstresult=True)
def sweep_cell_checkpoints(cell: "Cell", directory: "Path", session: "Session") -> "list[Path] | None":
    """Which entries of one of the cell's checkpoint dirs are checkpoints; first answer wins.

    :param directory: the cell dir's ``ckpt/`` (``{ckpt_dir}``) or the dir a plugin named
        through :func:`sweep_cell_ckpt_dir`; it may not exist.
    :return: the entries that are checkpoints to resume from (an empty list for none), in
        the order they were written, or None to leave the dir to other plugins. Without
        any answer every entry of the dir is a checkpoint (a command target's may have any
        name).

    The plan asks it to decide whether a cell holds checkpoints (a plain run of such a
    cell stops, ``--resume`` resumes it); the driver asks it for each dir
    :func:`sweep_prepare_cell_dir` names, and the cell's job deletes the entries it
    answered, and only those, as it starts a ``--rerun``. The built-in trainer's plugin
    leaves out the files it writes before its first checkpoint; the checkpoint guard
    answers SkyRL's ``global_step_*`` and latest-step pointer for its own dirs.
    """


@hookspec(firstresult=True)
def sweep_checkpoint_pointer(cell: "Cell", entry: "Path", session: "Session") -> "str | None":
    """Whether ``entry``, one of the entries :func:`sweep_cell_checkpoints` answered for a cell,
    is a latest-step pointer (a file naming the step to resume from), and how it names a step;
    first answer wins.

    :return: the pointer's text for step N as a format with one ``{}`` for N (the trainer's
        ``latest``: ``"global_step_{}"``; SkyRL's ``latest_ckpt_global_step.txt``: ``"{}"``),
        or None when ``entry`` is no pointer this plugin knows.

    ``sweep clean`` asks it for each checkpoint entry: a pointer that names a step about to
    be deleted is rewritten to name the kept step before anything is deleted.
    """


@hookspec
def sweep_prepare_cell_dir(cell: "Cell", cell_dir: "Path", fresh: bool, rerun: bool,
                           session: "Session") -> "list[Path]":
    """Called in the driver when it has marked the cell pending and created its directory,
    before the cell is handed to its executor (which may start it much later, or never).

    :param fresh: True for a fresh run (empty checkpoint dir), False for a resume.
    :param rerun: the user asked to start the cell over (``sweep run --rerun``): the only
        case in which checkpoints it has are to be deleted.
    :return: checkpoint dirs outside the cell dir (checked, resolved) whose checkpoints
        (:func:`sweep_cell_checkpoints`, asked now) the cell's job deletes as it starts the
        cell; an empty list for none. Delete nothing here: a sweep stopped before it gets
        to the cell must leave its checkpoints.
    """


@hookspec
def sweep_cell_env(cell: "Cell", session: "Session") -> "dict[str, str]":
    """Extra environment variables for a cell's process; every plugin's dicts are merged."""


@hookspec
def sweep_cell_args(cell: "Cell", resume: bool, session: "Session") -> "list[str]":
    """Arguments appended to the cell's command line, after the target's own argv.

    :param resume: True when the run continues from the latest checkpoint (a planned
        resume, or a chain link after the head), False for a fresh run; each cell's
        job is asked both ways so a chain link gets its resumed command.
    :return: the arguments (an empty list for a cell the plugin does not know). Every
        plugin's lists are appended, in pluggy's call order.

    The arguments belong to the target, not to an executor: they are appended on every
    executor, after a cluster's interpreter and container wrapper have been applied, and
    a job script lists the full command line. The SkyRL plugin appends its overrides
    here: ``++path=value`` for the fork's Hydra entry point, ``path=value`` for upstream's.
    """


@hookspec
def sweep_cell_start_config(cell: "Cell", config: "dict[str, Any]", resume: bool,
                            session: "Session") -> "dict[str, Any]":
    """Keys of a cell's ``config.json`` that depend on how it starts.

    :param config: the target's config of the cell (a copy; change nothing in it).
    :param resume: True for a start that continues from the latest checkpoint (a planned
        resume, or a chain link after the head), False for a fresh start; each cell's job
        is asked both ways, as for :func:`sweep_cell_args`.
    :return: the keys this plugin sets for that start (an empty dict for a cell it does
        not know). Every plugin's dicts are merged over ``config``, in pluggy's call order.

    The cell's job writes the result as ``config.json`` when it starts the attempt (the
    only place it is written). The checkpoint guard sets ``resume_mode`` of a target whose
    schema has the key: ``"latest"`` for a resume, None for a fresh start.
    """


@hookspec
def sweep_cell_started(cell: "Cell", state) -> None:
    """Called when a cell's process has started (``state``: its current on-disk state)."""


@hookspec
def sweep_cell_finished(cell: "Cell", state) -> None:
    """Called when a cell has ended, whatever the outcome (``state``: the final state)."""


@hookspec(firstresult=True)
def sweep_watch_cell(cell: "Cell", records: "list[dict]") -> "str | None":
    """A live guard: the reason to stop a running cell now, or None.

    ``records`` are the cell's metric records so far (``kind``, ``step`` and the numeric
    metrics each logged, NaN kept), in step order; called as new ones arrive. A guard that
    needs more than the records (the runs dir) is a plugin object bound to the session at
    :func:`sweep_configure`, as ``sweepkit_plugins.guards``' ``ceiling_probe`` is. The
    runner stops a cell a guard names the way ``sweep cancel`` does (the trainer
    checkpoints its last step) and records the attempt failed with failure class ``GUARD``
    and the reason. A guard only stops: it never changes a cell's settings (a series must keep its hyper-parameters).
    """


# -- report ---------------------------------------------------------------------------


@hookspec(historic=True)
def sweep_register_report_tables(register: Callable[..., None]) -> None:
    """Register a table of ``sweep report`` (every format shows every table; ``--table``
    picks one).

    :param register: ``register(name, table)`` with a :class:`sweepkit.report.registry.ReportTable`:
        ``table.build(frames)`` returns a polars LazyFrame a row a cell (with a ``cell``
        column) from the grid's :class:`sweepkit.report.tables.GridFrames`: ``frames.cells`` (every
        built-in column, a row a cell, in the grid's order) and ``frames.steps`` (a row per
        cell, kind and step, every numeric metric any cell logged). Build with expressions
        and leave the frame lazy: the report collects all tables in one pass. The table's
        ``columns`` (:class:`sweepkit.report.columns.ReportColumn` specs: header, direction,
        noise class, interval bounds, width priority) say how its new columns are shown,
        and how ``sweep suggest`` and ``sweep compare`` read them.
    """


@hookspec(historic=True)
def sweep_register_report_formats(register: Callable[..., None]) -> None:
    """Register a format of ``sweep report``, selectable with ``--format``.

    :param register: ``register(name, fmt)`` with a :class:`sweepkit.report.registry.ReportFormat`:
        ``fmt.write(report)`` writes files under ``report.report_dir`` (every report, or
        only under ``--format`` this one when ``fmt.always`` is False) and returns them;
        ``fmt.show(report, console)`` prints it. ``report`` is a
        :class:`sweepkit.report.registry.GridReport` (the collected tables, the curves' steps).
    """


# -- cluster jobs (the SLURM executor) ------------------------------------------------


@hookspec(firstresult=True)
def sweep_job_resources(cell: "Cell", session: "Session") -> "JobResources | None":
    """A cluster's pieces of ``cell``'s job script; first answer wins. The SLURM executor
    asks once per cell, as it binds the cell's job.

    :return: None to keep the cell's own launch keys, or the cell's
        :class:`sweepkit.run.executors.resources.JobResources`: ``nodes``,
        ``gpus_per_node``, ``time_limit`` (``[D-]HH:MM:SS``), ``account``, ``partition``,
        ``qos``, ``preamble`` (shell lines run before the command; ``#SBATCH`` lines among
        them go to the header), ``env`` (exported in the script, quoted), ``argv_prefix``
        (a container wrapper put before the cell's command), ``python`` (replaces
        ``{python}`` in the target's argv), ``ray_bringup`` (a bash fragment starting Ray
        over the job's nodes) and the file systems the driver's interpreter is checked
        against. A field that is None keeps the cell's launch key. Until every cluster
        plugin returns that class, an answer of another class with attributes of those
        names (``sweepkit_plugins.clusters.JobPieces``) is read field by field
        (:meth:`~sweepkit.run.executors.resources.JobResources.of`).
    """


@hookspec
def sweep_job_sbatch_options(cell: "Cell", session: "Session") -> "dict[str, str]":
    """Extra ``#SBATCH --name=value`` options of ``cell``'s job (``""`` for a flag such as
    ``exclusive``); every plugin's dicts are merged, the cell's ``sbatch`` launch key last.
    Values are quoted; a value with a line break is refused."""


@hookspec(firstresult=True)
def sweep_cell_gpus(cell: "Cell", session: "Session") -> "int | None":
    """GPUs a cell's job is given when its ``gpus`` launch key is not set; first answer wins.

    The local executor places that many GPUs (``CUDA_VISIBLE_DEVICES``); a target whose
    own config says how many GPUs it starts processes on (the built-in trainer's
    ``num_gpus``) answers with that. None (every plugin): no GPUs.
    """


@hookspec(firstresult=True)
def sweep_job_concurrency_cap(session: "Session") -> "int | ClusterCap | None":
    """How many cells may be in a cluster's queue at once; first answer wins, None for no
    cap. Pending jobs count, a chain counts once, an array counts its ``%N``.

    :return: a number: a cap on this runs dir's jobs, which ``--max-parallel`` overrides;
        or a :class:`sweepkit.run.executors.cluster_cap.ClusterCap` (the clusters plugin's,
        from ``ClusterProfile.max_running``: the seeds' "at most 6 RL jobs running" per
        user and cluster): a cap on the user's jobs on the cluster from every runs dir,
        and on foreign jobs its ``foreign_job_pattern`` names, which holds beside any
        ``--max-parallel``.
    """


# -- the end of a sweep (sweep export, sweep clean) -------------------------------------


@hookspec(firstresult=True)
def sweep_export_dir(session: "Session") -> "Path | None":
    """Where ``sweep export`` writes without ``--to``; first answer wins, None for ``./exports``.

    A cluster plugin answers with the file system meant for results that outlive a sweep
    (Leonardo: ``$WORK/sweepkit-exports``, never a scratch purged after weeks). The models go
    under ``<dir>/<grid>/<cell>/``.
    """


@hookspec(firstresult=True)
def sweep_export_checkpoint(cell: "Cell", step_dir: "Path", to: "Path", session: "Session") -> "list[Path] | None":
    """Write one checkpoint of ``cell`` as a Hugging Face model dir; first answer wins.

    :param step_dir: the checkpoint entry ``sweep export`` picked (a ``global_step_N`` that
        :func:`sweep_cell_checkpoints` named).
    :param to: the model dir to write: absent or empty. Write it whole or not at all (into a
        temporary sibling, then rename); ``sweep export`` adds its ``manifest.json`` after.
    :return: the files written (relative to ``to`` or absolute under it), or None when the
        plugin does not know this checkpoint. Raise :class:`sweepkit.errors.UsageError`, with
        nothing written, for a checkpoint the plugin knows but cannot convert here.

    The built-in trainer's plugin runs ``python -m trainer.export`` on its checkpoints; the
    SkyRL plugin copies an HF-format export SkyRL wrote, and refuses FSDP shards.
    """
