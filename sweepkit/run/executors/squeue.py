"""This user's jobs as ``squeue`` lists them: one call (:func:`user_queue`), parsed (:func:`parse`).

``squeue`` asks the controller, which knows a job the moment ``sbatch`` returns (``sacct``
learns of it a second or so later): what is counted against a cap, and what is looked for
among the jobs a killed driver never recorded, is read from here. Each row has six
fields, separated by the ASCII unit separator because a job's name or comment may hold
any printable character:

==========  ====  =======================================================================
job id      %i    ``123``, a running array task ``123_4``, an array's tasks not started
                  yet in one row ``123_[5-7%2]`` (expanded; ``%2`` is its parallelism)
name        %j    the job's name
state       %T    ``RUNNING``, ``PENDING``, ``COMPLETING``, ... (squeue lists jobs not ended)
reason      %r    why a pending job waits: ``Dependency``, ``Resources``, ``JobHeldUser``...
dependency  %E    the dependencies it still waits on, ``afterany:122(unfulfilled)``; none: ``(null)``
comment     %k    the job's comment; none: ``(null)``
==========  ====  =======================================================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

import attrs

from sweepkit.run.executors import sacct

SEPARATOR = "\x1f"
FORMAT = SEPARATOR.join(("%i", "%j", "%T", "%r", "%E", "%k"))
NULL = "(null)"
_PARALLELISM = re.compile(r"%(\d+)\]$")
_DEPENDENCY_ID = re.compile(r":(\d+(?:_\d+)?)")  # afterany:12, afterok:12_3:14, afterany:12+60


@attrs.frozen
class QueuedJob:
    """One row of ``squeue``: a job, a running array task, or the not-started tasks of an
    array in one row (``ids`` has them all; ``parallelism`` is its ``%N``)."""

    ids: tuple[str, ...]
    state: str
    reason: str = ""
    comment: str = ""
    name: str = ""
    dependency: str = ""
    parallelism: int | None = None

    @property
    def array(self) -> str | None:
        """The array's own id, for a row of array tasks; None for a plain job."""
        return sacct.array_id(self.ids[0]) if "_" in self.ids[0] else None

    def dependency_ids(self) -> list[str]:
        """The ids of the jobs this one still waits on (``singleton`` names none)."""
        return _DEPENDENCY_ID.findall(self.dependency)


def _field(value: str) -> str:
    value = value.strip()
    return "" if value == NULL else value


def parse(text: str) -> list[QueuedJob]:
    """The rows of ``squeue -h -o FORMAT``'s output; a line without six fields is skipped."""
    rows = []
    for line in text.splitlines():
        fields = line.split(SEPARATOR, 5)
        if len(fields) < 6 or not fields[0].strip():
            continue
        job_id, name, state, reason, dependency, comment = fields
        parallelism = _PARALLELISM.search(job_id.strip())
        rows.append(QueuedJob(ids=tuple(sacct.expand_ids(job_id.strip())), state=state.split()[0] if state.strip()
                              else "", reason=_field(reason), comment=_field(comment), name=name,
                              dependency=_field(dependency), parallelism=int(parallelism[1]) if parallelism else None))
    return rows


def user_queue() -> list[QueuedJob]:
    """This user's jobs in the queue, from one ``squeue`` call. Raises
    :class:`~sweepkit.run.executors.sacct.SlurmUnavailable` when the controller cannot be asked."""
    return parse(sacct.ask(["squeue", "-h", "-u", str(os.getuid()), "-o", FORMAT]))


def listed_ids(rows: Iterable[QueuedJob]) -> set[str]:
    """Every job id the rows list, with the own id of each array among them."""
    ids = {job_id for row in rows for job_id in row.ids}
    return ids | {sacct.array_id(job_id) for job_id in ids}
