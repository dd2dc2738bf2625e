"""The session: plugin manager, directories, options and registries of one ``sweep`` call."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import attrs
import pluggy
from rich.console import Console

from sweepkit import plugin
from sweepkit.errors import display_path
from sweepkit.registry import Registry


def make_console(file=None) -> Console:
    # soft_wrap: a node id plus its diff stays on one line, so output can be grepped.
    return Console(file=file or sys.stdout, soft_wrap=True, highlight=False)


@attrs.define(kw_only=True)
class Session:
    """Shared state of one command: everything a hook may need to look at.

    ``options`` is the parsed command line (``options.command`` is the
    subcommand); ``registry`` holds the launch keys, targets, executors and
    profiles plugins registered; ``runs_dir`` defaults to ``<rootdir>/runs``;
    ``collected`` caches each grid file's cells (before profiles) by absolute path.
    """

    pm: pluggy.PluginManager
    rootdir: Path
    runs_dir: Path
    options: argparse.Namespace
    console: Console = attrs.field(factory=make_console)
    err_console: Console = attrs.field(factory=lambda: make_console(sys.stderr))
    registry: Registry = attrs.field(factory=Registry)
    collected: dict[Path, list] = attrs.field(factory=dict)
    #: Values plugins keep for the session (pytest's ``config.stash``); key by plugin name.
    stash: dict = attrs.field(factory=dict)

    @classmethod
    def from_options(cls, pm: pluggy.PluginManager, options: argparse.Namespace) -> "Session":
        rootdir = Path(options.rootdir or Path.cwd()).resolve()
        runs_dir = Path(options.runs_dir) if options.runs_dir else rootdir / "runs"
        if not runs_dir.is_absolute():
            runs_dir = Path.cwd() / runs_dir
        return cls(pm=pm, rootdir=rootdir, runs_dir=runs_dir, options=options)

    @property
    def hook(self):
        return self.pm.hook

    def register_hooks(self) -> None:
        """Run the historic registration hooks; plugins registered later get them too."""
        hook = self.pm.hook
        hook.sweep_register_keys.call_historic(kwargs={"register": self.registry.register_key})
        hook.sweep_register_targets.call_historic(kwargs={"register": self.registry.register_target})
        hook.sweep_register_executors.call_historic(
            kwargs={"register": self.registry.register_executor})
        hook.sweep_register_profiles.call_historic(kwargs={"register": self.registry.register_profile})

    def configure(self) -> None:
        self.pm.hook.sweep_configure.call_historic(kwargs={"session": self})

    def unconfigure(self) -> None:
        self.pm.hook.sweep_unconfigure(session=self)

    def display_path(self, path: Path) -> str:
        """A path as the user sees it: relative to the rootdir when inside it."""
        return display_path(path, self.rootdir)

    # -- the arrows of the pipeline, in order ------------------------------------------

    def load_sweepconfs(self, directory: Path) -> None:
        """Register the ``sweepconf.py`` files that apply to ``directory`` (each once), and fail
        on a misspelt hook of theirs, before the directory's grids are collected."""
        for path in plugin.sweepconf_paths(directory, self.rootdir):
            plugin.load_sweepconf(self.pm, path, self.rootdir)
        plugin.check_pending(self.pm)

    def collect(self, paths: list[str]):
        """Grid files named by ``paths`` (``grids/`` when empty) -> cells, before profiles."""
        from sweepkit.grid.collect import collect

        return collect(self, paths)

    def select(self, paths: list[str], *, profile: str | None = None, keyword: str | None = None,
               markexpr: str | None = None, failed: bool = False) -> list:
        """collect -> profile -> ``sweep_collection_modifyitems`` -> select."""
        from sweepkit.grid.profile import apply_profile
        from sweepkit.grid.select import select

        collected = self.collect(paths)
        cells = apply_profile(self, list(collected.cells), profile)
        self.pm.hook.sweep_collection_modifyitems(session=self, cells=cells)
        return select(self, cells, collected.wanted, keyword=keyword, markexpr=markexpr,
                      failed=failed)

    def validate(self, cells: list, *, check_runs_dir: bool, outcome: str = "nothing was run") -> None:
        """Every problem of every cell (and of the runs dir) at once, as one UsageError."""
        from sweepkit.grid.validate import validate

        validate(self, cells, runs_dir=self.runs_dir if check_runs_dir else None, outcome=outcome)
