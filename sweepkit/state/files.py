"""A cell dir's files, written whole or not at all, and the locks around them.

Every write goes to a temporary file in the same directory and is moved over the old one
with ``os.replace``, so a reader (another driver, ``sweep status``) sees the old file or
the new one, never half of one; a write that fails leaves no temporary file behind. On a
full file system a file that already holds enough blocks for its new text is written
over in place instead (a full runs dir must still be able to record how its cells
ended); when even that cannot be done, :class:`NoSpace` names the file.

``.lock`` is held by the process that runs the cell for its whole life, so "is this cell
running?" is answered by trying that lock, which the kernel frees when the holder dies
however it dies. ``.state.lock`` is held around every read-change-write of ``state.json``
(:mod:`sweepkit.state.transitions`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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

FULL = (errno.ENOSPC, errno.EDQUOT)
# A file system with less than this free is full for sweepkit's purposes: a cell that
# failed there most likely failed for want of space, and no cell should start there.
LOW_SPACE_BYTES = 64 * 1024


class NoSpace(OSError):
    """A run-state file could not be written: its file system is full (or its quota spent)."""

    def __init__(self, path: Path, code: int = errno.ENOSPC):
        self.path = Path(path)
        why = "no space left on device" if code == errno.ENOSPC else "disk quota exceeded"
        super().__init__(code, f"{why}: cannot write {path}", str(path))

    def __str__(self) -> str:
        return self.strerror


class DamagedFile(ValueError):
    """A run-state file that exists but cannot be read back: empty, cut short (a full disk, a
    copy that stopped), or not the record it should be. ``reason`` says which."""

    def __init__(self, path: Path, reason: str):
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def write_atomic(path: Path, write: Callable[[Path], Any]) -> Path:
    """``write(temp)``, then the temp file renamed to ``path``: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    write(temp)
    temp.replace(path)
    return path


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file in the same dir, fsync, ``os.replace``); on a full
    file system, in place where the file's blocks hold the new text, else :class:`NoSpace`."""
    path = Path(path)
    text = (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode()
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temp, "wb") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except OSError as error:
        temp.unlink(missing_ok=True)
        if error.errno not in FULL:
            raise
        if not _overwrite_in_place(path, text):
            raise NoSpace(path, error.errno) from None


def _overwrite_in_place(path: Path, text: bytes) -> bool:
    """Write ``text`` over ``path`` without asking its file system for a block: only where the
    blocks the file holds already fit it. The text is padded with spaces to the old length
    (JSON ignores them) rather than truncated, so that no reader sees the new text followed
    by the old one's tail; a reader racing the write may see a damaged file for a moment."""
    try:
        held = os.stat(path)
    except FileNotFoundError:
        return False
    if held.st_blocks * 512 < max(len(text), held.st_size):
        return False
    padded = text[:-1] + b" " * max(0, held.st_size - len(text)) + b"\n"
    fd = os.open(path, os.O_WRONLY)
    try:
        written = 0
        while written < len(padded):
            written += os.write(fd, padded[written:])
        os.fsync(fd)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def no_space_left(path: Path) -> bool:
    """True when the file system of ``path`` has (next to) nothing left for an ordinary user."""
    try:
        found = os.statvfs(path)
    except OSError:
        return False
    return found.f_bavail * found.f_frsize < LOW_SPACE_BYTES


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


@contextlib.contextmanager
def flock(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """An exclusive ``flock`` on ``path`` (created if need be) for as long as it lasts;
    yields False, holding nothing, when ``blocking`` is False and another holds it."""
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
        # Record who holds it, for status output; the lock itself is the truth, and is held
        # even where a full file system keeps the record from being written.
        with contextlib.suppress(OSError):
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
