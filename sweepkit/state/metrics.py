"""Reading a cell's metrics, from ``metrics.jsonl`` or from ``WANDB_MIRROR`` stdout lines.

A cell's process reports each step either as a JSON object per line in ``metrics.jsonl``
(``{"kind": "train", "step": 3, "timing/step": 1.2, ...}``) or as a stdout line
``WANDB_MIRROR kind=train step=3 metrics={...}`` (the seeds' format), or both; when the
file exists it wins, since it survives restarts and the stdout of a resumed run may
repeat steps. The last line of a file that is still being written can be cut short; it is
skipped until it is complete. A record whose step is not an integer (``"step": "five"``) is
left out, and :func:`bad_lines` names its line. When a step appears twice (a resumed run repeats the steps
after its checkpoint), the later record wins.

There is one reader, and it makes one shape: the per-step frame of a cell (``kind``,
``step`` and every numeric metric as Float64, one row per (kind, step), in step order).
:func:`scan` gives it for a cell's whole file (``sweep report`` joins every cell's,
``sweep status`` summarizes it), :class:`Follower` grows it from the
bytes written since its last read (the driver's live display and its guards, every poll),
and :func:`summary_expressions` are the expressions all of them compute a cell's step,
sec/step and reward with.

polars is imported by the functions that read, not by the module: the runner (loaded by
every ``sweep`` command) imports this module, and ``sweep list`` never reads a metric. The
driver imports both polars and steadystate with :func:`import_readers` before it starts
anything, never from its loop.
"""

from __future__ import annotations

import functools
import io
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from sweepkit.state import records as st

if TYPE_CHECKING:
    import polars as pl

MIRROR_LINE = re.compile(r"WANDB_MIRROR kind=(?P<kind>\S+) step=(?P<step>-?\d+) metrics=(?P<metrics>\{.*\})\s*$")

STEP_TIME = "timing/step"
REWARD = "reward/mean"


def import_readers() -> None:
    """Import what reading metrics needs (polars, steadystate) now, so that a later read
    does not. An import that a Ctrl-C cuts short leaves its package half-imported for the
    rest of the process (its next import fails on a missing attribute). The driver's loop
    acts on a first Ctrl-C between its steps (:mod:`sweepkit.run.interrupts`), but a second
    one acts at once, so a driver imports these before it submits anything: its first read
    of a cell's metrics is then never an import."""
    import polars  # noqa: F401
    import steadystate  # noqa: F401


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


