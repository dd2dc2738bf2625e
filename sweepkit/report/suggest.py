"""``sweep suggest``: the winner of each one-factor axis of a grid by one report column,
where the data can tell it from the noise, and the combo cell that joins the winners'
changes, as grid-file code to paste.

The rules:

- **Axes.** The cells are grouped by the set of keys their diff against ``base`` changes:
  ``tbs64`` and ``tbs128`` (both change ``train_batch_size, policy_mini_batch_size``) are one
  axis, ``cudagraph`` (``enforce_eager``) another. A cell whose keys are exactly the union of
  two or more smaller groups' keys is a *combo* of those axes (``combo_B`` = ``cudagraph`` +
  ``tbs128``), not an axis: it is listed as measured, and takes no part in picking winners.
  The repeats of a cell over seeds are its report row, not an axis of ``seed``.
- **Options.** Each axis competes with ``base``, its "no change" option. Only cells that
  passed (``passed``, or ``xpassed``: an expected failure that ran to its end) and have a
  value in the column compete; the others are excluded and named with the reason (their
  status, "no <column>", "not in the report"). A table without a ``status`` column is taken
  as all passed. NaN counts as missing.
- **Only on signal.** A change wins only when its Δ against base is a finding: for
  ``sec_per_step`` (and ``delta_vs_base_pct``) and ``pass_at_k``, the report's verdict of
  that row (its Δ interval excludes 0, at a level that holds for all the grid's
  comparisons at once; ``sweepkit.report.intervals``), in the better direction; for a column the
  report gives no interval, a move beyond ``sweepkit.report.compare.DEFAULT_NOISE`` (5 % of base's
  value for timings, 0.02 for rates), said as such. A change whose knobs its run reported
  as having no effect (verdict ``inert``) never wins. Among an axis's findings the best
  value wins (ties: the first in the grid). An axis without a finding keeps base's value
  and says why: "no winner (within noise)", "inert here", "too few steps" or "1 seed".
- **No base value.** When ``base`` did not pass or has no value, nothing can be told from
  the noise: no axis has a winner, and the suggestion says so.
- **Joining.** Axes whose winner is ``base`` contribute nothing. Two winners that set the
  same key to different values conflict: the one with the better value is kept and the
  other dropped, with a note (setting a key to the same value is no conflict).
- **The code.** One comment line per axis (its winner, its Δ vs base with the interval and
  what it rests on: timed steps or seeds), then ``<name> = sk.cell(key=value, ...)``;
  ``name`` is made unique against the grid's cell ids, so that appending the code to the
  grid file adds one cell with exactly the joined changes. When a measured cell already
  has exactly those changes, the suggestion says so (appending would then be refused as two
  cells with the same config).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import polars as pl

from steadystate import ratio
from sweepkit.errors import UsageError, did_you_mean
from sweepkit.grid.cell import Cell
from sweepkit.report.columns import BY_NAME, COLUMNS, ReportColumn, by_name, directions, shown_as
from sweepkit.report.compare import OTHER, Noise, default_noise
from sweepkit.report.intervals import AGAINST
from sweepkit.report.suggest_code import code_text, number_text
from sweepkit.report.tables import BASE_CELL

DEFAULT_NAME = "combo_suggested"
# Outcomes whose numbers stand for the cell's config (sweepkit.state.records.outcome's words).
PASSING = ("passed", "xpassed")
# The columns with a known better direction (True: lower is better), from their specs'
# ``better``; any other numeric column needs lower_is_better spelled out.
DIRECTIONS = directions(COLUMNS)
# The columns whose numbers rest on timed steps (what a row's Δ rests on, said in the code).
TIMED = ("sec_per_step", "delta_vs_base_pct", "tok_per_s")


@attrs.frozen(kw_only=True)
class Signal:
    """How the report tells a column's Δ vs base from the noise: the row's verdict column,
    the words of a finding in each direction, and the Δ with its bounds (``scale``: 100 for
    a Δ kept in percent)."""

    verdict: str
    lower: str  # the verdict of a lower value
    higher: str
    delta: tuple[str, str, str]
    percent: bool


def signals(specs: Iterable[ReportColumn]) -> dict[str, Signal]:
    """Column -> its signal, for the columns whose spec names the ``verdict`` that decides
    them: the Δ-vs-base comparison that writes that verdict (``intervals.AGAINST``)."""
    specs = tuple(specs)
    named = {**BY_NAME, **by_name(specs)}
    comparisons = {against.verdict: against for against in AGAINST}
    out = {}
    for spec in specs:
        if spec.verdict is None:
            continue
        against = comparisons.get(spec.verdict)
        if against is None:
            raise UsageError(f"suggest: column {spec.name!r}: no Δ vs base writes its verdict {spec.verdict!r} "
                             f"(known: {', '.join(comparisons)})")
        out[spec.name] = Signal(verdict=against.verdict, lower=against.lower, higher=against.higher,
                                delta=(against.column, *named[against.column].bounds),
                                percent=against.change is ratio)
    return out


SIGNALS = signals(COLUMNS)
# What a row's verdict says when it is no finding, as an axis's reason to keep base.
NO_FINDING = {"within noise": "no winner (within noise)", "inert": "inert here", "too few steps": "too few steps",
              "1 seed": "1 seed: no seed spread measured (give base seeds=3)"}


@attrs.frozen(kw_only=True)
class Option:
    """One competitor of an axis: a cell and its value (None where it is excluded), its Δ
    vs base with its interval, what it rests on, and whether it is a finding."""

    cell: str
    value: float | None
    changes: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)
    excluded: str | None = None  # why it does not compete
    delta: tuple[float | None, float | None, float | None] | None = None  # value, low, high
    verdict: str | None = None  # the report's word, or the default rule's
    rests_on: str = ""  # "18 timed steps", "3 seeds"
    finding: bool = False


@attrs.frozen(kw_only=True)
class Axis:
    """One axis: the keys its cells change, its options (base first, then grid order), the
    winner (``base`` for no change; None when nothing competed) and why."""

    keys: tuple[str, ...]
    name: str  # the grid variable when its cells share one, else the keys
    options: tuple[Option, ...]
    winner: str | None
    value: float | None
    tied: tuple[str, ...] = ()  # the other findings with the winning value
    dropped: str | None = None  # the conflict that kept the winner's changes out
    why: str | None = None  # why base is kept: no finding among the options

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
    base_rests_on: str
    axes: tuple[Axis, ...]
    changes: Mapping[str, Any] = attrs.field(converter=dict)  # the joined changes, key -> value
    joined: tuple[str, ...]  # the winning cells whose changes are in ``changes``
    combos: tuple[Option, ...]  # measured combos of axes, not competing
    notes: tuple[str, ...]
    name: str
    same_as: str | None  # a measured cell with exactly ``changes``
    rule: str  # how a change was told from the noise
    delta_percent: bool = False  # the column's Δ vs base is in percent

    @property
    def code(self) -> str:
        """Grid-file code to append: comments per axis, then the cell (or only comments)."""
        return code_text(self)


def suggest(cells: Sequence[Cell], table: pl.DataFrame, *, column: str,
            lower_is_better: bool | None = None, name: str = DEFAULT_NAME,
            specs: Iterable[ReportColumn] = COLUMNS) -> Suggestion:
    """The winner of each one-factor axis of the grid of ``cells`` by ``column`` of
    ``table`` (the report's tables of the grid, joined: one row per cell, its repeats over
    seeds folded in), and the combo that joins them.

    ``lower_is_better`` may be left out for the columns whose spec says which direction is
    better (:data:`DIRECTIONS`, of ``specs``: the built-in columns, and those a plugin's
    tables bring).
    """
    specs = tuple(specs)
    lower_is_better = _direction(table, column, lower_is_better, directions(specs))
    noise = default_noise(specs).get(column, OTHER)
    known_signals = signals(specs)
    cells = [cell for cell in cells if getattr(cell, "group", cell.name) == cell.name]  # a row per repeat group
    grids = {cell.grid for cell in cells}
    if len(grids) > 1:
        raise UsageError(f"suggest: cells of one grid expected, got {', '.join(sorted(grids))}")
    base = next((cell for cell in cells if cell.name == BASE_CELL), None)
    if base is None:
        raise UsageError("suggest: the grid has no base cell")
    rows = _rows(table, column, shown_as(specs, "verdict"))
    signal = known_signals.get(column)
    if signal is not None and signal.verdict not in table.columns:
        signal = None  # a table made before the report had intervals: the default rule
    good = None if signal is None else signal.lower if lower_is_better else signal.higher
    base_row = rows.get(BASE_CELL, {})
    base_value = base_row.get("value") if base_row.get("status") in PASSING else None

    def option(cell: Cell) -> Option:
        changes = {key: after for key, (_, after) in cell.diff.items()}
        row = rows.get(cell.name)
        if row is None:
            return Option(cell=cell.name, value=None, changes=changes, excluded="not in the report")
        status, value = row["status"], row["value"]
        if status not in PASSING:
            return Option(cell=cell.name, value=None, changes=changes, excluded=status or "no status")
        if value is None:
            return Option(cell=cell.name, value=None, changes=changes, excluded=f"no {column}")
        if cell.name == BASE_CELL:
            return Option(cell=cell.name, value=value, changes=changes, rests_on=row["rests_on"])
        if signal is not None:
            delta = tuple(row.get(name) for name in signal.delta)
            verdict = row.get(signal.verdict)
            finding = verdict == good and base_value is not None
        else:
            verdict, delta, finding = _default_rule(noise, value, base_value, lower_is_better, row.get("inert"))
        return Option(cell=cell.name, value=value, changes=changes, delta=delta, verdict=verdict,
                      rests_on=row["rests_on"], finding=finding)

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
                     "no change can be told from the noise, so no axis has a winner")
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
    rule = (f"a change counts when the report's interval of its Δ vs base excludes 0 ({signal.verdict})"
            if signal is not None else
            f"{column} has no interval in the report: a change counts beyond the default noise rule "
            f"(sweepkit.report.compare.DEFAULT_NOISE: {_rule_text(noise)})")
    return Suggestion(column=column, lower_is_better=lower_is_better, base_value=base_value,
                      base_rests_on=base_option.rests_on, axes=tuple(axes), changes=changes, joined=tuple(joined),
                      combos=combos, notes=tuple(notes), name=unique, same_as=same_as, rule=rule,
                      delta_percent=column in known_signals and known_signals[column].percent)


def _rule_text(noise: Noise) -> str:
    return f"{noise.relative:.0%} of base" if noise.relative else f"{noise.absolute:g} absolute"


def _default_rule(noise: Noise, value: float, base: float | None, lower_is_better: bool, inert: bool):
    """(verdict, Δ, finding) of a column the report gives no interval: the compare rule
    ``noise``."""
    if base is None:
        return None, None, False
    if inert:
        return "inert", (value - base, None, None), False
    threshold = max(noise.absolute, noise.relative * abs(base))
    move = value - base
    if abs(move) <= threshold:
        return "within noise", (move, None, None), False
    better = move < 0 if lower_is_better else move > 0
    return ("better" if better else "worse"), (move, None, None), better


def _direction(table: pl.DataFrame, column: str, lower_is_better: bool | None, known: Mapping[str, bool]) -> bool:
    if column not in table.columns:
        raise UsageError(f"suggest: --by {column}: no such column in the report{did_you_mean(column, table.columns)}")
    if not table.schema[column].is_numeric():
        raise UsageError(f"suggest: --by {column}: the column is not numeric ({table.schema[column]})")
    if lower_is_better is None:
        if column not in known:
            raise UsageError(f"suggest: --by {column}: say whether lower or higher {column} is better "
                             f"(--lower or --higher; known: {', '.join(known)})")
        return known[column]
    return lower_is_better


def _rows(table: pl.DataFrame, column: str, verdict_columns: Sequence[str]) -> dict[str, dict[str, Any]]:
    """cell -> its row: ``status``, ``value`` (None where missing or NaN), ``rests_on``,
    ``inert`` (a verdict of ``verdict_columns`` says so) and the columns a signal reads."""
    out = {}
    for row in table.iter_rows(named=True):
        value = row.get(column)
        value = None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)
        status = row.get("status", PASSING[0]) if "status" in table.columns else PASSING[0]
        seeds, steps = row.get("seeds"), row.get("timed_steps")
        if seeds and seeds > 1:
            rests_on = f"{seeds} seeds"
        elif column in TIMED and steps:
            rests_on = f"{steps} timed step{'' if steps == 1 else 's'}"
        elif column == "pass_at_k" and row.get("eval_prompts"):
            rests_on = f"1 seed, {row['eval_prompts']} prompts"
        else:
            rests_on = ""
        verdicts = [row.get(name) for name in verdict_columns]
        out[row["cell"]] = {**row, "status": status, "value": value, "rests_on": rests_on,
                            "inert": "inert" in verdicts}
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
    findings = [o for o in competing if o.finding]
    if not findings:
        why = f"no base value to compare with ({base_option.excluded})" if base_option.excluded else \
            _no_winner(options)
        return Axis(keys=keys, name=name, options=options, winner=BASE_CELL, value=base_option.value, why=why)
    best = min(o.value for o in findings) if lower_is_better else max(o.value for o in findings)
    tied = [o.cell for o in findings if o.value == best]  # grid order: the first wins a tie
    return Axis(keys=keys, name=name, options=options, winner=tied[0], value=best, tied=tuple(tied[1:]))


def _no_winner(options: Sequence[Option]) -> str:
    """Why an axis keeps base: what its options' verdicts say."""
    verdicts = [o.verdict for o in options if o.cell != BASE_CELL and o.value is not None]
    if not verdicts:
        return "nothing to compare with base"
    if all(verdict == "inert" for verdict in verdicts):
        return NO_FINDING["inert"]
    for verdict in ("within noise", "1 seed", "too few steps"):
        if verdict in verdicts:
            return NO_FINDING[verdict]
    return "no change beats base"


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
                    f"kept {other.winner} ({number_text(other.value)} vs {number_text(axis.value)})")
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


def format_suggestion(s: Suggestion) -> str:
    """The suggestion as the command prints it: the code block to paste."""
    return s.code
