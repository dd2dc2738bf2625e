"""``sweep status``: where each cell stands, read from its files alone.

Nothing here needs the driver that started the cells: a cell is running iff its lock is
held, and its step, sec/step and reward come from its metrics, read by the one reader of
per-step frames that ``sweep report`` and the live display use too
(:func:`sweepkit.state.metrics.summary`: the expressions of ``metrics.SUMMARY``). So ``status`` works while
a driver runs, after it exited, and after it was killed. A cell whose fresh attempt has
not started yet shows no numbers (and no job or failure of its earlier run): the files it
still holds until it starts are that run's. One whose fresh attempt its driver will never
start (a ``--rerun`` whose driver was killed first) shows that earlier run's numbers, as
``RERUN-INTERRUPTED``.

The grid file may have changed since the cells ran (edited after ``--detach``, say). Of a
grid named whole (every grid, with no path), every cell with runs on disk is shown, those
the grid no longer has marked ``removed``; a cell whose config the grid has changed since
it ran (under the profile it ran with) is marked ``changed``.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from rich.text import Text

from sweepkit.errors import ExitCode, UsageError
from sweepkit.run import failures
from sweepkit.run.progress import fmt_duration, fmt_number, label, status_text
from sweepkit.screen import Column, print_table
from sweepkit.state import metrics
from sweepkit.state import records as st

BAD_LINES_SHOWN = 3  # of a metrics file, named one by one; the rest are counted
# The table of ``sweep status``: a cell's node id and state are always shown whole; at a
# narrow width the failure and the job are cut, then the job, the time since the last
# metrics line and the reward are left out, in that order. The "grid" column, shown only
# where a cell has one, says how the grid file changed since the cell ran.
COLUMNS = (
    Column(header="cell"),
    Column(header="status"),
    Column(header="grid"),
    Column(header="try", justify="right"),
    Column(header="step", justify="right"),
    Column(header="s/step", justify="right"),
    Column(header="reward", justify="right", drop=3),
    Column(header="updated", drop=2),
    Column(header="job", floor=12, drop=1),
    Column(header="failure", floor=16),
)


def file_warnings(cell: st.CellView, display=str, nodeid: str | None = None) -> list[str]:
    """What of a cell's files cannot be read, each naming its file (and line), with what it
    means and what to do; ``nodeid`` is the cell's, where its files do not say it."""
    nodeid = nodeid or (cell.record or {}).get("nodeid") or (cell.state.nodeid if cell.state else None) \
        or f"PATH::{cell.name}"
    lines = []
    for problem in cell.problems:
        if problem.path.name == st.STATE_FILE:
            lines.append(f"{display(problem.path)}: {problem.reason}; the cell's record is left out (it shows as "
                         f"DAMAGED): sweep run {nodeid} --rerun starts it over")
        else:
            lines.append(f"{display(problem.path)}: {problem.reason}; the cell is shown from its state alone until "
                         f"a run of it writes the file again (sweep run {nodeid} --rerun)")
    bad = metrics.bad_lines(cell.directory) if cell.directory.exists() else []
    for number, why in bad[:BAD_LINES_SHOWN]:
        lines.append(f"{display(cell.directory / st.METRICS_FILE)}:{number}: {why}; the line is left out")
    if len(bad) > BAD_LINES_SHOWN:
        lines.append(f"{display(cell.directory / st.METRICS_FILE)}: {len(bad) - BAD_LINES_SHOWN} more such lines "
                     "are left out")
    return lines


def grid_order(view: st.CellView) -> tuple:
    """Sort key of a grid's cells in the order of its file, as ``sweep list`` shows them:
    the place each cell's ``cell.json`` records (from when it last started); a cell whose
    record has none (written by an older sweepkit, or unreadable) goes after them, by its
    line in the file, then by its name, digits as numbers."""
    record = view.record or {}
    index = record.get("index")
    location = record.get("location") or [None, 0]
    line = location[1] if len(location) > 1 and isinstance(location[1], int) else 0
    return (view.name != "base", index if isinstance(index, int) else math.inf, line, _natural(view.name))


def _natural(text: str) -> list:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text) if part]


REMOVED, CHANGED = "removed", "changed"
GRID_NOTES = {
    REMOVED: "no longer in its grid file; its runs stay (sweep report shows them too)",
    CHANGED: "its grid file has changed its config since it ran (sweep run --rerun runs it as it is now)",
}