def complete_bytes(path: Path, offset: int = 0) -> tuple[bytes, int]:
    """The bytes of ``path`` from ``offset`` up to its last newline, and the offset after
    them; a last line still being written is left for the next read."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read()
    end = data.rfind(b"\n") + 1
    return data[:end], offset + end


def complete_text(path: Path, offset: int = 0) -> tuple[str, int]:
    """:func:`complete_bytes` as text."""
    data, end = complete_bytes(path, offset)
    return data.decode(errors="replace"), end


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


def bad_lines(directory: Path) -> list[tuple[int, str]]:
    """``(line number, why)`` of the records of a cell's ``metrics.jsonl`` that are left out
    (:func:`record_problem`); the ``WANDB_MIRROR`` lines of stdout always have integer steps."""
    found = source(directory)
    if found is None or found[0] != "jsonl":
        return []
    text, _ = complete_text(found[1])
    return [(number, problem) for number, record in _records(text.splitlines())
            if (problem := record_problem(record)) is not None]


# -- the per-step frame ----------------------------------------------------------------


def _per_step(frame: pl.LazyFrame) -> pl.LazyFrame:
    """``kind``, ``step`` (Int64) and the numeric metrics as Float64, the last record of
    each (kind, step). Strings and nested values (the ``info`` record's device, knobs) are
    not metrics: the report reads them from the file's first records (``run_info``). A key
    written only as null (the trainer's NaN or inf at every step) stays, a Float64 column of
    nulls: health tells it from a key never written, which has no column."""
    import polars as pl

    schema = frame.collect_schema()
    numeric = [name for name, dtype in schema.items()
               if (dtype.is_numeric() or dtype == pl.Null) and name != "step"]
    return (
        frame.filter(pl.col("kind").is_not_null() & pl.col("step").is_not_null())
        .select(pl.col("kind"), pl.col("step").cast(pl.Int64), *(pl.col(name).cast(pl.Float64) for name in numeric))
        .unique(subset=["kind", "step"], keep="last", maintain_order=True)
        .sort("step", maintain_order=True)
    )


def _polars_can_take(frame) -> bool:
    """False where a step that is not an integer on some line ("five") made the column
    another type, or a kind that is not a string did: the line parser leaves such lines out."""
    import polars as pl

    schema = frame.collect_schema()
    return ("kind" in schema and "step" in schema and schema["step"].is_integer()
            and schema["kind"] == pl.String)


def _parsed(kind: str, data: bytes) -> pl.LazyFrame | None:
    """Complete lines of a metrics source, parsed one by one (stdout lines, or a metrics
    file polars cannot take as it is: a damaged line, a NaN, a bad step)."""
    import polars as pl

    records = list(PARSERS[kind](data.decode(errors="replace").splitlines()))
    return pl.from_dicts(records, infer_schema_length=None).lazy() if records else None


def frame_of(kind: str, data: bytes) -> pl.LazyFrame | None:
    """The per-step frame of complete lines (``data`` ends at a newline) of a source of
    ``kind`` (``jsonl`` or ``stdout``), or None when they hold no record."""
    import polars as pl

    if not data.strip():
        return None
    frame = None
    if kind == "jsonl":
        try:
            frame = pl.read_ndjson(io.BytesIO(data), infer_schema_length=None).lazy()
            if not _polars_can_take(frame):
                frame = None
        except pl.exceptions.PolarsError:
            frame = None
    frame = frame if frame is not None else _parsed(kind, data)
    return None if frame is None else _per_step(frame)


def scan(directory: Path) -> pl.LazyFrame | None:
    """A cell's per-step frame, every kind of record (train, eval, info), or None when it
    has no metrics yet. The file is read once, its complete lines parsed once (polars has to
    read a whole NDJSON file to know its columns anyway), and the frame stays lazy: the
    report plans every cell's aggregates, the tables and the curves over it in one pass."""
    found = source(directory)
    if found is None:
        return None
    kind, path = found
    try:
        data, _ = complete_bytes(path)
    except FileNotFoundError:  # a fresh start removed it between the two looks
        return None
    return frame_of(kind, data)


def _finite(expression: pl.Expr) -> pl.Expr:
    return expression.filter(expression.is_finite())


@functools.cache
def summary_expressions() -> tuple:
    """What the live display and ``sweep status`` show of a cell, over its train rows, but
    sec/step (:func:`steady_sec_per_step`): the last step and the last finite reward."""
    import polars as pl

    return (
        pl.col("step").max().alias("step"),
        _finite(pl.col(REWARD).sort_by("step")).last().alias("reward"),
    )


def steady_sec_per_step(frame: pl.DataFrame) -> float | None:
    """The steady-state mean of a per-step frame's step times: the warm-up the data shows
    left out, each process's own (its start is the step of an ``info`` record), as the
    report's ``sec_per_step`` (``steadystate.steady_mean``)."""
    import math

    import polars as pl

    from steadystate import starts_of, steady_mean

    train = frame.filter(pl.col("kind") == "train").sort("step")
    rows = [(step, time) for step, time in train.select("step", STEP_TIME).iter_rows()
            if time is not None and math.isfinite(time)]
    starts = starts_of([step for step, _ in rows], frame.filter(pl.col("kind") == "info")["step"].to_list())
    estimate = steady_mean([time for _, time in rows], starts)
    return estimate.mean if estimate is not None else None


@attrs.frozen(kw_only=True)
class Summary:
    """The few numbers the live display and ``sweep status`` show for a cell."""

    step: int | None = None
    sec_per_step: float | None = None
    reward: float | None = None
    updated: float | None = None  # mtime of the metrics source


def summarize_frame(frame: pl.LazyFrame | pl.DataFrame | None, updated: float | None = None) -> Summary:
    """:func:`summary_expressions` of a per-step frame."""
    import polars as pl

    if frame is None:
        return Summary(updated=updated)
    present = frame.collect_schema().names()
    frame = frame.lazy().with_columns(pl.lit(None, dtype=pl.Float64).alias(name) for name in (STEP_TIME, REWARD)
                                      if name not in present).collect()
    row = frame.filter(pl.col("kind") == "train").select(summary_expressions()).row(0, named=True)
    return Summary(updated=updated, sec_per_step=steady_sec_per_step(frame), **row)


def summarize(records: Iterable[dict[str, Any]], updated: float | None = None) -> Summary:
    """:func:`summary_expressions` of records as the trainer writes them (a test's expected values)."""
    import polars as pl

    records = [record for record in records if record_problem(record) is None]
    frame = _per_step(pl.from_dicts(records, infer_schema_length=None).lazy()) if records else None
    return summarize_frame(frame, updated)


def read(directory: Path) -> tuple[pl.DataFrame | None, float | None]:
    """A cell's per-step frame, collected (None without metrics), and its metrics file's mtime
    (None without one, or when a fresh start removed it between the two looks)."""
    found = source(directory)
    try:
        updated = found[1].stat().st_mtime if found else None
    except FileNotFoundError:
        return None, None
    scanned = scan(directory)
    return (None if scanned is None else scanned.collect()), updated


def summary(directory: Path) -> Summary:
    """A cell's :class:`Summary` from its files."""
    frame, updated = read(directory)
    return summarize_frame(frame, updated=updated)


class Follower:
    """A cell's per-step frame grown from the bytes written since the last read, so a live
    display that polls every fraction of a second costs only the new lines."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._source: tuple[str, Path] | None = None
        self._offset = 0
        self._frame: pl.DataFrame | None = None
        self._summary = Summary()
        self._ordered: list[dict[str, Any]] | None = []

    @property
    def ordered(self) -> list[dict[str, Any]]:
        """Every record read so far, in step order, each with the metrics it logged."""
        if self._ordered is None:
            self._ordered = [{key: value for key, value in row.items() if value is not None}
                             for row in self._frame.iter_rows(named=True)]
        return self._ordered

    def _start_over(self) -> None:
        self._offset, self._frame, self._ordered, self._summary = 0, None, [], Summary()

    def summary(self) -> Summary:
        found = source(self.directory)
        if found is None:
            return Summary()
        if found != self._source:  # metrics.jsonl appeared after stdout was being read
            self._source = found
            self._start_over()
        kind, path = found
        try:
            stat = path.stat()
            if stat.st_size < self._offset:  # the file was started over (a fresh run)
                self._start_over()
            data, self._offset = complete_bytes(path, self._offset)
        except FileNotFoundError:
            return Summary()
        new = frame_of(kind, data)
        if new is not None:
            import polars as pl

            rows = new if self._frame is None else pl.concat([self._frame.lazy(), new], how="diagonal_relaxed")
            self._frame = _per_step(rows).collect()
            self._ordered = None
            self._summary = summarize_frame(self._frame)
        return attrs.evolve(self._summary, updated=stat.st_mtime)
