"""A driver's results, summed up as pytest sums up a session: each cell's outcome and, for a
failing one, why; the short summary of the failing cells; the closing line and exit code."""

from __future__ import annotations

from rich.text import Text

from sweepkit.errors import ExitCode
from sweepkit.run.progress import STYLES, label
from sweepkit.state import records as st

ORDER = ("failed", "xpassed-strict", "interrupted", "cancelled", "passed", "skipped", "xfailed", "xpassed")


class Summary:
    """The outcome of each of a driver's cells, by node id, and why each failing one failed."""

    def __init__(self, console, total: int):
        self.console = console
        self.total = total
        self.outcomes: dict[str, str] = {}
        self.reasons: dict[str, str] = {}

    def record(self, nodeid: str, result: str, reason: str | None = None) -> None:
        """``nodeid`` ended ``result``; a failing result's ``reason`` is kept unless one is already."""
        self.outcomes[nodeid] = result
        if result in st.FAILING_OUTCOMES:
            self.reasons.setdefault(nodeid, reason or label(result))

    def explain(self, nodeid: str, reason: str) -> None:
        """Why ``nodeid`` is failing, in place of what its outcome alone would say."""
        self.reasons[nodeid] = reason

    @property
    def failures(self) -> int:
        return sum(result in st.FAILING_OUTCOMES for result in self.outcomes.values())

    def close(self, elapsed: float, *, detached: bool = False) -> int:
        """Print the short summary and the closing line; the exit code. ``detached``: the
        cells not finished were submitted to a queue that runs them without this process."""
        counts: dict[str, int] = {}
        for result in self.outcomes.values():
            counts[result] = counts.get(result, 0) + 1
        parts = [f"{counts[key]} {key}" for key in ORDER if key in counts]
        unfinished = self.total - len(self.outcomes)
        if unfinished:
            parts.append(f"{unfinished} not finished")
        failing = bool(self.failures or unfinished)
        self._short_summary()
        self.console.print(f"==== {', '.join(parts) or 'no cells'} in {elapsed:.2f}s ====",
                           style="bold red" if failing else "bold green", markup=False)
        if detached and unfinished:
            return ExitCode.OK
        return ExitCode.CELLS_FAILED if failing else ExitCode.OK

    def _short_summary(self) -> None:
        """pytest's "short test summary info": one line per failing cell, with why, in run order."""
        failing = [(nodeid, result) for nodeid, result in self.outcomes.items() if result in st.FAILING_OUTCOMES]
        if not failing:
            return
        self.console.print("==== short summary ====", style="bold", markup=False)
        for nodeid, result in failing:
            line = Text(f"{label(result)} ", style=STYLES.get(result, ""))
            line.append(f"{nodeid} - {self.reasons.get(nodeid, label(result))}")
            self.console.print(line, soft_wrap=True)
        if any(result == "failed" for _, result in failing):
            self.console.print("run the failed cells again with: sweep run … --lf", markup=False)
