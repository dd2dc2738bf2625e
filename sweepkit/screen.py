"""Tables that fit the console's width, one line a row, as pytest's summary and polars' frames do.

A column is shown whole (ids, states, numbers: never wrapped, never cut), or cut (free text
such as a failure or a diff: truncated with an ellipsis, down to a floor), and it may be
optional (left out, lowest value first, when cutting is not enough). A table that cannot
fit even so is printed at its narrowest, whole, and the terminal wraps it: a cut id would
name nothing. The width is the console's: the terminal's, ``$COLUMNS``, or 80 for a pipe.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

# box=None, padding (0, 1), no padding at the edges: two spaces between columns.
GAP = 2
# What a cut column keeps where nothing else is left to give: a word and its ellipsis.
LAST_RESORT_FLOOR = 6


@attrs.frozen(kw_only=True)
class Column:
    """``floor``: the width the column may be cut down to (None: never cut); ``drop``: its
    rank among the columns left out to fit, lowest first (None: always shown)."""

    header: str
    justify: str = "left"
    floor: int | None = None
    drop: int | None = None


def fit_widths(columns: Sequence[Column], natural: Sequence[int], width: int) -> dict[int, int]:
    """Column index -> width, for the columns shown in ``width`` cells (every one, at its
    natural width, when they fit)."""
    shown = list(range(len(columns)))

    def floor(i: int, last_resort: bool) -> int:
        wanted = columns[i].floor
        return natural[i] if wanted is None else min(natural[i], LAST_RESORT_FLOOR if last_resort else wanted)

    def narrowest(last_resort: bool = False) -> int:
        return sum(floor(i, last_resort) for i in shown) + GAP * (len(shown) - 1)

    droppable = sorted((i for i, c in enumerate(columns) if c.drop is not None), key=lambda i: columns[i].drop)
    dropped = []
    while narrowest() > width and droppable:
        dropped.append(droppable.pop(0))
        shown.remove(dropped[-1])
    # What a later drop made room for comes back, most useful first.
    for i in reversed(dropped[:-1]):
        shown.append(i)
        shown.sort()
        if narrowest() > width:
            shown.remove(i)
    # Every optional column is out and it still does not fit: cut text below its floor.
    last_resort = narrowest() > width
    widths = {i: natural[i] for i in shown}
    cut = sorted((i for i in shown if columns[i].floor is not None), key=lambda i: natural[i])
    room = width - sum(natural[i] for i in shown if columns[i].floor is None) - GAP * (len(shown) - 1)
    # The narrow ones whole, the rest share what is left evenly (none below its floor).
    for position, i in enumerate(cut):
        share = room // (len(cut) - position)
        widths[i] = max(min(natural[i], share), floor(i, last_resort))
        room -= widths[i]
    return widths


def fitted_table(columns: Sequence[Column], rows: Sequence[Sequence[Text]], width: int) -> tuple[Table, int, list[str]]:
    """The rich Table of ``rows`` fitted to ``width`` cells, its total width (more than
    ``width`` when it cannot fit), and the headers left out."""
    natural = [max([cell_len(column.header)] + [row[i].cell_len for row in rows])
               for i, column in enumerate(columns)]
    widths = fit_widths(columns, natural, width)
    table = Table(box=None, pad_edge=False, show_edge=False)
    for i, column_width in widths.items():
        table.add_column(columns[i].header, justify=columns[i].justify, width=column_width, no_wrap=True,
                         overflow="ellipsis")
    for row in rows:
        table.add_row(*(row[i] for i in widths))
    total = sum(widths.values()) + GAP * (len(widths) - 1)
    return table, total, [column.header for i, column in enumerate(columns) if i not in widths]


def print_table(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[Text]],
                title: str | None = None) -> list[str]:
    """Print ``rows`` (one Text a column) to fit ``console``; returns the headers left out."""
    table, total, dropped = fitted_table(columns, rows, console.width)
    if title:
        console.print(Text(title, style="italic"))
    # A table wider than the console (it could not fit) is printed whole: rich would
    # otherwise squeeze every column, ids included.
    before = console.width
    console.width = max(before, total)
    try:
        console.print(table)
    finally:
        console.width = before
    return dropped
