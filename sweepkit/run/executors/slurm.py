"""The ``slurm`` executor: cells as SLURM jobs, submitted through submitit.

How a cell becomes a job request, how cells are grouped into chains, jobs and arrays, and
the job script, are :mod:`sweepkit.run.executors.slurm_submit`; how jobs are followed and
what is recovered from a killed driver, :mod:`sweepkit.run.executors.slurm_follow`. A
cell's cluster resources (``sweep_job_resources``) are asked once, as its job is bound,
and kept for everything derived from them.

Two caps, each held when it is set (the free slots are the fewer of the two):

- the sweep's, ``--max-parallel N`` (else a plain number the ``sweep_job_concurrency_cap``
  hook answers), is counted over every job this runs dir has in the queue, under the runs
  dir's submit lock (:mod:`sweepkit.run.executors.slurm_jobs`): it bounds this runs dir only;
- the cluster's, a :class:`~sweepkit.run.executors.cluster_cap.ClusterCap` the hook answers
  (the clusters plugin, from the active cluster's ``max_running``), is counted over the
  user's whole queue on the cluster, every runs dir's sweepkit jobs and the foreign jobs
  its pattern (or ``--cap-count-pattern``) names, under a per-user lock of that cluster.

:meth:`take` acquires the locks (the runs dir's first) when it hands out cells and
:meth:`submit` releases them once they are queued; in between, the runner checks each
cell's state again, so that a cell another driver took or finished meanwhile is not
submitted. Every job's comment names its runs dir and cells: a job that a driver
killed between sbatch and recording it left in the queue is counted too, and cancelled by
the next driver that runs its cell (adopted, if it runs the cell already); the driver says
so (:meth:`SlurmExecutor.events`), as it does of a cell's earlier jobs it cancels before
submitting the cell again (``--rerun``, a take-over).

The executor returns facts: the job ids of what it submitted (the runner records them),
whether a job is done, why one died, and the failure classes sacct's final states give.
Jobs outlive the driver: ``--detach`` submits and exits.

Default executor: ``slurm`` is chosen here when ``sbatch`` is on PATH and ``$SWEEP_SLURM=1``;
a plugin may choose it too (``sweep_choose_executor``: the clusters plugin does while a
cluster is active); otherwise cells run locally. A machine that merely has SLURM installed,
such as a developer's box running ``scripts/local-slurm``, keeps running cells locally
unless asked.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from sweepkit.errors import UsageError
from sweepkit.hookspec import hookimpl
from sweepkit.run import failures
from sweepkit.run.executors import sacct, squeue
from sweepkit.run.executors import sbatch as sb
from sweepkit.run.executors.base import DONE, QUEUED, RUNNING, Executor, Handle
from sweepkit.run.executors.cluster_cap import CapLock, ClusterCap, QueueCount, count_slots, describe, pattern_problem
from sweepkit.run.executors.resources import JobResources
from sweepkit.run.executors.slurm_follow import JobStates, failure_classes, let_go, settle_orphans
from sweepkit.run.executors.slurm_jobs import ARRAY, Registry, Submission, job_comment, orphan_slots
from sweepkit.run.executors.slurm_submit import (
    Unit,
    interpreter_problem,
    render_dry_run,
    request_for,
    script_cell,
    submit_unit,
    units_of,
    wrap_argv,
)
from sweepkit.run.job import CellJob, resumed

SLURM_ENV = "SWEEP_SLURM"
CAP_RECHECK_S = 2.0


class SlurmExecutor(Executor):
    name = "slurm"
    jobs_outlive_driver = True

    def __init__(self, session, cap: int | None, cluster_cap: ClusterCap | None = None):
        self.session = session
        self.cap = cap  # the sweep's, over this runs dir's jobs
        self.cluster_cap = cluster_cap  # the cluster's, over the user's queue
        self.registry = Registry(session.runs_dir)
        self.cap_lock = CapLock(cluster_cap.cluster) if cluster_cap is not None else None
        self.states = JobStates()
        self._resources: dict[str, JobResources | None] = {}  # by node id: asked once per cell
        self._requests: dict[str, sb.JobRequest] = {}
        self._cells: dict[str, str] = {}  # the resolved cell dirs of the jobs bound here -> node id
        self._parallelism: dict[tuple, int | None] = {}
        self._events: list[tuple[str, str, str]] = []
        self._cap_checked = 0.0
        self._cap_said: QueueCount | None = None
        self._interpreter_checked = False

    @property
    def max_parallel(self) -> int | None:
        caps = [cap for cap in (self.cap, self.cluster_cap.limit if self.cluster_cap else None) if cap is not None]
        return min(caps) if caps else None

    def resources(self, cell) -> JobResources | None:
        """The cell's cluster resources (``sweep_job_resources``), asked once per cell."""
        if cell.nodeid not in self._resources:
            answer = self.session.hook.sweep_job_resources(cell=cell, session=self.session)
            self._resources[cell.nodeid] = JobResources.of(answer)
        return self._resources[cell.nodeid]

    def _check_interpreter(self, resources: JobResources | None) -> None:
        """Once per executor (the interpreter is the driver's, the same for every cell):
        an error stops a submission, a warning is printed (a dry run only warns)."""
        if self._interpreter_checked:
            return
        self._interpreter_checked = True
        problem = interpreter_problem(resources, sys.executable, sys.prefix)
        if problem is None:
            return
        kind, message = problem
        if kind == "error" and not getattr(self.session.options, "dry_run", False):
            raise UsageError(message)
        self.session.err_console.print(f"warning: {message}" + (" (an error when submitting)" if kind == "error"
                                                                 else ""), markup=False, highlight=False)

    def bind(self, job: CellJob, cell) -> CellJob:
        resources = self.resources(cell)
        self._check_interpreter(resources)
        try:
            request = request_for(cell, self.session, resources, gpus=job.gpus)
            job = wrap_argv(job, cell, resources)
            # A line break in the command or env, which would end the script's comment, is
            # refused now rather than at submit time.
            script_cell(job)
            script_cell(resumed(job))
        except (sb.RequestError, ValueError) as error:
            file, line = cell.location
            raise UsageError(f"{file}:{line}: {cell.name}: cannot make its SLURM job: {error}") from None
        self._requests[job.token] = request
        self._cells[str(Path(job.cell_dir).resolve())] = job.nodeid
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
        # Held until submit: the runner decides once more under them whether each cell is still
        # this driver's to submit, and nobody else submits in between.
        self._lock()
        try:
            settled = settle_orphans(self.registry, set(self._cells))
            self._say_cancelled(settled.cancelled)
            free = self._free_slots(settled.orphans)
        except sacct.SlurmUnavailable:
            free = None if self.max_parallel is None else 0  # cannot count: wait rather than overrun a cap
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
            self._unlock()
        return taken

    def _lock(self) -> None:
        """The runs dir's submit lock, then the cluster cap's: always in this order."""
        self.registry.acquire()
        if self.cap_lock is not None:
            self.cap_lock.acquire()

    def _unlock(self) -> None:
        if self.cap_lock is not None:
            self.cap_lock.release()
        self.registry.release()

    def _free_slots(self, orphans) -> int | None:
        """The slots both caps leave free (None: no cap), counted under the locks. Raises
        ``sacct.SlurmUnavailable``."""
        free = None
        if self.cap is not None:
            free = self.cap - self.registry.slots_used() - orphan_slots(orphans)
        if self.cluster_cap is not None:
            count = count_slots(squeue.user_queue(), self.session.runs_dir, self.cluster_cap.foreign_job_pattern)
            self._say_waiting(count)
            cluster_free = self.cluster_cap.limit - count.total
            free = cluster_free if free is None else min(free, cluster_free)
        return free

    def _say_waiting(self, count: QueueCount) -> None:
        """Once per count that differs: the cluster's cap is full, and not only with this runs dir's jobs."""
        full = count.total >= self.cluster_cap.limit and count.total > count.this_runs_dir
        if full and count != self._cap_said:
            self._events.append(("waiting", "run", describe(self.cluster_cap, count)))
        self._cap_said = count if full else None

    def _say_cancelled(self, orphans) -> None:
        for orphan in orphans:
            nodeid = self._cells.get(str(orphan.cell_dir), "run")
            self._events.append(("scancelled", nodeid, f"SLURM job {orphan.job_id} ({orphan.state}), which a "
                                                       "killed driver submitted and never recorded, before "
                                                       "submitting the cell again"))

    @staticmethod
    def _unit_key(unit: Unit) -> tuple:
        return tuple(job.token for job in unit.jobs)

    # -- submitting --------------------------------------------------------------------------

    def submit(self, jobs: Sequence[CellJob]) -> list[Handle]:
        handles: dict[str, Handle] = {}
        capped = self.max_parallel is not None
        self._lock()
        try:
            self._cancel_previous(jobs)
            for unit in units_of(jobs, self._requests):
                parallelism = self._parallelism.get(self._unit_key(unit), 1 if capped else None)
                ids = submit_unit(unit, self._commented(unit), parallelism)
                self._register(unit, ids, parallelism)
                for job, job_id in zip(unit.jobs, ids):
                    handles[job.token] = Handle(executor=self.name, job_id=job_id, cell=job)
        finally:
            self._unlock()
        now = time.time()
        for handle in handles.values():
            self.states.watch(handle.job_id, now)
        return [handles[job.token] for job in jobs]

    def _cancel_previous(self, jobs: Sequence[CellJob]) -> None:
        """A cell submitted again (``--rerun``, or a take-over) loses its earlier jobs first."""
        try:
            previous = self.registry.jobs_of({job.nodeid for job in jobs})
        except sacct.SlurmUnavailable:
            return
        if previous:
            sacct.cancel(previous)
            self._events.append(("scancelled", "run", f"SLURM job(s) {', '.join(previous)}: the earlier, unfinished "
                                                      "jobs of cells submitted again"))

    def _commented(self, unit: Unit) -> sb.JobRequest:
        """The unit's request with the comment that says whose job it is (``slurm_jobs``)."""
        return attrs.evolve(unit.request, comment=job_comment(self.session.runs_dir,
                                                              [job.cell_dir for job in unit.jobs]))

    def _register(self, unit: Unit, ids: list[str], parallelism: int | None) -> None:
        cells = [{"nodeid": job.nodeid, "cell_dir": job.cell_dir, "token": job.token, "job_id": one}
                 for job, one in zip(unit.jobs, ids)]
        if unit.kind == ARRAY:
            entry = Submission(kind=ARRAY, job_id=sacct.array_id(ids[0]), cells=cells, tasks=len(ids),
                               parallelism=parallelism, submitted=time.time())
        else:
            entry = Submission(kind=unit.kind, job_id=ids[0], cells=cells, submitted=time.time())
        self.registry.append(entry)

    # -- following jobs -------------------------------------------------------------------------

    def attach(self, job_id: str) -> Handle | None:
        submitted = self.registry.submitted_times()
        for one in sacct.split_ids([job_id]):
            # A job sacct does not know is alive only while it may just have been submitted.
            self.states.watch(one, submitted.get(one, 0.0))
        return Handle(executor=self.name, job_id=job_id, cell=None)

    def records(self, job_id: str) -> list[sacct.JobRecord | None]:
        return self.states.of(job_id)

    def poll(self, handle: Handle) -> str:
        ids = sacct.split_ids([handle.job_id])
        records = self.states.of(handle.job_id)
        unfinished = self.states.unfinished(handle.job_id)
        if unfinished and handle.cell is not None:
            unfinished = let_go(handle.cell, dict(zip(ids, records)), ids, unfinished)
        if not unfinished:
            return DONE
        running = any(record is not None and record.state == "RUNNING" for record in records)
        return RUNNING if running else QUEUED

    def failure_classes(self, handle: Handle) -> dict[int, str]:
        if handle.cell is None:
            return {}
        ids = sacct.split_ids([handle.job_id])
        return failure_classes(Path(handle.cell.cell_dir), dict(zip(ids, self.states.of(handle.job_id))))

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

    def events(self) -> list[tuple[str, str, str]]:
        events, self._events = self._events, []
        return events

    def cancel(self, handle: Handle) -> None:
        sacct.cancel([handle.job_id])

    def close(self) -> None:
        self._unlock()

    # -- dry run -------------------------------------------------------------------------------

    def render_dry_run(self, jobs: Sequence[CellJob]) -> list[Path]:
        """Write the job scripts ``submit`` would send to ``<runs>/.dry-run/<grid>/``."""
        units = units_of([job for job in jobs if job.token in self._requests], self._requests)
        return render_dry_run(units, [self._commented(unit) for unit in units], self.session.runs_dir,
                              self.max_parallel)

    def cap_notes(self) -> list[str]:
        """Which caps apply and who takes their slots now, read from the queue (nothing written)."""
        if self.max_parallel is None:
            return ["cap: none, every cell is queued at once (no --max-parallel, no cluster cap)"]
        try:
            rows, problem = squeue.user_queue(), None
        except sacct.SlurmUnavailable as error:
            rows, problem = None, str(error)
        notes = []
        if self.cap is not None:
            where = "--max-parallel" if getattr(self.session.options, "max_parallel", None) is not None \
                else "sweep_job_concurrency_cap"
            text = f"cap: {self.cap} cell(s) of this runs dir at once ({where}; other runs dirs are not counted)"
            taken = None if rows is None else count_slots(rows, self.session.runs_dir).this_runs_dir
            notes.append(f"{text}; the queue cannot be read now ({problem})" if rows is None
                         else f"{text}; taken: {taken}, {max(0, self.cap - taken)} free")
        if self.cluster_cap is not None:
            count = None if rows is None else count_slots(rows, self.session.runs_dir,
                                                          self.cluster_cap.foreign_job_pattern)
            notes.append(describe(self.cluster_cap, count, problem))
        return notes


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


