"""The ``sweep`` command line: parse, build the session, call one command.

Parsing happens twice, as in pytest: an early pass finds ``-p``, ``--rootdir``
and the paths so that plugins (and the ``sweepconf.py`` next to the grids) are
loaded first; then the full parser, with the options plugins added through
``sweep_addoption``, parses for real.
"""

from __future__ import annotations

import argparse
import signal
import sys
import traceback
from pathlib import Path

from sweepkit import commands, plugin
from sweepkit.errors import ExitCode, UsageError
from sweepkit.grid.collect import DEFAULT_GRID_DIR, split_arg
from sweepkit.report.health import STALL_FACTOR, STALL_MIN_S
from sweepkit.session import Session, make_console


class _EarlyParseError(Exception):
    pass


class _EarlyParser(argparse.ArgumentParser):
    """Parses what it can and never exits: the full parser reports mistakes later."""

    def error(self, message):
        raise _EarlyParseError(message)

    def exit(self, status=0, message=None):
        raise _EarlyParseError(message or "")


class _Parser(argparse.ArgumentParser):
    """A mistake on the command line is bad input (exit 4, as a bad grid file is), not
    argparse's exit 2, which is sweepkit's "interrupted"."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}", self.format_usage().strip())


class OptionParser:
    """What :func:`sweepkit.hookspec.sweep_addoption` receives."""

    def __init__(self, subparsers: dict[str, argparse.ArgumentParser]):
        self._subparsers = subparsers

    def addoption(self, *flags: str, commands=("run",), **kwargs) -> None:
        """Add an argparse option to the named subcommands (``"run"``, ``"list"``, ...)."""
        for name in commands:
            if name not in self._subparsers:
                raise UsageError(f"addoption {flags}: no subcommand {name!r} "
                                 f"(subcommands: {', '.join(self._subparsers)})")
            self._subparsers[name].add_argument(*flags, **kwargs)


class _RunsDirs(argparse.Action):
    """``sweep status --runs-dir``, repeatable: every one in ``runs_dirs``, the last also in
    ``runs_dir`` (the session's runs dir, as the option sets it for every other command)."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.runs_dir = values
        namespace.runs_dirs = [*(getattr(namespace, "runs_dirs", None) or []), values]


def _global_options(parser: argparse.ArgumentParser, suppress: bool, several_runs_dirs: bool = False) -> None:
    default = argparse.SUPPRESS if suppress else None
    if several_runs_dirs:
        parser.add_argument("--runs-dir", action=_RunsDirs, default=default, metavar="DIR",
                            help="where run state lives (default: <rootdir>/runs); repeatable, and a glob "
                                 "('/scratch/*/runs', quoted) names every runs dir it matches")
    else:
        parser.add_argument("--runs-dir", default=default, metavar="DIR",
                            help="where run state lives (default: <rootdir>/runs)")
    parser.add_argument("-p", dest="plugins", action="append", default=default, metavar="MODULE",
                        help="load a plugin module (repeatable); -p no:NAME blocks one")
    parser.add_argument("--rootdir", default=default, metavar="DIR",
                        help="project root: paths are shown relative to it (default: cwd)")


def build_parser(registry=None, parser_class=_Parser):
    """The full parser; help for executors and profiles comes from the registry."""
    parser = parser_class(prog="sweep", description="Sweep training runs: grid files -> named "
                                                    "cells -> runs -> tables.")
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=parser_class)
    executors = ", ".join(sorted(registry.executors)) if registry else ""
    profiles = ", ".join(sorted(registry.profiles)) if registry else ""
    paths_help = (f"grid files or directories, PATH::CELL for one cell "
                  f"(default: {DEFAULT_GRID_DIR}/)")
    subparsers = {}

    def command(name, help, several_runs_dirs=False):
        p = sub.add_parser(name, help=help, description=help)
        _global_options(p, suppress=True, several_runs_dirs=several_runs_dirs)
        subparsers[name] = p
        return p

    def selection(p):
        p.add_argument("paths", nargs="*", metavar="PATH[::CELL]", help=paths_help)
        p.add_argument("-k", dest="keyword", metavar="EXPR",
                       help="select cells whose ids/keywords match, e.g. 'tbs and not 512'")
        p.add_argument("-m", dest="markexpr", metavar="MARKEXPR",
                       help="select cells by marks, e.g. 'not slow'")
        p.add_argument("--profile", metavar="NAME", help=f"rewrite every cell ({profiles or 'none'})")
        p.add_argument("--failed", "--lf", "--last-failed", dest="failed", action="store_true",
                       help="only the cells whose last run failed (pytest's --lf)")
        verbosity(p)

    def verbosity(p):
        p.add_argument("-q", "--quiet", dest="verbose", action="store_const", const=-1, default=0,
                       help="less output: node ids only in list; no progress lines in run")
        p.add_argument("-v", "--verbose", dest="verbose", action="store_const", const=1,
                       help="more output: each cell's whole config in list")

    selection(command("list", "list the cells and their diff against base (collect only)"))
    run = command("run", "run the selected cells (skips completed ones)")
    selection(run)
    run.add_argument("--collect-only", "--co", dest="collect_only", action="store_true",
                     help="list the selected cells and run nothing (as 'sweep list')")
    run.add_argument("-x", "--exitfirst", dest="maxfail", action="store_const", const=1, default=0,
                     help="start no more cells after the first failure (running ones finish)")
    run.add_argument("--maxfail", dest="maxfail", type=int, metavar="N",
                     help="start no more cells after N failures (running ones finish)")
    run.add_argument("--executor", metavar="NAME",
                     help=f"where cells run ({executors or 'none registered'}; default: chosen by plugins)")
    run.add_argument("--dry-run", action="store_true", help="validate and show the plan; run nothing")
    run.add_argument("--detach", action="store_true", help="submit and exit; follow with 'sweep status'")
    again = run.add_mutually_exclusive_group()
    again.add_argument("--rerun", action="store_true", help="run completed cells again, fresh")
    again.add_argument("--resume", action="store_true", help="continue cells from their latest checkpoint")
    status = command("status", "state, step, sec/step and health of each cell, from disk", several_runs_dirs=True)
    status.add_argument("paths", nargs="*", metavar="PATH[::CELL]", help=paths_help)
    _health_options(status)
    report = command("report", "throughput and accuracy tables from the runs on disk")
    report.add_argument("paths", nargs="*", metavar="PATH[::CELL]",
                        help="grid files or directories; the tables of a PATH::CELL are its whole grid's")
    report.add_argument("--format", default="table", metavar="FORMAT",
                        help="what is printed (default: table; an unknown one lists the registered "
                             "formats); every format's files (json's only when asked for) are written "
                             "under runs/<grid>/report/ whatever the format; csv and json print data "
                             "only (what was written goes to stderr)")
    report.add_argument("--table", metavar="TABLE",
                        help="print only this table (an unknown one lists the registered tables; csv "
                             "needs one: a CSV file holds one table)")
    level_help = ("the intervals' confidence level, in (0, 1) (default: 0.95); Δ vs base holds at that level for "
                  "all of a grid's comparisons at once")
    report.add_argument("--level", default="0.95", metavar="LEVEL", help=level_help)
    suggest = command("suggest", "the winner of each one-factor axis beyond the noise, and a combo cell joining "
                                 "them, as grid code")
    suggest.add_argument("paths", nargs="*", metavar="PATH", help="the grid file (one)")
    suggest.add_argument("--by", default="sec_per_step", metavar="COLUMN",
                         help="the report column that decides (default: sec_per_step; also tok_per_s, "
                              "pass_at_k, reward_last, any numeric column)")
    direction = suggest.add_mutually_exclusive_group()
    direction.add_argument("--lower", dest="lower", action="store_const", const=True, default=None,
                           help="lower is better (known for the usual columns)")
    direction.add_argument("--higher", dest="lower", action="store_const", const=False)
    suggest.add_argument("--level", default="0.95", metavar="LEVEL", help=level_help)
    for name in ("keyword", "markexpr", "profile"):
        suggest.set_defaults(**{name: None})
    suggest.set_defaults(failed=False, verbose=0)
    compare = command("compare", "two runs of a grid, cell by cell: the change of each column, beyond the noise")
    compare.add_argument("a", metavar="A", help="runs/<grid> dir, a grid of this runs dir, or REV:PATH "
                                                "(the report tables committed at git revision REV under PATH)")
    compare.add_argument("b", metavar="B", help="the other side, in the same forms")
    compare.add_argument("--columns", metavar="C1,C2", help="columns to compare (default: every numeric one)")
    compare.add_argument("--level", default="0.95", metavar="LEVEL", help=level_help)
    cancel = command("cancel", "cancel the SLURM jobs (and chains) of cells, whoever submitted them, "
                               "and stop the local sweep run on this machine that runs any of them")
    cancel.add_argument("paths", nargs="*", metavar="PATH[::CELL]", help=paths_help)
    _end_commands(command, paths_help)
    command("plugins", "list active plugins and the hooks each implements")
    return parser, subparsers


