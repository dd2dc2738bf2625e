"""Deleting a cell's checkpoints, which only the job of a fresh start does (``--rerun``).

What sweepkit itself knows of checkpoints is where they are: the cell dir's own ``ckpt/``,
emptied whole on ``--rerun`` (never through a ``ckpt/`` linked out of the cell dir), and
the entries a plugin named in a directory of its own. Which entries of a directory are
checkpoints is the plugins' to say (``sweep_cell_checkpoints``: the built-in trainer's
files that are none, SkyRL's ``global_step_*`` and latest-step pointer); the driver asks
them when it prepares the cell, and hands the job the entries to delete.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from sweepkit.state.files import CKPT_DIR


class DeletionRefused(Exception):
    """Deleting would reach outside the cell's own directories; the message says where."""


def ckpt_link_refusal(directory: Path) -> str | None:
    """Why the cell's ``ckpt/`` must not be emptied: it is a symlink whose target lies
    outside the cell dir (a directory other cells or other files share); None when it is
    the cell's own."""
    ckpt = Path(directory) / CKPT_DIR
    if not ckpt.is_symlink():
        return None
    target, home = ckpt.resolve(), Path(directory).resolve()
    if target != home and target.is_relative_to(home):
        return None
    return (f"its checkpoint dir {ckpt} is a symlink to {target}, outside its cell dir; --rerun deletes "
            f"nothing through it: remove the link (rm {ckpt}) to start over in an empty ckpt/, and "
            "delete what you mean to in its target yourself")


def _delete(entries: Iterable[Path]) -> None:
    for entry in entries:  # an entry that is a symlink goes itself; its target is not touched
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)


def wipe_checkpoints(directory: Path) -> list[Path]:
    """Empty the cell's own ``ckpt/`` (never anything outside the cell dir: DeletionRefused
    for a ``ckpt/`` linked out of it); returns what was deleted so the caller can announce it."""
    refusal = ckpt_link_refusal(directory)
    if refusal is not None:
        raise DeletionRefused(refusal)
    ckpt = Path(directory) / CKPT_DIR
    if not ckpt.is_dir():
        return []
    deleted = sorted(ckpt.iterdir())
    _delete(deleted)
    return deleted


def delete_checkpoints(entries: Iterable[Path]) -> list[Path]:
    """Delete checkpoint entries of directories outside the cell dir, which a plugin checked
    and resolved when the cell was prepared (``sweep_prepare_cell_dir``), in their order;
    those gone since are skipped. DeletionRefused, before anything is deleted, when a
    symlink has since appeared on the way to one of their directories."""
    entries = [Path(entry) for entry in entries]
    for directory in dict.fromkeys(entry.parent for entry in entries):
        if directory.resolve() != directory:
            raise DeletionRefused(f"checkpoint dir {directory} now resolves to {directory.resolve()}; "
                                  "deleting nothing there")
    present = [entry for entry in entries if entry.exists() or entry.is_symlink()]
    _delete(present)
    return present
