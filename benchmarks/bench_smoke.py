"""Wall time of the smoke cells of a grid on the local executor, cold against warm.

Runs ``sweep run GRID::CELL ... --profile smoke`` on the first ``--cells`` cells of the grid
(all of them by default: the 18 of ``grids/gsm8k_throughput.py``), each time in a fresh
runs dir, once with ``SWEEP_WARM=0`` (every cell a plain subprocess that imports torch and
transformers itself) and once warm (one worker per sweep run imports them, each cell is a
fork of it), ``--repeats`` times, alternating which goes first so that a machine shared
with other work slows both alike. Prints each run's wall seconds and the cold / warm
ratio of the medians::

    python benchmarks/bench_smoke.py                      # the main job: 18 cells
    python benchmarks/bench_smoke.py --cells 4 --repeats 3

A run that does not exit 0 (some cell failed) is reported and ends the benchmark: a time
is only worth comparing for the same cells, all passed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cell_ids(grid: str, count: int | None) -> list[str]:
    listing = subprocess.run([sys.executable, "-m", "sweepkit", "list", grid], cwd=ROOT, capture_output=True,
                             text=True, check=True)
    ids = re.findall(r"^(\S+::\S+)", listing.stdout, flags=re.MULTILINE)
    return ids[:count] if count else ids


def run_once(ids: list[str], warm: bool, scratch: Path) -> float:
    runs = Path(tempfile.mkdtemp(prefix="runs-", dir=scratch))
    env = {**os.environ, "SWEEP_WARM": "1" if warm else "0", "CUDA_VISIBLE_DEVICES": ""}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "sweepkit", "--runs-dir", str(runs), "run", *ids,
                             "--profile", "smoke", "--executor", "local"],
                            cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"{'warm' if warm else 'cold'} run exited {result.returncode}:\n{result.stdout[-3000:]}"
                 f"\n{result.stderr[-3000:]}")
    shutil.rmtree(runs, ignore_errors=True)
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default="grids/gsm8k_throughput.py")
    parser.add_argument("--cells", type=int, default=None, help="the first N cells (default: all)")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    ids = cell_ids(args.grid, args.cells)
    print(f"{len(ids)} cells of {args.grid} under --profile smoke, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    times: dict[str, list[float]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="bench-smoke-") as scratch:
        for repeat in range(args.repeats):
            order = ("cold", "warm") if repeat % 2 == 0 else ("warm", "cold")
            for kind in order:
                times[kind].append(run_once(ids, kind == "warm", Path(scratch)))
                print(f"  run {repeat + 1} {kind}: {times[kind][-1]:6.1f} s  "
                      f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    cold, warm = statistics.median(times["cold"]), statistics.median(times["warm"])
    print(f"\n| cells | cold (SWEEP_WARM=0) s | warm s | cold / warm |\n|---|---|---|---|\n"
          f"| {len(ids)} | {', '.join(f'{t:.1f}' for t in times['cold'])} | "
          f"{', '.join(f'{t:.1f}' for t in times['warm'])} | {cold / warm:.2f} |")


if __name__ == "__main__":
    main()