COUNT_PATTERN_OPTION = "--cap-count-pattern"


@hookimpl
def sweep_addoption(parser):
    parser.addoption(COUNT_PATTERN_OPTION, commands=("run",), dest="cap_count_pattern", default=None,
                     metavar="REGEX", help="slurm: the user's jobs launched outside sweepkit whose name this "
                     "regular expression matches take slots of the cluster's cap too (default: the "
                     "cluster's foreign_job_pattern)")


def caps(session) -> tuple[int | None, ClusterCap | None]:
    """The sweep's cap over this runs dir and the cluster's over the user's queue (see the module)."""
    options = session.options
    answer = session.hook.sweep_job_concurrency_cap(session=session)
    if answer is not None and not isinstance(answer, ClusterCap) and (isinstance(answer, bool) or
                                                                      not isinstance(answer, int) or answer < 1):
        raise UsageError(f"sweep_job_concurrency_cap answered {answer!r}: expected a number of cells of at least 1, "
                         "a sweepkit.run.executors.cluster_cap.ClusterCap, or None")
    cap = getattr(options, "max_parallel", None)
    if cap is None and isinstance(answer, int):
        cap = answer
    cluster_cap = answer if isinstance(answer, ClusterCap) else None
    pattern = getattr(options, "cap_count_pattern", None)
    if pattern is not None:
        problem = pattern_problem(pattern)
        if problem:
            raise UsageError(f"{COUNT_PATTERN_OPTION} {problem}")
        if cluster_cap is None:
            raise UsageError(f"{COUNT_PATTERN_OPTION}: no cluster cap applies to this run (a cluster plugin's "
                             "max_running, e.g. --cluster jupiter), so there is nothing to count foreign jobs against")
        cluster_cap = attrs.evolve(cluster_cap, foreign_job_pattern=pattern)
    return cap, cluster_cap


def _make(session) -> SlurmExecutor:
    dry_run = getattr(session.options, "dry_run", False)
    if shutil.which("sbatch") is None and not dry_run:
        raise UsageError("--executor slurm: sbatch is not on PATH (is this a SLURM login node? "
                         "for a local cluster run scripts/local-slurm start)")
    executor = SlurmExecutor(session, *caps(session))
    if executor.cap_lock is not None and not dry_run:
        executor.cap_lock.acquire()  # a lock that cannot be taken is said now, before anything is submitted
        executor.cap_lock.release()
    return executor


@hookimpl
def sweep_register_executors(register):
    register("slurm", _make, "SLURM jobs through submitit: job arrays of equal cells, afterany chains "
             "for max_restarts, a concurrency cap (--max-parallel N or the cluster's)")


@hookimpl
def sweep_choose_executor(session):
    # Only when asked: a machine with SLURM installed (scripts/local-slurm) runs cells locally.
    # Which cluster a sweep is on is a plugin's to say; it answers this hook itself.
    if os.environ.get(SLURM_ENV) == "1" and shutil.which("sbatch") is not None:
        return "slurm"
    return None
