"""How the SLURM executor turns cells into submissions: each cell's job request, their
grouping into chains, single jobs and arrays, and submitit's executor writing sweepkit's
job script (:mod:`sweepkit.run.executors.sbatch`).

A cell's request is built from its launch keys (``gpus``, ``cpus``, ``mem_gb``,
``time_limit``, ``partition``, ``account``, ``qos``, ``sbatch``, ``max_restarts``) and from
its cluster's :class:`~sweepkit.run.executors.resources.JobResources` (``sweep_job_resources``,
which the executor asks once per cell) and ``sweep_job_sbatch_options``. Without a
cluster's pieces, ``gpus`` (the GPUs the cell needs, in all) is spread evenly over the
job's nodes (:func:`spread_gpus`). What is submitted:

- a cell with ``max_restarts K > 0``: a chain of a head job and K ``afterany`` links
  (:mod:`sweepkit.run.chain`), one cell per chain;
- other cells of one grid with equal requests: one job array, ``%P`` being the
  concurrency cap's free slots (no ``%`` without a cap); a lone cell is a plain job.

Every job script lists, in comments, what each of its cells runs (array: per task index;
chain link: the resumed command): the command line with the cluster's container wrapper
and interpreter and the plugins' arguments (``sweep_cell_args``), the cell dir and the
variables the job function adds (:class:`~sweepkit.run.executors.sbatch.ScriptCell`).
"""

from __future__ import annotations

import math
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from sweepkit.run import plan as pl
from sweepkit.run.chain import run_link
from sweepkit.run.executors import sbatch as sb
from sweepkit.run.executors.resources import JobResources
from sweepkit.run.executors.slurm_jobs import ARRAY, CHAIN, JOB, SLURM_DIR
from sweepkit.run.job import CellJob, added_env, resumed
from sweepkit.run.launch import parse_time_limit

DRY_RUN_DIR = ".dry-run"
PREVIOUS_LINK = "PREVIOUS_LINK_JOB_ID"  # stands for a link's dependency in a dry run


def grid_and_cell(job: CellJob) -> tuple[str, str]:
    directory = Path(job.cell_dir)
    return directory.parent.name, directory.name


def job_folder(job: CellJob) -> Path:
    """Where submitit keeps a grid's pickles and job logs: ``<runs>/<grid>/.slurm``."""
    return Path(job.cell_dir).parent / SLURM_DIR


# -- the request of a cell ---------------------------------------------------------------


def spread_gpus(gpus: int, nodes: int | None, node_size: int | None) -> tuple[int, int]:
    """Nodes and GPUs per node of a job whose GPUs no cluster plugin places.

    ``gpus`` is the cell's total (launch key ``gpus``). The nodes are ``nodes`` (``num_nodes``),
    else as many nodes of ``node_size`` (``gpus_per_node``) GPUs as the total needs, else
    one; each node is asked for an equal share of the total (``node_size`` itself when the
    cell sets no ``gpus``). RequestError, naming the keys, when the total does not divide
    evenly over the nodes or a share is more than a node has.
    """
    if nodes is None:
        nodes = math.ceil(gpus / node_size) if node_size and gpus else 1
    if nodes < 1:
        raise sb.RequestError(f"num_nodes={nodes}: a job needs at least one node")
    if not gpus:
        return nodes, node_size or 0
    if gpus % nodes:
        raise sb.RequestError(f"gpus={gpus} (the GPUs the cell needs, in all) cannot be spread evenly over "
                              f"num_nodes={nodes}; set gpus to a multiple of {nodes} or change num_nodes")
    share = gpus // nodes
    if node_size and share > node_size:
        raise sb.RequestError(f"gpus={gpus} over num_nodes={nodes} is {share} GPUs a node, more than "
                              f"gpus_per_node={node_size}; set num_nodes={math.ceil(gpus / node_size)} "
                              "or leave it unset to derive it")
    return nodes, share


def request_for(cell, session, resources: JobResources | None, *, gpus: int) -> sb.JobRequest:
    """The job request of ``cell``, whose job has ``gpus`` GPUs: its launch keys, overridden
    by its cluster's ``resources``."""
    launch = cell.launch()
    pieces = resources or JobResources()

    def piece(value, default=None):
        return default if value is None else value

    nodes, gpus_per_node = piece(pieces.nodes, launch.get("num_nodes")), pieces.gpus_per_node
    if gpus_per_node is None:
        nodes, gpus_per_node = spread_gpus(gpus, None if nodes is None else int(nodes),
                                           launch.get("gpus_per_node"))
    time_limit = pieces.time_limit
    if time_limit is None and launch.get("time_limit") is not None:
        time_limit = sb.time_text(parse_time_limit(launch["time_limit"]))
    options: dict[str, str] = {}
    for extra in session.hook.sweep_job_sbatch_options(cell=cell, session=session):
        options.update(extra or {})
    options.update(launch.get("sbatch") or {})
    return sb.JobRequest(
        name=sb.job_name(cell.grid_name, cell.name),
        nodes=int(nodes or 1),
        gpus_per_node=int(gpus_per_node),
        cpus=launch.get("cpus"),
        mem_gb=launch.get("mem_gb"),
        time_limit=time_limit,
        partition=piece(pieces.partition, launch.get("partition")),
        account=piece(pieces.account, launch.get("account")),
        qos=piece(pieces.qos, launch.get("qos")),
        options=options,
        preamble=pieces.preamble,
        env=pieces.env,
        ray_bringup=pieces.ray_bringup,
        chain=1 + int(launch.get("max_restarts") or 0),
    )


