"""The ``slurm`` executor: cells as SLURM jobs, submitted through submitit.

Each cell's job script is assembled from a :class:`~sweepkit.run.executors.sbatch.JobRequest`
built from the cell's launch keys (``gpus``, ``cpus``, ``mem_gb``, ``time_limit``,
``partition``, ``account``, ``qos``, ``sbatch``, ``max_restarts``) and from the hooks
``sweep_job_resources`` (a cluster's pieces: nodes, GPUs per node, preamble, container
wrapper, env, Ray bring-up) and ``sweep_job_sbatch_options``. Without a cluster's pieces,
``gpus`` (the GPUs the cell needs, in all) is spread evenly over the job's nodes
(:func:`spread_gpus`). What is submitted:

- a cell with ``max_restarts K > 0``: a chain of a head job and K ``afterany`` links
  (:mod:`sweepkit.run.chain`), one cell per chain;
- other cells of one grid with equal requests: one job array, ``%P`` being the
  concurrency cap's free slots (no ``%`` without a cap); a lone cell is a plain job.

Every job script lists, in comments, what each of its cells runs (array: per task index;
chain link: the resumed command): the command line with the cluster's container wrapper
and interpreter and the plugins' arguments (``sweep_cell_args``), the cell dir and the
variables the job function adds (:class:`~sweepkit.run.executors.sbatch.ScriptCell`).

The cap (``--max-parallel N``, else the ``sweep_job_concurrency_cap`` hook, else none)
is counted over every job this runs dir has in the queue, under the runs dir's submit
lock (:mod:`sweepkit.run.executors.slurm_jobs`): :meth:`take` acquires the lock when it hands
out cells and :meth:`submit` releases it once they are queued; in between, the runner
checks each cell's state again, so that a cell another driver took or finished meanwhile
is not submitted. Every job's comment names its runs dir and cells: a job that a driver
killed between sbatch and recording it left in the queue is counted too, and cancelled by
the next driver that runs its cell (adopted, if it runs the cell already).

Job states come from ``sacct`` (:mod:`sweepkit.run.executors.sacct`), one query per poll
interval for every job this driver follows, so a driver (or ``sweep status``) keeps
working while slurmctld restarts. Jobs outlive the driver: ``--detach`` submits and exits.

Default executor: ``slurm`` is chosen when ``sbatch`` is on PATH and either
``$SWEEP_SLURM=1`` or a cluster is named (``--cluster`` / ``$SWEEP_CLUSTER``, other than
``none``); otherwise cells run locally. A machine that merely has SLURM installed, such as
a developer's box running ``scripts/local-slurm``, keeps running cells locally unless asked.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from sweepkit.errors import UsageError
from sweepkit.hookspec import hookimpl
from sweepkit.run import failures
from sweepkit.run import plan as pl
from sweepkit.run.chain import resumed, run_link
from sweepkit.run.executors import sacct
from sweepkit.run.executors import sbatch as sb
from sweepkit.run.executors.base import DONE, QUEUED, RUNNING, Executor, Handle
from sweepkit.run.executors.slurm_jobs import (
    ARRAY,
    CHAIN,
    JOB,
    SLURM_DIR,
    UNKNOWN_GRACE_S,
    Orphan,
    Registry,
    Submission,
    alive,
    job_comment,
    orphan_slots,
)
from sweepkit.run.job import CellJob, added_env
from sweepkit.run.launch import parse_time_limit
from sweepkit.state import records as st

SLURM_ENV = "SWEEP_SLURM"
STATE_REFRESH_S = 1.0
CAP_RECHECK_S = 2.0
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


def request_for(cell, session, *, gpus: int) -> sb.JobRequest:
    """The job request of ``cell``, whose job has ``gpus`` GPUs: its launch keys, overridden
    by a cluster's pieces."""
    launch = cell.launch()
    pieces = session.hook.sweep_job_resources(cell=cell, session=session)

    def piece(name, default=None):
        value = getattr(pieces, name, None) if pieces is not None else None
        return default if value is None else value

    nodes, gpus_per_node = piece("nodes", launch.get("num_nodes")), piece("gpus_per_node")
    if gpus_per_node is None:
        nodes, gpus_per_node = spread_gpus(gpus, None if nodes is None else int(nodes),
                                           launch.get("gpus_per_node"))
    time_limit = piece("time_limit")
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
        partition=piece("partition", launch.get("partition")),
        account=piece("account", launch.get("account")),
        qos=piece("qos", launch.get("qos")),
        options=options,
        preamble=piece("preamble", ()),
        env=piece("env", {}),
        ray_bringup=piece("ray_bringup"),
        chain=1 + int(launch.get("max_restarts") or 0),
    )


