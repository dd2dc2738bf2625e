"""The values that flow from collection to execution: marks, targets and cells.

Everything here is frozen: a cell is a plan, built once by collection (and
once more by a profile), then only read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import attrs


def _tuple(value) -> tuple:
    return tuple(value)


def _dict(value) -> dict:
    return dict(value)


@attrs.frozen(kw_only=True)
class Mark:
    """A named label on a cell: ``sk.mark.slow``, ``sk.mark.xfail(reason=...)``.

    Calling a mark gives a copy that carries arguments, the way pytest's mark
    decorators do: ``sk.mark.xfail`` and ``sk.mark.xfail(reason="OOM")`` are both marks.
    """

    name: str
    args: tuple = attrs.field(default=(), converter=_tuple)
    kwargs: Mapping[str, Any] = attrs.field(factory=dict, converter=_dict, hash=False)

    def __call__(self, *args, **kwargs) -> "Mark":
        return Mark(name=self.name, args=self.args + args, kwargs={**self.kwargs, **kwargs})

    @property
    def reason(self) -> str:
        """The reason of an xfail (keyword or first positional argument), or ''."""
        if "reason" in self.kwargs:
            return str(self.kwargs["reason"])
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.name}({', '.join(parts)})" if parts else self.name


@attrs.frozen(kw_only=True)
class Target:
    """What a cell's process runs.

    ``argv`` is a template; sweepkit substitutes ``{python}`` (the interpreter),
    ``{config}``, ``{ckpt_dir}``, ``{metrics}`` and ``{cell_dir}`` (the process's working
    directory), and, from ``places``, ``{grid_dir}`` (the grid file's directory) and
    ``{root}`` (the project root), so that a script of the project can be named although
    the process runs in its cell dir. ``schema`` maps every key the target accepts to
    ``{"type", "type_name", "default", "doc"}`` and, for a key whose value may be a
    filesystem path, ``"path": True`` (collection takes such a value, when relative, from the
    project root: :func:`sweepkit.grid.resolve.resolve_path`); ``None`` accepts any key.
    ``seed_key`` is the config key that holds the run's seed: the key a grid's ``seeds=``
    sets on each repeat of a cell, and the one key in which the cells of a group differ
    (:attr:`Cell.group`); ``None`` for a target whose cells cannot repeat over seeds.
    """

    name: str
    argv: tuple[str, ...] = attrs.field(converter=_tuple)
    schema: Mapping[str, dict] | None = attrs.field(default=None, hash=False, eq=False)
    seed_key: str | None = attrs.field(default="seed", validator=attrs.validators.optional(
        attrs.validators.instance_of(str)))
    # Where the grid that uses the target lives; not part of the identity of a target (nor
    # of a cell's config hash): a project moved elsewhere runs the same cells.
    places: Mapping[str, str] = attrs.field(factory=dict, converter=_dict, hash=False, eq=False)

    def placed(self, *, grid_dir: str, root: str) -> "Target":
        """This target as a grid at ``grid_dir`` in the project at ``root`` runs it."""
        return attrs.evolve(self, places={"grid_dir": str(grid_dir), "root": str(root)})

    def render_argv(self, **paths: str) -> list[str]:
        """The command line with the placeholders filled (unknown braces are left alone:
        an argument may be code with braces of its own)."""
        values = {**self.places, **paths}
        out = []
        for part in self.argv:
            for key, value in values.items():
                part = part.replace("{" + key + "}", str(value))
            out.append(part)
        return out


def _canonical(value: Any) -> str:
    # Tuples and lists are the same in JSON; default=repr keeps odd values hashable.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


@attrs.frozen(kw_only=True)
class Cell:
    """One runnable point of a grid, fully resolved.

    ``config`` holds base + cell + profile values, target keys and launch keys
    together; :meth:`target_config` and :meth:`launch` split them.
    ``launch_keys`` maps each registered launch key to its default.
    ``diff`` and ``profile_changes`` map a key to ``(before, after)``; a key the
    earlier config did not set shows the target schema's default (or None).
    ``resolved_paths`` maps each path-valued key whose relative value collection took
    from the project root to ``(as written, absolute)``: ``config`` holds the absolute
    path, the config hash the value as written. ``unprofiled`` is the cell as its grid
    wrote it, before ``profile`` rewrote it (None without a profile). ``index`` is the
    cell's place in its grid, base first, as ``sweep list`` shows them: ``cell.json``
    records it, so that ``sweep report`` lists a grid's cells in that order from disk alone
    (the values of one axis or product share a line of the file). ``group`` is the id of
    the first cell of the grid whose config equals this one's in every key but the target's
    ``seed_key`` (the repeats of a cell over seeds, however declared, share it; a cell
    alone is its own group): the report makes one row of a group.
    """

    grid: str
    grid_name: str
    name: str
    config: Mapping[str, Any] = attrs.field(converter=_dict, hash=False)
    target: Target
    diff: Mapping[str, tuple[Any, Any]] = attrs.field(factory=dict, converter=_dict, hash=False)
    marks: tuple[Mark, ...] = attrs.field(default=(), converter=_tuple)
    location: tuple[str, int]
    profile: str | None = None
    profile_changes: Mapping[str, tuple[Any, Any]] = attrs.field(
        factory=dict, converter=_dict, hash=False)
    keywords: frozenset[str] = attrs.field(factory=frozenset, converter=frozenset)
    launch_keys: Mapping[str, Any] = attrs.field(factory=dict, converter=_dict, hash=False)
    key_locations: Mapping[str, tuple[str, int]] = attrs.field(
        factory=dict, converter=_dict, hash=False, eq=False)
    resolved_paths: Mapping[str, tuple[str, str]] = attrs.field(
        factory=dict, converter=_dict, hash=False, eq=False)
    unprofiled: "Cell | None" = attrs.field(default=None, hash=False, eq=False, repr=False)
    index: int | None = attrs.field(default=None, hash=False, eq=False)
    group: str = attrs.field(default=attrs.Factory(lambda cell: cell.name, takes_self=True), hash=False, eq=False)

    @property
    def nodeid(self) -> str:
        return f"{self.grid}::{self.name}"

    @property
    def xfail(self) -> Mark | None:
        return next((m for m in self.marks if m.name == "xfail"), None)

    def target_config(self) -> dict[str, Any]:
        """The keys the target reads: what goes into ``config.json``."""
        return {k: v for k, v in self.config.items() if k not in self.launch_keys}

    def launch(self) -> dict[str, Any]:
        """Every registered launch key, the cell's value or the key's default."""
        return {k: self.config.get(k, default) for k, default in self.launch_keys.items()}

    def location_of(self, key: str) -> tuple[str, int]:
        """Where ``key`` got its value (the declaring line), else the cell's own line."""
        return self.key_locations.get(key, self.location)

    def written_config(self) -> dict[str, Any]:
        """The config with the relative paths collection resolved back as the grid wrote them
        (a value a profile replaced stays replaced)."""
        return {key: self.resolved_paths[key][0]
                if key in self.resolved_paths and self.resolved_paths[key][1] == value else value
                for key, value in self.config.items()}

    def config_hash(self) -> str:
        """Stable across runs, and where the project moves: sha256 of the resolved config, its
        relative paths as written, and the target's argv."""
        payload = _canonical({"config": self.written_config(), "argv": list(self.target.argv)})
        return hashlib.sha256(payload.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready description (what ``cell.json`` records)."""
        return {
            "nodeid": self.nodeid,
            "grid": self.grid,
            "grid_name": self.grid_name,
            "name": self.name,
            "target": {"name": self.target.name, "argv": list(self.target.argv),
                       "places": dict(self.target.places), "seed_key": self.target.seed_key},
            "config": dict(self.config),
            "target_config": self.target_config(),
            "launch": self.launch(),
            "diff": {k: list(v) for k, v in self.diff.items()},
            "marks": [{"name": m.name, "args": list(m.args), "kwargs": dict(m.kwargs)}
                      for m in self.marks],
            "location": list(self.location),
            "index": self.index,
            "group": self.group,
            "profile": self.profile,
            "profile_changes": {k: list(v) for k, v in self.profile_changes.items()},
            "config_hash": self.config_hash(),
        }


def canonical_config(config: Mapping[str, Any]) -> str:
    """A string equal for two configs exactly when their JSON forms are equal."""
    return _canonical(dict(config))