def wrap_argv(job: CellJob, cell, resources: JobResources | None) -> CellJob:
    """A cluster's interpreter for ``{python}`` and its container wrapper around the command
    (and around the resumed command of a chain link); the plugins' arguments stay last."""
    python = resources.python if resources is not None else None
    prefix = resources.argv_prefix if resources is not None else ()
    if python is None and not prefix:
        return job

    def wrapped(argv: Sequence[str]) -> tuple[str, ...]:
        if python is not None:
            # render_argv keeps one part per template part; what follows is the plugins'.
            target = cell.target.render_argv(**{**pl.paths(Path(job.cell_dir)), "python": python})
            argv = [*target, *argv[len(cell.target.argv):]]
        return (*prefix, *argv)

    return attrs.evolve(job, argv=wrapped(job.argv), resume_argv=wrapped(job.resume_argv) if job.resume_argv else ())


def interpreter_problem(resources: JobResources | None, executable: str, prefix: str) -> tuple[str, str] | None:
    """``("error" | "warning", message)`` when the interpreter ``srun`` starts for
    submitit's job runner (this driver's own, ``executable``, with its packages under
    ``prefix``) may not be there on a compute node; None when it is, or when the cluster's
    resources name no file systems. Under one of their ``shared_filesystems``: fine;
    under one of their ``node_local_filesystems`` (``/tmp``): an error, every node has its
    own; anywhere else: a warning (the cluster does not say whether its nodes see it)."""
    shared = resources.shared_filesystems if resources is not None else ()
    local = resources.node_local_filesystems if resources is not None else ()
    if not shared and not local:
        return None
    cluster = resources.cluster or "the cluster"
    fix = (f"make the driver's venv on a shared file system ({', '.join(shared) or 'ask the cluster'}), e.g. "
           "python -m venv $WORK/venvs/sweep && $WORK/venvs/sweep/bin/pip install -e <sweepkit checkout>, "
           "and run sweep from it")
    for path in dict.fromkeys([executable, prefix]):
        where = Path(path).absolute()
        if any(where.is_relative_to(root) for root in shared):
            continue
        what = f"srun starts this driver's interpreter {executable} (packages in {prefix}) on {cluster}'s compute node"
        local_root = next((root for root in local if where.is_relative_to(root)), None)
        if local_root is not None:
            return "error", (f"{what}, but {path} is on {local_root}, which every node has its own of: the job "
                             f"fails at its first line with 'No such file or directory'; {fix}")
        return "warning", (f"{what}, but {path} is on none of the file systems {cluster}'s nodes are known to see "
                           f"({', '.join(shared)}); if they do not see it the job fails at once; {fix}")
    return None


def script_cell(job: CellJob) -> sb.ScriptCell:
    """What ``job`` runs, as its job script lists it."""
    return sb.ScriptCell(nodeid=job.nodeid, cell_dir=job.cell_dir, argv=job.argv, env=added_env(job))


def script_cells(unit_kind: str, jobs: Sequence[CellJob], link: int = 0) -> list[sb.ScriptCell]:
    """The cells a job script of a unit lists: a chain link after the head runs its cell resumed."""
    if unit_kind == CHAIN and link > 0:
        return [script_cell(resumed(job)) for job in jobs]
    return [script_cell(job) for job in jobs]


# -- grouping into submissions -------------------------------------------------------------


@attrs.frozen
class Unit:
    """What one submission carries: a chain of one cell, one job, or an array."""

    kind: str
    jobs: tuple[CellJob, ...]
    request: sb.JobRequest


def units_of(jobs: Sequence[CellJob], requests: dict[str, sb.JobRequest]) -> list[Unit]:
    """Chains alone; other cells grouped by grid and equal request, in first-seen order."""
    order: list[tuple[str, object]] = []
    groups: dict[tuple, list[CellJob]] = {}
    for job in jobs:
        request = requests[job.token]
        if request.chain > 1:
            order.append((CHAIN, job))
            continue
        key = (grid_and_cell(job)[0], request.array_key())
        if key not in groups:
            groups[key] = []
            order.append((ARRAY, key))
        groups[key].append(job)
    units = []
    for kind, item in order:
        if kind == CHAIN:
            units.append(Unit(CHAIN, (item,), requests[item.token]))
            continue
        members = groups[item]
        first = members[0]
        if len(members) == 1:
            units.append(Unit(JOB, (first,), requests[first.token]))
            continue
        grid, cell = grid_and_cell(first)
        name = sb.job_name(grid, f"{cell}+{len(members) - 1}")
        units.append(Unit(ARRAY, tuple(members), attrs.evolve(requests[first.token], name=name)))
    return units


