"""What a driver shows while its cells run.

On a terminal: a rich ``Live`` table, one row per cell (state, attempt, step, sec/step,
reward, elapsed), redrawn as metrics arrive. Anywhere else (a log file, CI, a detached
driver): plain lines, one per event, plus a progress line per running cell at most every
``PLAIN_PROGRESS_EVERY_S`` seconds, so logs stay readable and greppable. A row's step,
sec/step and reward are a :class:`sweepkit.state.metrics.Summary`, made by the driver's
:class:`sweepkit.state.metrics.Follower` (the per-step frame grown from the new lines at each
poll) with the same expressions ``sweep status`` uses.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import attrs
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sweepkit.screen import Column, fitted_table
from sweepkit.state.metrics import Summary

PLAIN_PROGRESS_EVERY_S = 30.0
LIVE_COLUMNS = (Column(header="cell"), Column(header="state"), Column(header="try", justify="right", drop=1),
                Column(header="step", justify="right"), Column(header="s/step", justify="right"),
                Column(header="reward", justify="right"), Column(header="elapsed", justify="right", drop=2),
                Column(header="", floor=12))

# Outcome words, pytest's where they exist.
LABELS = {
    "passed": "PASSED", "failed": "FAILED", "xfailed": "XFAIL", "xpassed": "XPASS",
    "xpassed-strict": "XPASS(strict)", "skipped": "SKIPPED", "cancelled": "CANCELLED",
    "interrupted": "INTERRUPTED", "pending": "pending", "submitted": "submitted",
    "running": "running", "attached": "running*", "completed": "completed",
    "deleted": "DELETED", "damaged": "DAMAGED", "stopping": "STOPPING",
    "rerun-interrupted": "RERUN-INTERRUPTED", "scancelled": "SCANCELLED",
}
STYLES = {
    "passed": "green", "xfailed": "yellow", "xpassed": "yellow", "skipped": "cyan",
    "failed": "bold red", "xpassed-strict": "bold red", "cancelled": "red", "interrupted": "red",
    "running": "blue", "attached": "blue", "deleted": "magenta", "damaged": "bold red", "stopping": "bold red",
    "rerun-interrupted": "yellow", "scancelled": "magenta",
}


def label(status: str) -> str:
    return LABELS.get(status, status)


def status_text(status: str) -> Text:
    return Text(label(status), style=STYLES.get(status, ""))


def fmt_number(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 10:
        return f"{seconds:.1f}s"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@attrs.define(kw_only=True)
class Row:
    nodeid: str
    status: str = "pending"
    attempt: int | None = None
    summary: Summary = attrs.field(factory=Summary)
    started: float | None = None
    ended: float | None = None
    note: str = ""
    last_plain: float = attrs.field(factory=time.time)


class RunDisplay:
    """Rows keyed by node id; ``update`` changes one, ``event`` prints a line above them."""

    def __init__(self, console: Console, nodeids: Sequence[str], *, quiet: bool = False):
        self.console = console
        self.quiet = quiet  # -q: no progress lines between a cell's events
        self.rows = {nodeid: Row(nodeid=nodeid) for nodeid in nodeids}
        self.live = console.is_terminal
        self._live: Live | None = None

    def __enter__(self) -> "RunDisplay":
        if self.live:
            self._live = Live(self._table(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.__exit__(*exc)
            self._live = None

    def event(self, status: str, nodeid: str, detail: str = "") -> None:
        text = f"{label(status):<13} {nodeid}" + (f"  {detail}" if detail else "")
        # A Text, not a str with style=: the live table is redrawn inside this print and
        # would take on its style.
        self.console.print(Text(text, style=STYLES.get(status, "")))

    def update(self, nodeid: str, **changes) -> None:
        row = self.rows[nodeid]
        for key, value in changes.items():
            setattr(row, key, value)
        if (not self.live and not self.quiet and row.status in ("running", "attached")
                and row.summary.step is not None):
            now = time.time()
            if now - row.last_plain >= PLAIN_PROGRESS_EVERY_S:
                row.last_plain = now
                self.console.print(Text(f"{'':<13} {nodeid}  {describe(row.summary)}"))

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._table())

    def _table(self) -> Table:
        """One line a row at the console's width: ids, states and numbers whole, the note cut
        with an ellipsis, ``try`` and ``elapsed`` left out first where even that is too wide."""
        now = time.time()
        rows = []
        for row in self.rows.values():
            elapsed = None if row.started is None else (row.ended or now) - row.started
            rows.append([
                Text(row.nodeid),
                status_text(row.status),
                Text("" if row.attempt is None else str(row.attempt)),
                Text("" if row.summary.step is None else str(row.summary.step)),
                Text(fmt_number(row.summary.sec_per_step)),
                Text(fmt_number(row.summary.reward)),
                Text(fmt_duration(elapsed)),
                Text(row.note),
            ])
        table, _, _ = fitted_table(LIVE_COLUMNS, rows, self.console.width)
        return table


def describe(summary: Summary) -> str:
    """``step 12  0.31 s/step  reward 0.52`` with the parts that are known."""
    parts = []
    if summary.step is not None:
        parts.append(f"step {summary.step}")
    if summary.sec_per_step is not None:
        parts.append(f"{summary.sec_per_step:.3g} s/step")
    if summary.reward is not None:
        parts.append(f"reward {summary.reward:.3g}")
    return "  ".join(parts)
