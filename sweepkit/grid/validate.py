"""Validation of selected cells before anything runs (core plugin for keys and types).

Every error of every cell, from the core and from each plugin's
``sweep_validate_cell``, is gathered and reported together, each with the
file:line where the offending key was set; one error stops the whole run.
"""

from __future__ import annotations

import math
import os
import tempfile
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

from sweepkit.errors import UsageError, did_you_mean
from sweepkit.grid.cell import Cell
from sweepkit.grid.profile import profile_failure
from sweepkit.hookspec import hookimpl


def type_name(tp) -> str:
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(tp, "__name__", str(tp))


def check_type(value: Any, tp) -> bool:
    """Whether ``value`` (as written in a grid, or read from JSON) fits the annotation ``tp``.

    Ints are accepted for floats; lists for tuples (JSON has no tuples); bools are not ints.
    """
    if tp is Any:
        return True
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return any(check_type(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if tp is type(None) or tp is None:
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is str:
        return isinstance(value, str)
    if origin is tuple or tp is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if not args:
            return True
        if len(args) == 2 and args[1] is Ellipsis:
            return all(check_type(v, args[0]) for v in value)
        return len(value) == len(args) and all(check_type(v, a) for v, a in zip(value, args))
    if origin is list or tp is list:
        return isinstance(value, (list, tuple)) and all(check_type(v, args[0]) for v in value if args)
    if origin is dict or tp is dict:
        return isinstance(value, Mapping) and all(
            check_type(k, args[0]) and check_type(v, args[1]) for k, v in value.items() if args)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def _same_kind(before: Any, after: Any) -> bool:
    """For a target without schema: a value keeps the kind of the base's value."""
    if before is None or after is None:
        return True
    numbers = (int, float)
    if isinstance(before, bool) or isinstance(after, bool):
        return isinstance(before, bool) and isinstance(after, bool)
    if isinstance(before, numbers) and isinstance(after, numbers):
        return True
    if isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)):
        return True
    return type(before) is type(after)


def _finite(value: Any) -> bool:
    """False for a NaN or an infinity, also inside a list or dict: JSON has neither, and a
    run given one fails (or learns nothing) long after it started."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_finite(item) for item in value)
    if isinstance(value, Mapping):
        return all(_finite(item) for item in value.values())
    return True


def key_errors(cell: Cell, launch_types: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(key, message)`` for unknown keys, non-finite numbers and wrongly typed values of one
    cell, and relative paths that are not there."""
    errors = []
    schema = cell.target.schema
    for key, (written, absolute) in cell.resolved_paths.items():
        if cell.config.get(key) == absolute and not Path(absolute).exists():
            root = cell.target.places.get("root")
            errors.append((key, f"{key}: {written!r} is not there: a relative path in a cell is taken from the "
                                f"project root {root}, so it names {absolute}; correct it or give an absolute path"))
    for key, value in cell.config.items():
        if not _finite(value):
            errors.append((key, f"{key}: expected a finite number, got {value!r}"))
            continue
        if key in launch_types:
            tp = launch_types[key]
        elif schema is None:
            before = cell.diff.get(key, (None, None))[0]
            if not _same_kind(before, value):
                errors.append((key, f"{key}: expected {type(before).__name__} like the base's "
                                    f"{before!r}, got {value!r} ({type(value).__name__})"))
            continue
        elif key in schema:
            tp = schema[key]["type"]
        else:
            hint = did_you_mean(key, list(schema) + list(launch_types), n=1)
            errors.append((key, f"{key}: unknown key for target {cell.target.name!r}{hint}"))
            continue
        if not check_type(value, tp):
            name = schema[key]["type_name"] if schema and key in schema else type_name(tp)
            errors.append((key, f"{key}: expected {name}, got {value!r} ({type(value).__name__})"))
    return errors


