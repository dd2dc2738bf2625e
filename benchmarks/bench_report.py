"""Time of `sweep report`'s tables (and its HTML page) against cells x steps of metrics on disk.

Writes a grid dir of N cells, each with a cell.json, a state.json and a metrics.jsonl
of S train steps (an eval every 10), then times ``sweepkit.report.tables.grid_frames`` and
``collect_report`` (the one lazy scan behind both tables and the curves, collected in one
pass) and the HTML page, best of
``--repeats``. Prints seconds and microseconds per (cell x step) row, so linear cost
shows as a flat last column::

    python benchmarks/bench_report.py                     # 10/100 cells x 100/1000 steps
    python benchmarks/bench_report.py --sizes 100x1000
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweepkit.report.html import write_page  # noqa: E402
from sweepkit.report.tables import BUILTIN_TABLES, REPORT_DIR, collect_report, grid_frames  # noqa: E402


def write_grid(root: Path, cells: int, steps: int) -> Path:
    grid = root / f"g{cells}x{steps}"
    for index in range(cells):
        name = "base" if index == 0 else f"c{index}"
        cell = grid / name
        cell.mkdir(parents=True)
        (cell / "cell.json").write_text(json.dumps({
            "nodeid": f"grids/g.py::{name}", "name": name, "index": index, "profile": None,
            "diff": {} if index == 0 else {"lr": [1e-6, index * 1e-7]},
            "config": {"model": "tiny-random"}, "launch": {"gpus": 4}}))
        (cell / "state.json").write_text(json.dumps({
            "nodeid": f"grids/g.py::{name}", "state": "completed", "config_hash": "x", "driver": None,
            "previous": None, "profile": None, "submission": None, "updated": 0.0,
            "attempts": [{"n": 1, "started": 0.0, "ended": 3600.0, "returncode": 0, "executor": "local",
                          "job_id": "1", "pid": 1, "host": "h", "devices": "", "deleted": [], "resume": False,
                          "failure": None, "failure_class": None}]}))
        lines = [json.dumps({"kind": "info", "step": 0, "device": "cuda:0", "inert_knobs": {}})]
        for step in range(1, steps + 1):
            t = 1.0 + 0.1 * math.sin(step + index)
            lines.append(json.dumps({
                "kind": "train", "step": step, "timing/step": t, "timing/generate": 0.5 * t,
                "timing/policy_train": 0.4 * t, "timing/sync_weights": 0.01, "timing/ref": 0.0,
                "throughput/tokens_per_s": 1000 / t, "reward/mean": step / steps, "policy/entropy": 2 - step / steps,
                "policy/grad_norm": 0.5, "policy/kl": 0.001, "memory/peak_gb": 10.0}))
            if step % 10 == 0:
                lines.append(json.dumps({"kind": "eval", "step": step, "eval/pass_at_1": step / steps,
                                         "eval/pass_at_k": min(1.0, 1.5 * step / steps), "eval/k": 4}))
        (cell / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return grid


def best_of(repeats: int, work) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10x100,10x1000,100x100,100x1000",
                        help="comma-separated CELLSxSTEPS")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{'cells':>6} {'steps':>6} {'rows':>8} {'tables s':>9} {'us/row':>7} {'+ html s':>9}")
    with tempfile.TemporaryDirectory() as root:
        for size in args.sizes.split(","):
            cells, steps = (int(part) for part in size.split("x"))
            grid = write_grid(Path(root), cells, steps)

            def tables():
                return collect_report(grid_frames(grid), BUILTIN_TABLES, report_dir=grid / REPORT_DIR)

            tables_s = best_of(args.repeats, tables)

            def page():
                report = tables()
                write_page(report.report_dir / "index.html", grid=report.grid, tables=report.tables,
                           steps=report.steps, diffs=report.diffs, heading=report.heading)

            page_s = best_of(args.repeats, page)
            rows = cells * steps
            print(f"{cells:>6} {steps:>6} {rows:>8} {tables_s:>9.3f} {tables_s / rows * 1e6:>7.2f} {page_s:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
