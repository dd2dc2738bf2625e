"""What a cell's files say: the records of ``state.json`` and ``cell.json`` read back, what a
state means (the effective state, pytest's outcome words), and the views ``status`` and
``report`` show.

Nothing here writes ``state.json``: every change of a cell's state is a named transition
of :mod:`sweepkit.state.transitions`. How files are written and locked is
:mod:`sweepkit.state.files`; a cell's checkpoints, :mod:`sweepkit.state.checkpoints`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from sweepkit.state.files import STATE_FILE, DamagedFile, is_held, is_locked, read_json

# The layout of a cell dir, which the readers of these records (status, report) find here too.
from sweepkit.state.files import CELL_FILE, CKPT_DIR, CONFIG_FILE, DRIVERS_DIR, LOCK_FILE  # noqa: F401
from sweepkit.state.files import METRICS_FILE, STATE_LOCK_FILE, STDERR_FILE, STDOUT_FILE  # noqa: F401

STATES = ("pending", "submitted", "running", "completed", "failed", "cancelled")
FINISHED = ("completed", "failed", "cancelled")


def _tuple(value) -> tuple:
    return tuple(value or ())


def _from_json(cls, data: Mapping[str, Any]):
    """An attrs record from its JSON form; keys a newer sweepkit added are ignored."""
    fields = {field.name for field in attrs.fields(cls)}
    return cls(**{key: value for key, value in data.items() if key in fields})


@attrs.frozen(kw_only=True)
class Attempt:
    """One start of a cell's process (a fresh run, a retry or a resume)."""

    n: int
    executor: str
    job_id: str | None = None
    host: str | None = None
    pid: int | None = None
    resume: bool = False
    devices: str | None = None  # the CUDA_VISIBLE_DEVICES the cell's process got
    started: float | None = None
    ended: float | None = None
    returncode: int | None = None
    failure: str | None = None
    failure_class: str | None = None  # sweepkit.run.failures: set once the job's final state is known
    # What the job deleted of the cell's earlier run before this attempt started (--rerun).
    deleted: tuple[str, ...] = attrs.field(default=(), converter=_tuple)



@attrs.frozen(kw_only=True)
class Submission:
    """The job a driver last handed to an executor for this cell.

    ``token`` is written before the job starts and handed to the job; a job that finds a
    different token once it holds the cell lock was superseded by a later driver and exits
    without running anything (see ``sweepkit.run.job``).
    """

    executor: str
    token: str
    job_id: str | None = None
    submitted: float = 0.0
    resume: bool = False



@attrs.frozen(kw_only=True)
class CellState:
    """Contents of ``state.json``."""

    nodeid: str
    state: str = attrs.field(validator=attrs.validators.in_(STATES))
    config_hash: str
    profile: str | None = None
    attempts: tuple[Attempt, ...] = attrs.field(default=(), converter=_tuple)
    submission: Submission | None = None
    # A pending cell's driver: the path of the lock it holds while it lives (DriverLock).
    driver: str | None = None
    # Set while a fresh attempt waits to start over an earlier run: the state that run was
    # in. Until the job starts the attempt the cell's files are that run's (nothing is
    # deleted before), ``config_hash`` and ``profile`` still describe them, status and report
    # show none of their numbers, and a driver that gives up the attempt before it starts
    # puts this state back.
    previous: str | None = None
    updated: float = 0.0
    # What ``sweep clean`` deleted of the run's checkpoints (transitions.cleaned): ``kept``
    # (the step left, None for none), ``deleted`` (entry names), ``freed_bytes``, ``by``, ``at``.
    # None for a cell never cleaned, and again once a new attempt starts.
    cleaned: Mapping[str, Any] | None = attrs.field(default=None, hash=False)

    @property
    def last_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def to_json(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "state": self.state,
            "config_hash": self.config_hash,
            "profile": self.profile,
            "attempts": [attrs.asdict(attempt) for attempt in self.attempts],
            "submission": attrs.asdict(self.submission) if self.submission else None,
            "driver": self.driver,
            "previous": self.previous,
            "updated": self.updated,
            "cleaned": dict(self.cleaned) if self.cleaned is not None else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, source: str = STATE_FILE) -> "CellState":
        missing = [key for key in ("nodeid", "state", "config_hash") if key not in data]
        if missing:
            raise ValueError(f"{source}: missing keys {', '.join(missing)}")
        submission = data.get("submission")
        return cls(
            nodeid=data["nodeid"],
            state=data["state"],
            config_hash=data["config_hash"],
            profile=data.get("profile"),
            attempts=[_from_json(Attempt, attempt) for attempt in data.get("attempts") or ()],
            submission=_from_json(Submission, submission) if submission else None,
            driver=data.get("driver"),
            previous=data.get("previous"),
            updated=data.get("updated", 0.0),
            cleaned=data.get("cleaned"),
        )


