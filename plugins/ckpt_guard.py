"""The guarded checkpoint wipe: a fresh cell's old ``global_step_*`` go, nothing else ever does.

When a checkpoint root is configured (launch key ``ckpt_root``, else ``$CHECKPOINTS_DIR``)
every cell whose target does not take sweepkit's ``{ckpt_dir}`` (a SkyRL command; the
built-in trainer's checkpoints stay in its cell dir) gets its own checkpoint dir
``<root>/<grid>/<cell>``, exported to it as ``CKPT_DIR`` / ``EXPORT_PATH``, so no two
cells share one (a shared dir made later cells silently resume another cell's steps). The
plugin names that dir to sweepkit's plan (``sweep_cell_ckpt_dir``), so a rerun of a cell
with checkpoints there stops and asks for ``--resume`` or ``--rerun``, and ``--resume``
resumes from them, exactly as for checkpoints in the cell dir. When the cell's job starts
it (never earlier: a sweep stopped before it got to a cell leaves that cell's steps),
its dir is wiped only when all of these held as the driver prepared the cell:

- the user asked for a fresh start (``sweep run --rerun``), which is the explicit fresh
  mode the wipe waits for whatever the cell's own ``resume_mode``: a ``"latest"`` cell
  would otherwise go on from the steps ``--rerun`` promised to delete. Without
  ``--rerun`` nothing is deleted, whatever the resume mode;
- the dir resolves (symlinks followed) strictly inside the resolved root;
- the wipe is not switched off (``clean_ckpt=False`` or ``CLEAN_CKPT=0``).

What it deletes (the ``global_step_*`` entries and SkyRL's latest-step pointer: what this
plugin answers ``sweep_cell_checkpoints`` with for the dir, :func:`checkpoint_entries`) is
printed when the cell is prepared, before it is deleted; the job deletes those entries of
the dir as resolved then, and nothing if a symlink has appeared on the way to it since. An
unset or unknown resume mode is an error before any deletion: a script whose resume mode
never arrived once fell back to "fresh" and deleted the checkpoint it was meant to resume
(2026-06-24).

A relative root (``CHECKPOINTS_DIR=ckpts``) is taken relative to the directory ``sweep``
runs in and made absolute here, in the driver, for the plan and for the cell alike: the
cell's process runs in its cell dir, where the same relative path names another place.

The resume mode is this plugin's too: a target whose schema has ``resume_mode`` (the
built-in trainer, a command target that declares it) gets ``"latest"`` in the
``config.json`` of a resumed start and None in a fresh one's (``sweep_cell_start_config``),
the explicit fresh mode this guard waits for.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Optional

from sweepkit.hookspec import hookimpl
from sweepkit.state.checkpoints import DeletionRefused, delete_checkpoints

ROOT_ENV = "CHECKPOINTS_DIR"
CLEAN_ENV = "CLEAN_CKPT"
#: The cell keys that carry the resume mode: the built-in trainer's and SkyRL's Hydra path.
RESUME_KEYS = ("resume_mode", "trainer.resume_mode")
FRESH_MODES = (None, "null")
RESUME_MODES = ("latest", "from_path")
RESUME_KEY = "resume_mode"  # the key of a target's schema that takes the resume mode
LATEST_POINTER = "latest_ckpt_global_step.txt"  # SkyRL's pointer to its latest step
_STEP = re.compile(r"^global_step_(\d+)$")


class CheckpointGuardError(Exception):
    """The wipe was refused; the message says why and what to set."""


class _Missing:
    def __repr__(self) -> str:
        return "<unset>"


#: Pass as ``resume_mode`` when the cell sets none; the guard refuses it.
MISSING = _Missing()


def is_fresh(resume_mode) -> bool:
    """True for an explicitly fresh mode, False for a resume; CheckpointGuardError otherwise."""
    if resume_mode is MISSING:
        raise CheckpointGuardError(
            "resume mode is unset: set resume_mode=None for a fresh run (its old checkpoints "
            "are deleted) or resume_mode='latest' to continue from the latest one")
    if resume_mode in FRESH_MODES:
        return True
    if resume_mode in RESUME_MODES:
        return False
    raise CheckpointGuardError(
        f"resume_mode={resume_mode!r} is not a resume mode: use None (fresh) or one of "
        f"{', '.join(repr(m) for m in RESUME_MODES)}")


def checkpoint_entries(path: Path) -> list[Path]:
    """The ``global_step_*`` entries of a cell's checkpoint dir under the root, in step order,
    then its latest-step pointer. Anything else there (an export, logs) is not a
    checkpoint: it neither stops a plain run nor is deleted by ``--rerun``."""
    path = Path(path)
    if not path.is_dir():
        return []
    steps = sorted((p for p in path.iterdir() if _STEP.match(p.name)), key=lambda p: int(_STEP.match(p.name)[1]))
    pointer = path / LATEST_POINTER
    return steps + ([pointer] if pointer.is_file() else [])


def delete_checkpoint_entries(path: Path) -> list[Path]:
    """Delete the :func:`checkpoint_entries` of ``path``, a dir :func:`guarded_wipe` checked
    and resolved; DeletionRefused when a symlink has since appeared on the way to it. (The
    cell's job does the same with the entries listed when the cell was prepared.)"""
    path = Path(path)
    if path.resolve() != path:
        raise DeletionRefused(f"checkpoint dir {path} now resolves to {path.resolve()}; deleting nothing there")
    return delete_checkpoints(checkpoint_entries(path))


def inside_root(path: Path, root: Path) -> Path:
    """``path`` resolved (symlinks followed); CheckpointGuardError unless strictly inside ``root``."""
    resolved, resolved_root = Path(path).resolve(), Path(root).resolve()
    if resolved == resolved_root or not resolved.is_relative_to(resolved_root):
        via = f" (it resolves to {resolved})" if resolved != Path(path).absolute() else ""
        raise CheckpointGuardError(
            f"checkpoint dir {path}{via} is not inside the checkpoint root {resolved_root}; "
            "refusing to delete anything there: point ckpt_root / $CHECKPOINTS_DIR at the "
            "directory that holds the cells' checkpoints, or remove the symlink")
    return resolved


def guarded_wipe(ckpt_dir: Path, root: Path, resume_mode, *, clean: bool = True,
                 announce: Callable[[str], None] = print) -> Path | None:
    """Check and announce the wipe of a fresh run's old checkpoints in ``ckpt_dir``; return
    the dir, resolved, whose checkpoint entries (:func:`checkpoint_entries`) the cell's job
    deletes as it starts the cell, or None: nothing to delete.

    Checks, before anything is announced: the resume mode (unset or unknown raises, a
    resume deletes nothing), that the dir resolves inside ``root``, then ``clean``. Entries
    that are symlinks are unlinked, never followed.
    """
    if not is_fresh(resume_mode):
        return None
    resolved = inside_root(ckpt_dir, root)
    entries = checkpoint_entries(resolved)
    if not entries:
        return None
    names = ", ".join(entry.name for entry in entries)
    if not clean:
        announce(f"keeping {len(entries)} checkpoint entries in {resolved} ({names}): "
                 f"the wipe is switched off (clean_ckpt=False / {CLEAN_ENV}=0)")
        return None
    announce(f"WARNING: fresh run: deleting {len(entries)} checkpoint entries in {resolved} "
             f"when the cell starts: {names}")
    return resolved


# -- the cell's side --------------------------------------------------------------------------


def takes_sweep_ckpt_dir(cell) -> bool:
    """A target whose argv takes ``{ckpt_dir}`` (the built-in trainer) keeps its checkpoints
    in the cell dir, which sweepkit itself empties for a fresh run."""
    return any("{ckpt_dir}" in part for part in cell.target.argv)


def absolute(path: str) -> Path:
    """A path the user gave (``$VARS`` and ``~`` expanded), relative to the directory sweep runs in."""
    return Path(os.path.expandvars(str(path))).expanduser().absolute()


def checkpoint_root(cell, environ: Mapping[str, str]) -> Path | None:
    """The checkpoint root of a cell whose target keeps checkpoints outside the cell dir."""
    if takes_sweep_ckpt_dir(cell):
        return None
    root = cell.launch().get("ckpt_root") or environ.get(ROOT_ENV)
    return absolute(root) if root else None


def cell_ckpt_dir(cell, root: Path) -> Path:
    """The cell's own checkpoint dir under the root: ``<root>/<grid>/<cell>``."""
    return Path(root) / cell.grid_name / cell.name


def ckpt_dir_of(cell, environ: Mapping[str, str]) -> Path | None:
    """The cell's checkpoint dir outside its cell dir (None: it has none). The plan, the
    wipe, the cell's env and the SkyRL overrides all ask this one function."""
    root = checkpoint_root(cell, environ)
    return cell_ckpt_dir(cell, root) if root is not None else None


def export_dir(cell, environ: Mapping[str, str]) -> Path | None:
    """Where the final model is exported: ``export_path``, else ``<ckpt dir>/export``."""
    explicit = cell.launch().get("export_path")
    if explicit:
        return absolute(explicit)
    directory = ckpt_dir_of(cell, environ)
    return directory / "export" if directory is not None else None


def resume_mode_of(cell):
    for key in RESUME_KEYS:
        if key in cell.config:
            return cell.config[key]
    return MISSING


def clean_enabled(cell, environ: Mapping[str, str]) -> bool:
    if environ.get(CLEAN_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    return bool(cell.launch().get("clean_ckpt", True))


LAUNCH_KEYS = (
    ("ckpt_root", Optional[str], None,
     f"root of the cells' checkpoint dirs <root>/<grid>/<cell> (None: ${ROOT_ENV}, else the "
     "cell dir's ckpt/)"),
    ("clean_ckpt", bool, True,
     f"delete a fresh cell's old global_step_* before it starts (also off with {CLEAN_ENV}=0)"),
    ("export_path", Optional[str], None, "where the final model is exported (None: <ckpt dir>/export)"),
)


@hookimpl
def sweep_register_keys(register):
    for name, tp, default, doc in LAUNCH_KEYS:
        register(name, tp, default, doc)


@hookimpl
def sweep_validate_cell(cell, session):
    root = checkpoint_root(cell, os.environ)
    if root is None:
        return []
    errors = []
    try:
        is_fresh(resume_mode_of(cell))
    except CheckpointGuardError as error:
        errors.append(f"{error} (the cell's checkpoints live in {cell_ckpt_dir(cell, root)})")
    try:
        inside_root(cell_ckpt_dir(cell, root), root)
    except CheckpointGuardError as error:
        errors.append(str(error))
    return errors


@hookimpl
def sweep_cell_ckpt_dir(cell, session):
    return ckpt_dir_of(cell, os.environ)


@hookimpl
def sweep_cell_checkpoints(cell, directory, session):
    """In the cell's own dir under the root (as named, or as resolved when prepared): its
    ``global_step_*`` and latest-step pointer; elsewhere, no answer."""
    own = ckpt_dir_of(cell, os.environ)
    if own is None or Path(directory).resolve() != own.resolve():
        return None
    return checkpoint_entries(directory)


@hookimpl
def sweep_checkpoint_pointer(cell, entry, session):
    """SkyRL's ``latest_ckpt_global_step.txt`` in the cell's own dir under the root: it holds N."""
    own = ckpt_dir_of(cell, os.environ)
    if own is None or Path(entry).name != LATEST_POINTER or Path(entry).parent.resolve() != own.resolve():
        return None
    return "{}"


@hookimpl
def sweep_cell_start_config(cell, config, resume, session):
    if cell.target.schema is None or RESUME_KEY not in cell.target.schema:
        return {}
    return {RESUME_KEY: "latest" if resume else None}


@hookimpl
def sweep_prepare_cell_dir(cell, cell_dir, fresh, rerun, session):
    directory = ckpt_dir_of(cell, os.environ)
    if directory is None:
        return []

    def announce(line: str) -> None:
        session.console.print(f"{cell.nodeid}: {line}", markup=False)

    # sweepkit's plan decides first: a planned resume never deletes, whatever the cell says;
    # a fresh plan deletes only on --rerun. Checkpoints that appeared after a plain run's
    # plan found none are kept: nobody asked to lose them.
    wipe = None
    if rerun:
        # --rerun is the explicit fresh start the wipe waits for, whatever the cell's own
        # resume_mode (a 'latest' cell would otherwise go on from the steps --rerun promised
        # to delete, while sweepkit started its metrics over).
        wipe = guarded_wipe(directory, checkpoint_root(cell, os.environ), None,
                            clean=clean_enabled(cell, os.environ), announce=announce)
    elif fresh and (kept := checkpoint_entries(directory)):
        announce(f"keeping {len(kept)} checkpoint entries in {directory} "
                 f"({', '.join(entry.name for entry in kept)}): only --rerun deletes them")
    directory.mkdir(parents=True, exist_ok=True)
    return [wipe] if wipe is not None else []


@hookimpl
def sweep_cell_env(cell, session):
    directory = ckpt_dir_of(cell, os.environ)
    if directory is None:
        return {}
    env = {"CKPT_DIR": str(directory), "EXPORT_PATH": str(export_dir(cell, os.environ))}
    root = os.environ.get(ROOT_ENV)
    if root and absolute(root) != Path(os.path.expandvars(root)).expanduser():
        env[ROOT_ENV] = str(absolute(root))  # a relative root the cell inherits would name another dir there
    return env
