"""The subcommands: each takes the configured session and returns an exit code.

``run``, ``status`` and ``report`` hand over to the runner, status and report
modules; ``list`` and ``plugins`` are complete here.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from sweepkit import plugin
from sweepkit.errors import ExitCode, UsageError
from sweepkit.grid.cell import Cell
from sweepkit.grid.collect import files_of_args, split_arg
from sweepkit.grid.ids import format_value
from sweepkit.grid.select import by_node_ids
from sweepkit.session import Session
from sweepkit.state import records as st


def _short(value) -> str:
    if isinstance(value, (float, bool)):
        return format_value(value)
    return json.dumps(value, default=repr) if not isinstance(value, str) else value


def cell_line(cell: Cell) -> Text:
    """``grids/x.py::tbs128  train_batch_size=128 policy_mini_batch_size=128  [slow]``."""
    line = Text(cell.nodeid, style="bold")
    diff = " ".join(f"{k}={_short(new)}" for k, (_, new) in cell.diff.items())
    line.append("  " + (diff or "(base)"), style="" if diff else "dim")
    marks = [f"xfail: {m.reason}" if m.name == "xfail" and m.reason else m.name for m in cell.marks]
    if marks:
        line.append("  [" + ", ".join(marks) + "]", style="yellow" if cell.xfail else "cyan")
    if cell.profile_changes:
        changes = " ".join(f"{k}={_short(new)}" for k, (_, new) in cell.profile_changes.items())
        line.append(f"  | {cell.profile}: {changes}", style="dim")
    return line


def _config_lines(cell: Cell) -> str:
    """Every key of the cell's config, one ``    key = value`` line each (``-v``)."""
    config = cell.target_config()
    return "\n".join(f"    {key} = {config[key]!r}" for key in sorted(config))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _selected(session: Session) -> list[Cell]:
    o = session.options
    return session.select(o.paths, profile=o.profile, keyword=o.keyword, markexpr=o.markexpr,
                          failed=getattr(o, "failed", False))


def cmd_list(session: Session) -> int:
    cells = _selected(session)
    verbose = getattr(session.options, "verbose", 0)
    if cells:
        # -q: node ids only (pytest's --co -q); -v: each cell's whole config under its line
        lines = [Text(cell.nodeid) if verbose < 0 else cell_line(cell) for cell in cells]
        if verbose > 0:
            for cell, line in zip(cells, lines):
                line.append("\n" + _config_lines(cell), style="dim")
        if session.console.is_terminal and verbose <= 0:
            # One line a cell, cut with an ellipsis where the terminal ends (never inside the
            # node id); a pipe or a file gets every line whole.
            width = session.console.width
            for cell, line in zip(cells, lines):
                line.truncate(max(width, len(cell.nodeid)), overflow="ellipsis")
        # One print of every line: a print per cell renders (and measures the terminal) as
        # many times as the grid has cells.
        session.console.print(Text("\n").join(lines))
    # Cells of the files named, not of a grid collected only to give another its base.
    named = {path.resolve() for path, _ in files_of_args(session.options.paths, session.rootdir)}
    total = sum(len(session.collected.get(path) or ()) for path in named)
    grids = {c.grid for c in cells}
    summary = f"{_plural(len(cells), 'cell')} in {_plural(len(grids), 'grid')}"
    if total > len(cells):
        summary += f" ({total - len(cells)} deselected)"
    session.console.print(summary, style="bold", markup=False)
    session.validate(cells, check_runs_dir=False, outcome="these cells would not run")
    return ExitCode.OK if cells else ExitCode.NO_CELLS


def _import_stage(module: str, name: str, command: str):
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise UsageError(f"sweep {command} needs {module}.{name}, which cannot be imported: {exc}") from None


def _skip_damaged(session: Session, cells: list[Cell]) -> list[Cell]:
    """The cells whose ``state.json`` cannot be read, each named with its file: whether such
    a cell ran is not known, so only ``--rerun`` (which writes a new one) runs it."""
    damaged = []
    for cell in cells:
        problem = st.state_problem(st.cell_dir(session.runs_dir, cell))
        if problem is not None:
            damaged.append(cell)
            session.err_console.print(
                f"DAMAGED  {cell.nodeid}: {session.display_path(problem.path)}: {problem.reason}; whether it ran "
                f"is not known, so it is skipped: sweep run {cell.nodeid} --rerun starts it over", markup=False)
    return damaged