def wrap_argv(job: CellJob, cell, session) -> CellJob:
    """A cluster's interpreter for ``{python}`` and its container wrapper around the command
    (and around the resumed command of a chain link); the plugins' arguments stay last."""
    pieces = session.hook.sweep_job_resources(cell=cell, session=session)
    python = getattr(pieces, "python", None) if pieces is not None else None
    prefix = tuple(getattr(pieces, "argv_prefix", ()) or ()) if pieces is not None else ()
    if python is None and not prefix:
        return job

    def wrapped(argv: Sequence[str]) -> tuple[str, ...]:
        if python is not None:
            # render_argv keeps one part per template part; what follows is the plugins'.
            target = cell.target.render_argv(**{**pl.paths(Path(job.cell_dir)), "python": python})
            argv = [*target, *argv[len(cell.target.argv):]]
        return (*prefix, *argv)

    return attrs.evolve(job, argv=wrapped(job.argv), resume_argv=wrapped(job.resume_argv) if job.resume_argv else ())


def interpreter_problem(pieces, executable: str, prefix: str) -> tuple[str, str] | None:
    """``("error" | "warning", message)`` when the interpreter ``srun`` starts for
    submitit's job runner (this driver's own, ``executable``, with its packages under
    ``prefix``) may not be there on a compute node; None when it is, or when the cluster's
    pieces name no file systems. Under one of the pieces' ``shared_filesystems``: fine;
    under one of their ``node_local_filesystems`` (``/tmp``): an error, every node has its
    own; anywhere else: a warning (the cluster does not say whether its nodes see it)."""
    shared = tuple(getattr(pieces, "shared_filesystems", ()) or ())
    local = tuple(getattr(pieces, "node_local_filesystems", ()) or ())
    if not shared and not local:
        return None
    cluster = getattr(pieces, "cluster", None) or "the cluster"
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


# -- the executor ---------------------------------------------------------------------------


