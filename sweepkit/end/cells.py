"""The cells ``sweep export`` and ``sweep clean`` act on: selected as ``sweep run`` selects them
(``PATH[::CELL]``, ``-k``, ``-m``), and of those only the finished ones.

A finished cell is ``completed``, ``failed`` (an expected failure too) or ``cancelled`` with
no process holding its ``.lock``. A cell that is running, pending or submitted, one whose
``state.json`` cannot be read, one that never ran and one waiting to start over an earlier
run are refused, each with the reason: their checkpoints may still be written or read.
"""

from __future__ import annotations

from pathlib import Path

from sweepkit.errors import UsageError
from sweepkit.state import records as st
from sweepkit.state.files import lock_holder

FINISHED = st.FINISHED


def selected_cells(session) -> list:
    """The selected cells of the paths (``grids/`` without any), in grid order; UsageError
    when the runs dir does not exist or nothing is selected."""
    runs_dir = session.runs_dir
    if not Path(runs_dir).is_dir():
        raise UsageError(f"runs dir {session.display_path(runs_dir)}: no such directory; nothing ran there "
                         "(--runs-dir names another)")
    options = session.options
    cells = session.select(options.paths, keyword=options.keyword, markexpr=options.markexpr)
    if not cells:
        raise UsageError("no cells selected")
    return cells


def refusal(session, cell) -> str | None:
    """Why ``cell``'s checkpoints are not to be touched now, or None for a finished cell."""
    directory = st.cell_dir(session.runs_dir, cell)
    view = st.view(directory)
    damaged = [problem for problem in view.problems if problem.path.name == st.STATE_FILE]
    if damaged:
        problem = damaged[0]
        return f"{session.display_path(problem.path)} cannot be read ({problem.reason}): whether it runs is not known"
    if view.state is None:
        return f"never ran (no {st.STATE_FILE} in {session.display_path(directory)})"
    if st.is_locked(directory):
        return f"is running now ({lock_holder(directory)})"
    if view.effective not in FINISHED or view.state.previous is not None:
        state = view.effective if view.state.previous is None else f"{view.effective} (to start over)"
        return f"is {state}; only a finished cell ({', '.join(FINISHED)}) is exported or cleaned"
    return None


def human_bytes(size: int) -> str:
    """``512 B``, ``12.3 KiB``, ``1.5 GiB``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # not reached
