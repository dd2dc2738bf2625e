"""What one ``sweep status`` reads, and how: the runs dirs it names (``--runs-dir``, repeated
or a glob), the short label of each, and its health options (``--check``, ``--watch``,
``--watch-count``, ``--stall-factor``, ``--stall-min-s``), checked before anything is read."""

from __future__ import annotations

import glob
import math
from collections.abc import Sequence
from pathlib import Path

import attrs

from sweepkit.errors import UsageError
from sweepkit.report import health


@attrs.frozen(kw_only=True)
class HealthOptions:
    """``sweep status``'s health options, checked: ``--check``, ``--watch``, ``--watch-count``,
    ``--stall-factor``, ``--stall-min-s``."""

    check: bool = False
    watch: float | None = None
    watch_count: int | None = None
    stall: health.StallRule = health.StallRule()

    @classmethod
    def of(cls, options) -> "HealthOptions":
        watch, count = getattr(options, "watch", None), getattr(options, "watch_count", None)
        if watch is not None and not (math.isfinite(watch) and watch > 0):
            raise UsageError(f"--watch {watch:g}: expected a number of seconds above 0")
        if count is not None and watch is None:
            raise UsageError(f"--watch-count {count}: only with --watch SECONDS")
        if count is not None and count < 1:
            raise UsageError(f"--watch-count {count}: expected a number of rounds of at least 1")
        factor = getattr(options, "stall_factor", health.STALL_FACTOR)
        min_s = getattr(options, "stall_min_s", health.STALL_MIN_S)
        if not (math.isfinite(factor) and factor > 0):
            raise UsageError(f"--stall-factor {factor:g}: expected a number above 0")
        if not (math.isfinite(min_s) and min_s >= 0):
            raise UsageError(f"--stall-min-s {min_s:g}: expected a number of seconds of at least 0")
        return cls(check=bool(getattr(options, "check", False)), watch=watch, watch_count=count,
                   stall=health.StallRule(factor=factor, min_s=min_s))


def named_runs_dirs(session) -> tuple[list[Path], bool]:
    """The runs dirs ``sweep status`` reads, and whether they are several (``--runs-dir``
    given more than once, or a glob): each named one as given, a glob's matches sorted,
    none twice. A named runs dir that does not exist, or a glob that matches no directory,
    is a UsageError naming it; the default ``<rootdir>/runs`` may not exist yet."""
    options = session.options
    named = getattr(options, "runs_dirs", None) or ([options.runs_dir] if getattr(options, "runs_dir", None) else [])
    if not named:
        return [session.runs_dir], False
    found: list[Path] = []
    for spec in named:
        if glob.has_magic(spec):
            matches = sorted(Path(match) for match in glob.glob(str(Path(spec).expanduser())) if Path(match).is_dir())
            if not matches:
                raise UsageError(f"--runs-dir {spec}: matches no directory")
        else:
            matches = [Path(spec).expanduser()]
            if not matches[0].is_dir():
                why = "not a directory" if matches[0].exists() else "no such directory"
                raise UsageError(f"--runs-dir {spec}: {why}")
        found += [match if match.is_absolute() else Path.cwd() / match for match in matches]
    unique = list({path.resolve(): path for path in found}.values())
    return unique, len(named) > 1 or any(glob.has_magic(spec) for spec in named)


def short_labels(runs_dirs: Sequence[Path]) -> dict[Path, str]:
    """The ``runs`` column: each runs dir's shortest tail of path parts that no other has
    (``alice/runs`` and ``bob/runs`` for ``/scratch/alice/runs`` and ``/scratch/bob/runs``)."""
    parts = {path: path.resolve().parts for path in runs_dirs}
    longest = max((len(p) for p in parts.values()), default=1)
    for n in range(1, longest + 1):
        labels = {path: "/".join(p[-n:]) for path, p in parts.items()}
        if len(set(labels.values())) == len(labels):
            return labels
    return {path: str(path) for path in runs_dirs}
