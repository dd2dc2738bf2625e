"""Profiles: named, registered rewrites of every cell's config (``--profile smoke``).

A profile changes configs after collection, so cells keep their ids even when
two of them end up alike; what it changed is recorded on each cell.
"""

from __future__ import annotations

import attrs

from sweepkit.cell import Cell
from sweepkit.errors import UsageError
from sweepkit.resolve import config_diff


def apply_profile(session, cells: list[Cell], name: str | None) -> list[Cell]:
    if not name:
        return list(cells)
    spec = session.registry.profiles.get(name)
    if spec is None:
        known = ", ".join(sorted(session.registry.profiles)) or "none"
        raise UsageError(f"--profile {name}: no such profile (registered: {known})")
    out = []
    for cell in cells:
        config = dict(cell.config)
        for fn in spec.fns:
            changes = fn(dict(config), cell.target.name) or {}
            config.update(changes)
        changed = config_diff(cell.config, config, cell.target.schema or {})
        out.append(attrs.evolve(cell, config=config, profile=name, profile_changes=changed))
    return out
