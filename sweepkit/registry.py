"""What plugins register through the ``sweep_register_*`` hooks.

The registry is handed to the hooks as bound ``register`` methods (tox's
``tox_register_tox_env(register)``), so help text and error messages list
what is actually installed.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

from sweepkit.errors import UsageError
from sweepkit.grid.cell import Target


@attrs.frozen(kw_only=True)
class KeySpec:
    name: str
    type: Any
    default: Any
    doc: str


@attrs.frozen(kw_only=True)
class ExecutorSpec:
    name: str
    factory: Callable[[Any], Any]
    doc: str


@attrs.frozen(kw_only=True)
class ProfileSpec:
    name: str
    fns: tuple[Callable[[dict, str], dict], ...]
    doc: str


@attrs.define
class Registry:
    keys: dict[str, KeySpec] = attrs.field(factory=dict)
    targets: dict[str, Target] = attrs.field(factory=dict)
    executors: dict[str, ExecutorSpec] = attrs.field(factory=dict)
    profiles: dict[str, ProfileSpec] = attrs.field(factory=dict)

    def register_key(self, name: str, type: Any, default: Any = None, doc: str = "") -> None:
        _check_new("launch key", name, self.keys)
        self.keys[name] = KeySpec(name=name, type=type, default=default, doc=doc)

    def register_target(self, name: str, target: Target) -> None:
        _check_new("target", name, self.targets)
        if not isinstance(target, Target):
            raise UsageError(f"target {name!r}: expected a sweepkit.Target, got {target!r}")
        self.targets[name] = target

    def register_executor(self, name: str, factory: Callable[[Any], Any], doc: str = "") -> None:
        _check_new("executor", name, self.executors)
        self.executors[name] = ExecutorSpec(name=name, factory=factory, doc=doc)

    def register_profile(self, name: str, fn: Callable[[dict, str], dict], doc: str = "") -> None:
        known = self.profiles.get(name)
        if known is None:
            self.profiles[name] = ProfileSpec(name=name, fns=(fn,), doc=doc)
        else:
            self.profiles[name] = attrs.evolve(known, fns=known.fns + (fn,), doc=known.doc or doc)

    def launch_defaults(self) -> dict[str, Any]:
        return {name: spec.default for name, spec in self.keys.items()}


def _check_new(kind: str, name: str, known: dict) -> None:
    if name in known:
        raise UsageError(f"{kind} {name!r} is registered twice")
