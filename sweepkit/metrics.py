"""Reading a cell's metrics, from ``metrics.jsonl`` or from ``WANDB_MIRROR`` stdout lines.

A cell's process reports each step either as a JSON object per line in ``metrics.jsonl``
(``{"kind": "train", "step": 3, "timing/step": 1.2, ...}``) or as a stdout line
``WANDB_MIRROR kind=train step=3 metrics={...}`` (the seeds' format), or both; when the
file exists it wins, since it survives restarts and the stdout of a resumed run may
repeat steps. The last line of a file that is still being written can be cut short; it is
skipped until it is complete. A record whose step is not an integer (``"step": "five"``) is
left out, and :func:`bad_lines` names its line. When a step appears twice (a resumed run repeats the steps
after its checkpoint), the later record wins.

This module is plain Python (the driver's live display and ``sweep status`` use it every
second); ``sweepkit.report`` scans the same sources with polars.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from sweepkit import state as st

MIRROR_LINE = re.compile(r"WANDB_MIRROR kind=(?P<kind>\S+) step=(?P<step>-?\d+) metrics=(?P<metrics>\{.*\})\s*$")

STEP_TIME = "timing/step"
REWARD = "reward/mean"


def source(directory: Path) -> tuple[str, Path] | None:
    """``("jsonl", path)`` or ``("stdout", path)``: where this cell's metrics are read from."""
    directory = Path(directory)
    jsonl = directory / st.METRICS_FILE
    if jsonl.exists():
        return "jsonl", jsonl
    stdout = directory / st.STDOUT_FILE
    if stdout.exists():
        return "stdout", stdout
    return None


def complete_text(path: Path, offset: int = 0) -> tuple[str, int]:
    """The text of ``path`` from ``offset`` up to its last newline, and the offset after it;
    a last line still being written is left for the next read."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read()
    end = data.rfind(b"\n") + 1
    return data[:end].decode(errors="replace"), offset + end


def record_problem(record: dict[str, Any]) -> str | None:
    """Why a record (an object with ``kind`` and ``step``) cannot be placed: a step that is
    not an integer (``"step": "five"``), or a kind that is not a string; None when it can."""
    step = record["step"]
    if isinstance(step, bool) or not isinstance(step, int):
        return f"step {step!r} is not an integer"
    if not isinstance(record["kind"], str):
        return f"kind {record['kind']!r} is not a string"
    return None


def _records(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of the lines that are JSON objects with ``kind`` and ``step``."""
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a killed writer
        if isinstance(record, dict) and "kind" in record and "step" in record:
            yield number, record


def parse_jsonl(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The records of ``metrics.jsonl`` lines; those :func:`record_problem` rejects are left out."""
    for _, record in _records(lines):
        if record_problem(record) is None:
            yield record


def parse_mirror(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if "WANDB_MIRROR" not in line:
            continue
        match = MIRROR_LINE.search(line)
        if match is None:
            continue
        try:
            metrics = json.loads(match["metrics"])
        except json.JSONDecodeError:
            continue
        if isinstance(metrics, dict):
            yield {"kind": match["kind"], "step": int(match["step"]), **metrics}


PARSERS = {"jsonl": parse_jsonl, "stdout": parse_mirror}


def dedupe(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per (kind, step), the last one written, ordered by step."""
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    for record in records:
        latest.pop((record["kind"], record["step"]), None)
        latest[(record["kind"], record["step"])] = record
    return sorted(latest.values(), key=lambda record: record["step"])


def bad_lines(directory: Path) -> list[tuple[int, str]]:
    """``(line number, why)`` of the records of a cell's ``metrics.jsonl`` that are left out
    (:func:`record_problem`); the ``WANDB_MIRROR`` lines of stdout always have integer steps."""
    found = source(directory)
    if found is None or found[0] != "jsonl":
        return []
    text, _ = complete_text(found[1])
    return [(number, problem) for number, record in _records(text.splitlines())
            if (problem := record_problem(record)) is not None]


def read_records(directory: Path) -> list[dict[str, Any]]:
    """All of a cell's metric records (train, eval and any other kind)."""
    found = source(directory)
    if found is None:
        return []
    kind, path = found
    text, _ = complete_text(path)
    return dedupe(PARSERS[kind](text.splitlines()))


def warmup_steps(n_steps: int) -> int:
    """Steps left out of timing medians: the first 10% of the steps, at least the first
    one (compilation, cache allocation and CUDA graph capture make it slow), none when
    there is only one step."""
    if n_steps <= 1:
        return 0
    return max(1, n_steps // 10)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


@attrs.frozen(kw_only=True)
class Summary:
    """The few numbers the live display and ``sweep status`` show for a cell."""

    step: int | None = None
    sec_per_step: float | None = None
    reward: float | None = None
    updated: float | None = None  # mtime of the metrics source


def summarize(records: list[dict[str, Any]], updated: float | None = None) -> Summary:
    train = [record for record in records if record["kind"] == "train"]
    if not train:
        return Summary(updated=updated)
    times = [_number(record.get(STEP_TIME)) for record in train]
    times = [value for value in times[warmup_steps(len(times)):] if value is not None]
    rewards = [_number(record.get(REWARD)) for record in train]
    rewards = [value for value in rewards if value is not None]
    return Summary(
        step=train[-1]["step"],
        sec_per_step=statistics.median(times) if times else None,
        reward=rewards[-1] if rewards else None,
        updated=updated,
    )


class Follower:
    """Reads a cell's metrics incrementally, so a live display costs only the new bytes."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._source: tuple[str, Path] | None = None
        self._offset = 0
        self._records: dict[tuple[str, int], dict[str, Any]] = {}
        self.ordered: list[dict[str, Any]] = []  # every record read so far, in step order

    def summary(self) -> Summary:
        found = source(self.directory)
        if found is None:
            return Summary()
        if found != self._source:  # metrics.jsonl appeared after stdout was being read
            self._source, self._offset, self._records = found, 0, {}
        kind, path = found
        try:
            stat = path.stat()
            if stat.st_size < self._offset:  # the file was started over (a fresh run)
                self._offset, self._records = 0, {}
            text, self._offset = complete_text(path, self._offset)
        except FileNotFoundError:
            return Summary()
        for record in PARSERS[kind](text.splitlines()):
            self._records.pop((record["kind"], record["step"]), None)
            self._records[(record["kind"], record["step"])] = record
        self.ordered = sorted(self._records.values(), key=lambda record: record["step"])
        return summarize(self.ordered, updated=stat.st_mtime)


def summary(directory: Path) -> Summary:
    found = source(directory)
    updated = found[1].stat().st_mtime if found else None
    return summarize(read_records(directory), updated=updated)
