"""From a grid file's declarations to cells: configs, ids, marks and diffs.

A cell's config is its starting point (the base, or ``on=``) updated with its own
values; its diff is taken against the base. Two cells with one id, or two cells
with the same config, are errors: ids must mean one thing, and a duplicate run
is wasted compute. Every mistake of a file is gathered before any is reported.

A cell's process runs in its cell dir, so a relative path in its config would be taken
from there; the values of the keys its target's schema marks ``"path": True`` are taken
from the project root instead (:func:`resolve_path` states the rule).

``seeds=`` repeats a cell over seeds (:func:`_repeats`): the first seed keeps the cell's id
(and, when it is the cell's own seed, its config, so adding ``seeds=`` to a grid keeps its
earlier results valid); each further seed ``v`` is a cell ``<id>-seed<v>``. The cell's own
``sk.param``/declaration ``seeds=`` (``sk.base``'s for base) wins over the grid's (a
module-level ``seeds =``). Every cell then gets its group (:func:`_groups`).
"""

from __future__ import annotations

import difflib
import functools
import itertools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from sweepkit.errors import did_you_mean
from sweepkit.grid import ids
from sweepkit.grid.cell import Cell, Mark, Target, canonical_config
from sweepkit.grid.declare import (
    AxisDecl,
    BaseDecl,
    CellDecl,
    GridError,
    GridErrors,
    Param,
    ProductDecl,
    is_int_seed,
    seeds_problem,
)

Location = tuple[str, int]


@attrs.frozen(kw_only=True)
class Start:
    """A config with the place each key was set."""

    config: Mapping[str, Any]
    locations: Mapping[str, Location]

    def updated(self, values: Mapping[str, Any], location: Location) -> "Start":
        return Start(config={**self.config, **values},
                     locations={**self.locations, **{k: location for k in values}})


@attrs.frozen(kw_only=True)
class GridSpec:
    """What the module of a grid file declared, in file order."""

    grid: str                  # display path
    grid_name: str
    target: Target
    module_marks: tuple[Mark, ...]
    base: BaseDecl
    base_start: Start          # the base's config, from_cell already applied
    declarations: tuple[tuple[str, Any], ...]  # (variable name, declaration), base excluded
    # Mistakes found in the module-level names (target, marks, a second base): the cells
    # are still built, to find their own mistakes too, and none is returned.
    problems: tuple[GridError, ...] = ()
    module_seeds: Any = None   # a module-level ``seeds = ...``, as written
    module_seeds_location: Location | None = None


@attrs.frozen(kw_only=True)
class Seeds:
    """The ``seeds=`` that applies to a cell, as written, and where it was written."""

    value: Any
    location: Location


@attrs.frozen(kw_only=True)
class Draft:
    name: str
    start: Start
    marks: tuple[Mark, ...]
    location: Location
    keywords: frozenset[str]
    seeds: Seeds | None = None
    # How seeds= made or changed this cell, for the messages that name it; None for a cell
    # the grid declares as it is.
    origin: str | None = None


def _first_given(*choices: tuple[Any, Location]) -> Seeds | None:
    return next((Seeds(value=value, location=where) for value, where in choices if value is not None), None)