def cell_dir(runs_dir: Path, cell) -> Path:
    """Where a cell's files live: ``<runs_dir>/<grid name>/<cell name>``."""
    return Path(runs_dir) / cell.grid_name / cell.name


def load_state(directory: Path) -> CellState | None:
    """The cell's ``state.json``; None when there is none; DamagedFile when it cannot be read."""
    path = Path(directory) / STATE_FILE
    data = read_json(path)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise DamagedFile(path, "not a state record: not a JSON object")
    try:
        return CellState.from_json(data, source=str(path))
    except (ValueError, TypeError, AttributeError) as error:
        raise DamagedFile(path, f"not a state record: {str(error).removeprefix(f'{path}: ')}") from None


def read_state(directory: Path) -> CellState | None:
    """The cell's state, or None when it has none or its ``state.json`` is damaged (then
    :func:`state_problem` says why, and a fresh run, ``--rerun``, writes a new one)."""
    try:
        return load_state(directory)
    except DamagedFile:
        return None


def state_problem(directory: Path) -> DamagedFile | None:
    """Why the cell's ``state.json`` cannot be read, or None."""
    try:
        load_state(directory)
    except DamagedFile as problem:
        return problem
    return None


def effective_state(directory: Path, state: CellState | None) -> str:
    """The state to show and act on: a ``running`` state whose lock is free is a run that
    died without recording its end ("interrupted"); a ``pending`` one whose driver is gone
    will never be started by it ("abandoned"; the next ``sweep run`` starts it)."""
    if state is None:
        return "pending"
    if state.state == "running" and not is_locked(directory):
        return "interrupted"
    if state.state == "pending" and state.driver and not is_held(Path(state.driver)):
        return "abandoned"
    return state.state


def outcome(state: str, xfail: Mapping[str, Any] | None) -> str:
    """pytest's words for a cell's result: passed, failed, xfailed, xpassed, xpassed-strict
    (an XPASS of a ``strict=True`` xfail, which fails the run), or the state itself while
    the cell has no result yet (pending, submitted, running, interrupted, cancelled)."""
    if state == "completed":
        if xfail is None:
            return "passed"
        return "xpassed-strict" if xfail.get("strict") else "xpassed"
    if state in ("failed", "interrupted"):
        return "xfailed" if xfail is not None else ("failed" if state == "failed" else "interrupted")
    return state


FAILING_OUTCOMES = ("failed", "interrupted", "cancelled", "xpassed-strict")
# The outcome of a cell whose fresh attempt (``--rerun``) was never started by its driver,
# killed first: its files, and the numbers shown, are still its earlier run's.
INTERRUPTED_RERUN = "rerun-interrupted"


def last_failed(runs_dir: Path, cells) -> list:
    """The cells whose last run did not succeed (pytest's ``--lf``): failed, cancelled or
    interrupted, or whose ``state.json`` is damaged; an expected failure (xfail) does not count."""
    picked = []
    for cell in cells:
        directory = cell_dir(runs_dir, cell)
        state = read_state(directory)
        if state is None:
            if state_problem(directory) is not None:
                picked.append(cell)  # its record is damaged: that it passed is not known
            continue
        effective = effective_state(directory, state)
        if effective in ("failed", "cancelled", "interrupted") and cell.xfail is None:
            picked.append(cell)
    return picked


def cell_record(cell) -> dict[str, Any]:
    """What ``cell.json`` holds: everything ``sweep status`` and ``sweep report`` need to
    describe a cell without importing its grid file."""
    xfail = cell.xfail
    return {
        **cell.to_json(),
        "xfail": None if xfail is None else {
            "reason": xfail.reason,
            "strict": bool(xfail.kwargs.get("strict", False)),
        },
    }


def read_cell_record(directory: Path) -> dict[str, Any] | None:
    """The cell's ``cell.json``; None when there is none; DamagedFile when it cannot be read."""
    path = Path(directory) / CELL_FILE
    record = read_json(path)
    if record is not None and not isinstance(record, dict):
        raise DamagedFile(path, "not a cell record: not a JSON object")
    return record


