"""The declarative grid-file API: ``sk.base``, ``sk.cell``, ``sk.axis``, ``sk.param``,
``sk.product``, ``sk.command`` and ``sk.mark``.

These calls only record what the file declares, with the file and line of each
call; :mod:`sweepkit.grid.collect` turns the recorded declarations into cells.

``seeds=`` (on every declaration, and as a module-level ``seeds = N``) repeats cells over
seeds: an int N (the cell's own seed and the N-1 after it) or a list of distinct ints.
It is recorded as written and checked with the rest of the file
(:func:`seeds_problem`), so that one bad value does not hide the file's other mistakes;
:mod:`sweepkit.grid.resolve` expands it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from sweepkit.grid.cell import Mark, Target

_THIS_FILE = __file__


class GridError(Exception):
    """A mistake in a grid file, at a known file and line."""

    def __init__(self, location: tuple[str, int], message: str):
        self.location = location
        self.message = message
        super().__init__(f"{location[0]}:{location[1]}: {message}")


class GridErrors(Exception):
    """Every mistake found in one grid file, in file order: collection goes on past the
    first, so that one round of fixes is enough."""

    def __init__(self, errors, cells=()):
        unique = {(e.location, e.message): e for e in errors}  # a cell built on a broken one repeats it
        self.errors = tuple(sorted(unique.values(), key=lambda e: (e.location[0], e.location[1])))
        # The cells the file's other declarations make: their key errors are reported with these.
        self.cells = tuple(cells)
        super().__init__("\n".join(str(e) for e in self.errors))


def caller_location() -> tuple[str, int]:
    """File and line of the grid-file statement that called into this module."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == _THIS_FILE:
        frame = frame.f_back
    if frame is None:
        return ("<unknown>", 0)
    return (frame.f_code.co_filename, frame.f_lineno)


def _marks(value, location) -> tuple[Mark, ...]:
    items = [value] if isinstance(value, Mark) else list(value or ())
    for item in items:
        if not isinstance(item, Mark):
            raise GridError(location, f"marks: expected sk.mark.<name> values, got {item!r}")
    return tuple(items)


def mark_problem(mark: Mark) -> str | None:
    """Why a mark cannot stand on a cell: a name ``-m`` cannot select (it is matched as an
    identifier), or an xfail without a reason (the report shows the reason next to XFAIL)."""
    if not mark.name.isidentifier() or mark.name in ("and", "or", "not"):
        return (f"mark {mark.name!r}: a mark name must be a Python identifier other than and, or, not, "
                "so that -m can select it")
    if mark.name == "xfail" and not mark.reason.strip():
        return 'xfail needs a reason: sk.mark.xfail(reason="..."), shown next to XFAIL'
    return None


class MarkGenerator:
    """``sk.mark.<name>`` makes a mark of that name; ``sk.mark.xfail(reason=...)`` adds arguments."""

    def __getattr__(self, name: str) -> Mark:
        if name.startswith("_"):
            raise AttributeError(name)
        return Mark(name=name)


mark = MarkGenerator()


def seeds_as_written(value):
    """``seeds=`` as recorded: a list becomes a tuple (declarations are frozen); anything
    else is kept as written, for :func:`seeds_problem` to name."""
    return tuple(value) if isinstance(value, list) else value


