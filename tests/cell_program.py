"""A small, real cell program for the tests, and the helpers that read what it leaves.

Run as a cell's command (``sk.command("{python}", PROGRAM)``), it reads its
``config.json``, reports one metrics record per step (to ``metrics.jsonl``, to stdout as
``WANDB_MIRROR`` lines, or both), writes a checkpoint per step into its ckpt dir,
continues from the latest checkpoint when ``SWEEP_RESUME=1``, and can fail or hang at a
given step. Every start and end is appended, with pid and time, to an events file so
tests can check what ran when. Config keys (all optional):

    steps (3)  sleep (0.1, seconds per step)  t (1.0, the step time it reports)
    fail_at, hang_at (a step)  report ("jsonl" | "stdout" | "both")  events (a path)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

PROGRAM = str(Path(__file__).resolve())


def record(config: dict, step: int) -> dict:
    """The metrics this program reports at ``step``; tests recompute them from here."""
    steps = config.get("steps", 3)
    step_time = config.get("t", 1.0) * (4.0 if step == 1 else 1.0 + 0.01 * step)
    return {
        "kind": "train",
        "step": step,
        "timing/step": step_time,
        "timing/generate": 0.5 * step_time,
        "timing/policy_train": 0.3 * step_time,
        "timing/sync_weights": 0.1 * step_time,
        "throughput/tokens_generated": 100 * step,
        "throughput/tokens_per_s": 100 * step / step_time,
        "reward/mean": step / steps,
        "policy/entropy": 1.0 / step,
    }


def eval_record(config: dict) -> dict:
    return {"kind": "eval", "step": config.get("steps", 3), "eval/pass_at_1": 0.25, "eval/pass_at_k": 0.75,
            "eval/k": 4, "eval/reward_mean": 0.5}


def log_event(path: str | None, event: str, **fields) -> None:
    if not path:
        return
    line = json.dumps({"event": event, "cell": os.environ.get("SWEEP_CELL"), "pid": os.getpid(),
                       "time": time.time(), **fields}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one small O_APPEND write: lines from concurrent cells never mix
    finally:
        os.close(fd)


def read_events(path: Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def intervals(events: list[dict]) -> list[tuple[str, float, float]]:
    """(cell, start, end) of every process that started, ended or not (then end=inf)."""
    starts = {}
    spans = []
    for event in events:
        key = (event["cell"], event["pid"])
        if event["event"] == "start":
            starts[key] = event["time"]
        elif event["event"] in ("end", "fail") and key in starts:
            spans.append((event["cell"], starts.pop(key), event["time"]))
    spans += [(cell, start, float("inf")) for (cell, _), start in starts.items()]
    return spans


def max_overlap(spans: list[tuple[str, float, float]]) -> int:
    """The largest number of processes that were running at one instant."""
    points = sorted([(start, 1) for _, start, _ in spans] + [(end, -1) for _, _, end in spans],
                    key=lambda point: (point[0], point[1]))
    running = best = 0
    for _, change in points:
        running += change
        best = max(best, running)
    return best


def main() -> int:
    config = json.loads(Path(os.environ["SWEEP_CONFIG"]).read_text())
    ckpt = Path(os.environ["SWEEP_CKPT_DIR"])
    steps = config.get("steps", 3)
    report = config.get("report", "jsonl")
    events = config.get("events")
    done = sorted(int(path.name.split("_")[1]) for path in ckpt.glob("step_*"))
    start = done[-1] if done and os.environ.get("SWEEP_RESUME") == "1" else 0
    log_event(events, "start", start_step=start, devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    metrics = None
    if report in ("jsonl", "both"):
        metrics = open(os.environ["SWEEP_METRICS"], "a")
    for step in range(start + 1, steps + 1):
        time.sleep(config.get("sleep", 0.1))
        records = [record(config, step)] + ([eval_record(config)] if step == steps else [])
        for item in records:
            if metrics is not None:
                metrics.write(json.dumps(item) + "\n")
                metrics.flush()
            if report in ("stdout", "both"):
                payload = {k: v for k, v in item.items() if k not in ("kind", "step")}
                print(f"WANDB_MIRROR kind={item['kind']} step={item['step']} metrics={json.dumps(payload)}", flush=True)
        (ckpt / f"step_{step}").write_text(json.dumps({"step": step}))
        if config.get("fail_at") == step:
            log_event(events, "fail", step=step)
            raise RuntimeError(f"boom at step {step}")
        if config.get("hang_at") == step:
            time.sleep(3600)
    log_event(events, "end", step=steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