def _end_commands(command, paths_help: str) -> None:
    """``sweep export`` and ``sweep clean`` (docs/running.md, sweepkit.end)."""
    by_help = ("the metric that picks the best checkpoint among the evals at checkpointed steps: a metric of "
               "metrics.jsonl (eval/pass_at_1, eval/reward_mean) or a report column reading one (pass_at_1); "
               "default: eval/pass_at_k, higher better (loss-like names: lower)")
    export = command("export", "write each finished cell's best (or --last, --step N) checkpoint as a Hugging "
                               "Face model dir with a manifest; uploads nothing")
    clean = command("clean", "delete the checkpoints of finished cells but the one --keep names; lists them "
                             "unless --yes")
    for p in (export, clean):
        p.add_argument("paths", nargs="*", metavar="PATH[::CELL]", help=paths_help)
        p.add_argument("-k", dest="keyword", metavar="EXPR", help="select cells whose ids/keywords match")
        p.add_argument("-m", dest="markexpr", metavar="MARKEXPR", help="select cells by marks")
        p.add_argument("--by", metavar="COLUMN", help=by_help)
    which = export.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, metavar="N", help="the checkpoint of step N")
    which.add_argument("--last", action="store_true", help="the last checkpoint")
    export.add_argument("--to", metavar="DIR", help="write under DIR/<grid>/<cell>/ (default: the cluster's "
                                                    "export dir, else ./exports)")
    clean.add_argument("--keep", required=True, choices=("best", "last", "none"),
                       help="the checkpoint each cell keeps: the best by --by, the last, or none")
    clean.add_argument("--yes", action="store_true", help="delete (without it: only list what would go)")


