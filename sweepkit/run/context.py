"""What one ``sweep run`` decides once: each cell's plan, and the executor.

Validation (the runner's ``sweep_validate_cell``), ``--dry-run`` and the run itself all
read the plans of one :class:`RunContext`, kept in the session's stash: each cell is
planned once per command, from its state on disk as validation found it. The executor is
chosen once (``--executor``, else ``sweep_choose_executor``) and made once; asking
whether a job of an earlier submission is still queued uses that same executor where the
names match, and makes any other executor once, on first need. What an executor derives
from a cell (a cluster job's resources) it asks once, as it binds the cell's job.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from sweepkit.errors import UsageError
from sweepkit.run import plan as pl
from sweepkit.run.executors.base import DONE, Executor
from sweepkit.state import records as st


@attrs.define
class RunContext:
    session: object
    plans: dict[str, pl.Plan] = attrs.field(factory=dict)  # by node id
    executors: dict[str, Executor | None] = attrs.field(factory=dict)  # by name; None: cannot be made here
    chosen: str | None = None

    STASH_KEY: ClassVar[str] = "runner.context"

    @classmethod
    def of(cls, session) -> "RunContext":
        """The context of the session's command (made on first need)."""
        return session.stash.setdefault(cls.STASH_KEY, cls(session))

    # -- the plan of each cell ---------------------------------------------------------

    def plan(self, cell) -> pl.Plan:
        """The cell's plan, made on its first need (PlanError: the options given cannot run it)."""
        if cell.nodeid not in self.plans:
            self.plans[cell.nodeid] = self.plan_now(cell)
        return self.plans[cell.nodeid]

    def plan_now(self, cell, *, rerun: bool | None = None) -> pl.Plan:
        """A plan of the cell from its state on disk now, not kept: for a cell whose state
        another driver changed since (a take-over). ``rerun`` overrides the option."""
        options, session = self.session.options, self.session
        return pl.plan_cell(cell, session.runs_dir, rerun=options.rerun if rerun is None else rerun,
                            resume=options.resume, queued=self.queued,
                            holding=lambda: pl.holding_checkpoints(cell, session.runs_dir, session),
                            preview=bool(getattr(options, "dry_run", False)) and rerun is None)

    # -- executors ---------------------------------------------------------------------

    @property
    def executor_name(self) -> str:
        """The run's executor: ``--executor``, else the plugins' choice (asked once)."""
        if self.chosen is None:
            session = self.session
            self.chosen = session.options.executor or session.hook.sweep_choose_executor(session=session)
        return self.chosen

    @property
    def executor(self) -> Executor:
        """The run's executor, made once; UsageError for a name no plugin registered."""
        session, name = self.session, self.executor_name
        if self.executors.get(name) is None:
            spec = session.registry.executors.get(name)
            if spec is None:
                known = ", ".join(sorted(session.registry.executors)) or "none"
                raise UsageError(f"--executor {name}: no such executor (registered: {known})")
            self.executors[name] = spec.factory(session)
        return self.executors[name]

    def _probe(self, name: str) -> Executor | None:
        if name not in self.executors:
            spec = self.session.registry.executors.get(name)
            try:
                self.executors[name] = spec.factory(self.session) if spec is not None else None
            except UsageError:
                self.executors[name] = None  # cannot be asked here (no sbatch): not queued
        return self.executors[name]

    def queued(self, submission: st.Submission) -> bool:
        """``plan_cell``'s ``queued``: whether the executor that submitted a job still has it
        in its queue."""
        executor = self._probe(submission.executor)
        handle = executor.attach(submission.job_id) if executor is not None else None
        return handle is not None and executor.poll(handle) != DONE
