"""How the SLURM executor follows jobs, and what it recovers from a driver that died.

Job states come from ``sacct`` (:mod:`sweepkit.run.executors.sacct`): :class:`JobStates`
asks once per :data:`STATE_REFRESH_S` for every job the executor follows, so a driver (or
``sweep status``) keeps working while slurmctld restarts (the last answer is kept). A job
sacct does not know yet is alive while it may just have been submitted.

Recovery: a cell whose state on disk is final lets go of what SLURM still holds for it
(:func:`let_go`); the jobs a driver killed between sbatch and recording them left in the
queue are adopted or cancelled by the next driver that runs their cells
(:func:`settle_orphans`); and the failure class of an ended attempt is read from its
job's final state (:func:`failure_classes`), for the runner to record.
"""

from __future__ import annotations

import time
from pathlib import Path

import attrs

from sweepkit.run import failures
from sweepkit.run.executors import sacct
from sweepkit.run.executors.slurm_jobs import JOB, UNKNOWN_GRACE_S, Orphan, Registry, Submission, alive
from sweepkit.run.job import CellJob
from sweepkit.state import records as st

STATE_REFRESH_S = 1.0


class JobStates:
    """sacct's records of the jobs one executor follows, each asked for at most once per
    :data:`STATE_REFRESH_S` (a job never asked yet at once)."""

    def __init__(self):
        self.records: dict[str, sacct.JobRecord] = {}
        self.watched: dict[str, float] = {}  # job id -> when it was submitted (0: unknown)
        self._asked: set[str] = set()
        self._refreshed = 0.0

    def watch(self, job_id: str, submitted: float) -> None:
        """Follow every job of ``job_id`` (a chain's links too), submitted at ``submitted``."""
        for one in sacct.split_ids([job_id]):
            self.watched.setdefault(one, submitted)

    def _refresh(self) -> None:
        never_asked = set(self.watched) - self._asked
        if not never_asked and time.time() - self._refreshed < STATE_REFRESH_S:
            return
        try:
            self.records.update(sacct.query(self.watched))
        except sacct.SlurmUnavailable:
            return  # keep the last answer; the jobs are where they were
        self._asked |= set(self.watched)
        self._refreshed = time.time()

    def of(self, job_id: str) -> list[sacct.JobRecord | None]:
        """The record of each job of ``job_id`` (None: not known to sacct yet)."""
        self._refresh()
        return [self.records.get(one) for one in sacct.split_ids([job_id])]

    def unfinished(self, job_id: str) -> list[str]:
        """The jobs of ``job_id`` that have not ended."""
        now = time.time()
        return [one for one, record in zip(sacct.split_ids([job_id]), self.of(job_id))
                if alive(record, self.watched.get(one, 0.0), now)]


def let_go(job: CellJob, records: dict[str, sacct.JobRecord | None], ids: list[str],
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



def failure_classes(cell_dir: Path, records: dict[str, sacct.JobRecord | None]) -> dict[int, str]:
    """The failure class of each ended, failed attempt of a cell that has none recorded yet
    and whose job's state is known (by attempt number), so that ``status`` shows it
    without asking sacct again."""
    known = {job_id: record for job_id, record in records.items() if record is not None}
    state = st.read_state(cell_dir)
    if state is None:
        return {}
    return {attempt.n: failures.attempt_failure(cell_dir, attempt, state, known).kind
            for attempt in state.attempts
            if attempt.failure is not None and attempt.failure_class is None
            and failures.attempt_record(attempt, known) is not None}


@attrs.frozen
class Settled:
    """The runs dir's orphans (they all take slots), and those of them that were cancelled."""

    orphans: list[Orphan]
    cancelled: list[Orphan]


def settle_orphans(registry: Registry, cells: set[str]) -> Settled:
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
            cancel.append(orphan)
    sacct.cancel(orphan.job_id for orphan in cancel)
    return Settled(orphans=orphans, cancelled=cancel)
