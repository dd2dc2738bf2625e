"""Building the plugin manager and loading plugins.

Plugins come from four places, in this order: the core's own modules
(:data:`DEFAULT_PLUGINS`), the ``sweepkit`` entry-point group, ``-p MODULE``
options (``-p no:NAME`` blocks one), and ``sweepconf.py`` files next to the
grids, loaded before their directory is collected, as pytest loads ``conftest.py``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path

import pluggy

from sweepkit import hookspec
from sweepkit.errors import UsageError, display_path
from sweepkit.grid.source import SWEEPCONF, exec_python_file

#: The core's own behaviour, as plugin modules.
DEFAULT_PLUGINS: tuple[str, ...] = (
    "sweepkit.run.launch",
    "sweepkit.grid.collect",
    "sweepkit.grid.validate",
    "sweepkit.run.runner",
    "sweepkit.run.executors.local",
    "sweepkit.run.executors.debug",
    "sweepkit.run.executors.slurm",
    "sweepkit.report.builtin",
)

ENTRY_POINT_GROUP = "sweepkit"


def make_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("sweepkit")
    pm.add_hookspecs(hookspec)
    return pm


def register(pm: pluggy.PluginManager, plugin, name: str) -> None:
    """Register once: the same module reached twice (entry point and -p) is one plugin."""
    if pm.is_registered(plugin) or pm.is_blocked(name):
        return
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise UsageError(f"plugin {name}: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"plugin {name}: {exc}") from None


def import_plugin(pm: pluggy.PluginManager, modname: str) -> None:
    """Import ``modname`` and register it under its module name (``-p`` and defaults)."""
    if modname.startswith("no:"):
        pm.set_blocked(modname[3:])
        return
    if pm.is_blocked(modname) or pm.get_plugin(modname) is not None:
        return
    try:
        module = importlib.import_module(modname)
    except ImportError as exc:
        raise UsageError(f"-p {modname}: cannot import plugin module: {exc}") from None
    register(pm, module, modname)


def load_entry_points(pm: pluggy.PluginManager) -> None:
    try:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    except ImportError as exc:
        raise UsageError(f"a plugin of the {ENTRY_POINT_GROUP!r} entry-point group "
                         f"cannot be imported: {exc}") from None


def load_plugins(pm: pluggy.PluginManager, extra: Iterable[str] = ()) -> None:
    """Defaults, then entry points, then ``-p`` modules; blocks (``no:``) apply to all."""
    extra = list(extra)
    for name in extra:
        if name.startswith("no:"):
            pm.set_blocked(name[3:])
    for name in DEFAULT_PLUGINS:
        import_plugin(pm, name)
    load_entry_points(pm)
    for name in extra:
        import_plugin(pm, name)


def sweepconf_paths(directory: Path, rootdir: Path) -> list[Path]:
    """``sweepconf.py`` files that apply to ``directory``: from the rootdir down to it."""
    directory = directory.resolve()
    chain = [directory]
    if directory.is_relative_to(rootdir):
        chain += [p for p in directory.parents if p.is_relative_to(rootdir)]
    return [d / SWEEPCONF for d in reversed(chain) if (d / SWEEPCONF).is_file()]


def load_sweepconf(pm: pluggy.PluginManager, path: Path, rootdir: Path) -> None:
    """Import one ``sweepconf.py`` (once) and register it as a plugin named by its path."""
    name = f"sweepconf:{display_path(path, rootdir)}"
    if pm.get_plugin(name) is not None or pm.is_blocked(name):
        return
    module = exec_python_file(path, rootdir, module_name=f"_sweepconf_{abs(hash(str(path)))}")
    register(pm, module, name)


def check_pending(pm: pluggy.PluginManager) -> None:
    """Fail on an implementation of a hook that does not exist (a misspelt hook name)."""
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise UsageError(f"{exc} (no such hook; the known hooks are in sweepkit/hookspec.py)") from None


def how_loaded(pm: pluggy.PluginManager, name: str, plugin) -> str:
    """``default``, ``entry point (dist)``, ``sweepconf`` or ``-p``."""
    if name in DEFAULT_PLUGINS:
        return "default"
    if name.startswith("sweepconf:"):
        return "sweepconf"
    for registered, dist in pm.list_plugin_distinfo():
        if registered is plugin:
            return f"entry point ({dist.metadata['name']})"
    return "-p"


def hooks_of(pm: pluggy.PluginManager, plugin) -> list[str]:
    """The hook names ``plugin`` implements, in hookspec order."""
    names = []
    for caller in pm.get_hookcallers(plugin) or []:
        names.append(caller.name)
    order = [n for n in vars(hookspec) if n.startswith("sweep_")]
    return sorted(names, key=lambda n: order.index(n) if n in order else len(order))
