"""A cell's state on disk: ``runs/<grid>/<cell>/`` and the files in it.

Every write goes to a temporary file in the same directory and is moved over the old one
with ``os.replace``, so a reader (another driver, ``sweep status``) sees the old file or
the new one, never half of one. Read-modify-write of ``state.json`` happens under
``.state.lock``; ``.lock`` is held by the process that runs the cell for its whole life, so
"is this cell running?" is answered by trying that lock, which the kernel frees when the
holder dies however it dies.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

STATES = ("pending", "submitted", "running", "completed", "failed", "cancelled")
FINISHED = ("completed", "failed", "cancelled")

CELL_FILE = "cell.json"
CONFIG_FILE = "config.json"
STATE_FILE = "state.json"
LOCK_FILE = ".lock"
STATE_LOCK_FILE = ".state.lock"
STDOUT_FILE = "stdout.log"
STDERR_FILE = "stderr.log"
METRICS_FILE = "metrics.jsonl"
CKPT_DIR = "ckpt"
DRIVERS_DIR = ".drivers"  # in the runs dir: drivers' locks and detached drivers' logs


def _tuple(value) -> tuple:
    return tuple(value or ())


def _from_json(cls, data: Mapping[str, Any]):
    """An attrs record from its JSON form; keys a newer sweepkit added are ignored."""
    fields = {field.name for field in attrs.fields(cls)}
    return cls(**{key: value for key, value in data.items() if key in fields})


@attrs.frozen(kw_only=True)
class Attempt:
    """One start of a cell's process (a fresh run, a retry or a resume)."""

    n: int
    executor: str
    job_id: str | None = None
    host: str | None = None
    pid: int | None = None
    resume: bool = False
    devices: str | None = None  # the CUDA_VISIBLE_DEVICES the cell's process got
    started: float | None = None
    ended: float | None = None
    returncode: int | None = None
    failure: str | None = None
    failure_class: str | None = None  # sweepkit.run.failures: set once the job's final state is known
    # What the job deleted of the cell's earlier run before this attempt started (--rerun).
    deleted: tuple[str, ...] = attrs.field(default=(), converter=_tuple)



@attrs.frozen(kw_only=True)
class Submission:
    """The job a driver last handed to an executor for this cell.

    ``token`` is written before the job starts and handed to the job; a job that finds a
    different token once it holds the cell lock was superseded by a later driver and exits
    without running anything (see ``sweepkit.run.job``).
    """

    executor: str
    token: str
    job_id: str | None = None
    submitted: float = 0.0
    resume: bool = False



@attrs.frozen(kw_only=True)
class CellState:
    """Contents of ``state.json``."""

    nodeid: str
    state: str = attrs.field(validator=attrs.validators.in_(STATES))
    config_hash: str
    profile: str | None = None
    attempts: tuple[Attempt, ...] = attrs.field(default=(), converter=_tuple)
    submission: Submission | None = None
    # A pending cell's driver: the path of the lock it holds while it lives (DriverLock).
    driver: str | None = None
    # Set while a fresh attempt waits to start over an earlier run: the state that run was
    # in. Until the job starts the attempt the cell's files are that run's (nothing is
    # deleted before), ``config_hash`` and ``profile`` still describe them, status and report
    # show none of their numbers, and a driver that gives up the attempt before it starts
    # puts this state back.
    previous: str | None = None
    updated: float = 0.0

    @property
    def last_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def to_json(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "state": self.state,
            "config_hash": self.config_hash,
            "profile": self.profile,
            "attempts": [attrs.asdict(attempt) for attempt in self.attempts],
            "submission": attrs.asdict(self.submission) if self.submission else None,
            "driver": self.driver,
            "previous": self.previous,
            "updated": self.updated,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, source: str = STATE_FILE) -> "CellState":
        missing = [key for key in ("nodeid", "state", "config_hash") if key not in data]
        if missing:
            raise ValueError(f"{source}: missing keys {', '.join(missing)}")
        submission = data.get("submission")
        return cls(
            nodeid=data["nodeid"],
            state=data["state"],
            config_hash=data["config_hash"],
            profile=data.get("profile"),
            attempts=[_from_json(Attempt, attempt) for attempt in data.get("attempts") or ()],
            submission=_from_json(Submission, submission) if submission else None,
            driver=data.get("driver"),
            previous=data.get("previous"),
            updated=data.get("updated", 0.0),
        )


