"""``sweep clean --keep best|last|none [--by COL] [--yes]``: free a finished sweep's checkpoints.

For each selected finished cell (:mod:`sweepkit.end.cells`) the checkpoint entries that
would go are listed with their sizes and the total freed; without ``--yes`` nothing is
deleted. What goes:

- ``--keep best`` / ``--keep last``: every ``global_step_N`` the plugins name as a checkpoint
  (``sweep_cell_checkpoints``) but the kept one (:mod:`sweepkit.end.pick`). A latest-step
  pointer (the plugins say which entries are pointers and how they name a step,
  ``sweep_checkpoint_pointer``: the trainer's ``latest``, SkyRL's
  ``latest_ckpt_global_step.txt``) that names a deleted step is rewritten, before anything
  is deleted, to name the kept one;
- ``--keep none``: every entry the plugins name as a checkpoint, pointers too.

Nothing else is touched: not ``metrics.jsonl``, logs or reports, nor the files the plugins
do not call checkpoints (the trainer's ``reference.safetensors``, ``run_info.json``, its final
``export/``). Symlinks are never followed: a ``ckpt/`` that is a symlink out of its cell dir,
or a plugin's checkpoint dir that is itself a symlink, is refused (nothing is deleted
there); a ``global_step_N`` that is a symlink is unlinked, its target left whole (and counted
as 0 bytes freed). A cell's ``.lock`` is held while its entries are deleted, so no run
starts meanwhile; the cleaning is recorded in its ``state.json`` (``transitions.cleaned``),
its state unchanged, and ``sweep status`` shows it. A ``sweep run --resume`` of a cell whose
every checkpoint went (``--keep none``) is refused by the plan (:mod:`sweepkit.run.plan`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import attrs

from sweepkit.end.cells import human_bytes, refusal, selected_cells
from sweepkit.end.pick import Choice, checkpoint_entries, column_specs, pick, step_of
from sweepkit.errors import ExitCode, UsageError
from sweepkit.state import checkpoints as ck
from sweepkit.state import records as st
from sweepkit.state import transitions
from sweepkit.state.files import CellLock, write_atomic

KEEP = ("best", "last", "none")
_POINTED = re.compile(r"^(?:global_step_)?(\d+)$")


@attrs.frozen(kw_only=True)
class CleanPlan:
    """What cleaning one cell deletes and rewrites."""

    cell: object
    directory: Path
    kept: Choice | None
    doomed: tuple[Path, ...] = ()
    rewrites: tuple[tuple[Path, str], ...] = ()  # (pointer, its new text)
    sizes: tuple[int, ...] = ()

    @property
    def freed(self) -> int:
        return sum(self.sizes)


def entry_bytes(entry: Path) -> int:
    """The bytes deleting ``entry`` frees: its regular files' sizes, symlinks never followed (a
    symlink entry frees nothing of its target)."""
    if entry.is_symlink():
        return 0
    if entry.is_file():
        return entry.stat().st_size
    total = 0
    for root, _, files in os.walk(entry):  # followlinks=False: a linked dir is not walked
        for name in files:
            path = Path(root) / name
            if not path.is_symlink():
                total += path.lstat().st_size
    return total


def _safe_dirs(session, cell) -> dict[Path, list[Path]]:
    """The cell's checkpoint dirs that hold checkpoints, resolved, with their entries there;
    ValueError (the cell is refused) for a dir reached through a symlink out of its own places."""
    cell_dir = st.cell_dir(session.runs_dir, cell)
    safe = {}
    for directory, entries in checkpoint_entries(cell, session).items():
        if not entries:
            continue
        if directory == cell_dir / st.CKPT_DIR:
            if ck.ckpt_link_refusal(cell_dir) is not None:
                raise ValueError(f"its checkpoint dir {directory} is a symlink to {directory.resolve()}, outside "
                                 "its cell dir; sweep clean deletes nothing through it")
        elif directory.is_symlink():
            raise ValueError(f"its checkpoint dir {directory} is a symlink (to {directory.resolve()}); sweep clean "
                             "deletes nothing through it")
        resolved = directory.resolve()
        safe[resolved] = [resolved / entry.name for entry in entries]
    return safe


def _pointer_rewrite(pointer: Path, names: str, kept: Choice | None, doomed_steps: set[int]) -> str | None:
    """The new text of a latest-step pointer that names a step about to go, or None to leave it;
    ``names`` is how it names a step (``sweep_checkpoint_pointer``'s format)."""
    if pointer.is_symlink() or not pointer.is_file():
        return None
    match = _POINTED.match(pointer.read_text().strip())
    if match is None or int(match.group(1)) not in doomed_steps:
        return None
    return names.format(kept.step) + "\n"


def plan_clean(session, cell, keep: str, by: str | None, specs) -> CleanPlan:
    """What cleaning ``cell`` would do; ValueError for a cell whose dirs are refused, UsageError
    for one without a checkpoint to keep as asked."""
    safe = _safe_dirs(session, cell)
    directory = st.cell_dir(session.runs_dir, cell)
    if not safe:
        return CleanPlan(cell=cell, directory=directory, kept=None)
    kept = None if keep == "none" else pick(cell, session, by=by, last=keep == "last", specs=specs)
    doomed, rewrites = [], []
    for base, entries in safe.items():
        if kept is None:
            doomed += entries
            continue
        steps = {step_of(entry) for entry in entries} - {None}
        doomed_here = [entry for entry in entries if step_of(entry) is not None and step_of(entry) != kept.step]
        doomed += doomed_here
        gone = {step_of(entry) for entry in doomed_here}
        for entry in entries:
            names = session.hook.sweep_checkpoint_pointer(cell=cell, entry=entry, session=session)
            if names is not None:
                text = _pointer_rewrite(entry, names, kept, gone)
                if text is not None and kept.step in steps:
                    rewrites.append((entry, text))
                elif text is not None:
                    doomed.append(entry)  # it names a step that goes, in a dir that keeps none
    return CleanPlan(cell=cell, directory=directory, kept=kept, doomed=tuple(doomed), rewrites=tuple(rewrites),
                     sizes=tuple(entry_bytes(entry) for entry in doomed))


def apply(plan: CleanPlan, keep: str) -> bool:
    """Delete what ``plan`` lists, holding the cell's ``.lock``, and record it; False (nothing
    deleted) when the cell started or stopped being finished since it was planned."""
    lock = CellLock(plan.directory)
    if not lock.acquire(blocking=False):
        return False
    try:
        state = st.read_state(plan.directory)
        if state is None or state.state not in st.FINISHED or state.previous is not None:
            return False
        for pointer, text in plan.rewrites:  # first: a kill mid-way leaves it naming a step that is there
            write_atomic(pointer, lambda temp, text=text: temp.write_text(text))
        ck.delete_checkpoints(plan.doomed)
        by = keep if plan.kept is None or plan.kept.metric is None else plan.kept.metric.name
        transitions.cleaned(plan.directory, kept=plan.kept.step if plan.kept else None,
                            deleted=[entry.name for entry in plan.doomed], freed_bytes=plan.freed, by=by)
        return True
    finally:
        lock.release()


def clean_command(session) -> int:
    options = session.options
    keep, yes = options.keep, options.yes
    if options.by and keep != "best":
        raise UsageError(f"--by {options.by}: only --keep best picks by a metric (got --keep {keep})")
    cells = selected_cells(session)
    specs = column_specs(session)
    plans, refused, errors = [], [], []
    for cell in cells:
        why = refusal(session, cell)
        if why is None:
            try:
                plans.append(plan_clean(session, cell, keep, options.by, specs))
                continue
            except ValueError as error:
                why = str(error)
            except UsageError as error:
                errors.extend(error.lines)
                continue
        refused.append((cell, why))
    if errors:
        raise UsageError(*errors, "nothing was deleted")
    show = session.display_path
    for cell, why in refused:
        session.err_console.print(f"REFUSED  {cell.nodeid}: {why}; nothing deleted", markup=False)
    total, count = 0, 0
    for plan in plans:
        nodeid = plan.cell.nodeid
        kept = f"keeping {plan.kept.describe()}" if plan.kept else "keeping no checkpoint"
        if not plan.doomed:
            session.console.print(f"{nodeid}: nothing to delete ({kept if plan.kept else 'no checkpoints'})",
                                  markup=False)
            continue
        if yes and not apply(plan, keep):
            session.err_console.print(f"REFUSED  {nodeid}: started or changed since it was read; nothing deleted",
                                      markup=False)
            refused.append((plan.cell, "changed"))
            continue
        verb = "deleted" if yes else "would delete"
        session.console.print(f"{nodeid}: {kept}", markup=False)
        for entry, size in zip(plan.doomed, plan.sizes):
            session.console.print(f"  {verb} {show(entry)}  {human_bytes(size)}", markup=False)
        for pointer, text in plan.rewrites:
            session.console.print(f"  {'rewrote' if yes else 'would rewrite'} {show(pointer)} -> {text.strip()}",
                                  markup=False)
        total += plan.freed
        count += len(plan.doomed)
    freed = "freed" if yes else "would be freed"
    summary = f"{count} checkpoint entr{'y' if count == 1 else 'ies'}, {human_bytes(total)} {freed}"
    session.console.print(summary if yes else f"{summary}; add --yes to delete", markup=False)
    return ExitCode.CELLS_FAILED if refused else ExitCode.OK