def build_cells(spec: GridSpec, launch_keys: Mapping[str, Any],
                make_id: Callable[[str, tuple, tuple], str | None],
                display: Callable[[str], str]) -> list[Cell]:
    """Resolve every declaration; GridErrors listing every mistake, each at its file:line.

    A declaration that cannot be resolved (``on=`` a missing cell, an axis over a key its
    start lacks) is reported and left out; the others are still checked.
    """
    # The cells of a grid name a handful of files, each thousands of times (every cell's
    # location and the place of each of its keys): resolve each once.
    display = functools.cache(display)
    problems = list(spec.problems)
    # A module-level ``seeds =`` is the grid's; sk.base(seeds=) is base's own, as a cell's is
    # (repeating base alone is the cheap way to measure the seed spread every row then takes).
    grid_seeds = ((spec.module_seeds, spec.module_seeds_location),)
    drafts = [Draft(name="base", start=spec.base_start, marks=spec.module_marks + spec.base.marks,
                    location=spec.base.location, keywords=frozenset({"base"}),
                    seeds=_first_given((spec.base.seeds, spec.base.location), *grid_seeds))]
    cell_names = {decl: name for name, decl in spec.declarations if isinstance(decl, CellDecl)}
    resolved: dict[int, Start] = {}

    def start_of(on, location: Location, chain=()) -> Start:
        if on is None or isinstance(on, BaseDecl):
            return spec.base_start
        if isinstance(on, str):
            matches = [d for d, n in cell_names.items() if n == on]
            if not matches:
                raise GridError(location, f"on={on!r}: no cell of that name in this grid"
                                          f"{did_you_mean(on, cell_names.values())}")
            on = matches[0]
        if not isinstance(on, CellDecl):
            raise GridError(location, f"on=: expected a cell (sk.cell or sk.base), got {on!r}")
        if on not in cell_names:
            raise GridError(location, "on=: that cell is not assigned to a module-level name")
        return cell_start(on, chain)

    def cell_start(decl: CellDecl, chain=()) -> Start:
        if id(decl) not in resolved:
            if decl in chain:
                raise GridError(decl.location, "on=: cells build on each other in a cycle")
            start = start_of(decl.on, decl.location, chain + (decl,))
            resolved[id(decl)] = start.updated(decl.values, decl.location)
        return resolved[id(decl)]

    for name, decl in spec.declarations:
        try:
            if isinstance(decl, CellDecl):
                drafts.append(Draft(name=name, start=cell_start(decl),
                                    marks=spec.module_marks + decl.marks, location=decl.location,
                                    keywords=frozenset({name}),
                                    seeds=_first_given((decl.seeds, decl.location), *grid_seeds)))
            elif isinstance(decl, (AxisDecl, ProductDecl)):
                drafts.extend(_axis_drafts(name, decl, start_of(decl.on, decl.location),
                                           spec.module_marks, make_id, spec.target, launch_keys, grid_seeds))
        except GridError as error:
            problems.append(error)

    repeated = []
    for draft in drafts:
        try:
            repeated += _repeats(draft, spec.target, display)
        except GridError as error:
            problems.append(error)
            repeated.append(draft)
    drafts = repeated
    problems += _id_problems(drafts, display)
    problems += _duplicate_configs(drafts, display)
    groups = _groups(drafts, spec.target.seed_key)
    base_config = spec.base_start.config
    schema = spec.target.schema or {}
    root = spec.target.places.get("root")
    cells = []
    for index, d in enumerate(drafts):
        resolved = resolve_paths(d.start.config, schema, root) if root is not None else {}
        diff = config_diff(base_config, d.start.config, schema)
        if d.origin is not None and spec.target.seed_key in diff:  # the cell's own change first, then its seed
            diff[spec.target.seed_key] = diff.pop(spec.target.seed_key)
        cells.append(Cell(
            grid=spec.grid, grid_name=spec.grid_name, name=d.name,
            config={**d.start.config, **{key: absolute for key, (_, absolute) in resolved.items()}},
            target=spec.target, diff=diff,
            marks=d.marks, location=(display(d.location[0]), d.location[1]),
            keywords=d.keywords | {spec.grid_name} | {m.name for m in d.marks},
            launch_keys=launch_keys, resolved_paths=resolved, index=index, group=groups[index],
            key_locations={k: (display(f), line) for k, (f, line) in d.start.locations.items()}))
    if problems:
        # With the cells that could be built, so that their key errors come in the same round.
        raise GridErrors(problems, cells=cells)
    return cells