def cell_dir(runs_dir: Path, cell) -> Path:
    """Where a cell's files live: ``<runs_dir>/<grid name>/<cell name>``."""
    return Path(runs_dir) / cell.grid_name / cell.name


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically: temp file in the same dir, fsync, ``os.replace``."""
    path = Path(path)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temp, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


class DamagedFile(ValueError):
    """A run-state file that exists but cannot be read back: empty, cut short (a full disk, a
    copy that stopped), or not the record it should be. ``reason`` says which."""

    def __init__(self, path: Path, reason: str):
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def read_json(path: Path) -> Any | None:
    """The JSON value of ``path``; None when there is no such file; DamagedFile when it cannot be read."""
    try:
        data = Path(path).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not data.strip():
        raise DamagedFile(path, "empty")
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DamagedFile(path, f"not valid JSON ({error})") from None


def load_state(directory: Path) -> CellState | None:
    """The cell's ``state.json``; None when there is none; DamagedFile when it cannot be read."""
    path = Path(directory) / STATE_FILE
    data = read_json(path)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise DamagedFile(path, "not a state record: not a JSON object")
    try:
        return CellState.from_json(data, source=str(path))
    except (ValueError, TypeError, AttributeError) as error:
        raise DamagedFile(path, f"not a state record: {str(error).removeprefix(f'{path}: ')}") from None


def read_state(directory: Path) -> CellState | None:
    """The cell's state, or None when it has none or its ``state.json`` is damaged (then
    :func:`state_problem` says why, and a fresh run, ``--rerun``, writes a new one)."""
    try:
        return load_state(directory)
    except DamagedFile:
        return None


def state_problem(directory: Path) -> DamagedFile | None:
    """Why the cell's ``state.json`` cannot be read, or None."""
    try:
        load_state(directory)
    except DamagedFile as problem:
        return problem
    return None


def write_state(directory: Path, state: CellState) -> None:
    write_json(Path(directory) / STATE_FILE, attrs.evolve(state, updated=time.time()).to_json())


@contextlib.contextmanager
def _flock(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            yield False
            return
        yield True
    finally:
        os.close(fd)


def update_state(directory: Path, change: Callable[[CellState | None], CellState | None]) -> CellState | None:
    """Read, change and write ``state.json`` under ``.state.lock``; ``change`` returning
    None leaves the file as it is."""
    directory = Path(directory)
    with _flock(directory / STATE_LOCK_FILE):
        new = change(read_state(directory))
        if new is not None:
            write_state(directory, new)
        return new


def is_locked(directory: Path) -> bool:
    """True while some process holds the cell's ``.lock`` (that is, runs the cell)."""
    return is_held(Path(directory) / LOCK_FILE)


def lock_holder(directory: Path) -> str:
    """Who holds a cell's lock, as its lock file says ("pid N on HOST")."""
    try:
        host, pid = (Path(directory) / LOCK_FILE).read_text().split()
        return f"pid {pid} on {host}"
    except (OSError, ValueError):
        return "lock held"


def is_held(lock: Path) -> bool:
    """True while some process holds the ``flock`` on the file ``lock``. Never creates it:
    a lock file its owner removed on release stays gone."""
    try:
        fd = os.open(lock, os.O_RDONLY)  # any reader may ask
    except FileNotFoundError:
        return False
    try:
        # Shared: it conflicts with the holder's exclusive lock all the same, and needs only
        # read access (on NFS, flock is emulated with fcntl locks, and an exclusive one
        # needs the file open for writing).
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EAGAIN, errno.EACCES):
            return True
        raise
    finally:
        os.close(fd)
    return False


