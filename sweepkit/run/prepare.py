"""What the driver does with a planned cell before its executor takes it, and when it gives
the cell back unstarted.

Preparing a cell (:func:`prepare`) marks it pending under this driver
(:func:`sweepkit.state.transitions.pending`), makes its dir, its ``ckpt/`` and, for a cell
with no earlier run there, its ``cell.json`` (so that ``status`` and ``report`` find it
while it waits), and asks the plugins which checkpoint dirs outside the cell dir a fresh
start empties (``sweep_prepare_cell_dir``) and which of their entries are checkpoints
(``sweep_cell_checkpoints``): those entries go with the job, which deletes them as it
starts the cell. Nothing is deleted here, and ``config.json`` is the job's to write.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from sweepkit.run import plan as pl
from sweepkit.run.job import CellJob
from sweepkit.state import files as fs
from sweepkit.state import records as st
from sweepkit.state import transitions as tr


def mark_pending(plan: pl.Plan, driver: Path) -> st.CellState | None:
    """The cell is this driver's to run (its lock file ``driver``); the state written, or
    None when a job took the cell's lock meanwhile."""
    cell = plan.cell
    return tr.pending(plan.directory, nodeid=cell.nodeid, config_hash=cell.config_hash(), profile=cell.profile,
                      fresh=plan.action == pl.FRESH, driver=driver)


def write_cell_files(plan: pl.Plan, state: st.CellState) -> None:
    """Create the cell dir, its ``ckpt/`` and its ``cell.json``, unless the dir holds an
    earlier run that a fresh attempt replaces (``state.previous``): that run's files
    describe it until the job starts the attempt, which writes them then."""
    directory = plan.directory
    directory.mkdir(parents=True, exist_ok=True)
    if state.previous is None:
        fs.write_json(directory / st.CELL_FILE, st.cell_record(plan.cell))
    if not (directory / st.CKPT_DIR).is_symlink():
        (directory / st.CKPT_DIR).mkdir(exist_ok=True)


def prepare(plan: pl.Plan, job: CellJob, driver: Path, session) -> CellJob | None:
    """Mark the cell pending and ready its dir; the job to submit (with the checkpoint
    entries its fresh start deletes), or None when a job runs the cell already."""
    state = mark_pending(plan, driver)
    if state is None:
        return None
    write_cell_files(plan, state)
    answers = session.hook.sweep_prepare_cell_dir(cell=plan.cell, cell_dir=plan.directory,
                                                  fresh=plan.action == pl.FRESH, rerun=plan.rerun, session=session)
    wiped = [Path(path) for paths in answers for path in paths or ()]
    if not wiped or job.fresh is None:
        return job
    entries = [entry for directory in wiped for entry in pl.checkpoints_in(plan.cell, directory, session)]
    return attrs.evolve(job, fresh=attrs.evolve(job.fresh, checkpoint_entries=entries))


def withdraw(plan: pl.Plan, driver: Path) -> None:
    """Give back a cell this driver took and never got started: its earlier run's state
    again, else cancelled (:func:`sweepkit.state.transitions.withdrawn`)."""
    tr.withdrawn(plan.directory, driver=driver)