class SlurmExecutor(Executor):
    name = "slurm"
    jobs_outlive_driver = True

    def __init__(self, session, cap: int | None):
        self.session = session
        self.cap = cap
        self.registry = Registry(session.runs_dir)
        self._requests: dict[str, sb.JobRequest] = {}
        self._cells: set[str] = set()  # the cell dirs of the jobs bound here
        self._parallelism: dict[tuple, int | None] = {}
        self._records: dict[str, sacct.JobRecord] = {}
        self._watched: dict[str, float] = {}  # job id -> when it was submitted (0: unknown)
        self._asked: set[str] = set()
        self._refreshed = 0.0
        self._cap_checked = 0.0
        self._interpreter_checked = False

    @property
    def max_parallel(self) -> int | None:
        return self.cap

    def _check_interpreter(self, cell) -> None:
        """Once per executor (the interpreter is the driver's, the same for every cell):
        an error stops a submission, a warning is printed (a dry run only warns)."""
        if self._interpreter_checked:
            return
        self._interpreter_checked = True
        pieces = self.session.hook.sweep_job_resources(cell=cell, session=self.session)
        problem = interpreter_problem(pieces, sys.executable, sys.prefix)
        if problem is None:
            return
        kind, message = problem
        if kind == "error" and not getattr(self.session.options, "dry_run", False):
            raise UsageError(message)
        self.session.err_console.print(f"warning: {message}" + (" (an error when submitting)" if kind == "error"
                                                                 else ""), markup=False, highlight=False)

    def bind(self, job: CellJob, cell) -> CellJob:
        self._check_interpreter(cell)
        try:
            request = request_for(cell, self.session, gpus=job.gpus)
            job = wrap_argv(job, cell, self.session)
            # A line break in the command or env, which would end the script's comment, is
            # refused now rather than at submit time.
            script_cell(job)
            script_cell(resumed(job))
        except (sb.RequestError, ValueError) as error:
            file, line = cell.location
            raise UsageError(f"{file}:{line}: {cell.name}: cannot make its SLURM job: {error}") from None
        self._requests[job.token] = request
        self._cells.add(str(Path(job.cell_dir).resolve()))
        return job

    # -- taking cells under the cap --------------------------------------------------------

    def take(self, pending: Sequence[CellJob]) -> list[CellJob]:
        pending = [job for job in pending if job.token in self._requests]
        if not pending:
            return []
        if time.time() - self._cap_checked < CAP_RECHECK_S:
            return []  # the driver polls every 0.2 s; the queue is counted far less often
        self._cap_checked = time.time()
        units = units_of(pending, self._requests)
        # Held until submit: the runner decides once more under it whether each cell is still
        # this driver's to submit, and nobody else submits in between.
        self.registry.acquire()
        try:
            orphans = settle_orphans(self.registry, self._cells)
            free = None if self.cap is None else self.cap - self.registry.slots_used() - orphan_slots(orphans)
        except sacct.SlurmUnavailable:
            free = None if self.cap is None else 0  # cannot count: wait rather than overrun the cap
        taken: list[CellJob] = []
        for unit in units:
            if free is None:  # no cap
                parallelism = None
            elif free <= 0:
                break
            elif unit.kind == ARRAY:
                parallelism = min(len(unit.jobs), free)
                free -= parallelism
            else:
                parallelism = None
                free -= 1
            self._parallelism[self._unit_key(unit)] = parallelism
            taken += unit.jobs
        if not taken:
            self.registry.release()
        return taken

    @staticmethod
    def _unit_key(unit: Unit) -> tuple:
        return tuple(job.token for job in unit.jobs)

    # -- submitting --------------------------------------------------------------------------

    def submit(self, jobs: Sequence[CellJob]) -> list[Handle]:
        handles: dict[str, Handle] = {}
        try:
            with self.registry.locked_section():
                self._cancel_previous(jobs)
                for unit in units_of(jobs, self._requests):
                    parallelism = self._parallelism.get(self._unit_key(unit), None if self.cap is None else 1)
                    for job, job_id in zip(unit.jobs, self._submit_unit(unit, parallelism)):
                        handles[job.token] = Handle(executor=self.name, job_id=job_id, cell=job)
                        pl.record_job_id(job, job_id)
        finally:
            self.registry.release()
        now = time.time()
        for handle in handles.values():
            for job_id in sacct.split_ids([handle.job_id]):
                self._watched.setdefault(job_id, now)
        return [handles[job.token] for job in jobs]

    def _cancel_previous(self, jobs: Sequence[CellJob]) -> None:
        """A cell submitted again (``--rerun``, or a take-over) loses its earlier jobs first."""
        try:
            previous = self.registry.jobs_of({job.nodeid for job in jobs})
        except sacct.SlurmUnavailable:
            return
        if previous:
            sacct.cancel(previous)

    def _commented(self, unit: Unit) -> sb.JobRequest:
        """The unit's request with the comment that says whose job it is (``slurm_jobs``)."""
        return attrs.evolve(unit.request, comment=job_comment(self.session.runs_dir,
                                                              [job.cell_dir for job in unit.jobs]))

    def _submit_unit(self, unit: Unit, parallelism: int | None) -> list[str]:
        submitter_class = _submitter_class()
        folder = job_folder(unit.jobs[0])
        folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        request = self._commented(unit)
        if unit.kind == CHAIN:
            job = unit.jobs[0]
            ids: list[str] = []
            for link in range(unit.request.chain):
                submitter = submitter_class(folder, request, script_cells(CHAIN, unit.jobs, link),
                                            dependency=sb.dependency_after(ids[-1:]) if ids else None)
                ids.append(str(submitter.submit(run_link, job, link, unit.request.chain).job_id))
                if link == 0:
                    pl.record_job_id(job, ids[0])  # the head may start before the links exist
            chain = ",".join(ids)
            self._register(CHAIN, chain, unit.jobs, [chain], now)
            return [chain]
        submitter = submitter_class(folder, request, script_cells(unit.kind, unit.jobs), parallelism=parallelism)
        if unit.kind == JOB:
            job_id = str(submitter.submit(run_link, unit.jobs[0]).job_id)
            self._register(JOB, job_id, unit.jobs, [job_id], now)
            return [job_id]
        with submitter.batch():
            submitted = [submitter.submit(run_link, job) for job in unit.jobs]
        ids = [str(item.job_id) for item in submitted]
        self._register(ARRAY, sacct.array_id(ids[0]), unit.jobs, ids, now, tasks=len(ids), parallelism=parallelism)
        return ids

    def _register(self, kind, job_id, jobs, ids, now, *, tasks=1, parallelism=None) -> None:
        cells = [{"nodeid": job.nodeid, "cell_dir": job.cell_dir, "token": job.token, "job_id": one}
                 for job, one in zip(jobs, ids)]
        self.registry.append(Submission(kind=kind, job_id=job_id, cells=cells, tasks=tasks,
                                        parallelism=parallelism, submitted=now))

    # -- following jobs -------------------------------------------------------------------------

    def attach(self, job_id: str) -> Handle | None:
        submitted = self.registry.submitted_times()
        for one in sacct.split_ids([job_id]):
            # A job sacct does not know is alive only while it may just have been submitted.
            self._watched.setdefault(one, submitted.get(one, 0.0))
        return Handle(executor=self.name, job_id=job_id, cell=None)

    def _refresh(self) -> None:
        never_asked = set(self._watched) - self._asked
        if not never_asked and time.time() - self._refreshed < STATE_REFRESH_S:
            return
        try:
            self._records.update(sacct.query(self._watched))
        except sacct.SlurmUnavailable:
            return  # keep the last answer; the jobs are where they were
        self._asked |= set(self._watched)
        self._refreshed = time.time()

    def records(self, job_id: str) -> list[sacct.JobRecord | None]:
        self._refresh()
        return [self._records.get(one) for one in sacct.split_ids([job_id])]

    def poll(self, handle: Handle) -> str:
        ids = sacct.split_ids([handle.job_id])
        records = self.records(handle.job_id)
        now = time.time()
        unfinished = [job_id for job_id, record in zip(ids, records)
                      if alive(record, self._watched.get(job_id, 0.0), now)]
        if unfinished and handle.cell is not None:
            unfinished = self._let_go(handle.cell, dict(zip(ids, records)), ids, unfinished)
        if not unfinished:
            if handle.cell is not None:
                record_failure_classes(Path(handle.cell.cell_dir), dict(zip(ids, records)))
            return DONE
        running = any(record is not None and record.state == "RUNNING" for record in records)
        return RUNNING if running else QUEUED

    @staticmethod
    def _let_go(job: CellJob, records: dict[str, sacct.JobRecord | None], ids: list[str],
                unfinished: list[str]) -> list[str]:
        """A cell whose state on disk is final is final: what SLURM still holds for it that
        is not running is cancelled and no longer waited for (returns the ids still to wait
        for). That is the job that ran its last attempt when it is queued again (a
        controller that was killed and started again requeues tasks that ended meanwhile),
        and for a completed chain the links after it that the link could not cancel (they
        were not recorded yet). A job that runs is left to exit on its own, even while
        sacct does not know it yet, and so is one that sacct still shows pending while it
        may just not have recorded its start."""
        state = st.read_state(Path(job.cell_dir))
        if state is None or state.state not in st.FINISHED or state.last_attempt is None \
                or state.submission is None or state.submission.token != job.token:
            return unfinished
        attempt = state.last_attempt
        ran = records.get(attempt.job_id)
        waiting = []
        # Pending long after it ended: sacct has long caught up with its start, so it is queued again.
        if attempt.job_id in unfinished and ran is not None and (ran.state in sacct.REQUEUED or (
                ran.state == "PENDING" and time.time() - (attempt.ended or time.time()) > UNKNOWN_GRACE_S)):
            waiting.append(attempt.job_id)
        if state.state == "completed" and attempt.job_id in ids:
            waiting += [job_id for job_id in ids[ids.index(attempt.job_id) + 1:] if job_id in unfinished
                        and (records.get(job_id) is None or records[job_id].state == "PENDING")]
        if waiting:
            sacct.cancel(waiting)
        return [job_id for job_id in unfinished if job_id not in waiting]

    def error(self, handle: Handle) -> str | None:
        records = [record for record in self.records(handle.job_id) if record is not None]
        if not records:
            return "the SLURM job ended unknown to sacct before running the cell"
        record = records[-1]
        cell_dir = Path(handle.cell.cell_dir) if handle.cell else None
        tail = failures.read_tail(failures.job_log_paths(cell_dir, record.job_id)) if cell_dir else ""
        last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "")
        return f"SLURM job {record.job_id} ended {record.state} (exit {record.exit_code}) before " \
               f"recording a result" + (f": {last[:200]}" if last else "")

    def cancel(self, handle: Handle) -> None:
        sacct.cancel([handle.job_id])

    def close(self) -> None:
        self.registry.release()

    # -- dry run -------------------------------------------------------------------------------

    def render_dry_run(self, jobs: Sequence[CellJob]) -> list[Path]:
        """Write the job scripts ``submit`` would send to ``<runs>/.dry-run/<grid>/``."""
        written = []
        python = shlex.quote(sys.executable)
        for unit in units_of([job for job in jobs if job.token in self._requests], self._requests):
            grid = grid_and_cell(unit.jobs[0])[0]
            target = Path(self.session.runs_dir) / DRY_RUN_DIR / grid
            target.mkdir(parents=True, exist_ok=True)
            folder = str(job_folder(unit.jobs[0]))
            if unit.kind == CHAIN:
                for link in range(unit.request.chain):
                    path = target / (f"{unit.request.name}.sbatch" if link == 0 else
                                     f"{unit.request.name}.link{link}.sbatch")
                    path.write_text(sb.render(self._commented(unit), folder=folder, python=python,
                                              dependency=sb.dependency_after([PREVIOUS_LINK]) if link else None,
                                              cells=script_cells(CHAIN, unit.jobs, link)))
                    written.append(path)
                continue
            array = (len(unit.jobs), self.cap) if unit.kind == ARRAY else None
            path = target / f"{unit.request.name}.sbatch"
            path.write_text(sb.render(self._commented(unit), folder=folder, python=python, array=array,
                                      cells=script_cells(unit.kind, unit.jobs)))
            written.append(path)
        return written