def cmd_run(session: Session) -> int:
    max_parallel = getattr(session.options, "max_parallel", None)
    if max_parallel is not None and max_parallel < 1:
        raise UsageError(f"--max-parallel {max_parallel}: expected a number of cells of at least 1")
    cells = _selected(session)
    if not cells:
        session.err_console.print("no cells selected; nothing to run", markup=False)
        return ExitCode.NO_CELLS
    damaged = [] if session.options.rerun else _skip_damaged(session, cells)
    cells = [cell for cell in cells if cell not in damaged]
    if not cells:
        return ExitCode.CELLS_FAILED  # none of them passed
    # Validation plans each cell (once, for the whole command: sweepkit.run.context); the
    # runner chooses and makes the executor, once.
    session.validate(cells, check_runs_dir=True)
    run_cells = _import_stage("sweepkit.run.runner", "run_cells", "run")
    code = run_cells(session, cells)
    if not damaged:
        return code
    # Said again after the run, whose own summary does not count them.
    session.err_console.print(f"{_plural(len(damaged), 'cell')} skipped as DAMAGED (above): "
                              f"{', '.join(cell.nodeid for cell in damaged)}", markup=False)
    return ExitCode.CELLS_FAILED if code == ExitCode.OK else code


def _named_cells(session: Session) -> list[Cell]:
    """The cells of the paths, only the named ones where a ``PATH::CELL`` names cells; an
    unknown cell is refused with its near names, as ``run`` and ``list`` refuse it."""
    collected = session.collect(session.options.paths)
    return by_node_ids(list(collected.cells), collected.wanted)


def cmd_status(session: Session) -> int:
    """The named cells, and of the grids named whole (every grid, with no path) every cell
    that has runs on disk, also those the grid file no longer has; in each runs dir named
    (``--runs-dir`` repeated or a glob: with no path, every cell on disk, from disk alone)."""
    show_status = _import_stage("sweepkit.report.status", "show_status", "status")
    named_runs_dirs = _import_stage("sweepkit.report.status_scope", "named_runs_dirs", "status")
    runs_dirs, several = named_runs_dirs(session)
    if several and not session.options.paths:
        # Other clusters' runs dirs: their grid files need not be here, nor importable.
        return show_status(session, None, runs_dirs=runs_dirs, several=True)
    collected = session.collect(session.options.paths)
    cells = by_node_ids(list(collected.cells), collected.wanted)
    whole = {Path(grid).stem for grid, names in collected.wanted.items() if names is None}
    return show_status(session, cells, whole_grids=whole, every_grid=not session.options.paths,
                       runs_dirs=runs_dirs, several=several)


def cmd_cancel(session: Session) -> int:
    cells = _named_cells(session)
    cancel_command = _import_stage("sweepkit.run.cancel", "cancel_command", "cancel")
    return cancel_command(session, cells)


def cmd_export(session: Session) -> int:
    """Each selected finished cell's chosen checkpoint as a Hugging Face model dir (sweepkit.end.export)."""
    export_command = _import_stage("sweepkit.end.export", "export_command", "export")
    return export_command(session)


def cmd_clean(session: Session) -> int:
    """Delete finished cells' checkpoints but the kept one (sweepkit.end.clean)."""
    clean_command = _import_stage("sweepkit.end.clean", "clean_command", "clean")
    return clean_command(session)


def report_grids(session: Session) -> list[str]:
    """Grid names for ``sweep report``: from the paths' file names, without running the files
    unless a ``PATH::CELL`` names a cell, which must be one of its grid's (the report is still
    the whole grid's: its tables compare every cell with ``base``).

    With no path, every grid that has runs under the runs dir: a grid never run is not an
    error then, only when it is named.
    """
    paths = session.options.paths
    if not paths:
        runs = session.runs_dir
        return sorted(p.name for p in runs.iterdir()
                      if p.is_dir() and not p.name.startswith(".")) if runs.is_dir() else []
    named = [arg for arg in paths if split_arg(arg)[1] is not None]
    if named:
        collected = session.collect(named)
        by_node_ids(list(collected.cells), collected.wanted)
    return list(dict.fromkeys(path.stem for path, _ in files_of_args(paths, session.rootdir)))


def cmd_report(session: Session) -> int:
    make_report = _import_stage("sweepkit.report.tables", "make_report", "report")
    options = session.options
    return make_report(session, report_grids(session), options.format, options.table, options.level)


def _plugins_table(rows: list[tuple[str, str, str]]) -> Table:
    table = Table(title="active plugins", title_justify="left")
    table.add_column("plugin", no_wrap=True)
    table.add_column("loaded by", no_wrap=True)
    table.add_column("hooks")  # wraps between names: cmd_plugins keeps it as wide as the longest
    for row in rows:
        table.add_row(*row)
    return table


