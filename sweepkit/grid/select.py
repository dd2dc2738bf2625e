"""Selection: ``PATH::CELL``, ``-k``, ``-m`` and ``--failed`` narrow the collected cells."""

from __future__ import annotations

import difflib

from sweepkit.errors import UsageError, did_you_mean
from sweepkit.grid.cell import Cell
from sweepkit.grid.expression import Expression, ParseError, TokenType, tokenize


def compile_option(flag: str, text: str) -> Expression:
    try:
        return Expression.compile(text)
    except ParseError as exc:
        pointer = " " * (exc.column - 1) + "^"
        raise UsageError(f"{flag} {text!r}: wrong expression at column {exc.column}: {exc.message}",
                         f"    {text}", f"    {pointer}") from None


def keyword_matcher(cell: Cell):
    """``-k``: a name matches when it is a substring (any case) of a keyword of the cell."""
    words = [w.lower() for w in cell.keywords]
    return lambda name: any(name.lower() in word for word in words)


def mark_matcher(cell: Cell):
    """``-m``: a name matches when the cell carries a mark of exactly that name."""
    names = {m.name for m in cell.marks}
    return lambda name: name in names


def unknown_marks(markexpr: str, cells: list[Cell]) -> None:
    """Refuse a ``-m`` expression that names a mark no collected cell has (a typo would select
    nothing, or, under ``not``, everything), listing the marks there are."""
    known = sorted({m.name for c in cells for m in c.marks})
    names = [t.value for t in tokenize(markexpr) if t.type is TokenType.IDENT]
    missing = list(dict.fromkeys(name for name in names if name not in known))
    if not missing:
        return
    lines = [f"-m {markexpr!r}: no cell has the mark {name!r}{did_you_mean(name, known, n=1)}" for name in missing]
    lines[-1] += f"; the marks of the collected cells: {', '.join(known) or 'none'}"
    raise UsageError(*lines)


def by_node_ids(cells: list[Cell], wanted: dict[str, frozenset[str] | None]) -> list[Cell]:
    """Keep the cells the ``PATH::CELL`` arguments named; unknown ids are errors with near names."""
    errors = []
    for grid, names in wanted.items():
        if names is None:
            continue
        known = [c.name for c in cells if c.grid == grid]
        for name in sorted(names - set(known)):
            close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
            hint = f"; near names: {', '.join(close)}" if close else f"; it has: {', '.join(known)}"
            errors.append(f"{grid}::{name}: no such cell in {grid}{hint}")
    if errors:
        raise UsageError(*errors)
    return [c for c in cells if wanted.get(c.grid) is None or c.name in wanted[c.grid]]


def select(session, cells: list[Cell], wanted: dict[str, frozenset[str] | None],
           keyword: str | None = None, markexpr: str | None = None,
           failed: bool = False) -> list[Cell]:
    """The selected cells in collection order; the hook hears about the rest."""
    selected = by_node_ids(cells, wanted)
    if keyword:
        expression = compile_option("-k", keyword)
        selected = [c for c in selected if expression.evaluate(keyword_matcher(c))]
    if markexpr:
        expression = compile_option("-m", markexpr)
        unknown_marks(markexpr, cells)
        selected = [c for c in selected if expression.evaluate(mark_matcher(c))]
    if failed:
        try:
            from sweepkit.state.records import last_failed
        except ImportError as exc:
            raise UsageError(f"--failed needs the run state module: {exc}") from None
        selected = list(last_failed(session.runs_dir, selected))
    chosen = {id(c) for c in selected}
    deselected = [c for c in cells if id(c) not in chosen]
    if deselected:
        session.hook.sweep_deselected(cells=deselected)
    return selected