def resolve_path(value: Any, root: Path) -> str | None:
    """The absolute path that the value of a path-valued key names, or None to keep the value.

    Relative values are taken from the project root, not from the cell dir the process
    runs in: one starting with ``./`` or ``../`` always (validation then checks that it
    exists), any other value with a ``/`` or a leading ``.`` only when it exists there.
    Anything else stays as written: an absolute path, a name without a ``/``
    (``synthetic``, ``gsm8k``) and a hub name that is no local path
    (``Qwen/Qwen2.5-1.5B-Instruct``).
    """
    if not isinstance(value, str) or os.path.isabs(value) or ("/" not in value and not value.startswith(".")):
        return None
    path = Path(root) / value
    if value.startswith(("./", "../")) or value in (".", "..") or path.exists():
        return str(path.resolve())
    return None


def resolve_paths(config: Mapping[str, Any], schema: Mapping[str, dict], root) -> dict[str, tuple[str, str]]:
    """``key -> (as written, absolute)`` for the path-valued keys of ``config`` that
    :func:`resolve_path` takes from the project root ``root``."""
    out = {}
    for key, value in config.items():
        if schema.get(key, {}).get("path") and (absolute := resolve_path(value, root)) is not None:
            out[key] = (value, absolute)
    return out


def _axis_drafts(name: str, decl, start: Start, module_marks, make_id, target: Target,
                 launch_keys: Mapping[str, Any], grid_seeds=()) -> list[Draft]:
    missing = [k for k in decl.keys if k not in start.config]
    where = "the cell it is on" if decl.on is not None else "the base"
    known = None if target.schema is None else [*target.schema, *launch_keys]
    unknown = [k for k in missing if known is not None and k not in known]
    if unknown:
        # A misspelt key: say so now, not "set it in the base" and then "unknown key" after that.
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        also = "" if close and close[0] in start.config else f"; {where} must set the key it sweeps"
        raise GridError(decl.location, f"axis over {', '.join(repr(k) for k in unknown)}: no such key for "
                                       f"target {target.name!r}{hint}{also}")
    if missing:
        raise GridError(decl.location, f"axis over {', '.join(repr(k) for k in missing)}: "
                                       f"{where} has no such key; set it there to sweep it"
                                       f"{did_you_mean(missing[0], start.config)}")
    drafts = []
    for index, (param, values) in enumerate(_points(decl)):
        point = dict(zip(decl.keys, values))
        cell_id = param.id
        if cell_id is None and getattr(decl, "ids", None) is not None:
            cell_id = decl.ids[index]
        if cell_id is None and decl.id_template is not None:
            try:
                cell_id = ids.from_template(decl.id_template, point)
            except (KeyError, IndexError, ValueError) as exc:
                raise GridError(decl.location, f"id template {decl.id_template!r}: {exc!s} is not "
                                               f"one of the keys {', '.join(decl.keys)}") from None
        if cell_id is None:
            cell_id = make_id(name, decl.keys, values)
        marks = module_marks + decl.marks + param.marks
        seeds = _first_given((param.seeds, param.location), (decl.seeds, decl.location), *grid_seeds)
        drafts.append(Draft(name=cell_id, start=start.updated(point, param.location), marks=marks,
                            location=param.location, keywords=frozenset({cell_id, name}), seeds=seeds))
    return drafts


_MISSING = object()


