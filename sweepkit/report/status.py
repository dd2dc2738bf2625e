"""``sweep status``: where each cell stands, read from its files alone.

Nothing here needs the driver that started the cells: a cell is running iff its lock is
held, and its step, sec/step and reward come from its metrics, read by the one reader of
per-step frames that ``sweep report`` and the live display use too
(:func:`sweepkit.state.metrics.summary`: the expressions of ``metrics.SUMMARY``). So ``status`` works while
a driver runs, after it exited, and after it was killed. A cell whose fresh attempt has
not started yet shows no numbers (and no job or failure of its earlier run): the files it
still holds until it starts are that run's.
"""

from __future__ import annotations

import math
import re
import time

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
# metrics line and the reward are left out, in that order.
COLUMNS = (
    Column(header="cell"),
    Column(header="status"),
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


def status_rows(runs_dir, specs, display=str) -> list[dict]:
    """One dict per cell with the values ``sweep status`` shows (plain values, for tests
    and other front ends); ``warnings`` lists what of its files cannot be read, with paths
    as ``display`` shows them."""
    try:
        directories = st.find_cell_dirs(runs_dir, specs)
    except ValueError as error:
        raise UsageError(str(error)) from None
    # A collected cell that never ran has no files to name it yet.
    nodeids = {st.cell_dir(runs_dir, spec): spec.nodeid for spec in specs or () if hasattr(spec, "grid_name")}
    rows = []
    now = time.time()
    views = [st.view(directory) for directory in directories]
    if not any(hasattr(spec, "grid_name") for spec in specs or ()):
        # Found on disk, by name: each grid's cells in its file's order, the grids as found.
        grids = list(dict.fromkeys(directory.parent for directory in directories))
        pairs = sorted(zip(directories, views), key=lambda pair: (grids.index(pair[0].parent), grid_order(pair[1])))
        directories, views = [d for d, _ in pairs], [v for _, v in pairs]
    records = failures.job_records(views)  # SLURM job states: liveness and failure classes
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


def show_status(session, specs) -> int:
    """Print the status table of the cells named by ``specs`` (grid files, node ids,
    cells, or nothing for every grid under the runs dir)."""
    rows = status_rows(session.runs_dir, specs, session.display_path)
    for row in rows:
        for line in row["warnings"]:
            session.err_console.print(f"WARNING: {line}", markup=False)
    if not rows:
        session.console.print(f"no runs under {session.display_path(session.runs_dir)}", markup=False)
        return ExitCode.OK
    values = [(
        Text(row["cell"]),
        status_text(row["status"]),
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
    return ExitCode.OK