# -- submitit with sweepkit's job script ----------------------------------------------------


def _submitter_class():
    import submitit
    from submitit.core import utils as submitit_utils

    class Submitter(submitit.SlurmExecutor):
        """submitit's SLURM executor writing sweepkit's job script (see ``sbatch.render``),
        one task per job, arrays of any size."""

        def __init__(self, folder: Path, request: sb.JobRequest, cells: Sequence[sb.ScriptCell], *,
                     dependency: str | None = None, parallelism: int | None = None):
            super().__init__(folder=folder, max_num_timeout=0)
            self.request = request
            self.cells = list(cells)
            self.dependency = dependency
            self.parallelism = parallelism
            self.array_size: int | None = None
            if request.time_limit:
                self.update_parameters(time=max(1, parse_time_limit(request.time_limit) // 60))

        def _num_tasks(self) -> int:
            return 1

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            array = (self.array_size, self.parallelism) if self.array_size else None
            return sb.render(self.request, folder=str(self.folder), python=self.python, array=array,
                             dependency=self.dependency, cells=self.cells)

        def _internal_process_submissions(self, delayed_submissions):
            if len(delayed_submissions) == 1:
                return super()._internal_process_submissions(delayed_submissions)
            folder = submitit_utils.JobPaths.get_first_id_independent_folder(self.folder)
            folder.mkdir(parents=True, exist_ok=True)
            pickles = []
            for n, delayed in enumerate(delayed_submissions):
                path = folder / f".array_{os.getpid()}_{time.time_ns()}_{n}.pkl"
                delayed.set_timeout(self.parameters.get("time", 5), self.max_num_timeout)
                delayed.dump(path)
                pickles.append(path)
            self.array_size = len(delayed_submissions)
            try:
                first = self._submit_command(self._submitit_command_str)
            finally:
                self.array_size = None
            jobs = [submitit.SlurmJob(folder=self.folder, job_id=f"{first.job_id}_{n}", tasks=[0])
                    for n in range(len(pickles))]
            for job, path in zip(jobs, pickles):
                job.paths.move_temporary_file(path, "submitted_pickle")
            return jobs

    return Submitter


def submit_unit(unit: Unit, request: sb.JobRequest, parallelism: int | None) -> list[str]:
    """Submit one unit with its commented ``request``; the job id of each of its cells (a
    chain's: its links' ids joined by commas, head first)."""
    submitter_class = _submitter_class()
    folder = job_folder(unit.jobs[0])
    folder.mkdir(parents=True, exist_ok=True)
    if unit.kind == CHAIN:
        job = unit.jobs[0]
        ids: list[str] = []
        for link in range(unit.request.chain):
            submitter = submitter_class(folder, request, script_cells(CHAIN, unit.jobs, link),
                                        dependency=sb.dependency_after(ids[-1:]) if ids else None)
            ids.append(str(submitter.submit(run_link, job, link, unit.request.chain).job_id))
        return [",".join(ids)]
    submitter = submitter_class(folder, request, script_cells(unit.kind, unit.jobs), parallelism=parallelism)
    if unit.kind == JOB:
        return [str(submitter.submit(run_link, unit.jobs[0]).job_id)]
    with submitter.batch():
        submitted = [submitter.submit(run_link, job) for job in unit.jobs]
    return [str(item.job_id) for item in submitted]


def render_dry_run(units: Sequence[Unit], requests: Sequence[sb.JobRequest], runs_dir: Path,
                   cap: int | None) -> list[Path]:
    """Write the job scripts of ``units`` (each with its commented request) to
    ``<runs>/.dry-run/<grid>/``; returns the paths written."""
    written = []
    python = shlex.quote(sys.executable)
    for unit, request in zip(units, requests):
        grid = grid_and_cell(unit.jobs[0])[0]
        target = Path(runs_dir) / DRY_RUN_DIR / grid
        target.mkdir(parents=True, exist_ok=True)
        folder = str(job_folder(unit.jobs[0]))
        if unit.kind == CHAIN:
            for link in range(unit.request.chain):
                path = target / (f"{unit.request.name}.sbatch" if link == 0 else
                                 f"{unit.request.name}.link{link}.sbatch")
                path.write_text(sb.render(request, folder=folder, python=python,
                                          dependency=sb.dependency_after([PREVIOUS_LINK]) if link else None,
                                          cells=script_cells(CHAIN, unit.jobs, link)))
                written.append(path)
            continue
        array = (len(unit.jobs), cap) if unit.kind == ARRAY else None
        path = target / f"{unit.request.name}.sbatch"
        path.write_text(sb.render(request, folder=folder, python=python, array=array,
                                  cells=script_cells(unit.kind, unit.jobs)))
        written.append(path)
    return written
