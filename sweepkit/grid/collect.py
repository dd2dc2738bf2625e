"""Collection: command-line paths -> grid files -> cells (core plugin for ``*.py`` grids).

A grid file is executed as a Python module; its module-level ``sk.*``
declarations become cells (:mod:`sweepkit.grid.resolve`). ``sweepconf.py`` files
are loaded before the directory they sit in is collected. A bad file does not stop the
others from being collected: the mistakes of every file are reported together.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from sweepkit.errors import UsageError, did_you_mean
from sweepkit.grid.cell import Cell, Mark, Target
from sweepkit.grid.declare import (
    AxisDecl,
    BaseDecl,
    CellDecl,
    GridError,
    GridErrors,
    ProductDecl,
    mark_problem,
    seeds_as_written,
)
from sweepkit.grid.ids import format_value
from sweepkit.grid.resolve import GridSpec, Start, build_cells
from sweepkit.grid.source import SWEEPCONF, exec_python_file, grid_usage_error
from sweepkit.grid.validate import key_error_lines
from sweepkit.hookspec import hookimpl

DEFAULT_GRID_DIR = "grids"
DEFAULT_TARGET = "trainer"
# session.stash key: grid path -> the UsageError its collection raised (raised again, not
# collected again, when another grid takes its base from it).
FAILED = "collect.failed"


@attrs.frozen(kw_only=True)
class Collected:
    """Cells of the named files, and which cells each ``PATH::CELL`` argument asked for.

    ``wanted`` maps a grid's display path to the cell ids named on the command
    line, or to None when the whole file was named.
    """

    cells: tuple[Cell, ...]
    wanted: dict[str, frozenset[str] | None]


def split_arg(arg: str) -> tuple[str, str | None]:
    path, sep, name = arg.partition("::")
    return path, (name if sep else None)


def grid_files_in(directory: Path) -> list[Path]:
    """The grid files of a directory: ``*.py`` not starting with ``_``, minus ``sweepconf.py``."""
    return sorted(p for p in directory.glob("*.py")
                  if not p.name.startswith("_") and p.name != SWEEPCONF)


def files_of_args(args: list[str], rootdir: Path) -> list[tuple[Path, str | None]]:
    """``(grid file, cell id or None)`` per argument, directories expanded; no args: ``grids/``."""
    if not args:
        default = rootdir / DEFAULT_GRID_DIR
        if not default.is_dir():
            raise UsageError(f"no PATH given and no {DEFAULT_GRID_DIR}/ directory in {rootdir}")
        args = [str(default)]
    out = []
    for arg in args:
        raw, name = split_arg(arg)
        path = Path(raw)
        if not path.exists():
            raise UsageError(f"{raw}: no such file or directory")
        if path.is_dir():
            if name is not None:
                raise UsageError(f"{arg}: '::CELL' needs a grid file, not a directory")
            out += [(p.resolve(), None) for p in grid_files_in(path)]
        else:
            out.append((path.resolve(), name))
    return out


def collect(session, args: list[str]) -> Collected:
    """Collect every grid file the arguments name (before profiles and selection); one
    UsageError lists the mistakes of all of them."""
    cells: list[Cell] = []
    wanted: dict[str, frozenset[str] | None] = {}
    owners: dict[str, str] = {}
    errors: list[str] = []
    for path, name in files_of_args(args, session.rootdir):
        display = session.display_path(path)
        if display not in wanted:
            owner = owners.setdefault(path.stem, display)
            if owner != display:
                errors.append(f"{display} and {owner} are both grid {path.stem!r}; "
                              f"their runs would share runs/{path.stem}/: rename one")
            try:
                cells += collect_file(path, session)
            except UsageError as exc:
                errors += exc.lines
            wanted[display] = frozenset()
        if name is None or wanted[display] is None:
            wanted[display] = None
        else:
            wanted[display] = wanted[display] | {name}
    if errors:
        # A grid whose base comes from a bad grid repeats that grid's errors.
        errors = list(dict.fromkeys(errors))
        if len(errors) > 1:
            bad_files = len(session.stash.get(FAILED, ()))  # also a grid that only gives a base
            where = f" in {bad_files} grid files" if bad_files > 1 else ""
            errors.append(f"{len(errors)} errors found{where}; nothing was run")
        raise UsageError(*errors)
    return Collected(cells=tuple(cells), wanted=wanted)


def collect_file(path: Path, session) -> list[Cell]:
    """Cells of one grid file, collected once per session (a base from another grid reuses them)."""
    path = Path(path).resolve()
    failed = session.stash.setdefault(FAILED, {})
    if path in failed:
        raise failed[path]
    if path in session.collected:
        if session.collected[path] is None:
            raise UsageError(f"{session.display_path(path)}: grids take their base from each other "
                             "in a cycle")
        return session.collected[path]
    session.collected[path] = None
    try:
        session.load_sweepconfs(path.parent)
        try:
            cells = session.hook.sweep_collect_file(path=path, session=session)
        except (GridError, GridErrors) as exc:
            # With the key errors of the cells that could be built: one round of fixes.
            launch_types = {name: spec.type for name, spec in session.registry.keys.items()}
            extra = key_error_lines(getattr(exc, "cells", ()), launch_types)
            raise grid_usage_error(exc, session.rootdir, extra) from None
        if cells is None:
            raise UsageError(f"{session.display_path(path)}: no plugin collects this file")
    except UsageError as exc:
        del session.collected[path]
        failed[path] = exc
        raise
    session.collected[path] = list(cells)
    return session.collected[path]


def _grid_spec(module, path: Path, session) -> GridSpec:
    display = session.display_path(path)
    lines = module.__dict__.get("__sweep_assignments__", {})
    own = [(name, value) for name, value in vars(module).items()
           if isinstance(value, (BaseDecl, CellDecl, AxisDecl, ProductDecl))
           and Path(value.location[0]) == path]
    problems: list[GridError] = []
    bases = [(name, d) for name, d in own if isinstance(d, BaseDecl)]
    problems += [GridError(d.location, f"a second sk.base ({name!r}); a grid has one base")
                 for name, d in bases[1:]]
    module_marks = module.__dict__.get("marks", ())
    module_marks = (module_marks,) if isinstance(module_marks, Mark) else tuple(module_marks)
    if not all(isinstance(m, Mark) for m in module_marks):
        problems.append(GridError((str(path), lines.get("marks", 0)),
                                  f"marks: expected a list of sk.mark.<name>, got {module.marks!r}"))
        module_marks = ()
    # A module-level ``seeds = N`` repeats every cell; a declaration of that name (an axis
    # over the seed key called ``seeds``) is a declaration, not the option.
    module_seeds = module.__dict__.get("seeds")
    if isinstance(module_seeds, (BaseDecl, CellDecl, AxisDecl, ProductDecl)):
        module_seeds = None
    target_value = module.__dict__.get("target", DEFAULT_TARGET)
    try:
        target = _target(target_value, (str(path), lines.get("target", 0)), session)
    except GridError as error:
        problems.append(error)
        target = Target(name=str(target_value), argv=())  # stands in while the cells are checked
    problems += _mark_problems(path, lines.get("marks", 0), module_marks, own)
    if not bases:
        if own:  # at the first declaration, which would be built on it
            first = min(d.location[1] for _, d in own)
            problems.append(GridError((str(path), first), "no base cell; declare one with base = sk.base(...)"))
        else:
            problems.append(GridError((str(path), 1), "the grid file declares nothing; declare its base cell: "
                                                      "base = sk.base(key=value, ...)"))
        raise GridErrors(problems)
    base = bases[0][1]
    try:
        base_start = _base_start(base, path, session)
    except GridError as error:
        raise GridErrors([*problems, error]) from None
    return GridSpec(
        grid=display, grid_name=path.stem,
        target=target.placed(grid_dir=path.parent, root=session.rootdir),
        module_marks=module_marks, base=base, base_start=base_start,
        module_seeds=seeds_as_written(module_seeds), module_seeds_location=(str(path), lines.get("seeds", 0)),
        declarations=tuple((n, d) for n, d in own if not isinstance(d, BaseDecl)),
        problems=tuple(problems))


def _mark_problems(path: Path, marks_line: int, module_marks, own) -> list[GridError]:
    """Every mark of the file that -m could not select, and every xfail without a reason."""
    placed = [((str(path), marks_line), mark) for mark in module_marks]
    for _, decl in own:
        placed += [(decl.location, mark) for mark in decl.marks]
        placed += [(param.location, mark) for param in getattr(decl, "params", ()) for mark in param.marks]
    return [GridError(location, problem) for location, mark in placed if (problem := mark_problem(mark))]


def _target(value, location, session) -> Target:
    if isinstance(value, Target):
        return value
    known = session.registry.targets
    if isinstance(value, str) and value in known:
        return known[value]
    names = ", ".join(sorted(known)) or "none; is the trainer plugin installed?"
    raise GridError(location, f"target {value!r}: not a registered target (registered: {names}) "
                              "and not an sk.command(...)")


def _base_start(base: BaseDecl, path: Path, session) -> Start:
    start = Start(config={}, locations={})
    if base.from_cell is not None:
        other_file, _, name = base.from_cell.partition("::")
        other = (path.parent / other_file).resolve()
        if not other.is_file():
            raise GridError(base.location, f"from_cell={base.from_cell!r}: no grid file {other_file} "
                                           f"next to this grid")
        try:
            cells = {c.name: c for c in collect_file(other, session)}
        except UsageError as exc:
            where = f"{session.display_path(base.location[0])}:{base.location[1]}"
            raise UsageError(*exc.lines, f"{where}: from_cell={base.from_cell!r}: {other_file} cannot "
                                         "be collected (above)") from None
        if name not in cells:
            raise GridError(base.location, f"from_cell={base.from_cell!r}: {other_file} has no cell "
                                           f"{name!r}{did_you_mean(name, cells)}")
        source = cells[name]
        # Keep pointing at the other grid's lines for keys this base does not override; its
        # relative paths as written, which this grid takes from the same project root.
        start = Start(config=source.written_config(),
                      locations={k: (str((session.rootdir / f).resolve()), line)
                                 for k, (f, line) in source.key_locations.items()})
    return start.updated(base.values, base.location)


@hookimpl(trylast=True)
def sweep_collect_file(path: Path, session):
    if path.suffix != ".py":
        return None
    module_name = f"_sweepgrid_{path.stem}_{abs(hash(str(path)))}"
    module = exec_python_file(path, session.rootdir, module_name)
    spec = _grid_spec(module, path, session)

    def make_id(axis_name, keys, values):
        return session.hook.sweep_make_cell_id(axis_name=axis_name, keys=keys, values=values,
                                               session=session)

    return build_cells(spec, session.registry.launch_defaults(), make_id, session.display_path)


@hookimpl(trylast=True)
def sweep_make_cell_id(axis_name, keys, values, session):
    return axis_name + "-".join(format_value(v) for v in values)