def status_rows(runs_dir, specs, display=str, *, grids: Iterable[str] = (),
                current_hash: Callable[[object, str | None], str | None] | None = None) -> list[dict]:
    """One dict per cell with the values ``sweep status`` shows (plain values, for tests
    and other front ends); ``warnings`` lists what of its files cannot be read, with paths
    as ``display`` shows them. ``grids``: grid names whose every cell dir is shown, those
    ``specs`` do not name marked ``removed``; ``current_hash(cell, profile)``: a named
    cell's config hash as its grid has it now under ``profile`` (None: unknown), for the
    ``changed`` mark."""
    try:
        directories = st.find_cell_dirs(runs_dir, specs)
    except ValueError as error:
        raise UsageError(str(error)) from None
    # A collected cell that never ran has no files to name it yet.
    cells = {st.cell_dir(runs_dir, spec): spec for spec in specs or () if hasattr(spec, "grid_name")}
    nodeids = {directory: cell.nodeid for directory, cell in cells.items()}
    views = [st.view(directory) for directory in directories]
    if not any(hasattr(spec, "grid_name") for spec in specs or ()):
        # Found on disk, by name: each grid's cells in its file's order, the grids as found.
        order = list(dict.fromkeys(directory.parent for directory in directories))
        pairs = sorted(zip(directories, views), key=lambda pair: (order.index(pair[0].parent), grid_order(pair[1])))
        directories, views = [d for d, _ in pairs], [v for _, v in pairs]
    named = set(directories)
    gone = [directory for grid in sorted(set(grids)) for directory in st.cell_dirs(Path(runs_dir) / grid)
            if directory not in named]
    gone_views = sorted((st.view(directory) for directory in gone),
                        key=lambda view: (view.directory.parent.name, grid_order(view)))
    directories += [view.directory for view in gone_views]
    views += gone_views
    records = failures.job_records(views)  # SLURM job states: liveness and failure classes
    rows = []
    now = time.time()
    for directory, cell in zip(directories, views):
        # A cell waiting to start over keeps its earlier run's files until it starts: none
        # of their numbers are this attempt's.
        summary = metrics.summary(directory) if directory.exists() and not cell.stale_files else metrics.Summary()
        status = cell.outcome if cell.state or cell.problems else "not run"
        if cell.effective == "interrupted" and failures.job_alive(cell, records):
            status = cell.state.state  # its job runs on: the lock is just not visible from here
        rows.append({
            "cell": nodeids.get(directory, cell.nodeid),
            "status": status,
            "grid": REMOVED if directory not in named else _changed(cells.get(directory), cell, current_hash),
            "attempts": len(cell.state.attempts) if cell.state else 0,
            "step": summary.step,
            "sec_per_step": summary.sec_per_step,
            "reward": summary.reward,
            "metric_age_s": None if summary.updated is None else max(0.0, now - summary.updated),
            "job": cell.job,
            "failure": None if cell.waiting else failures.failure_text(cell, records),
            "warnings": file_warnings(cell, display, nodeids.get(directory)),
        })
    return rows


def _changed(cell, view: st.CellView, current_hash) -> str | None:
    """``changed`` for a cell that ran with another config than its grid has now (not one
    waiting to start over: the attempt it waits for runs the grid's)."""
    state = view.state
    if cell is None or current_hash is None or state is None or not state.attempts or view.stale_files:
        return None
    now = current_hash(cell, state.profile)
    return CHANGED if now is not None and now != state.config_hash else None


def profiled_hashes(session) -> Callable[[object, str | None], str | None]:
    """``current_hash(cell, profile)`` for :func:`status_rows`: the cell's config hash under
    the profile its last run had (each profile applied once per grid's cells)."""
    from sweepkit.grid.profile import apply_profile

    known: dict[tuple[str, str | None], str | None] = {}

    def current_hash(cell, profile: str | None) -> str | None:
        key = (cell.nodeid, profile)
        if key not in known:
            if profile is None:
                known[key] = cell.config_hash()
            else:
                try:
                    (profiled,) = apply_profile(session, [cell], profile)
                except (UsageError, ValueError):
                    profiled = None  # a profile this session does not know: say nothing
                known[key] = profiled.config_hash() if profiled is not None else None
        return known[key]

    return current_hash


def _grid_file_gone(grid_dir: Path, rootdir: Path) -> bool:
    """The grid file the cells of ``grid_dir`` were collected from is no longer there."""
    for directory in st.cell_dirs(grid_dir):
        try:
            grid = (st.read_cell_record(directory) or {}).get("grid")
        except st.DamagedFile:
            continue
        if grid:
            return not (Path(rootdir) / grid).exists()
    return False


def show_status(session, specs, *, whole_grids: Iterable[str] = (), every_grid: bool = False) -> int:
    """Print the status table of the cells named by ``specs`` (grid files, node ids,
    cells, or nothing for every grid under the runs dir), with every cell on disk of the
    ``whole_grids`` (``every_grid``: also of the runs dir's grids whose file is gone)."""
    grids = set(whole_grids)
    if every_grid:  # and the runs of grid files that are gone
        grids |= {directory.name for directory in st.grid_dirs(session.runs_dir)
                  if directory.name not in grids and _grid_file_gone(directory, session.rootdir)}
    rows = status_rows(session.runs_dir, specs, session.display_path, grids=grids,
                       current_hash=profiled_hashes(session))
    for row in rows:
        for line in row["warnings"]:
            session.err_console.print(f"WARNING: {line}", markup=False)
    if not rows:
        session.console.print(f"no runs under {session.display_path(session.runs_dir)}", markup=False)
        return ExitCode.OK
    values = [(
        Text(row["cell"]),
        status_text(row["status"]),
        Text(row["grid"] or "", style="yellow"),
        Text(str(row["attempts"])),
        Text("" if row["step"] is None else str(row["step"])),
        Text(fmt_number(row["sec_per_step"])),
        Text(fmt_number(row["reward"])),
        Text("" if row["metric_age_s"] is None else f"{fmt_duration(row['metric_age_s'])} ago"),
        Text(row["job"] or ""),
        Text(row["failure"] or ""),
    ) for row in rows]
    # A column no cell has a value in (no job submitted yet, no failure) is left out.
    shown = [i for i, column in enumerate(COLUMNS)
             if i < 2 or any(value[i].plain for value in values)]
    dropped = print_table(session.console, [COLUMNS[i] for i in shown],
                          [[value[i] for i in shown] for value in values])
    if dropped:
        session.console.print(f"left out to fit {session.console.width} columns: {', '.join(dropped)}",
                              style="dim", markup=False)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    session.console.print(", ".join(f"{n} {label(status)}" for status, n in counts.items()), markup=False)
    for mark, note in GRID_NOTES.items():
        marked = [row["cell"] for row in rows if row["grid"] == mark]
        if marked:
            session.console.print(f"{mark}: {len(marked)} cell{'s' * (len(marked) != 1)} {note}: "
                                  f"{', '.join(marked)}", markup=False)
    return ExitCode.OK
