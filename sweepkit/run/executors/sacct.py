"""What SLURM says about jobs: states from ``sacct``, cancelling with ``scancel``.

``sacct`` reads the accounting database (slurmdbd), not the controller, so it keeps
answering while slurmctld restarts; that is why states come from it and not from
``squeue``. Two of its habits shape this module: a job appears in it a second or so after
``sbatch`` returns (callers treat a young job it does not know as alive), and the
not-yet-started tasks of an array are one row such as ``11_[2-5%2]`` that only a query
by the array's own id returns, so ids are always queried by their array id and ranges
are expanded.

Job ids are strings: ``123`` (a job), ``123_4`` (a task of an array), and a cell's chain
is stored as its jobs' ids joined with commas (``123,124,125``, head first).

An id can name two jobs: a controller that died without saving its state hands out again
the ids it gave since its last save, and ``sacct -j`` shows the newest job of an id that
the database knows, until the new job reaches it the earlier one. Each record carries its
end time so that callers who know when they submitted can tell (``slurm_jobs.alive``).

The user's whole queue, as the controller lists it (for orphans and the cap across runs
dirs), is :mod:`sweepkit.run.executors.squeue`.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterable

import attrs

# States of a job that has not ended (sacct's words, first word only).
ALIVE = frozenset({"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
                   "SUSPENDED", "CONFIGURING", "COMPLETING", "STAGE_OUT", "SIGNALING", "STOPPED",
                   "RESV_DEL_HOLD", "SPECIAL_EXIT"})
# Alive states of a job that ran and is queued to run again.
REQUEUED = frozenset({"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
QUERY_TIMEOUT_S = 30


@attrs.frozen
class JobRecord:
    job_id: str
    state: str  # first word: "CANCELLED by 0" is CANCELLED
    exit_code: str = ""
    reason: str = ""
    end: float | None = None  # when it ended (seconds since the epoch); None while it has not

    @property
    def alive(self) -> bool:
        return self.state in ALIVE


class SlurmUnavailable(Exception):
    """``sacct`` is missing or did not answer."""


def split_ids(job_ids: Iterable[str | None]) -> list[str]:
    """Individual ids of job-id strings that may be chains (``1,2,3``)."""
    out: list[str] = []
    for value in job_ids:
        for part in str(value or "").split(","):
            if part.strip():
                out.append(part.strip())
    return list(dict.fromkeys(out))


def array_id(job_id: str) -> str:
    return job_id.split("_", 1)[0]


def expand_ids(job_id_field: str) -> list[str]:
    """``11_[1-3%1]`` -> ``11_1, 11_2, 11_3``; ``11_0`` and ``12`` stay as they are."""
    if "_[" not in job_id_field:
        return [job_id_field]
    main, _, ranges = job_id_field.partition("_[")
    ranges = ranges.rstrip("]").split("%")[0]
    ids = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        ids += [f"{main}_{n}" for n in range(int(low), int(high or low) + 1)]
    return ids


def query(job_ids: Iterable[str | None]) -> dict[str, JobRecord]:
    """The latest record of each job ``sacct`` knows among ``job_ids`` (chains split,
    array tasks expanded); a job it does not know yet is absent. Raises
    :class:`SlurmUnavailable` when sacct cannot be asked."""
    wanted = split_ids(job_ids)
    if not wanted:
        return {}
    masters = sorted({array_id(job_id) for job_id in wanted}, key=lambda value: int(value) if value.isdigit() else 0)
    answer = ask(["sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode,Reason,End", "-j", ",".join(masters)])
    records: dict[str, JobRecord] = {}
    for line in answer.splitlines():
        fields = line.split("|")
        if len(fields) < 5 or not fields[0]:
            continue
        state = fields[1].split()[0] if fields[1].strip() else "UNKNOWN"
        for job_id in expand_ids(fields[0]):
            # A requeued job has several rows; the last one is the current run.
            records[job_id] = JobRecord(job_id=job_id, state=state, exit_code=fields[2], reason=fields[3],
                                        end=timestamp(fields[4]))
    wanted_set = set(wanted)
    # A plain id that is an array's own id stands for every task of it.
    return {job_id: record for job_id, record in records.items()
            if job_id in wanted_set or array_id(job_id) in wanted_set}


def timestamp(text: str) -> float | None:
    """sacct's ``2026-12-06T06:10:47`` (the local time of this process, as sacct prints it)
    in seconds since the epoch; None for ``Unknown``, ``None`` or an empty field."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def in_queue(job_ids: Iterable[str | None]) -> set[str] | None:
    """Which of ``job_ids`` ``squeue`` still lists (a cancelled job stays there while it
    completes), or None when the controller cannot be asked."""
    wanted = set(split_ids(job_ids))
    if not wanted:
        return set()
    if shutil.which("squeue") is None:
        return None
    masters = sorted({array_id(job_id) for job_id in wanted})
    try:
        answer = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(masters)], capture_output=True,
                                text=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if answer.returncode != 0:
        # squeue exits 1 for ids it no longer knows; the controller being away says so on stderr.
        return set() if "Invalid job id" in answer.stderr else None
    listed = {job_id for line in answer.stdout.split() for job_id in expand_ids(line.strip())}
    return {job_id for job_id in wanted if job_id in listed or array_id(job_id) in listed}


def cancel(job_ids: Iterable[str | None]) -> list[str]:
    """``scancel`` the given jobs (chains split); returns the ids asked for. A job that
    has already ended is no error."""
    ids = split_ids(job_ids)
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    return ids


def ask(command: list[str]) -> str:
    """The standard output of a SLURM query; :class:`SlurmUnavailable` when it cannot be asked."""
    tool = command[0]
    if shutil.which(tool) is None:
        raise SlurmUnavailable(f"{tool} is not on PATH")
    try:
        answer = subprocess.run(command, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SlurmUnavailable(f"{tool}: {error}") from None
    if answer.returncode != 0:
        raise SlurmUnavailable(f"{tool} exited {answer.returncode}: {answer.stderr.strip()[:300]}")
    return answer.stdout
