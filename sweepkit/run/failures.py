"""Why an attempt failed, in one word: its failure class.

A failed attempt is classified from what the scheduler says about its job (the SLURM
state from ``sacct``, when there is one) and from the tail of its logs, in this order:

1. a scheduler state that names the cause: ``OUT_OF_MEMORY`` -> ``OOM``, ``TIMEOUT`` /
   ``DEADLINE`` -> ``TIMEOUT``, ``NODE_FAIL`` / ``BOOT_FAIL`` -> ``NODE_FAIL``,
   ``PREEMPTED`` -> ``PREEMPTED``, ``CANCELLED`` -> ``CANCELLED``;
2. submitit's "timed-out and not checkpointable" (its warning signal came before the
   limit; see docs/local-slurm.md) -> ``TIMEOUT``;
3. the log tail: out-of-memory messages (CUDA, host, the cgroup OOM killer) -> ``OOM``;
   a full file system or a spent quota (also as the job recorded it) -> ``DISK_FULL``;
   NCCL errors and watchdog timeouts -> ``NCCL``; a Python traceback -> ``EXCEPTION`` with
   its last line, but one that ends in ``KeyboardInterrupt`` is the interrupt's own
   (Ctrl-C reached the command outside its handlers) -> ``CANCELLED``;
4. an attempt the driver or ``sweep cancel`` interrupted -> ``CANCELLED``;
5. anything else -> ``UNKNOWN`` with the recorded failure text.

Out-of-memory is looked for before NCCL because a CUDA allocation failure inside a
collective surfaces as an NCCL error whose text still says "out of memory".
The same rules apply to local runs (there is just no scheduler state).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import attrs

from sweepkit.run.executors import sacct
from sweepkit.state import records as st

OOM, TIMEOUT, NODE_FAIL, PREEMPTED, CANCELLED = "OOM", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "CANCELLED"
NCCL, EXCEPTION, UNKNOWN, XFAIL = "NCCL", "EXCEPTION", "UNKNOWN", "XFAIL"
GUARD = "GUARD"  # stopped by a live guard (sweep_watch_cell), the rule in the attempt's failure
DISK_FULL = "DISK_FULL"  # no space left where the cell writes (its runs dir, its checkpoints)

SCHEDULER_STATES = {
    "OUT_OF_MEMORY": OOM,
    "TIMEOUT": TIMEOUT,
    "DEADLINE": TIMEOUT,
    "NODE_FAIL": NODE_FAIL,
    "BOOT_FAIL": NODE_FAIL,
    "PREEMPTED": PREEMPTED,
    "CANCELLED": CANCELLED,
}
SUBMITIT_TIMEOUT = "timed-out and not checkpointable"

OOM_PATTERNS = re.compile(
    r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|oom[-_]kill|"
    r"out-of-memory handler|Out of memory: Killed process|\bMemoryError\b|"
    r"No available memory for the cache blocks",
    re.IGNORECASE,
)
DISK_FULL_PATTERNS = re.compile(r"No space left on device|Disk quota exceeded|\bENOSPC\b|\bEDQUOT\b",
                                re.IGNORECASE)
NCCL_PATTERNS = re.compile(
    r"NCCL error|\bnccl\w*Error\b|Watchdog caught collective operation timeout|"
    r"NCCL communicator was aborted|ProcessGroupNCCL.*(?:timeout|timed out|error)|DistBackendError",
    re.IGNORECASE,
)
TRACEBACK = "Traceback (most recent call last):"
# The line that ends a traceback: ``module.Name: message`` or a bare ``Name``.
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure)\b.*$|"
                            r"^[A-Za-z_][\w.]*: .+$")
TAIL_BYTES = 16384
DETAIL_CHARS = 300


@attrs.frozen
class Failure:
    kind: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


def scheduler_class(job_state: str | None) -> str | None:
    """The class a scheduler state implies (``CANCELLED by 0`` counts as ``CANCELLED``)."""
    if not job_state:
        return None
    return SCHEDULER_STATES.get(job_state.split()[0].upper())


def classify(*, job_state: str | None = None, log_tail: str = "", failure: str | None = None,
             cell_state: str | None = None) -> Failure:
    """The class of one failed attempt.

    :param job_state: the scheduler's final state of the attempt's job (None: none known).
    :param log_tail: the last lines of the attempt's logs (cell stderr, job log).
    :param failure: the failure text recorded in ``state.json`` (``exit code 1: ...``).
    :param cell_state: the cell's recorded state (``cancelled`` when it was interrupted).
    """
    failure = failure or ""
    by_state = scheduler_class(job_state)
    if by_state is not None:
        return Failure(by_state, _detail(failure) or job_state.split()[0].upper())
    if SUBMITIT_TIMEOUT in failure or SUBMITIT_TIMEOUT in log_tail:
        return Failure(TIMEOUT, "submitit's time-limit signal stopped the job")
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    for pattern, kind in ((OOM_PATTERNS, OOM), (DISK_FULL_PATTERNS, DISK_FULL), (NCCL_PATTERNS, NCCL)):
        matched = _last_match(lines, pattern) or (failure if pattern.search(failure) else None)
        if matched:
            return Failure(kind, _detail(matched))
    if TRACEBACK in log_tail:
        last = _exception_line(lines)
        if last is not None and re.match(r"KeyboardInterrupt\b", last):  # the interrupt itself
            return Failure(CANCELLED, _detail(failure or last))
        return Failure(EXCEPTION, _detail(last or failure))
    if cell_state == "cancelled" or failure.startswith("interrupted"):
        return Failure(CANCELLED, _detail(failure))
    return Failure(UNKNOWN, _detail(failure))


def _last_match(lines: list[str], pattern: re.Pattern) -> str | None:
    for line in reversed(lines):
        if pattern.search(line):
            return line
    return None


def _exception_line(lines: list[str]) -> str | None:
    """The last line of the last traceback in ``lines``."""
    start = max((n for n, line in enumerate(lines) if line.startswith(TRACEBACK)), default=None)
    if start is None:
        return None
    for line in reversed(lines[start + 1:]):
        if EXCEPTION_LINE.match(line) and not line.startswith("File "):
            return line
    return lines[-1] if len(lines) > start + 1 else None


def _detail(text: str | None) -> str:
    return (text or "").strip()[:DETAIL_CHARS]


def read_tail(paths: Iterable[Path | str | None], tail_bytes: int = TAIL_BYTES) -> str:
    """The last ``tail_bytes`` of each existing file, joined in order."""
    parts = []
    for path in paths:
        if path is None:
            continue
        try:
            with open(path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - tail_bytes))
                parts.append(handle.read().decode(errors="replace"))
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            continue
    return "\n".join(parts)


# -- what status and report show --------------------------------------------------------

SLURM = "slurm"
JOB_LOG_DIR = ".slurm"  # submitit's folder of a grid's SLURM jobs: <runs>/<grid>/.slurm


def job_log_paths(cell_dir: Path, job_id: str | None) -> list[Path]:
    """A SLURM job's own stderr and stdout (submitit's names, task 0)."""
    if not job_id:
        return []
    folder = Path(cell_dir).parent / JOB_LOG_DIR
    return [folder / f"{job_id}_0_log.err", folder / f"{job_id}_0_log.out"]


def job_records(views) -> dict[str, sacct.JobRecord]:
    """sacct's records of the SLURM jobs of the views' attempts and submissions ({} when
    sacct cannot be asked: the recorded classes are shown alone)."""
    ids = []
    for view in views:
        if view.state is None:
            continue
        ids += [attempt.job_id for attempt in view.state.attempts if attempt.executor == SLURM]
        submission = view.state.submission
        if submission is not None and submission.executor == SLURM:
            ids.append(submission.job_id)
    try:
        return sacct.query(ids)
    except sacct.SlurmUnavailable:
        return {}


def attempt_record(attempt: st.Attempt, records) -> sacct.JobRecord | None:
    """The SLURM record of an attempt; for an attempt recorded against a whole chain (a
    job lost before it started), the last link that did something other than being
    cancelled, else the last one."""
    found = [records.get(job_id) for job_id in sacct.split_ids([attempt.job_id])]
    found = [record for record in found if record is not None]
    if not found:
        return None
    meaningful = [record for record in found if record.state != "CANCELLED"]
    return (meaningful or found)[-1]


def attempt_failure(cell_dir: Path, attempt: st.Attempt, state: st.CellState, records) -> Failure:
    """The class of one failed attempt: the recorded one, else classified now."""
    record = attempt_record(attempt, records) if attempt.executor == SLURM else None
    job_ids = sacct.split_ids([attempt.job_id]) if attempt.executor == SLURM else []
    # The cell's logs end with the last attempt; earlier attempts only have their job's log.
    cell_logs = [Path(cell_dir) / st.STDERR_FILE] if attempt is state.last_attempt else []
    found = classify(job_state=record.state if record else None, failure=attempt.failure,
                     log_tail=read_tail([*cell_logs, *job_log_paths(cell_dir, job_ids[-1] if job_ids else None)]),
                     cell_state=state.state)
    if attempt.failure_class is not None:
        return Failure(attempt.failure_class, found.detail)
    return found


def job_alive(view, records) -> bool:
    """True while the SLURM job of a cell's submission runs or waits (its lock may live on
    another node's filesystem view, so a free lock alone does not mean it died)."""
    submission = view.state.submission if view.state else None
    if submission is None or submission.executor != SLURM:
        return False
    return any(records.get(job_id) is not None and records[job_id].alive
               for job_id in sacct.split_ids([submission.job_id]))


def failure_text(view, records) -> str | None:
    """The failure column of ``sweep status`` / ``sweep report`` for one cell."""
    if view.problems:  # a damaged cell.json or state.json; the command names its path too
        damage = "; ".join(f"{problem.path.name}: {problem.reason}" for problem in view.problems)
        failure = failure_text(attrs.evolve(view, problems=()), records) if view.state else None
        return f"{damage}; {failure}" if failure else damage
    state = view.state
    attempt = state.last_attempt if state else None
    if attempt is None or attempt.failure is None or view.outcome in ("passed", "xpassed", "xpassed-strict"):
        return None
    found = attempt_failure(view.directory, attempt, state, records)
    text = str(found)
    if view.outcome == "xfailed":
        return f"{XFAIL} ({text})"
    if view.effective in ("submitted", "running"):
        normal = " (normal for a chain link)" if found.kind == TIMEOUT else ""
        return f"attempt {attempt.n} {text}{normal}; the next link resumes"
    return text