def _repeats(draft: Draft, target: Target, display) -> list[Draft]:
    """The draft, then one draft per further seed of its ``seeds=``; GridError at the line
    that wrote ``seeds=`` when it cannot be expanded."""
    if draft.seeds is None or ids.id_problem(draft.name):  # a bad id is reported on its own
        return [draft]
    value, location = draft.seeds.value, draft.seeds.location
    problem = seeds_problem(value)
    if problem:
        raise GridError(location, problem)
    if value == 1:
        return [draft]
    written = f"seeds={list(value) if isinstance(value, tuple) else value}"
    key = target.seed_key
    if key is None:
        raise GridError(location, f"{written}: target {target.name!r} has no seed key (its seed_key is None), "
                                  "so its cells cannot repeat over seeds")
    own = draft.start.config.get(key, (target.schema or {}).get(key, {}).get("default", _MISSING))
    if isinstance(value, int):
        if own is _MISSING or own is None:
            raise GridError(location, f"{written} counts up from the cell's own {key!r}, which neither the cell "
                                      f"sets nor target {target.name!r} gives a default for; set {key}=... in "
                                      f"sk.base, or list the seeds: seeds=[1, 2, 3]")
        if not is_int_seed(own):
            raise GridError(location, f"{written} counts up from the cell's own {key!r}, which is {own!r} "
                                      f"({type(own).__name__}), not an int")
        values = [own + step for step in range(value)]
    else:
        values = list(value)
    where = f"{written} at {display(location[0])}:{location[1]}"
    first = draft
    if not (is_int_seed(own) and own == values[0]):
        first = attrs.evolve(draft, start=draft.start.updated({key: values[0]}, location),
                             origin=f"{key}={values[0]} from {where}")
    repeats = [attrs.evolve(draft, name=f"{draft.name}-seed{seed}", start=draft.start.updated({key: seed}, location),
                            keywords=draft.keywords | {f"{draft.name}-seed{seed}"},
                            origin=f"a repeat of {draft.name!r}: {key}={seed} from {where}")
               for seed in values[1:]]
    return [first, *repeats]


def _groups(drafts: list[Draft], seed_key: str | None) -> list[str]:
    """Each draft's group: the first draft, in grid order, whose config equals its config in
    every key but ``seed_key`` (without a seed key, each draft is its own)."""
    first: dict[str, str] = {}
    out = []
    for draft in drafts:
        if seed_key is None:
            out.append(draft.name)
            continue
        rest = canonical_config({k: v for k, v in draft.start.config.items() if k != seed_key})
        out.append(first.setdefault(rest, draft.name))
    return out


def _points(decl) -> list[tuple[Param, tuple]]:
    if isinstance(decl, AxisDecl):
        return [(p, tuple(p.value) if len(decl.keys) > 1 else (p.value,)) for p in decl.params]
    plain = Param(value=None, id=None, marks=(), location=decl.location)  # the product's seeds= applies
    return [(plain, combo) for combo in itertools.product(*decl.values)]


def _id_problems(drafts: list[Draft], display) -> list[GridError]:
    problems = []
    seen: dict[str, Draft] = {}
    for draft in drafts:
        problem = ids.id_problem(draft.name)
        if problem:
            problems.append(GridError(draft.location, problem))
            continue
        if draft.name in seen:
            first = seen[draft.name].location
            problems.append(GridError(draft.location, f"cell id {draft.name!r} is already used by the "
                                                      f"cell at {display(first[0])}:{first[1]}; ids must "
                                                      "be unique"))
            continue
        seen[draft.name] = draft
    return problems


def _duplicate_configs(drafts: list[Draft], display) -> list[GridError]:
    problems = []
    seen: dict[str, Draft] = {}
    for draft in drafts:
        key = canonical_config(draft.start.config)
        if key in seen:
            first = seen[key]
            this = f"cell {draft.name!r}" + (f" ({draft.origin})" if draft.origin else "")
            where = f"{display(first.location[0])}:{first.location[1]}"
            that = f"cell {first.name!r} ({where}" + (f"; {first.origin})" if first.origin else ")")
            hint = "; give seeds= values that no other cell of the grid has" if draft.origin or first.origin else ""
            problems.append(GridError(draft.location, f"{this} has the same config as {that}; "
                                                      f"a duplicate cell would run the same thing twice{hint}"))
            continue
        seen[key] = draft
    return problems


def config_diff(before: Mapping[str, Any], after: Mapping[str, Any],
                schema: Mapping[str, dict]) -> dict[str, tuple[Any, Any]]:
    """Keys whose value changed: ``key -> (before, after)``; an unset key shows its default."""
    out = {}
    for key in list(before) + [k for k in after if k not in before]:
        old = before.get(key, schema.get(key, {}).get("default"))
        new = after.get(key, schema.get(key, {}).get("default"))
        if canonical_config({"v": old}) != canonical_config({"v": new}):
            out[key] = (old, new)
    return out