def is_int_seed(value) -> bool:
    """An int that can be a seed (a bool is no seed, although Python counts it an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def seeds_problem(value) -> str | None:
    """Why ``value`` is no ``seeds=``: it must be an int of at least 1 (that many seeds) or
    a non-empty list of distinct ints (exactly those seeds)."""
    if is_int_seed(value):
        return None if value >= 1 else f"seeds: must be at least 1, got {value}"
    if isinstance(value, tuple):
        if not value:
            return "seeds: an empty list; give at least one seed, or leave seeds= out"
        bad = [v for v in value if not is_int_seed(v)]
        if bad:
            return f"seeds: {bad[0]!r} ({type(bad[0]).__name__}) in {list(value)!r} is not an int seed"
        repeated = sorted({v for v in value if value.count(v) > 1})
        if repeated:
            return (f"seeds: {', '.join(map(str, repeated))} repeated in {list(value)!r}; "
                    "each seed must appear once (a repeated seed would run the same thing twice)")
        return None
    return (f"seeds: expected a number of seeds (an int of at least 1) or a list of distinct int "
            f"seeds, got {value!r} ({type(value).__name__})")


@attrs.frozen(kw_only=True, eq=False)
class BaseDecl:
    values: Mapping[str, Any]
    from_cell: str | None
    marks: tuple[Mark, ...]
    location: tuple[str, int]
    seeds: Any = None  # base's own, as a cell's is; the module-level ``seeds`` is the grid's


@attrs.frozen(kw_only=True, eq=False)
class CellDecl:
    values: Mapping[str, Any]
    on: Any
    marks: tuple[Mark, ...]
    location: tuple[str, int]
    seeds: Any = None


@attrs.frozen(kw_only=True, eq=False)
class Param:
    value: Any
    id: str | None
    marks: tuple[Mark, ...]
    location: tuple[str, int]
    seeds: Any = None


@attrs.frozen(kw_only=True, eq=False)
class AxisDecl:
    """One-factor-at-a-time values of one key, or of several keys tied together."""

    keys: tuple[str, ...]
    params: tuple[Param, ...]
    id_template: str | None
    ids: tuple[str, ...] | None
    on: Any
    marks: tuple[Mark, ...]
    location: tuple[str, int]
    seeds: Any = None


@attrs.frozen(kw_only=True, eq=False)
class ProductDecl:
    keys: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]
    id_template: str | None
    on: Any
    marks: tuple[Mark, ...]
    location: tuple[str, int]
    seeds: Any = None


def base(*, from_cell: str | None = None, marks=(), seeds=None, **values) -> BaseDecl:
    """The canary cell, id ``base``; every other cell is a difference from it.

    ``from_cell="other_grid.py::cell"`` starts from a cell of another grid (the path
    is relative to this grid's directory); ``values`` then override it. ``seeds=`` repeats
    the base and every cell of the grid that gives no ``seeds=`` of its own.
    """
    location = caller_location()
    if from_cell is not None and "::" not in str(from_cell):
        raise GridError(location, f"from_cell: expected 'grid.py::cell', got {from_cell!r}")
    return BaseDecl(values=values, from_cell=from_cell, marks=_marks(marks, location),
                    location=location, seeds=seeds_as_written(seeds))


def cell(*, on=None, marks=(), seeds=None, **values) -> CellDecl:
    """A named cell (its id is the variable it is assigned to): base + ``values``.

    ``on=other_cell`` starts from another cell of this grid instead of the base (its
    ``seeds=`` is not taken along). ``seeds=3`` adds ``<id>-seed<s+1>``, ``<id>-seed<s+2>``.
    """
    location = caller_location()
    return CellDecl(values=values, on=on, marks=_marks(marks, location), location=location,
                    seeds=seeds_as_written(seeds))


def param(value, *, id: str | None = None, marks=(), seeds=None) -> Param:
    """One value of an axis with its own id, marks or seeds (pytest's ``pytest.param``)."""
    location = caller_location()
    return Param(value=value, id=id, marks=_marks(marks, location), location=location,
                 seeds=seeds_as_written(seeds))


def _split_keys(keys: str | Sequence[str], location) -> tuple[str, ...]:
    names = keys.split(",") if isinstance(keys, str) else list(keys)
    names = tuple(name.strip() for name in names)
    if not names or any(not name.isidentifier() for name in names):
        raise GridError(location, f"axis keys: expected 'key' or 'key1, key2', got {keys!r}")
    return names


def axis(keys: str | Sequence[str], values: Sequence, *, id: str | None = None,
         ids: Sequence[str] | None = None, on=None, marks=(), seeds=None) -> AxisDecl:
    """One cell per value, each changing only ``keys`` off the base (or off ``on``).

    ``keys`` is one key or several tied together (``"num_inference_engines, inference_tp"``
    with tuple values). Ids come from ``sk.param(id=...)``, else ``ids``, else the
    ``id`` template (``"tbs{train_batch_size}"``), else the variable name and the values.
    ``seeds=`` repeats each of its cells (an ``sk.param``'s own ``seeds=`` wins).
    """
    location = caller_location()
    names = _split_keys(keys, location)
    params = tuple(v if isinstance(v, Param) else Param(value=v, id=None, marks=(), location=location)
                   for v in values)
    if not params:
        raise GridError(location, f"axis over {', '.join(names)}: no values")
    for p in params:
        if len(names) > 1 and (not isinstance(p.value, (tuple, list)) or len(p.value) != len(names)):
            raise GridError(p.location, f"axis over {', '.join(names)}: value {p.value!r} "
                                        f"must be a tuple of {len(names)} values")
    if ids is not None:
        ids = tuple(ids)
        if len(ids) != len(params):
            raise GridError(location, f"axis over {', '.join(names)}: {len(ids)} ids "
                                      f"for {len(params)} values")
    return AxisDecl(keys=names, params=params, id_template=id, ids=ids, on=on,
                    marks=_marks(marks, location), location=location, seeds=seeds_as_written(seeds))


def product(*, id: str | None = None, on=None, marks=(), seeds=None, **axes: Sequence) -> ProductDecl:
    """The full cartesian product of the given keys' values; only where a file asks for it.
    ``seeds=`` repeats each of its cells."""
    location = caller_location()
    if not axes:
        raise GridError(location, "product: give at least one key=[values]")
    for key, values in axes.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise GridError(location, f"product: {key} needs a non-empty list of values")
    return ProductDecl(keys=tuple(axes), values=tuple(tuple(v) for v in axes.values()),
                       id_template=id, on=on, marks=_marks(marks, location), location=location,
                       seeds=seeds_as_written(seeds))


def command(*argv: str, schema: Mapping[str, dict] | None = None, seed_key: str | None = "seed") -> Target:
    """A target that runs any command: ``sk.command("{python}", "{root}/train.py", "{config}")``.

    The process runs in its cell dir: name the project's files through ``{root}`` or
    ``{grid_dir}`` (:class:`sweepkit.grid.cell.Target` lists the placeholders). Without a
    schema, keys are free; a key's type is then checked against the base value's. A schema
    entry with ``"path": True`` marks a key whose relative value is taken from the project root.
    ``seed_key`` is the config key ``seeds=`` sets on repeats (None: cells cannot repeat).
    """
    if not argv or not all(isinstance(a, str) for a in argv):
        raise GridError(caller_location(), f"command: expected strings, got {argv!r}")
    if seed_key is not None and (not isinstance(seed_key, str) or not seed_key):
        raise GridError(caller_location(), f"command: seed_key: expected a key name or None, got {seed_key!r}")
    return Target(name="command", argv=argv, schema=schema, seed_key=seed_key)
