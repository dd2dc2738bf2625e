"""A cluster's cap on the cells one user runs at once, held across every runs dir of the user.

A cluster plugin answers ``sweep_job_concurrency_cap`` with a :class:`ClusterCap` (the
seeds: at most 6 RL jobs RUNNING on Jupiter, per user and cluster, pending restart links
not counted). Then the SLURM executor keeps the user's slots taken on that cluster, from
any runs dir, within the cap, besides any ``--max-parallel`` of the sweep (which counts
the runs dir's own jobs, :mod:`sweepkit.run.executors.slurm_jobs`). What takes a slot,
counted by :func:`count_slots` on one ``squeue`` call
(:func:`sweepkit.run.executors.squeue.user_queue`):

- the user's jobs that are sweepkit's (their comment carries
  :data:`~sweepkit.run.executors.slurm_jobs.COMMENT_TAG`), of this runs dir or any other,
  and the jobs launched outside sweepkit whose name the cap's ``foreign_job_pattern`` (a
  regular expression, searched in the name) matches;
- of those, every job ``squeue`` lists, running or pending (SLURM starts a pending job
  without asking anyone, so a cap on running jobs holds only if no more are queued; a
  held job may be released at any time), but a job pending on a dependency on a job
  still in the queue: a chain's link waiting for the link before it, so a chain counts
  once. A link whose link before has left the queue counts (squeue says ``Dependency``
  for a few seconds more, until the scheduler starts it), and so does one waiting only
  on a job of another user; one whose dependency can never be met takes no slot;
- an array takes ``min(its tasks in the queue, its %N)``.

The count and the submissions are serialised by :class:`CapLock`, a file per user and
cluster held from counting to submitting, as the runs dir's submit lock is: two drivers of
one user never both take the last slot. It is ``$XDG_CACHE_HOME/sweepkit/cap-<cluster>.lock``
(``~/.cache/sweepkit/`` without ``XDG_CACHE_HOME``): under the home dir, which a cluster's
login nodes share, because the user's drivers may run on different ones (a
``$XDG_RUNTIME_DIR`` is one node's own tmpfs). ``flock`` must work on that file system
(NFS and GPFS do; Lustre only when mounted with ``flock``); set ``XDG_CACHE_HOME`` to a
directory that the login nodes share and where it works, otherwise.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

import attrs

from sweepkit.errors import UsageError
from sweepkit.run.executors.slurm_jobs import parse_comment
from sweepkit.run.executors.squeue import QueuedJob, listed_ids
from sweepkit.state.files import FileLock

LOCK_DIR = "sweepkit"
THIS, OTHER, FOREIGN = "this runs dir", "other runs dirs", "foreign"


def pattern_problem(pattern: str | None) -> str | None:
    """Why ``pattern`` is not a usable regular expression of job names; None when it is."""
    if pattern is None:
        return None
    if not isinstance(pattern, str) or not pattern:
        return f"{pattern!r}: expected a non-empty regular expression of job names"
    try:
        re.compile(pattern)
    except re.error as error:
        return f"{pattern!r} is not a regular expression: {error}"
    return None


def _check_pattern(instance, attribute, value) -> None:
    problem = pattern_problem(value)
    if problem:
        raise ValueError(f"{attribute.name}: {problem}")


def _check_limit(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name}: expected a number of cells of at least 1, got {value!r}")


@attrs.frozen(kw_only=True)
class ClusterCap:
    """How many cells one user may run at once on ``cluster``, from any runs dir;
    ``foreign_job_pattern``: the names of the user's jobs launched outside sweepkit that
    take slots too (None: only sweepkit's count)."""

    limit: int = attrs.field(validator=_check_limit)
    cluster: str = attrs.field(validator=attrs.validators.min_len(1))
    foreign_job_pattern: Optional[str] = attrs.field(default=None, validator=_check_pattern)


@attrs.frozen
class QueueCount:
    """The slots a user's queue takes, by whose jobs take them."""

    this_runs_dir: int = 0
    other_runs_dirs: int = 0
    foreign: int = 0

    @property
    def total(self) -> int:
        return self.this_runs_dir + self.other_runs_dirs + self.foreign


def owner(row: QueuedJob, runs_dir: str, pattern: re.Pattern | None) -> str | None:
    """:data:`THIS`, :data:`OTHER` or :data:`FOREIGN` for a job the cap counts; None for another."""
    parsed = parse_comment(row.comment)
    if parsed is not None:
        return THIS if parsed[0] == runs_dir else OTHER
    if pattern is not None and pattern.search(row.name):
        return FOREIGN
    return None


def waits_on_dependency(row: QueuedJob, listed: set[str]) -> bool:
    """A pending job that will not start before a job still in the queue ends (a chain's
    next link), or never (its dependency can no longer be met)."""
    if row.state != "PENDING" or not row.reason.startswith("Dependency"):
        return False
    if row.reason == "DependencyNeverSatisfied":
        return True
    return any(job_id in listed for job_id in row.dependency_ids())


def count_slots(rows: Sequence[QueuedJob], runs_dir: Path, foreign_job_pattern: str | None = None) -> QueueCount:
    """The slots the user's queue ``rows`` take against a :class:`ClusterCap` (see the module)."""
    listed = listed_ids(rows)
    pattern = re.compile(foreign_job_pattern) if foreign_job_pattern else None
    runs = str(Path(runs_dir).resolve())
    taken = {THIS: 0, OTHER: 0, FOREIGN: 0}
    arrays: dict[str, list] = {}  # array id -> [owner, tasks in the queue, parallelism]
    for row in rows:
        kind = owner(row, runs, pattern)
        if kind is None or waits_on_dependency(row, listed):
            continue
        if row.array is None:
            taken[kind] += 1
            continue
        array = arrays.setdefault(row.array, [kind, 0, None])
        array[1] += len(row.ids)
        array[2] = row.parallelism or array[2]
    for kind, tasks, parallelism in arrays.values():
        taken[kind] += min(tasks, parallelism or tasks)
    return QueueCount(this_runs_dir=taken[THIS], other_runs_dirs=taken[OTHER], foreign=taken[FOREIGN])


def describe(cap: ClusterCap, count: QueueCount | None, problem: str | None = None) -> str:
    """What the cap is and who takes its slots: ``--dry-run`` says it, and so does a driver
    that waits for slots other runs dirs or foreign jobs hold."""
    foreign = (f"jobs named like {cap.foreign_job_pattern!r}" if cap.foreign_job_pattern
               else "no jobs launched outside sweepkit (no foreign_job_pattern)")
    text = (f"cap: {cap.limit} cell(s) of this user running at once on cluster {cap.cluster}, counted over "
            f"the queue: sweepkit's jobs of every runs dir and {foreign}")
    if count is None:
        return f"{text}; the queue cannot be read now ({problem})"
    return (f"{text}; taken: {count.this_runs_dir} by this runs dir, {count.other_runs_dirs} by other runs dirs, "
            f"{count.foreign} by foreign jobs; {max(0, cap.limit - count.total)} free")


def lock_path(cluster: str, environ: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME/sweepkit/cap-<cluster>.lock``, ``~/.cache`` without it (see the module)."""
    cache = environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):  # the XDG spec: a relative value is ignored
        cache = os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return Path(cache) / LOCK_DIR / f"cap-{re.sub(r'[^A-Za-z0-9_.-]', '_', cluster)}.lock"


class CapLock(FileLock):
    """The per-user, per-cluster lock held while a driver counts the cap's slots and submits."""

    def __init__(self, cluster: str, environ: Mapping[str, str] | None = None):
        super().__init__(lock_path(cluster, os.environ if environ is None else environ))

    @property
    def locked(self) -> bool:
        return self._fd is not None

    def acquire(self, *, blocking: bool = True) -> bool:
        if self.locked:
            return True
        try:
            return super().acquire(blocking=blocking)
        except OSError as error:
            raise UsageError(f"the cluster cap's lock {self.path}: cannot lock it ({error.strerror or error}); "
                             "it must be on a file system the login nodes share where flock works: set "
                             "XDG_CACHE_HOME to a directory there") from None