def settle_orphans(registry: Registry, cells: set[str]) -> list[Orphan]:
    """The runs dir's jobs that a driver killed between sbatch and recording them left in
    the queue (``slurm_jobs``), all of which take slots; call under the registry's lock.
    Of those that run one of ``cells`` (resolved cell dirs: the calling driver's), one that
    runs its cell now is adopted (recorded, so it is counted and cancelled like any other);
    the others are cancelled: their cells were planned again, and such a job would only
    wait for a pickle its driver never moved into place, or find the cell another
    submission's. Another driver's cells' orphans are left to whoever runs those cells."""
    orphans = registry.orphans()
    cancel = []
    for orphan in orphans:
        if orphan.cell_dir is None or str(orphan.cell_dir) not in cells:
            continue
        state = st.read_state(orphan.cell_dir)
        attempt = state.last_attempt if state is not None else None
        if state is not None and state.state == "running" and attempt is not None \
                and attempt.job_id == orphan.job_id and st.is_locked(orphan.cell_dir):
            token = state.submission.token if state.submission is not None else ""
            registry.append(Submission(kind=JOB, job_id=orphan.job_id, submitted=time.time(), cells=[{
                "nodeid": state.nodeid, "cell_dir": str(orphan.cell_dir), "token": token, "job_id": orphan.job_id}]))
        else:
            cancel.append(orphan.job_id)
    sacct.cancel(cancel)
    return orphans