def runs_dir_problem(runs_dir: Path) -> str | None:
    """Why the runs dir cannot hold run state, or None. A missing dir is fine if it can be made."""
    existing = Path(runs_dir)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"runs dir {runs_dir} is not writable: {existing} is not a directory"
    if existing == Path(runs_dir):
        try:
            with tempfile.NamedTemporaryFile(dir=existing, prefix=".write-test-"):
                pass
        except OSError as exc:
            return f"runs dir {runs_dir} is not writable: {exc.strerror or exc}"
    elif not os.access(existing, os.W_OK | os.X_OK):
        return f"runs dir {runs_dir} cannot be created: {existing} is not writable"
    return None


def _located(cell: Cell, message: str) -> tuple[str, int]:
    head = message.split(":", 1)[0].strip().strip("'\"")
    return cell.location_of(head) if head in cell.config else cell.location


Grouped = dict[tuple[str, int, str], list[str]]


def _add(grouped: Grouped, cell: Cell, messages) -> None:
    for message in messages:
        file, line = _located(cell, message)
        names = grouped.setdefault((file, line, message), [])
        if cell.name not in names:
            names.append(cell.name)


def _lines(grouped: Grouped) -> list[str]:
    lines = []
    for (file, line, message), names in grouped.items():
        who = names[0] if len(names) == 1 else f"{', '.join(names)} ({len(names)} cells)"
        lines.append(f"{file}:{line}: {who}: {message}")
    return lines


def key_error_lines(cells, launch_types: Mapping[str, Any]) -> list[str]:
    """The :func:`key_errors` of ``cells`` as validation shows them (``file:line: cells: message``)."""
    grouped: Grouped = {}
    for cell in cells:
        _add(grouped, cell, [message for _, message in key_errors(cell, launch_types)])
    return _lines(grouped)


def _messages(results) -> list[str]:
    return list(dict.fromkeys(m for messages in results for m in (messages or ())))


def _value_rules(session):
    """``sweep_validate_cell`` without the runner's check of the run state on disk: that
    check is about the cells that run (under ``--profile``, the profiled ones), not about
    the values a grid wrote."""
    runner = session.pm.get_plugin("sweepkit.run.runner")
    return session.pm.subset_hook_caller("sweep_validate_cell", remove_plugins=[runner] if runner else [])


def _set_by_profile(cell: Cell, message: str) -> str:
    head = message.split(":", 1)[0].strip()
    return f"{message} (the value --profile {cell.profile} sets)" if head in cell.profile_changes else message


def validate(session, cells: list[Cell], *, runs_dir: Path | None = None,
             outcome: str = "nothing was run") -> None:
    """Raise one UsageError listing every problem of every cell (grouped by place and message).

    Under ``--profile``, each cell's values as its grid wrote them are checked first (a
    profile must not hide a value the real run refuses), then what the profile made of them.
    An unusable runs dir is reported first and alone: plugins' checks may read run state there.
    """
    if runs_dir is not None:
        problem = runs_dir_problem(runs_dir)
        if problem:
            raise UsageError(problem, outcome)
    grouped: Grouped = {}
    value_rules = _value_rules(session) if any(cell.unprofiled is not None for cell in cells) else None
    for cell in cells:
        own: list[str] = []
        if cell.unprofiled is not None:
            own = _messages(value_rules(cell=cell.unprofiled, session=session))
            _add(grouped, cell.unprofiled, own)
        failed = profile_failure(session, cell)
        if failed is not None:  # the grid's own values above are the likely cause
            _add(grouped, cell, [] if own else [failed])
            continue
        messages = _messages(session.hook.sweep_validate_cell(cell=cell, session=session))
        _add(grouped, cell, [_set_by_profile(cell, m) for m in messages if m not in own])
    lines = _lines(grouped)
    if lines:
        count = len(lines)
        raise UsageError(*lines, f"{count} error{'s' if count > 1 else ''} found; {outcome}")


@hookimpl
def sweep_validate_cell(cell: Cell, session) -> list[str]:
    launch_types = {name: spec.type for name, spec in session.registry.keys.items()}
    return [message for _, message in key_errors(cell, launch_types)]