def _health_options(status: argparse.ArgumentParser) -> None:
    """``sweep status``'s health options (docs/running.md, sweepkit.report.health)."""
    status.add_argument("--check", action="store_true",
                        help=f"exit {int(ExitCode.UNHEALTHY)} when any cell is unhealthy (nan, collapse, flat, "
                             f"stalled, failed), for cron")
    status.add_argument("--watch", type=float, metavar="SECONDS",
                        help="read again every SECONDS and print the rows whose state, step or health changed; "
                             "Ctrl-C ends it, exiting as --check does")
    status.add_argument("--watch-count", type=int, metavar="N", help="with --watch: stop after N rounds")
    status.add_argument("--stall-factor", type=float, default=STALL_FACTOR, metavar="K",
                        help=f"a running cell is stalled after K times its median sec/step without a new metrics "
                             f"line (default: {STALL_FACTOR:g})")
    status.add_argument("--stall-min-s", type=float, default=STALL_MIN_S, metavar="S",
                        help=f"... and never before S seconds (default: {STALL_MIN_S:g})")


def _early_options(argv: list[str]) -> argparse.Namespace:
    parser, _ = build_parser(parser_class=_EarlyParser)
    try:
        options, _ = parser.parse_known_args([a for a in argv if a not in ("-h", "--help")])
        return options
    except _EarlyParseError:
        return argparse.Namespace(plugins=None, rootdir=None, runs_dir=None, paths=[])


def _initial_sweepconf_dirs(paths: list[str], rootdir: Path) -> list[Path]:
    """Directories whose sweepconf.py must load before the full parse (they may add options).

    The early parse cannot tell an unknown option's value from a path, so arguments
    that are not existing paths are skipped; with none left, ``grids/`` is meant.
    """
    existing = [Path(split_arg(arg)[0]) for arg in paths if Path(split_arg(arg)[0]).exists()]
    if not existing:
        return [rootdir / DEFAULT_GRID_DIR]
    return [path if path.is_dir() else path.parent for path in existing]


def start_session(argv: list[str]) -> Session:
    early = _early_options(argv)
    pm = plugin.make_plugin_manager()
    # `-p acme_cluster` finds acme_cluster.py in the project (the installed `sweep` script,
    # unlike `python -m sweepkit`, has no current directory on its path); installed
    # modules still come first.
    project = str(Path(early.rootdir or ".").resolve())
    if project not in sys.path:
        sys.path.append(project)
    plugin.load_plugins(pm, early.plugins or ())
    session = Session.from_options(pm, early)
    for directory in _initial_sweepconf_dirs(getattr(early, "paths", None) or [], session.rootdir):
        for path in plugin.sweepconf_paths(directory, session.rootdir):
            plugin.load_sweepconf(pm, path, session.rootdir)
    plugin.check_pending(pm)
    session.register_hooks()
    parser, subparsers = build_parser(session.registry)
    pm.hook.sweep_addoption.call_historic(kwargs={"parser": OptionParser(subparsers)})
    session.options = parser.parse_args(argv)
    return session


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    err = make_console(sys.stderr)
    configured = None
    try:
        try:
            session = start_session(argv)
            session.configure()
            configured = session
            command = session.options.command
            if command == "run" and session.options.collect_only:
                command = "list"  # pytest's `--collect-only`: what would run, and nothing runs
            return int(getattr(commands, f"cmd_{command}")(session))
        finally:  # inside: a Ctrl-C as the plugins unconfigure ends the process as any other does
            if configured is not None:
                configured.unconfigure()
    except UsageError as exc:
        for index, line in enumerate(exc.lines):
            err.print(f"ERROR: {line}" if index == 0 else f"  {line}", markup=False)
        return int(ExitCode.USAGE_ERROR)
    except KeyboardInterrupt:
        err.print("interrupted", markup=False)
        return int(ExitCode.INTERRUPTED)
    except Exception:
        err.print("INTERNAL ERROR (a bug in sweepkit or a plugin):", markup=False)
        err.print(traceback.format_exc(), markup=False)
        return int(ExitCode.INTERNAL_ERROR)


def console_main() -> int:
    """The ``sweep`` command (and ``python -m sweepkit``): :func:`main`, then the process's
    end. A Ctrl-C that comes once main has returned (a second one, as the interpreter shuts
    down, when Python has put SIGINT back to its default) would kill the process and lose
    the exit status main returned: 2 for a run already interrupted and recorded."""
    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code
