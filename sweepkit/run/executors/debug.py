"""The ``debug`` executor: each cell runs inside the driver process, one after another.

Nothing is pickled and no job process sits between the driver and the cell's command, so
a breakpoint in a plugin's hook or in ``sweepkit.run.job`` stops where you expect. The cell's
own command still runs as a child process with the same files and environment as under
any other executor.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from sweepkit.hookspec import hookimpl
from sweepkit.run.executors.base import DONE, Executor, Handle
from sweepkit.run.interrupts import interrupts_at_once
from sweepkit.run.job import CellJob, run_cell


class DebugExecutor(Executor):
    name = "debug"

    def __init__(self):
        self._count = 0

    @property
    def max_parallel(self) -> int:
        return 1

    def take(self, pending: Sequence[CellJob]) -> list[CellJob]:
        return list(pending[:1])

    def submit(self, jobs: Sequence[CellJob]) -> list[Handle]:
        handles = []
        for job in jobs:
            self._count += 1
            job_id = f"debug-{os.getpid()}-{self._count}"
            handles.append(Handle(executor=self.name, job_id=job_id, cell=job))
            # Blocks: this executor's whole point. An interrupt stops the cell, is recorded,
            # and then stops the driver too: it is taken here at once, not after the cell.
            with interrupts_at_once():
                run_cell(job, job_id=job_id, reraise_interrupt=True)
        return handles

    def poll(self, handle: Handle) -> str:
        return DONE

    def cancel(self, handle: Handle) -> None:
        """Nothing to cancel: a debug job has ended by the time its handle exists."""


@hookimpl
def sweep_register_executors(register):
    register("debug", lambda session: DebugExecutor(),
             "in the driver process, one cell at a time (for debugging plugins and hooks)")
