"""Metrics out: one JSON object per line in ``metrics.jsonl`` and a ``WANDB_MIRROR`` line on stdout.

Both carry the same numbers (names in docs/ARCHITECTURE.md). The file is the
run's record across restarts: a fresh run starts it empty; a resumed run keeps
the lines up to the checkpoint's step and drops later ones, whose effects the
resume rolled back, so the file always reads as one continuous run.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
from pathlib import Path
from typing import Any, TextIO

import torch

TRAIN_KEYS = (
    "timing/step", "timing/generate", "timing/policy_train", "timing/sync_weights", "timing/ref",
    "throughput/tokens_generated", "throughput/tokens_per_s",
    "reward/mean", "reward/std",
    "policy/entropy", "policy/kl", "policy/clip_frac", "policy/loss", "policy/grad_norm", "policy/lr",
    "policy/optimizer_steps", "policy/skipped_updates",
    "response_length/mean", "response_length/max",
    "memory/peak_gb",
)
EVAL_KEYS = ("eval/pass_at_1", "eval/pass_at_k", "eval/k", "eval/reward_mean")


class MetricsLogger:
    def __init__(self, path: Path, *, stdout: TextIO = None, resume_step: int = 0):
        self.path = Path(path)
        self.stdout = stdout  # None: whatever sys.stdout is at write time (rich's bar wraps it)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # What earlier processes of this run logged and the resume kept (a timing run goes on
        # measuring from their step times); empty for a fresh run.
        self.history: tuple[dict[str, Any], ...] = _keep_history_up_to(self.path, resume_step)
        self.file = open(self.path, "a")

    def log(self, kind: str, step: int, metrics: dict[str, Any]) -> None:
        record = {"kind": kind, "step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        payload = {k: v for k, v in record.items() if k not in ("kind", "step")}
        stream = self.stdout or sys.stdout
        stream.write(f"WANDB_MIRROR kind={kind} step={step} metrics={json.dumps(payload)}\n")
        stream.flush()

    def close(self) -> None:
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SilentLogger:
    """The logger of every rank but rank 0 of a run of several: rank 0 writes the run's metrics."""

    history: tuple[dict[str, Any], ...] = ()

    def log(self, kind: str, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def peak_memory_gb(device: torch.device) -> float:
    """Peak allocated device memory on CUDA; the process's peak resident memory on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def _plain(value):
    """JSON has no NaN/inf; write them as null rather than produce an unparsable line."""
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _keep_history_up_to(path: Path, step: int) -> tuple[dict[str, Any], ...]:
    """Cut the file back to the records up to ``step`` (and every ``info``); returns them."""
    if not path.exists():
        return ()
    kept = []
    if step > 0:
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by the kill that ended the previous run
            if record.get("kind") == "info" or record.get("step", math.inf) <= step:
                kept.append((line, record))
    temp = path.with_name(f".tmp-{path.name}")
    temp.write_text("".join(line + "\n" for line, _ in kept))
    os.replace(temp, path)
    return tuple(record for _, record in kept)


class ProgressBar:
    """Steps done, with reward and sec/step, on a terminal; needs ``rich`` (ImportError without)."""

    def __init__(self, *, total: int, done: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                 TimeRemainingColumn(), TextColumn("{task.fields[status]}"))
        self.task = self.progress.add_task("train", total=total, completed=done, status="")
        self.progress.start()

    def update(self, step: int, metrics: dict) -> None:
        status = f"reward {metrics['reward/mean']:.3f}  {metrics['timing/step']:.2f} s/step"
        self.progress.update(self.task, completed=step, status=status)

    def close(self) -> None:
        self.progress.stop()