def grid_dirs(runs_dir: Path) -> list[Path]:
    """The grid directories of a runs dir (not its ``.drivers`` and such)."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return []
    return sorted(path for path in runs_dir.iterdir() if path.is_dir() and not path.name.startswith("."))


def cell_dirs(grid_dir: Path) -> list[Path]:
    """The cell directories of a grid directory: those with a ``cell.json``."""
    return sorted(path.parent for path in Path(grid_dir).glob(f"*/{CELL_FILE}"))


def find_cell_dirs(runs_dir: Path, specs) -> list[Path]:
    """Cell dirs named by ``specs`` without importing any grid file. A spec is a grid file
    (``grids/x.py``, its stem names ``runs/x``), a node id (``grids/x.py::cell``), a
    directory under the runs dir, or a ``Cell``; no specs means every grid of the runs dir.
    Raises ValueError naming a spec that matches nothing on disk."""
    runs_dir = Path(runs_dir)
    if not specs:
        return [directory for grid in grid_dirs(runs_dir) for directory in cell_dirs(grid)]
    found: list[Path] = []
    for spec in specs:
        if hasattr(spec, "grid_name"):
            found.append(cell_dir(runs_dir, spec))
            continue
        spec = str(spec)
        path, _, name = spec.partition("::")
        if Path(path).is_dir() and (Path(path) / CELL_FILE).exists():
            matches = [Path(path)]
        elif Path(path).is_dir():
            matches = cell_dirs(Path(path))
        else:
            grid = runs_dir / Path(path).stem
            matches = cell_dirs(grid) if not name else [grid / name] if (grid / name / CELL_FILE).exists() else []
        if not matches:
            raise ValueError(f"{spec}: no runs of it under {runs_dir}")
        found.extend(matches)
    return list(dict.fromkeys(found))


@attrs.frozen(kw_only=True)
class CellView:
    """A cell as its files describe it, for ``status`` and ``report``."""

    directory: Path
    nodeid: str
    name: str
    record: Mapping[str, Any] | None
    state: CellState | None
    effective: str
    outcome: str
    # Its cell.json or state.json, where one cannot be read; a damaged state.json makes
    # the cell "damaged" (its record is left out, its other files still read).
    problems: tuple[DamagedFile, ...] = ()

    @property
    def interrupted_rerun(self) -> bool:
        """A fresh attempt over an earlier run that its driver never started (it was killed
        first): the cell's files are still that run's, whole, and stay so until a later
        ``sweep run`` starts the cell; status and report show that run's numbers."""
        return self.effective == "abandoned" and self.state is not None and self.state.previous is not None

    @property
    def stale_files(self) -> bool:
        """The cell's metrics, logs and checkpoints are an earlier run's than the attempt
        its state describes (a fresh attempt that has not started over them, and may still):
        status and report show none of their numbers."""
        return self.state is not None and self.state.previous is not None and not self.interrupted_rerun

    @property
    def waiting(self) -> bool:
        """A fresh attempt waits to start over an earlier run: the last attempt recorded is
        that run's, not the cell's current one."""
        return self.stale_files and self.state.state in ("pending", "submitted")

    @property
    def attempt(self) -> Attempt | None:
        """The attempt the cell's state is about (None before its first, or while waiting)."""
        return None if self.state is None or self.waiting else self.state.last_attempt

    @property
    def failure(self) -> str | None:
        return self.attempt.failure if self.attempt else None

    @property
    def cleaned_note(self) -> str | None:
        """``cleaned (kept step 40)`` / ``cleaned (no checkpoint kept)`` for a cell whose
        checkpoints ``sweep clean`` deleted, else None."""
        cleaned = self.state.cleaned if self.state is not None else None
        if not cleaned:
            return None
        kept = cleaned.get("kept")
        return f"cleaned (kept step {kept})" if kept is not None else "cleaned (no checkpoint kept)"

    @property
    def job(self) -> str:
        submission = self.state.submission if self.state else None
        attempt = self.attempt
        if submission is not None and submission.job_id:
            return f"{submission.executor}:{submission.job_id}"
        if attempt is not None and attempt.job_id:
            return f"{attempt.executor}:{attempt.job_id}"
        return ""


def view(directory: Path) -> CellView:
    """The cell of ``directory`` as its files describe it; what cannot be read is in ``problems``."""
    directory = Path(directory)
    problems = []
    try:
        record = read_cell_record(directory)
    except DamagedFile as problem:
        record = None
        problems.append(problem)
    try:
        state = load_state(directory)
    except DamagedFile as problem:
        state = None
        problems.append(problem)
    damaged = any(problem.path.name == STATE_FILE for problem in problems)
    effective = "damaged" if damaged else effective_state(directory, state)
    result = outcome(effective, (record or {}).get("xfail"))
    if effective == "abandoned" and state is not None and state.previous is not None:
        result = INTERRUPTED_RERUN
    nodeid = (record or {}).get("nodeid") or (state.nodeid if state else f"{directory.parent.name}::{directory.name}")
    return CellView(
        directory=directory, nodeid=nodeid, name=directory.name, record=record, state=state,
        effective=effective, outcome=result, problems=tuple(problems),
    )