class FileLock:
    """An exclusive ``flock`` on a file that records its holder's host and pid."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, *, blocking: bool = True) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        # Record who holds it, for status output; the lock itself is the truth.
        os.ftruncate(fd, 0)
        os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        self._fd = fd
        return True

    @property
    def fd(self) -> int:
        if self._fd is None:
            raise RuntimeError(f"{self.path}: not held")
        return self._fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class CellLock(FileLock):
    """The exclusive ``flock`` on ``<cell dir>/.lock``, held for the whole life of a run."""

    def __init__(self, directory: Path):
        super().__init__(Path(directory) / LOCK_FILE)


class DriverLock(FileLock):
    """A ``sweep run`` driver's own lock, ``<runs dir>/.drivers/<host>-<pid>-<random>.lock``, held
    while it lives: a cell it marked pending, and that no job took, is abandoned once the
    lock is free (the driver was killed before it got to the cell)."""

    def __init__(self, runs_dir: Path):
        # The random part: a later driver that gets the same pid must not hold this path.
        name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.lock"
        super().__init__(Path(runs_dir) / DRIVERS_DIR / name)

    def release(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
        super().release()


LATEST_POINTER = "latest_ckpt_global_step.txt"  # SkyRL's pointer to its latest step
_STEP = re.compile(r"^global_step_(\d+)$")


def checkpoint_entries(path: Path) -> list[Path]:
    """The ``global_step_*`` entries of a checkpoint dir that a plugin keeps outside the
    cell dir, in step order, then its latest-step pointer. Anything else there (an export,
    logs) is not a checkpoint: it neither stops a plain run nor is deleted by ``--rerun``."""
    path = Path(path)
    if not path.is_dir():
        return []
    steps = sorted((p for p in path.iterdir() if _STEP.match(p.name)), key=lambda p: int(_STEP.match(p.name)[1]))
    pointer = path / LATEST_POINTER
    return steps + ([pointer] if pointer.is_file() else [])


# What the built-in trainer writes in its checkpoint dir that is no checkpoint to resume
# from: written before its first step (so a run stopped before it left nothing to resume),
# or the final export.
NOT_CHECKPOINTS = frozenset({"run_info.json", "reference.safetensors", "export"})
WRITING_PREFIX = ".tmp-"  # the trainer's half-written files, cleaned up when it next starts


def has_checkpoints(path: Path) -> bool:
    """True for a cell's ``ckpt/`` that holds checkpoints: anything but :data:`NOT_CHECKPOINTS`
    (a command target's checkpoints may have any name)."""
    path = Path(path)
    return path.is_dir() and any(entry.name not in NOT_CHECKPOINTS and not entry.name.startswith(WRITING_PREFIX)
                                 for entry in path.iterdir())


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


def _delete(entries: list[Path]) -> None:
    for entry in entries:  # an entry that is a symlink goes itself; its target is not touched
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


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


def delete_checkpoint_entries(path: Path) -> list[Path]:
    """Delete the :func:`checkpoint_entries` of a checkpoint dir outside the cell dir, which
    a plugin checked and resolved when the cell was prepared (``sweep_prepare_cell_dir``);
    DeletionRefused when a symlink has since appeared on the way to it."""
    path = Path(path)
    if path.resolve() != path:
        raise DeletionRefused(f"checkpoint dir {path} now resolves to {path.resolve()}; deleting nothing there")
    entries = checkpoint_entries(path)
    _delete(entries)
    return entries


def effective_state(directory: Path, state: CellState | None) -> str:
    """The state to show and act on: a ``running`` state whose lock is free is a run that
    died without recording its end ("interrupted"); a ``pending`` one whose driver is gone
    will never be started by it ("abandoned"; the next ``sweep run`` starts it)."""
    if state is None:
        return "pending"
    if state.state == "running" and not is_locked(directory):
        return "interrupted"
    if state.state == "pending" and state.driver and not is_held(Path(state.driver)):
        return "abandoned"
    return state.state


def outcome(state: str, xfail: Mapping[str, Any] | None) -> str:
    """pytest's words for a cell's result: passed, failed, xfailed, xpassed, xpassed-strict
    (an XPASS of a ``strict=True`` xfail, which fails the run), or the state itself while
    the cell has no result yet (pending, submitted, running, interrupted, cancelled)."""
    if state == "completed":
        if xfail is None:
            return "passed"
        return "xpassed-strict" if xfail.get("strict") else "xpassed"
    if state in ("failed", "interrupted"):
        return "xfailed" if xfail is not None else ("failed" if state == "failed" else "interrupted")
    return state


FAILING_OUTCOMES = ("failed", "interrupted", "cancelled", "xpassed-strict")


def last_failed(runs_dir: Path, cells) -> list:
    """The cells whose last run did not succeed (pytest's ``--lf``): failed, cancelled or
    interrupted, or whose ``state.json`` is damaged; an expected failure (xfail) does not count."""
    picked = []
    for cell in cells:
        directory = cell_dir(runs_dir, cell)
        state = read_state(directory)
        if state is None:
            if state_problem(directory) is not None:
                picked.append(cell)  # its record is damaged: that it passed is not known
            continue
        effective = effective_state(directory, state)
        if effective in ("failed", "cancelled", "interrupted") and cell.xfail is None:
            picked.append(cell)
    return picked


def cell_record(cell) -> dict[str, Any]:
    """What ``cell.json`` holds: everything ``sweep status`` and ``sweep report`` need to
    describe a cell without importing its grid file."""
    xfail = cell.xfail
    return {
        **cell.to_json(),
        "xfail": None if xfail is None else {
            "reason": xfail.reason,
            "strict": bool(xfail.kwargs.get("strict", False)),
        },
    }


def read_cell_record(directory: Path) -> dict[str, Any] | None:
    """The cell's ``cell.json``; None when there is none; DamagedFile when it cannot be read."""
    path = Path(directory) / CELL_FILE
    record = read_json(path)
    if record is not None and not isinstance(record, dict):
        raise DamagedFile(path, "not a cell record: not a JSON object")
    return record


def grid_dirs(runs_dir: Path) -> list[Path]:
    """The grid directories of a runs dir (not its ``.drivers`` and such)."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return []
    return sorted(path for path in runs_dir.iterdir() if path.is_dir() and not path.name.startswith("."))


def cell_dirs(grid_dir: Path) -> list[Path]:
    """The cell directories of a grid directory: those with a ``cell.json``."""
    return sorted(path.parent for path in Path(grid_dir).glob(f"*/{CELL_FILE}"))


def find_cell_dirs(runs_dir: Path, specs) -> list[Path]:
    """Cell dirs named by ``specs`` without importing any grid file. A spec is a grid file
    (``grids/x.py``, its stem names ``runs/x``), a node id (``grids/x.py::cell``), a
    directory under the runs dir, or a ``Cell``; no specs means every grid of the runs dir.
    Raises ValueError naming a spec that matches nothing on disk."""
    runs_dir = Path(runs_dir)
    if not specs:
        return [directory for grid in grid_dirs(runs_dir) for directory in cell_dirs(grid)]
    found: list[Path] = []
    for spec in specs:
        if hasattr(spec, "grid_name"):
            found.append(cell_dir(runs_dir, spec))
            continue
        spec = str(spec)
        path, _, name = spec.partition("::")
        if Path(path).is_dir() and (Path(path) / CELL_FILE).exists():
            matches = [Path(path)]
        elif Path(path).is_dir():
            matches = cell_dirs(Path(path))
        else:
            grid = runs_dir / Path(path).stem
            matches = cell_dirs(grid) if not name else [grid / name] if (grid / name / CELL_FILE).exists() else []
        if not matches:
            raise ValueError(f"{spec}: no runs of it under {runs_dir}")
        found.extend(matches)
    return list(dict.fromkeys(found))


@attrs.frozen(kw_only=True)
class CellView:
    """A cell as its files describe it, for ``status`` and ``report``."""

    directory: Path
    nodeid: str
    name: str
    record: Mapping[str, Any] | None
    state: CellState | None
    effective: str
    outcome: str
    # Its cell.json or state.json, where one cannot be read; a damaged state.json makes
    # the cell "damaged" (its record is left out, its other files still read).
    problems: tuple[DamagedFile, ...] = ()

    @property
    def stale_files(self) -> bool:
        """The cell's metrics, logs and checkpoints are an earlier run's than the attempt
        its state describes (a fresh attempt that has not started over them): status and
        report show none of their numbers."""
        return self.state is not None and self.state.previous is not None

    @property
    def waiting(self) -> bool:
        """A fresh attempt waits to start over an earlier run: the last attempt recorded is
        that run's, not the cell's current one."""
        return self.stale_files and self.state.state in ("pending", "submitted")

    @property
    def attempt(self) -> Attempt | None:
        """The attempt the cell's state is about (None before its first, or while waiting)."""
        return None if self.state is None or self.waiting else self.state.last_attempt

    @property
    def failure(self) -> str | None:
        return self.attempt.failure if self.attempt else None

    @property
    def job(self) -> str:
        submission = self.state.submission if self.state else None
        attempt = self.attempt
        if submission is not None and submission.job_id:
            return f"{submission.executor}:{submission.job_id}"
        if attempt is not None and attempt.job_id:
            return f"{attempt.executor}:{attempt.job_id}"
        return ""


def view(directory: Path) -> CellView:
    directory = Path(directory)
    problems = []
    try:
        record = read_cell_record(directory)
    except DamagedFile as problem:
        record = None
        problems.append(problem)
    try:
        state = load_state(directory)
    except DamagedFile as problem:
        state = None
        problems.append(problem)
    damaged = any(problem.path.name == STATE_FILE for problem in problems)
    effective = "damaged" if damaged else effective_state(directory, state)
    nodeid = (record or {}).get("nodeid") or (state.nodeid if state else f"{directory.parent.name}::{directory.name}")
    return CellView(
        directory=directory, nodeid=nodeid, name=directory.name, record=record, state=state,
        effective=effective, outcome=outcome(effective, (record or {}).get("xfail")), problems=tuple(problems),
    )
