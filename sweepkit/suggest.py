"""``sweep suggest``: the winner of each one-factor axis of a grid by one report column, and
the combo cell that joins the winners' changes, as grid-file code to paste.

The rules:

- **Axes.** The cells are grouped by the set of keys their diff against ``base`` changes:
  ``tbs64`` and ``tbs128`` (both change ``train_batch_size, policy_mini_batch_size``) are one
  axis, ``cudagraph`` (``enforce_eager``) another. A cell whose keys are exactly the union of
  two or more smaller groups' keys is a *combo* of those axes (``combo_B`` = ``cudagraph`` +
  ``tbs128``), not an axis: it is listed as measured, and takes no part in picking winners.
- **Options.** Each axis competes with ``base``, its "no change" option. Only cells that
  passed (``passed``, or ``xpassed``: an expected failure that ran to its end) and have a
  value in the column compete; the others are excluded and named with the reason (their
  status, "no <column>", "not in the report"). A table without a ``status`` column is taken
  as all passed. NaN counts as missing.
- **Ties.** Equal values: ``base`` wins over a change (a change must earn its place), and
  among changes the one first in the grid.
- **No base value.** When ``base`` did not pass or has no value, each axis's best cell still
  wins, with no "vs base", and the suggestion says so.
- **Joining.** Axes whose winner is ``base`` contribute nothing. Two winners that set the
  same key to different values conflict: the one with the better value is kept and the
  other dropped, with a note (setting a key to the same value is no conflict).
- **The code.** One comment line per axis (its winner and the change vs base), then
  ``<name> = sk.cell(key=value, ...)``; ``name`` is made unique against the grid's cell ids,
  so that appending the code to the grid file adds one cell with exactly the joined changes.
  When a measured cell already has exactly those changes, the suggestion says so (appending
  would then be refused as two cells with the same config).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import polars as pl

from sweepkit.cell import Cell
from sweepkit.errors import UsageError, did_you_mean
from sweepkit.report import BASE_CELL

DEFAULT_NAME = "combo_suggested"
LINE_WIDTH = 100  # the cell on one line up to this width, else one line per winner
# Outcomes whose numbers stand for the cell's config (sweepkit.state.outcome's words).
PASSING = ("passed", "xpassed")
# The columns with a known better direction (True: lower is better); any other numeric
# column needs lower_is_better spelled out.
DIRECTIONS = {
    "sec_per_step": True,
    "delta_vs_base_pct": True,
    "tok_per_s": False,
    "memory_peak_gb": True,
    "reward_last": False,
    "pass_at_1": False,
    "pass_at_k": False,
    "kl_last": True,
}


@attrs.frozen(kw_only=True)
class Option:
    """One competitor of an axis: a cell and its value (None where it is excluded)."""

    cell: str
    value: float | None
    changes: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)
    excluded: str | None = None  # why it does not compete


@attrs.frozen(kw_only=True)
class Axis:
    """One axis: the keys its cells change, its options (base first, then grid order), the
    winner (``base`` for no change; None when nothing competed) and why."""

    keys: tuple[str, ...]
    name: str  # the grid variable when its cells share one, else the keys
    options: tuple[Option, ...]
    winner: str | None
    value: float | None
    tied: tuple[str, ...] = ()  # the other cells with the winning value
    dropped: str | None = None  # the conflict that kept the winner's changes out

    @property
    def winner_option(self) -> Option | None:
        return next((o for o in self.options if o.cell == self.winner), None)

    @property
    def changes(self) -> dict[str, Any]:
        option = self.winner_option
        return dict(option.changes) if option is not None else {}


@attrs.frozen(kw_only=True)
class Suggestion:
    column: str
    lower_is_better: bool
    base_value: float | None
    axes: tuple[Axis, ...]
    changes: Mapping[str, Any] = attrs.field(converter=dict)  # the joined changes, key -> value
    joined: tuple[str, ...]  # the winning cells whose changes are in ``changes``
    combos: tuple[Option, ...]  # measured combos of axes, not competing
    notes: tuple[str, ...]
    name: str
    same_as: str | None  # a measured cell with exactly ``changes``

    @property
    def code(self) -> str:
        """Grid-file code to append: comments per axis, then the cell (or only comments)."""
        return _code(self)


def suggest(cells: Sequence[Cell], table: pl.DataFrame, *, column: str,
            lower_is_better: bool | None = None, name: str = DEFAULT_NAME) -> Suggestion:
    """The winner of each one-factor axis of the grid of ``cells`` by ``column`` of
    ``table`` (a ``grid_tables`` frame: one row per cell), and the combo that joins them.

    ``lower_is_better`` may be left out for the columns of :data:`DIRECTIONS`.
    """
    lower_is_better = _direction(table, column, lower_is_better)
    cells = list(cells)
    grids = {cell.grid for cell in cells}
    if len(grids) > 1:
        raise UsageError(f"suggest: cells of one grid expected, got {', '.join(sorted(grids))}")
    base = next((cell for cell in cells if cell.name == BASE_CELL), None)
    if base is None:
        raise UsageError("suggest: the grid has no base cell")
    rows = _rows(table, column)

    def option(cell: Cell) -> Option:
        changes = {key: after for key, (_, after) in cell.diff.items()}
        if cell.name not in rows:
            return Option(cell=cell.name, value=None, changes=changes, excluded="not in the report")
        status, value = rows[cell.name]
        if status not in PASSING:
            return Option(cell=cell.name, value=None, changes=changes, excluded=status or "no status")
        if value is None:
            return Option(cell=cell.name, value=None, changes=changes, excluded=f"no {column}")
        return Option(cell=cell.name, value=value, changes=changes)

    base_option = option(base)
    others = sorted((cell for cell in cells if cell is not base and cell.diff),
                    key=lambda cell: (cell.index is None, cell.index or 0))
    groups: dict[frozenset[str], list[Cell]] = {}
    for cell in others:
        groups.setdefault(frozenset(cell.diff), []).append(cell)
    combo_keys = _combos(groups)
    notes = []
    if base_option.excluded is not None:
        notes.append(f"base has no {column} to compare with ({base_option.excluded}): "
                     "each axis's best cell wins unchecked")
    axes = [_axis(group, base_option, option, lower_is_better)
            for keys, group in groups.items() if keys not in combo_keys]
    axes, changes, joined, conflict_notes = _join(axes, lower_is_better)
    notes += conflict_notes
    combos = tuple(option(cell) for keys, group in groups.items() if keys in combo_keys for cell in group)
    same_as = next((cell.name for cell in others if changes and _same(cell, changes)), None)
    taken = {cell.name for cell in cells}
    unique, counter = name, 2
    while unique in taken:
        unique, counter = f"{name}_{counter}", counter + 1
    return Suggestion(column=column, lower_is_better=lower_is_better, base_value=base_option.value,
                      axes=tuple(axes), changes=changes, joined=tuple(joined), combos=combos,
                      notes=tuple(notes), name=unique, same_as=same_as)


def _direction(table: pl.DataFrame, column: str, lower_is_better: bool | None) -> bool:
    if column not in table.columns:
        raise UsageError(f"suggest: no column {column!r} in the table{did_you_mean(column, table.columns)}")
    if not table.schema[column].is_numeric():
        raise UsageError(f"suggest: column {column!r} is not numeric ({table.schema[column]})")
    if lower_is_better is None:
        if column not in DIRECTIONS:
            raise UsageError(f"suggest: say whether lower or higher {column} is better "
                             f"(known: {', '.join(DIRECTIONS)})")
        return DIRECTIONS[column]
    return lower_is_better


def _rows(table: pl.DataFrame, column: str) -> dict[str, tuple[str | None, float | None]]:
    """cell -> (status, value): the value None where missing or NaN."""
    status = pl.col("status") if "status" in table.columns else pl.lit(PASSING[0])
    frame = table.select(pl.col("cell"), status.alias("status"), pl.col(column).cast(pl.Float64).alias("value"))
    out = {}
    for cell, state, value in frame.iter_rows():
        out[cell] = (state, None if value is None or math.isnan(value) else value)
    return out


def _combos(groups: Mapping[frozenset[str], list[Cell]]) -> set[frozenset[str]]:
    """The key sets that are the union of two or more smaller key sets of the grid."""
    combos = set()
    for keys in groups:
        parts = [other for other in groups if other < keys]
        if len(parts) >= 2 and frozenset().union(*parts) == keys:
            combos.add(keys)
    return combos


def _axis(group: list[Cell], base_option: Option, option, lower_is_better: bool) -> Axis:
    keys = tuple(group[0].diff)
    variables = [set(cell.keywords) - {cell.name, cell.grid_name} - {m.name for m in cell.marks}
                 for cell in group]
    shared = set.intersection(*variables)
    if len(shared) == 1:
        name = next(iter(shared))  # the axis's variable in the grid file
    elif len(group) == 1:
        name = group[0].name  # a named cell
    else:
        name = ", ".join(keys)
    options = (base_option, *(option(cell) for cell in group))
    competing = [o for o in options if o.value is not None]
    if not competing:
        return Axis(keys=keys, name=name, options=options, winner=None, value=None)
    best = min(o.value for o in competing) if lower_is_better else max(o.value for o in competing)
    # base first, then grid order: the first with the best value wins a tie.
    tied = [o.cell for o in competing if o.value == best]
    return Axis(keys=keys, name=name, options=options, winner=tied[0], value=best, tied=tuple(tied[1:]))


def _join(axes: list[Axis], lower_is_better: bool):
    """Winners' changes joined, the better winner first; a winner that sets a key already set
    to another value is dropped."""
    changes: dict[str, Any] = {}
    owner: dict[str, Axis] = {}
    joined, notes = [], []
    winning = [a for a in axes if a.winner not in (None, BASE_CELL)]
    by_merit = sorted(winning, key=lambda a: a.value if lower_is_better else -a.value)  # stable: grid order on ties
    kept = []
    result = {id(a): a for a in axes}
    for axis in by_merit:
        clash = {key: value for key, value in axis.changes.items()
                 if key in changes and not _equal(changes[key], value)}
        if clash:
            other = owner[next(iter(clash))]
            text = ", ".join(f"{key}={value!r} (not {changes[key]!r})" for key, value in clash.items())
            note = (f"{axis.winner} conflicts with {other.winner} on {text}: "
                    f"kept {other.winner} ({_number(other.value)} vs {_number(axis.value)})")
            notes.append(note)
            result[id(axis)] = attrs.evolve(axis, dropped=note)
            continue
        kept.append(axis)
        for key, value in axis.changes.items():
            changes.setdefault(key, value)
            owner.setdefault(key, axis)
    # The cell reads in grid order: the axes' order, each winner's keys in its diff's order.
    kept_ids = {id(a) for a in kept}
    order = [a for a in axes if id(a) in kept_ids]
    for axis in order:
        joined.append(axis.winner)
    ordered = {key: changes[key] for axis in order for key in axis.changes}
    return [result[id(a)] for a in axes], ordered, joined, notes


def _equal(a, b) -> bool:
    # Tuples and lists are the same config value (the diff compares JSON forms).
    normal = (lambda v: list(v) if isinstance(v, tuple) else v)
    return normal(a) == normal(b)


def _same(cell: Cell, changes: Mapping[str, Any]) -> bool:
    diff = {key: after for key, (_, after) in cell.diff.items()}
    return diff.keys() == changes.keys() and all(_equal(diff[key], changes[key]) for key in diff)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _versus(value: float | None, base: float | None) -> str:
    if value is None or base is None:
        return ""
    if base > 0:
        return f" ({(value / base - 1) * 100:+.1f}% vs base)"
    return f" ({value - base:+.4g} vs base {_number(base)})"


def _axis_line(axis: Axis, s: Suggestion) -> str:
    others = ", ".join(f"{o.cell} {_number(o.value)}" for o in axis.options
                       if o.cell != axis.winner and o.value is not None)
    excluded = ", ".join(f"{o.cell}: {o.excluded}" for o in axis.options
                         if o.excluded is not None and o.cell != BASE_CELL)
    tail = "".join([f"; {others}" if others else "", f"; excluded {excluded}" if excluded else ""])
    if axis.winner is None:
        return f"{axis.name}: nothing to compare{tail}"
    tie = f", tied with {', '.join(axis.tied)}" if axis.tied else ""
    if axis.winner == BASE_CELL:
        return f"{axis.name}: base wins {_number(axis.value)}{tie}{tail}"
    changes = " ".join(f"{key}={value!r}" for key, value in axis.changes.items())
    dropped = "; dropped (conflict)" if axis.dropped else ""
    return (f"{axis.name}: {axis.winner} {_number(axis.value)}{_versus(axis.value, s.base_value)}"
            f" [{changes}]{tie}{tail}{dropped}")


def _literal(value: Any) -> str:
    text = repr(value)
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise UsageError(f"suggest: value {text} cannot be written as a Python literal") from None
    return text


def _code(s: Suggestion) -> str:
    direction = "lower" if s.lower_is_better else "higher"
    lines = [f"# Suggested by {s.column} ({direction} is better), base {_number(s.base_value)}:"]
    lines += [f"#   {_axis_line(axis, s)}" for axis in s.axes]
    if s.combos:
        lines.append("#   measured combos: " + ", ".join(
            f"{o.cell} {_number(o.value)}{_versus(o.value, s.base_value)}" if o.value is not None
            else f"{o.cell} ({o.excluded})" for o in s.combos))
    lines += [f"# {note}" for note in s.notes]
    if not s.changes:
        lines.append("# no axis beats base: no combo to suggest")
        return "\n".join(lines) + "\n"
    if s.same_as:
        lines.append(f"# {s.same_as} already has exactly these changes")
    arguments = ", ".join(f"{key}={_literal(value)}" for key, value in s.changes.items())
    line = f"{s.name} = sk.cell({arguments})  # {s.column}: joins {', '.join(s.joined)}"
    if len(line) <= LINE_WIDTH:
        return "\n".join([*lines, line]) + "\n"
    # Too long for one line: one line per joined winner, its numbers beside its keys.
    lines.append(f"{s.name} = sk.cell(")
    written: set[str] = set()
    for axis in s.axes:
        if axis.winner in s.joined and axis.dropped is None:
            own = [key for key in axis.changes if key not in written]  # a key two winners agree on: once
            written.update(own)
            keys = "".join(f"{key}={_literal(s.changes[key])}, " for key in own).rstrip()
            spacing = "  " if keys else ""
            lines.append(f"    {keys}{spacing}# {axis.winner} {_number(axis.value)}"
                         f"{_versus(axis.value, s.base_value)}")
    lines.append(")")
    return "\n".join(lines) + "\n"


def format_suggestion(s: Suggestion) -> str:
    """The suggestion as the command prints it: the code block to paste."""
    return s.code
