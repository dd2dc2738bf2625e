"""Profiles: named, registered rewrites of every cell's config (``--profile smoke``).

A profile changes configs after collection, so cells keep their ids even when
two of them end up alike; what it changed is recorded on each cell, and so is the cell
as its grid wrote it, which validation checks first (a profile must not hide a value
the real run refuses).
"""

from __future__ import annotations

import attrs

from sweepkit.errors import UsageError
from sweepkit.grid.cell import Cell
from sweepkit.grid.resolve import config_diff

# session.stash key: node id -> why the profile could not rewrite that cell.
FAILED = "profile.failed"


def apply_profile(session, cells: list[Cell], name: str | None) -> list[Cell]:
    if not name:
        return list(cells)
    spec = session.registry.profiles.get(name)
    if spec is None:
        known = ", ".join(sorted(session.registry.profiles)) or "none"
        raise UsageError(f"--profile {name}: no such profile (registered: {known})")
    failed = session.stash.setdefault(FAILED, {})
    out = []
    for cell in cells:
        config = dict(cell.config)
        for fn in spec.fns:
            try:
                changes = fn(dict(config), cell.target.name) or {}
            except Exception as exc:  # most likely a value of the wrong type, which validation names
                failed[cell.nodeid] = f"--profile {name} cannot rewrite this cell: {type(exc).__name__}: {exc}"
                break
            config.update(changes)
        changed = config_diff(cell.config, config, cell.target.schema or {})
        out.append(attrs.evolve(cell, config=config, profile=name, profile_changes=changed, unprofiled=cell))
    return out


def profile_failure(session, cell: Cell) -> str | None:
    """Why the profile could not rewrite ``cell`` (a profile function raised), or None."""
    return session.stash.get(FAILED, {}).get(cell.nodeid) if cell.profile else None
