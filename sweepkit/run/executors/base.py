"""The executor interface: how prepared cells become running jobs.

The runner (``sweepkit.run.runner``) owns the loop and, through the transitions of
``sweepkit.state.transitions``, the state on disk; an executor only places jobs and
answers with facts (handles and their job ids, whether a job is done, why it died, the
failure classes its scheduler knows, what it did on its own), never writing a cell's
state. Per loop turn the runner asks ``take(pending)`` which prepared cells may start now
(the local executor answers from its free CPU/GPU slots; a cluster executor may take
everything and let the scheduler queue it), ``submit``s that batch (a cluster executor
may turn a batch of cells with equal resources into one job array), and ``poll``s every
handle until it is ``done``. A handle's ``job_id`` is a string stored in
``state.json`` so that a later process can ``attach`` to the job from disk.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs

from sweepkit.run.job import CellJob

# poll() answers one of these.
QUEUED, RUNNING, DONE = "queued", "running", "done"


@attrs.define(kw_only=True, eq=False)
class Handle:
    """A submitted job. ``job`` is the executor's own live object (a submitit Job) and is
    never serialised; ``job_id`` is."""

    executor: str
    job_id: str
    cell: CellJob | None  # None for a job attached from its id alone
    job: Any = None
    gpu_ids: tuple[str, ...] = ()


class Executor(abc.ABC):
    """Places prepared cells. Implementations register through the
    ``sweep_register_executors`` hook as ``register(name, factory, doc)``."""

    name: ClassVar[str]
    #: True when submitted jobs run to their end without the submitting process (a
    #: cluster queue); ``--detach`` then just submits and exits. False for executors whose
    #: jobs need the driver to start the rest (local): ``--detach`` starts a background driver.
    jobs_outlive_driver: ClassVar[bool] = False

    @property
    @abc.abstractmethod
    def max_parallel(self) -> int | None:
        """How many cells may run at once (None: no limit of this executor)."""

    def bind(self, job: CellJob, cell) -> CellJob:
        """Called once per prepared job with the cell it runs; returns the job to submit.
        An executor that derives per-cell settings from the cell (a cluster job's
        resources) computes them here, and may wrap the job's argv (a container)."""
        return job

    def render_dry_run(self, jobs: Sequence[CellJob]) -> list:
        """``--dry-run``: write what would be submitted for ``jobs`` (job scripts) and
        return the paths written; nothing is submitted."""
        return []

    def cap_notes(self) -> list[str]:
        """``--dry-run``: lines saying which cap on running cells applies and who takes its
        slots now (a cluster executor reads its queue); nothing is written. Empty by default."""
        return []

    def check(self, job: CellJob) -> str | None:
        """An error message when ``job`` can never run here (asks for more GPUs than the
        machine has), else None. Called before anything runs."""
        return None

    @abc.abstractmethod
    def take(self, pending: Sequence[CellJob]) -> list[CellJob]:
        """The prepared cells, in order, that may be submitted now. An executor may hold a
        lock from here until ``submit`` (a cluster's submit lock), under which the runner
        checks each cell once more before it is submitted."""

    @abc.abstractmethod
    def submit(self, jobs: Sequence[CellJob]) -> list[Handle]:
        """Start or enqueue ``jobs``, the cells of the last ``take`` that the runner still
        submits (maybe none: it is called after every ``take`` that returned cells); one
        handle per job, in order."""

    @abc.abstractmethod
    def poll(self, handle: Handle) -> str:
        """``QUEUED``, ``RUNNING`` or ``DONE``. When a job is ``DONE`` its resources are
        released; the cell's own result is in its ``state.json``."""

    def error(self, handle: Handle) -> str | None:
        """Why a ``DONE`` job ended without recording a result in ``state.json`` (the job
        process itself crashed or was killed), if the executor knows."""
        return None

    def failure_classes(self, handle: Handle) -> dict[int, str]:
        """For a ``DONE`` job: the failure class (``sweepkit.run.failures``) of each failed
        attempt of its cell that this executor's own records explain (a scheduler's final
        job states), by attempt number; the runner records them. Empty by default."""
        return {}

    def events(self) -> list[tuple[str, str, str]]:
        """What the executor did on its own since it was last asked, for the driver to say:
        ``(kind, node id or "run", text)``, such as the earlier jobs of a cell it cancelled
        before submitting the cell again. Empty by default."""
        return []

    @abc.abstractmethod
    def cancel(self, handle: Handle) -> None:
        """Stop the job; its cell records ``cancelled``."""

    def attach(self, job_id: str) -> Handle | None:
        """A handle for a job another process submitted (its id from ``state.json``), or
        None when this executor cannot follow it; the runner then relies on the cell's
        lock and gives a submission whose job never took the lock a grace period."""
        return None

    def hold_foreign(self, nodeid: str, attempt) -> None:
        """A cell started by another driver runs (``attempt``: its ``state.Attempt``, or
        None when it has not recorded one yet). An executor that hands out this machine's
        slots and GPUs counts them as taken until ``release_foreign(nodeid)``."""

    def release_foreign(self, nodeid: str) -> None:
        """The foreign cell of ``hold_foreign`` has ended."""

    def close(self) -> None:
        """Called once when the runner is done with the executor."""
