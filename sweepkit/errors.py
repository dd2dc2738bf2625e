"""The one exception type for bad input (its message is shown as-is, without a traceback),
and the exit codes every command ends with."""

from __future__ import annotations

import enum
import functools
from pathlib import Path


class ExitCode(enum.IntEnum):
    """Process exit codes, pytest's numbering."""

    OK = 0
    CELLS_FAILED = 1
    INTERRUPTED = 2
    INTERNAL_ERROR = 3
    USAGE_ERROR = 4
    NO_CELLS = 5
    # sweep status --check / --watch: a cell is unhealthy (sweepkit.report.health), for cron.
    UNHEALTHY = 6


class UsageError(Exception):
    """Bad input (grid file, command line, plugin); the message names the file, line or key."""

    def __init__(self, *lines: str):
        self.lines = [line for line in lines if line]
        super().__init__("\n".join(self.lines))


def display_path(path, rootdir) -> str:
    """A path as the user sees it: relative to ``rootdir`` when inside it."""
    path = Path(path)
    try:
        return path.resolve().relative_to(_resolved_root(str(rootdir))).as_posix()
    except ValueError:
        return str(path)


@functools.lru_cache(maxsize=16)
def _resolved_root(rootdir: str) -> Path:
    # Resolved once per process: every cell's location and key locations are shown through
    # display_path, and resolving the root (a walk of lstat calls) each time dominated
    # `sweep list` of a large grid.
    return Path(rootdir).resolve()


def did_you_mean(name: str, candidates, n: int = 3) -> str:
    """`` (did you mean 'a', 'b'?)`` from the close matches, or ''."""
    import difflib

    close = difflib.get_close_matches(name, list(candidates), n=n)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
