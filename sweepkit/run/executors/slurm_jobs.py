"""A runs dir's record of the SLURM jobs it submitted, and the concurrency cap over them.

``<runs>/.slurm/jobs.jsonl`` holds one line per submission (a job, a cell's chain, or a
job array) with the cells it runs; ``<runs>/.slurm/submit.lock`` is held while a driver
counts the slots in use and submits, so two ``sweep run`` commands racing on one runs dir
never put more than the cap into the queue together.

Slots: a job or a chain whose jobs have not all ended takes one (a chain runs one link at
a time, and its links waiting on a dependency do not count); an array takes as many as
it may run at once, ``min(its unfinished tasks, its %parallelism)``. Pending jobs count:
they start without asking anyone, so a cap on running jobs can only hold if jobs are
never queued beyond it.

Every job carries the comment ``sweepkit cells <grid>/<cell>,... in <runs dir>``
(:func:`job_comment`; an array's cells in task order). Its opening words,
:data:`COMMENT_TAG`, mark a job as sweepkit's for any reader of the queue (the cap across
runs dirs, :mod:`sweepkit.run.executors.cluster_cap`, counts the user's jobs that carry
it); they stay as they are, so the jobs an earlier sweepkit queued are still known. A job
in the queue with this runs dir's comment that no line records is an orphan
(:meth:`Registry.orphans`): its driver died between sbatch and recording it (the file is
only appended under the lock, so no live driver has one). Orphans take slots as recorded
jobs do.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from sweepkit.run.executors import sacct, squeue

SLURM_DIR = ".slurm"
REGISTRY_FILE = "jobs.jsonl"
LOCK_FILE = "submit.lock"
# sacct learns of a job a moment after sbatch returns: until then an unknown job is alive.
UNKNOWN_GRACE_S = 120.0
# An ended record whose end is this long before its job's submission is an earlier job's.
REUSED_ID_MARGIN_S = 5.0
JOB, CHAIN, ARRAY = "job", "chain", "array"
#: What a sweepkit job's comment says first (after a cell's own comment, ``; `` between).
COMMENT_TAG = "sweepkit cells"
_COMMENT = re.compile(rf"(?:^|; ){COMMENT_TAG} (\S+) in (.+)$")


def job_comment(runs_dir: Path, cell_dirs) -> str:
    """The comment of a job that runs these cells (an array's in task order) of ``runs_dir``."""
    cells = ",".join(f"{Path(directory).parent.name}/{Path(directory).name}" for directory in cell_dirs)
    return f"{COMMENT_TAG} {cells} in {Path(runs_dir).resolve()}"


def parse_comment(comment: str) -> tuple[str, list[str]] | None:
    """``(runs dir, ["<grid>/<cell>", ...])`` of a sweepkit job's comment; None for a job
    that is not sweepkit's."""
    found = _COMMENT.search(comment or "")
    return None if found is None else (found[2], found[1].split(","))


def comment_cells(comment: str, runs_dir: Path) -> list[Path] | None:
    """The cell dirs a job's comment names, or None for a job that is not this runs dir's."""
    found = parse_comment(comment)
    runs_dir = Path(runs_dir).resolve()
    if found is None or found[0] != str(runs_dir):
        return None
    return [runs_dir / cell for cell in found[1]]


@attrs.frozen
class Orphan:
    """A job (or array task) of this runs dir in the queue that the registry does not record,
    with the cell it runs (None when its comment names none for its task); ``parallelism``
    is its array's ``%N`` where squeue shows it."""

    job_id: str
    cell_dir: Path | None
    state: str
    reason: str = ""
    parallelism: int | None = None


def orphan_slots(orphans: Sequence[Orphan]) -> int:
    """What the orphans take of the cap, counted as :meth:`Registry.slots_used` counts."""
    used = 0
    arrays: dict[str, list[Orphan]] = {}
    for orphan in orphans:
        if "_" in orphan.job_id:
            arrays.setdefault(sacct.array_id(orphan.job_id), []).append(orphan)
        elif not (orphan.state == "PENDING" and orphan.reason == "Dependency"):
            used += 1  # a chain's link waiting on the link before takes none
    for tasks in arrays.values():
        parallelism = next((task.parallelism for task in tasks if task.parallelism), None)
        used += min(len(tasks), parallelism or len(tasks))
    return used


@attrs.frozen(kw_only=True)
class Submission:
    """One line of the registry. ``job_id``: the job, the chain (``1,2,3``) or the array's
    own id; ``cells``: ``{"nodeid", "cell_dir", "token", "job_id"}`` per cell."""

    kind: str
    job_id: str
    cells: tuple[dict, ...] = attrs.field(converter=tuple)
    tasks: int = 1
    parallelism: int | None = None
    submitted: float = 0.0

    def task_ids(self) -> list[str]:
        if self.kind == ARRAY:
            return [f"{self.job_id}_{n}" for n in range(self.tasks)]
        return sacct.split_ids([self.job_id])

    def to_json(self) -> dict:
        return {**attrs.asdict(self), "cells": list(self.cells)}


class Registry:
    def __init__(self, runs_dir: Path):
        self.runs_dir = Path(runs_dir)
        self.directory = self.runs_dir / SLURM_DIR
        self.path = self.directory / REGISTRY_FILE
        self._lock_fd: int | None = None

    # -- the submit lock ---------------------------------------------------------------

    def acquire(self) -> None:
        if self._lock_fd is not None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._lock_fd = fd

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- entries -------------------------------------------------------------------------

    def read(self) -> list[Submission]:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        entries = []
        for line in lines:
            try:
                entries.append(Submission(**json.loads(line)))
            except (ValueError, TypeError):
                continue  # a line cut short by a crash mid-write
        return entries

    def append(self, entry: Submission) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(entry.to_json()) + "\n").encode())
        finally:
            os.close(fd)

    def submitted_times(self) -> dict[str, float]:
        """When each job id of the file was submitted (no sacct call)."""
        return {job_id: entry.submitted for entry in self.read() for job_id in
                [*entry.task_ids(), *(cell["job_id"] for cell in entry.cells)]}

    def _rewrite(self, entries: Sequence[Submission]) -> None:
        temp = self.path.with_name(f".{REGISTRY_FILE}.{os.getpid()}.tmp")
        temp.write_text("".join(json.dumps(entry.to_json()) + "\n" for entry in entries))
        os.replace(temp, self.path)

    def live(self) -> list[tuple[Submission, list[str]]]:
        """Entries with unfinished jobs, each with its unfinished ids; entries whose jobs
        have all ended are dropped from the file (call under the lock). Raises
        ``sacct.SlurmUnavailable``."""
        entries = self.read()
        records = sacct.query(entry.job_id for entry in entries)
        now = time.time()
        live = []
        for entry in entries:
            unfinished = [job_id for job_id in entry.task_ids()
                          if alive(records.get(job_id), entry.submitted, now)]
            if unfinished:
                live.append((entry, unfinished))
        if len(live) != len(entries):
            self._rewrite([entry for entry, _ in live])
        return live

    def slots_used(self) -> int:
        used = 0
        for entry, unfinished in self.live():
            if entry.kind == ARRAY:
                used += min(len(unfinished), entry.parallelism or len(unfinished))
            else:
                used += 1
        return used

    def orphans(self) -> list[Orphan]:
        """This runs dir's jobs in the queue (their comment says so) that no entry records
        (call under the lock). Raises ``sacct.SlurmUnavailable``."""
        recorded: set[str] = set()
        for entry in self.read():
            recorded |= {entry.job_id, *entry.task_ids(), *sacct.split_ids(cell["job_id"] for cell in entry.cells)}
        found = []
        for row in squeue.user_queue():
            cells = comment_cells(row.comment, self.runs_dir)
            if cells is None:
                continue
            for job_id in row.ids:
                if job_id in recorded or sacct.array_id(job_id) in recorded:
                    continue
                index = int(job_id.split("_")[1]) if "_" in job_id else 0
                found.append(Orphan(job_id=job_id, cell_dir=cells[index] if index < len(cells) else None,
                                    state=row.state, reason=row.reason, parallelism=row.parallelism))
        return found

    def jobs_of(self, nodeids: set[str]) -> list[str]:
        """The unfinished job ids of the given cells (their chains and array tasks)."""
        out = []
        for entry, unfinished in self.live():
            for cell in entry.cells:
                if cell["nodeid"] in nodeids:
                    out += [job_id for job_id in sacct.split_ids([cell["job_id"]]) if job_id in unfinished]
        return out


def alive(record: sacct.JobRecord | None, submitted: float, now: float) -> bool:
    """Whether the job submitted at ``submitted`` (0: not known) has not ended: a job that sacct
    does not know yet, or knows only by an earlier job of its id, is alive for a grace time."""
    if record is None or earlier_job(record, submitted, now):
        return now - submitted < UNKNOWN_GRACE_S
    return record.alive


def earlier_job(record: sacct.JobRecord, submitted: float, now: float) -> bool:
    """Whether ``record`` is another, earlier job's that had the same id (``sacct`` says how):
    it ended well before this job was submitted. Only in the grace time, while this job may
    not have reached the database: after it, a record is taken as it is, so a clock that
    disagrees with the controller's delays what this job's record says, never loses it."""
    return (submitted > 0 and now - submitted < UNKNOWN_GRACE_S and not record.alive
            and record.end is not None and record.end < submitted - REUSED_ID_MARGIN_S)