def record_failure_classes(cell_dir: Path, records: dict[str, sacct.JobRecord | None]) -> None:
    """Store the failure class of each ended attempt of a cell whose job states are known,
    so that ``status`` shows it without asking sacct again."""
    known = {job_id: record for job_id, record in records.items() if record is not None}

    def change(state: st.CellState | None) -> st.CellState | None:
        if state is None:
            return None
        attempts = tuple(
            attrs.evolve(attempt, failure_class=failures.attempt_failure(cell_dir, attempt, state, known).kind)
            if attempt.failure is not None and attempt.failure_class is None
            and failures.attempt_record(attempt, known) is not None else attempt
            for attempt in state.attempts)
        return attrs.evolve(state, attempts=attempts) if attempts != state.attempts else None

    st.update_state(cell_dir, change)


# -- plugin hooks -----------------------------------------------------------------------------


@hookimpl
def sweep_register_keys(register):
    register("sbatch", dict[str, str], {},
             "extra sbatch options of the cell's SLURM job, e.g. {'constraint': 'a100', 'exclusive': ''}")


@hookimpl
def sweep_validate_cell(cell, session):
    launch = cell.launch()
    try:
        sb.JobRequest(name="check", partition=launch.get("partition"), account=launch.get("account"),
                      qos=launch.get("qos"), options=launch.get("sbatch") or {})
    except sb.RequestError as error:
        return [str(error)]
    return []


def _make(session) -> SlurmExecutor:
    if shutil.which("sbatch") is None and not getattr(session.options, "dry_run", False):
        raise UsageError("--executor slurm: sbatch is not on PATH (is this a SLURM login node? "
                         "for a local cluster run scripts/local-slurm start)")
    cap = getattr(session.options, "max_parallel", None)
    if cap is None:
        cap = session.hook.sweep_job_concurrency_cap(session=session)
    return SlurmExecutor(session, cap)


@hookimpl
def sweep_register_executors(register):
    register("slurm", _make, "SLURM jobs through submitit: job arrays of equal cells, afterany chains "
             "for max_restarts, a concurrency cap (--max-parallel N or the cluster's)")


@hookimpl
def sweep_choose_executor(session):
    if shutil.which("sbatch") is None:
        return None
    cluster = getattr(session.options, "cluster", None) or os.environ.get("SWEEP_CLUSTER")
    if os.environ.get(SLURM_ENV) == "1" or (cluster and cluster != "none"):
        return "slurm"
    return None
