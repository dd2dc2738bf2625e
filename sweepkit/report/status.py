"""``sweep status``: where each cell stands, read from its files alone.

Nothing here needs the driver that started the cells: a cell is running iff its lock is
held, and its step, sec/step and reward come from its metrics, read by the one reader of
per-step frames that ``sweep report`` and the live display use too
(:func:`sweepkit.state.metrics.read`, summed up by ``metrics.summarize_frame``). So ``status`` works while
a driver runs, after it exited, and after it was killed. A cell whose fresh attempt has
not started yet shows no numbers (and no job or failure of its earlier run): the files it
still holds until it starts are that run's. One whose fresh attempt its driver will never
start (a ``--rerun`` whose driver was killed first) shows that earlier run's numbers, as
``RERUN-INTERRUPTED``.

The grid file may have changed since the cells ran (edited after ``--detach``, say). Of a
grid named whole (every grid, with no path), every cell with runs on disk is shown, those
the grid no longer has marked ``removed``; a cell whose config the grid has changed since
it ran (under the profile it ran with) is marked ``changed``.

Each cell's health (:mod:`sweepkit.report.health`: ``nan``, ``collapse``, ``flat``,
``stalled``, ``failed``, each with its reason) is shown with the last ``policy/entropy``,
``policy/kl`` (log-ratio) and ``policy/grad_norm``. ``--runs-dir`` may be repeated or a glob:
with several runs dirs a ``runs`` column says whose each row is and, with no path, every cell
on disk is shown (their grid files may be on another machine). ``--check`` exits
``ExitCode.UNHEALTHY`` when a cell is unhealthy; ``--watch`` reads again every interval and
prints the rows whose state, step or health changed.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from rich.text import Text

from sweepkit.errors import ExitCode, UsageError
from sweepkit.report import health
from sweepkit.report.status_scope import HealthOptions, short_labels
from sweepkit.run import failures
from sweepkit.run.progress import fmt_duration, fmt_number, label, status_text
from sweepkit.screen import Column, print_table
from sweepkit.state import metrics
from sweepkit.state import records as st

BAD_LINES_SHOWN = 3  # of a metrics file, named one by one; the rest are counted
# The table of ``sweep status``: a cell's node id and state are always shown whole; at a
# narrow width the failure and the job are cut, then the job, the time since the last
# metrics line and the reward are left out, in that order, and only then the seeds'
# mandatory monitoring columns (grad_norm, logratio, entropy) and the health, the last to go
# (an id and its failure come first; the unhealthy cells' reasons are printed on stderr
# whatever the width). The "grid" column, shown only where a cell has one, says how the grid
# file changed since the cell ran; "runs", shown with several runs dirs, whose each row is.
COLUMNS = (
    Column(header="runs"),
    Column(header="cell"),
    Column(header="status"),
    Column(header="grid"),
    Column(header="try", justify="right"),
    Column(header="step", justify="right"),
    Column(header="health", drop=7),
    Column(header="s/step", justify="right"),
    Column(header="reward", justify="right", drop=3),
    Column(header="entropy", justify="right", drop=6),
    Column(header="logratio", justify="right", drop=5),
    Column(header="grad_norm", justify="right", drop=4),
    Column(header="updated", drop=2),
    Column(header="job", floor=12, drop=1),
    Column(header="failure", floor=16),
)
# Shown whenever a cell has been judged, empty or not: a run that does not log a mandatory
# metric shows as a blank in its column.
HEALTH_COLUMNS = ("health", *health.LAST_VALUES)


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
                current_hash: Callable[[object, str | None], str | None] | None = None,
                stall: health.StallRule = health.StallRule()) -> list[dict]:
    """One dict per cell with the values ``sweep status`` shows (plain values, for tests
    and other front ends); ``warnings`` lists what of its files cannot be read, with paths
    as ``display`` shows them. ``grids``: grid names whose every cell dir is shown, those
    ``specs`` do not name marked ``removed``; ``current_hash(cell, profile)``: a named
    cell's config hash as its grid has it now under ``profile`` (None: unknown), for the
    ``changed`` mark. ``health`` holds the cell's flags (:mod:`sweepkit.report.health`, with
    ``stall`` for ``stalled``), ``judged`` whether it had anything to judge."""
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
        summary, steps = cell_metrics(directory) if directory.exists() and not cell.stale_files \
            else (metrics.Summary(), [])
        status = cell.outcome if cell.state or cell.problems else "not run"
        if cell.effective == "interrupted" and failures.job_alive(cell, records):
            status = cell.state.state  # its job runs on: the lock is just not visible from here
        failure = None if cell.waiting else failures.failure_text(cell, records)
        flags = health.cell_health(steps, outcome=status, failure=failure, running=status == "running",
                                   updated=summary.updated, now=now, rule=stall)
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
            "failure": "; ".join(filter(None, (failure, cell.cleaned_note))) or None,  # sweep clean's note
            "warnings": file_warnings(cell, display, nodeids.get(directory)),
            "health": flags,
            "judged": bool(steps or flags),
            **{column: health.last_value(steps, metric) for column, metric in health.LAST_VALUES.items()},
        })
    return rows


def cell_metrics(directory: Path) -> tuple[metrics.Summary, list[dict]]:
    """A cell's :class:`~sweepkit.state.metrics.Summary` and the train records its health
    reads (``step`` and :data:`sweepkit.report.health.READS`, those it logs), from one read
    of its per-step frame."""
    import polars as pl

    frame, updated = metrics.read(directory)
    if frame is None:
        return metrics.Summary(updated=updated), []
    read = [name for name in ("step", *health.READS) if name in frame.columns]
    steps = frame.filter(pl.col("kind") == "train").select(read).to_dicts()
    return metrics.summarize_frame(frame, updated=updated), steps


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


def show_status(session, specs, *, whole_grids: Iterable[str] = (), every_grid: bool = False,
                runs_dirs: Sequence[Path] | None = None, several: bool = False) -> int:
    """Print the status table of the cells named by ``specs`` (grid files, node ids,
    cells, or nothing for every grid under the runs dir), with every cell on disk of the
    ``whole_grids`` (``every_grid``: also of the runs dir's grids whose file is gone), in
    each of ``runs_dirs`` (default: the session's; ``several``: with a ``runs`` column).
    ``--watch`` prints it again every interval, only the rows that changed; the exit code
    is :data:`ExitCode.UNHEALTHY` for an unhealthy cell under ``--check`` or ``--watch``."""
    options = HealthOptions.of(session.options)
    runs_dirs = list(runs_dirs or [session.runs_dir])
    labels = short_labels(runs_dirs) if several else {}
    hashes = profiled_hashes(session)

    def read() -> list[dict]:
        rows = []
        for runs_dir in runs_dirs:
            grids = set(whole_grids)
            if every_grid:  # and the runs of grid files that are gone
                grids |= {directory.name for directory in st.grid_dirs(runs_dir)
                          if directory.name not in grids and _grid_file_gone(directory, session.rootdir)}
            rows += [{**row, "runs": labels.get(runs_dir, "")} for row in
                     status_rows(runs_dir, specs, session.display_path, grids=grids, current_hash=hashes,
                                 stall=options.stall)]
        return rows

    if options.watch is not None:
        return _watch(session, read, options)
    rows = read()
    _print_warnings(session, rows)
    if not rows:
        where = ", ".join(session.display_path(runs_dir) for runs_dir in runs_dirs)
        session.console.print(f"no runs under {where}", markup=False)
        return ExitCode.OK
    _print_rows(session, rows)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    session.console.print(", ".join(f"{n} {label(status)}" for status, n in counts.items()), markup=False)
    for mark, note in GRID_NOTES.items():
        marked = [row["cell"] for row in rows if row["grid"] == mark]
        if marked:
            session.console.print(f"{mark}: {len(marked)} cell{'s' * (len(marked) != 1)} {note}: "
                                  f"{', '.join(marked)}", markup=False)
    return _exit_code(rows) if options.check else ExitCode.OK


def _print_warnings(session, rows: list[dict], shown: set[str] | None = None) -> None:
    """What of the cells' files cannot be read (each line once, where ``shown`` keeps them)."""
    for row in rows:
        for line in row["warnings"]:
            if shown is None or line not in shown:
                session.err_console.print(f"WARNING: {line}", markup=False)
                if shown is not None:
                    shown.add(line)


def _row_values(row: dict) -> dict[str, Text]:
    """A row's cells of the table, by column header."""
    judged = row["judged"]
    return {
        "runs": Text(row["runs"]),
        "cell": Text(row["cell"]),
        "status": status_text(row["status"]),
        "grid": Text(row["grid"] or "", style="yellow"),
        "try": Text(str(row["attempts"])),
        "step": Text("" if row["step"] is None else str(row["step"])),
        "health": Text(health.health_text(row["health"], judged), style="bold red" if row["health"] else "green"),
        "s/step": Text(fmt_number(row["sec_per_step"])),
        "reward": Text(fmt_number(row["reward"])),
        **{column: Text(fmt_number(row[column])) for column in health.LAST_VALUES},
        "updated": Text("" if row["metric_age_s"] is None else f"{fmt_duration(row['metric_age_s'])} ago"),
        "job": Text(row["job"] or ""),
        "failure": Text(row["failure"] or ""),
    }


def _print_rows(session, rows: list[dict], title: str | None = None) -> None:
    """The table of ``rows``, fitted to the console, then (on stderr) the reasons of their health flags."""
    values = [_row_values(row) for row in rows]
    # A column no cell has a value in (no job submitted yet, no failure) is left out; the
    # health columns are shown once a cell has been judged.
    judged = any(row["judged"] for row in rows)
    shown = [column for column in COLUMNS if column.header in ("cell", "status")
             or (column.header in HEALTH_COLUMNS and judged) or any(value[column.header].plain for value in values)]
    dropped = print_table(session.console, shown, [[value[column.header] for column in shown] for value in values],
                          title=title)
    if dropped:
        session.console.print(f"left out to fit {session.console.width} columns: {', '.join(dropped)}",
                              style="dim", markup=False)
    # The reasons go to stderr, as the warnings do: stdout stays the table (one line a cell,
    # for grep and for scripts that read the rows).
    unhealthy = [row for row in rows if row["health"]]
    if unhealthy:
        session.err_console.print(f"unhealthy: {len(unhealthy)} cell{'s' * (len(unhealthy) != 1)}",
                                  style="bold red", markup=False)
    for row in unhealthy:
        where = f" ({row['runs']})" if row["runs"] else ""
        for flag in row["health"]:
            session.err_console.print(f"  {row['cell']}{where}: {flag.name}: {flag.reason}", markup=False)


def _exit_code(rows: list[dict]) -> ExitCode:
    return ExitCode.UNHEALTHY if any(row["health"] for row in rows) else ExitCode.OK


def _watch(session, read: Callable[[], list[dict]], options: HealthOptions) -> int:
    """Read every ``options.watch`` seconds and print the rows whose state, step or health
    changed since the last print (every row the first time), under the time of the round;
    ends after ``options.watch_count`` rounds or at Ctrl-C, with the last round's health."""
    seen: dict[tuple, tuple] = {}
    warned: set[str] = set()
    rows: list[dict] = []
    rounds = 0
    try:
        while True:
            rows = read()
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            changed = [row for row in rows if seen.get(_key(row)) != _signature(row)]
            seen = {_key(row): _signature(row) for row in rows}
            _print_warnings(session, rows, warned)
            if changed:
                _print_rows(session, changed, title=f"{stamp}  {len(changed)} of {len(rows)} cells changed")
            else:
                session.console.print(f"{stamp}  no change ({len(rows)} cells)", markup=False)
            rounds += 1
            if options.watch_count is not None and rounds >= options.watch_count:
                break
            time.sleep(options.watch)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a watch ends
    return _exit_code(rows)


def _key(row: dict) -> tuple:
    return row["runs"], row["cell"]


def _signature(row: dict) -> tuple:
    """What makes a row print again under ``--watch``: its state, step and health."""
    return row["status"], row["step"], tuple(flag.name for flag in row["health"])