def _report_table(grid_dir, level) -> "object":
    """Both report tables of a grid dir as one frame, a row a cell, intervals at ``level``."""
    from sweepkit.report.tables import grid_tables, interval_level, wide_table

    return wide_table(grid_tables(grid_dir, level=interval_level(level)))


def _column_specs(session: Session) -> tuple:
    """The specs of every report column: the built-in ones and those plugins' tables bring
    (their directions, intervals and noise classes decide suggest and compare)."""
    from sweepkit.report.registry import report_registry

    return tuple(report_registry(session).columns().values())


def cmd_suggest(session: Session) -> int:
    """The winner of each one-factor axis by a column, and the combo cell that joins them."""
    from sweepkit.report.suggest import format_suggestion, suggest

    options = session.options
    cells = _selected(session)
    if not cells:
        return ExitCode.NO_CELLS
    grids = {cell.grid_name for cell in cells}
    if len(grids) != 1:
        raise UsageError(f"sweep suggest takes one grid, got {len(grids)}: {', '.join(sorted(grids))}")
    (grid,) = grids
    grid_dir = session.runs_dir / grid
    if not grid_dir.is_dir():
        raise UsageError(f"{grid}: no runs under {session.display_path(session.runs_dir)}; run it first")
    result = suggest(cells, _report_table(grid_dir, options.level), column=options.by, lower_is_better=options.lower,
                     specs=_column_specs(session))
    session.console.print(format_suggestion(result), markup=False, soft_wrap=True)
    return ExitCode.OK


def _compare_side(session: Session, spec: str, level):
    """One side of ``sweep compare``: a ``runs/<grid>`` dir, a grid of this runs dir, or
    ``REV:PATH``, the report tables committed at git revision REV under PATH."""
    from sweepkit.report.compare import committed_table
    from sweepkit.report.tables import wide_table

    revision, colon, path = spec.partition(":")
    if colon and revision and path and not Path(spec).exists():
        return wide_table(committed_table(session.rootdir, revision, path))
    directory = Path(spec)
    if not directory.is_dir():
        directory = session.runs_dir / Path(spec).stem
    if directory.is_dir() and any(directory.glob("*/cell.json")):
        return _report_table(directory, level)
    raise UsageError(f"sweep compare: {spec}: not a grid's runs (a directory of cell dirs, such as "
                     f"runs/<grid>, a grid of this runs dir, or REV:PATH for the report tables "
                     f"committed at git revision REV)")


def cmd_compare(session: Session) -> int:
    """Two runs of a grid, cell by cell: each column's change and which exceed the noise, the
    noise from the rows' intervals (their seeds' spread where they have seeds)."""
    from sweepkit.report.compare import compare, compared_columns, format_compare, noise_note

    options = session.options
    a, b = (_compare_side(session, spec, options.level) for spec in (options.a, options.b))
    specs = _column_specs(session)
    columns = compared_columns(a, b, options.columns.split(",") if options.columns else None, specs)
    frame = compare(a, b, columns=columns, specs=specs)
    session.console.print(format_compare(frame, noise_note(frame)), markup=False, soft_wrap=True)
    return ExitCode.OK


def cmd_plugins(session: Session) -> int:
    rows, hook_names = [], []
    for name, module in session.pm.list_name_plugin():
        hooks = plugin.hooks_of(session.pm, module)
        hook_names += hooks
        rows.append((name, plugin.how_loaded(session.pm, name, module), ", ".join(hooks)))
    longest = max((len(hook) + 1 for hook in hook_names), default=1)  # with its comma
    table = _plugins_table(rows)
    console = session.console
    wide = console.options.update(max_width=100_000)
    if console.is_terminal:
        # Fit the terminal, but no narrower than the table whose hooks column holds one name
        # a line: below that, rich would cut names to fit.
        narrowest = _plugins_table([(name, how, "x" * longest) for name, how, _ in rows])
        width = max(console.width, Measurement.get(console, wide, narrowest).maximum)
    else:
        # A pipe or a file: every plugin on one line, whatever $COLUMNS says, so that it greps.
        width = Measurement.get(console, wide, table).maximum
    before = console.width
    console.width = width
    try:
        console.print(table)
    finally:
        console.width = before
    registry = session.registry
    for label, names in (("targets", registry.targets), ("executors", registry.executors),
                         ("profiles", registry.profiles), ("launch keys", registry.keys)):
        session.console.print(f"{label}: {', '.join(names) or '(none)'}", markup=False)
    return ExitCode.OK
