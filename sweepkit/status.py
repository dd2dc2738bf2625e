"""``sweep status``: where each cell stands, read from its files alone.

Nothing here needs the driver that started the cells: a cell is running iff its lock is
held, and its step, sec/step and reward come from its metrics. So ``status`` works while
a driver runs, after it exited, and after it was killed. A cell whose fresh attempt has
not started yet shows no numbers (and no job or failure of its earlier run): the files it
still holds until it starts are that run's.
"""

from __future__ import annotations

import time

from rich.table import Table
from rich.text import Text

from sweepkit import failures, metrics
from sweepkit import state as st
from sweepkit.errors import UsageError
from sweepkit.progress import fmt_duration, fmt_number, label, print_wide, status_text
from sweepkit.session import ExitCode

BAD_LINES_SHOWN = 3  # of a metrics file, named one by one; the rest are counted
COLUMNS = ("cell", "status", "attempts", "step", "sec/step", "reward", "last metric", "job", "failure")


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
    table = Table(box=None, pad_edge=False)
    for column in COLUMNS:
        table.add_column(column, no_wrap=True, justify="right" if column in ("attempts", "step", "sec/step", "reward") else "left")
    for row in rows:
        table.add_row(
            Text(row["cell"]),
            status_text(row["status"]),
            str(row["attempts"]),
            "" if row["step"] is None else str(row["step"]),
            fmt_number(row["sec_per_step"]),
            fmt_number(row["reward"]),
            "" if row["metric_age_s"] is None else f"{fmt_duration(row['metric_age_s'])} ago",
            Text(row["job"]),
            Text(row["failure"] or ""),
        )
    print_wide(session.console, table)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    session.console.print(", ".join(f"{n} {label(status)}" for status, n in counts.items()), markup=False)
    return ExitCode.OK
