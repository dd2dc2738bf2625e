"""The code ``sweep suggest`` prints: a :class:`sweepkit.report.suggest.Suggestion` as grid-file
code to paste, a comment line per axis (its winner, its Δ vs base with the interval and what it
rests on, the options that lost or were excluded), the notes, then the combo cell
(``<name> = sk.cell(key=value, ...)``), on one line up to :data:`LINE_WIDTH`, else one line per
joined winner with its numbers beside its keys.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

from sweepkit.errors import UsageError
from sweepkit.report.tables import BASE_CELL

if TYPE_CHECKING:
    from sweepkit.report.suggest import Axis, Option, Suggestion

LINE_WIDTH = 100  # the cell on one line up to this width, else one line per winner


def number_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _delta_text(option: Option, s: Suggestion) -> str:
    """``-20.0% [-22.1, -17.8] vs base`` (or the Δ without bounds), and what it rests on."""
    if option.delta is None or option.delta[0] is None:
        return ""
    value, low, high = option.delta
    percent = s.delta_percent
    form = "+.1f" if percent else "+.3g"
    text = format(value, form) + ("%" if percent else "")
    if low is not None or high is not None:
        text += f" [{'?' if low is None else format(low, form)}, {'?' if high is None else format(high, form)}]"
    rests = f"; {option.rests_on}, base {s.base_rests_on}" if option.rests_on and s.base_rests_on else ""
    return f"{text} vs base{rests}"


def _option_text(option: Option, s: Suggestion) -> str:
    delta = _delta_text(option, s)
    verdict = f" {option.verdict}" if option.verdict and not option.finding else ""
    return f"{option.cell} {number_text(option.value)}" + (f" ({delta})" if delta else "") + verdict


def _axis_line(axis: Axis, s: Suggestion) -> str:
    others = ", ".join(_option_text(o, s) for o in axis.options
                       if o.cell not in (axis.winner, BASE_CELL) and o.value is not None)
    excluded = ", ".join(f"{o.cell}: {o.excluded}" for o in axis.options
                         if o.excluded is not None and o.cell != BASE_CELL)
    tail = "".join([f"; {others}" if others else "", f"; excluded {excluded}" if excluded else ""])
    if axis.winner is None:
        return f"{axis.name}: nothing to compare{tail}"
    tie = f", tied with {', '.join(axis.tied)}" if axis.tied else ""
    if axis.winner == BASE_CELL:
        return f"{axis.name}: {axis.why}, base kept{tail.replace('; ', ': ', 1)}"
    winner = axis.winner_option
    changes = " ".join(f"{key}={value!r}" for key, value in axis.changes.items())
    dropped = "; dropped (conflict)" if axis.dropped else ""
    return f"{axis.name}: {_option_text(winner, s)} [{changes}]{tie}{tail}{dropped}"


def _literal(value: Any) -> str:
    text = repr(value)
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise UsageError(f"suggest: value {text} cannot be written as a Python literal") from None
    return text


def code_text(s: Suggestion) -> str:
    """Grid-file code to append: a comment line per axis, its notes, then the cell (or only
    comments when no axis beats base)."""
    direction = "lower" if s.lower_is_better else "higher"
    rests = f" ({s.base_rests_on})" if s.base_rests_on else ""
    lines = [f"# Suggested by {s.column} ({direction} is better), base {number_text(s.base_value)}{rests};",
             f"# {s.rule}:"]
    lines += [f"#   {_axis_line(axis, s)}" for axis in s.axes]
    if s.combos:
        lines.append("#   measured combos: " + ", ".join(
            _option_text(o, s) if o.value is not None else f"{o.cell} ({o.excluded})" for o in s.combos))
    lines += [f"# {note}" for note in s.notes]
    if not s.changes:
        lines.append("# no axis beats base beyond the noise: no combo to suggest")
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
            lines.append(f"    {keys}{spacing}# {_option_text(axis.winner_option, s)}")
    lines.append(")")
    return "\n".join(lines) + "\n"
