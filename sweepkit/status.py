"""``sweep status``: where each cell stands, read from its files alone.

Nothing here needs the driver that started the cells: a cell is running iff its lock is
held, and its step, sec/step and reward come from its metrics. So ``status`` works while
a driver runs, after it exited, and after it was killed.
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

COLUMNS = ("cell", "status", "attempts", "step", "sec/step", "reward", "last metric", "job", "failure")


def status_rows(runs_dir, specs) -> list[dict]:
    """One dict per cell with the values ``sweep status`` shows (plain values, for tests
    and other front ends)."""
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
        summary = metrics.summary(directory) if directory.exists() else metrics.Summary()
        status = cell.outcome if cell.state else "not run"
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
            "failure": failures.failure_text(cell, records),
        })
    return rows


def show_status(session, specs) -> int:
    """Print the status table of the cells named by ``specs`` (grid files, node ids,
    cells, or nothing for every grid under the runs dir)."""
    rows = status_rows(session.runs_dir, specs)
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
