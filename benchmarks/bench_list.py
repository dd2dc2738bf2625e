"""``sweep list`` of a large product grid next to ``pytest --collect-only -q`` of as many tests.

For each size N a temp project gets ``grids/big.py``: a base plus ``sk.product`` of N / 10
learning rates x 10 seeds (N cells, N + 1 with the base), and ``test_big.py``: one test
parametrised over the same N / 10 x 10 values. Both commands run as a user runs them, in
their own process from the project dir, output to a pipe::

    python benchmarks/bench_list.py                      # 100, 1,000 and 5,000 cells
    python benchmarks/bench_list.py --sizes 1000 --repeats 9

Startup is part of what a user waits for, so it is timed too. Bytecode is cached (in a
temp ``PYTHONPYCACHEPREFIX``, whatever ``PYTHONDONTWRITEBYTECODE`` says) and one
untimed run of each command comes first, so neither pays for compiling its own modules.
Each row gives the fastest and the median wall time of ``--repeats`` runs and the CPU
time (user + sys) of the fastest; on a shared machine the CPU time is the steadier number.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEEDS = 10
GRID = '''\
import sweepkit as sk

base = sk.base(lr=1e-6, seed=0)
sweep = sk.product(lr=[round(1e-6 * (i + 2), 12) for i in range({lrs})], seed=list(range({seeds})),
                   id="lr{{lr}}_s{{seed}}")
'''
TESTS = '''\
import pytest


@pytest.mark.parametrize("seed", list(range({seeds})))
@pytest.mark.parametrize("lr", [round(1e-6 * (i + 2), 12) for i in range({lrs})])
def test_cell(lr, seed):
    pass
'''


def write_project(root: Path, cells: int) -> None:
    lrs = cells // SEEDS
    (root / "grids").mkdir(parents=True)
    (root / "grids" / "big.py").write_text(GRID.format(lrs=lrs, seeds=SEEDS))
    (root / "test_big.py").write_text(TESTS.format(lrs=lrs, seeds=SEEDS))
    (root / "pytest.ini").write_text("[pytest]\n")  # its own rootdir: no config of a parent dir


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + sys of the child) and stdout of one run."""
    cpu_before, start = _children_cpu(), time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu_before
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr}")
    return wall, cpu, proc.stdout


def measure(argv: list[str], cwd: Path, env: dict[str, str], repeats: int, check) -> dict:
    _, _, stdout = timed(argv, cwd, env)  # untimed: writes the bytecode cache
    check(stdout)
    runs = [timed(argv, cwd, env)[:2] for _ in range(repeats)]
    fastest = min(runs)
    return {"min": fastest[0], "median": statistics.median(wall for wall, _ in runs), "cpu": fastest[1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=lambda text: [int(n) for n in text.split(",")], default=[100, 1000, 5000],
                        help="cell counts, multiples of 10, comma-separated (default: 100,1000,5000)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per command and size (default: 5)")
    args = parser.parse_args(argv)
    if any(n <= 0 or n % SEEDS for n in args.sizes):
        parser.error(f"--sizes: every size must be a positive multiple of {SEEDS}")

    print(f"python {platform.python_version()} on {platform.platform()}, {os.cpu_count()} CPUs; "
          f"best of {args.repeats} (median), wall s; CPU s of the best run")
    header = f"{'cells':>6}  {'sweep list':>20}  {'pytest --collect-only':>22}  {'wall ratio':>10}  {'cpu ratio':>9}"
    print(header)
    with tempfile.TemporaryDirectory(prefix="bench_list_") as temp:
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPYCACHEPREFIX=str(Path(temp) / "pycache"), COLUMNS="200")
        for cells in args.sizes:
            root = Path(temp) / f"n{cells}"
            write_project(root, cells)

            def sweep_ok(stdout: str, cells=cells) -> None:
                if f"{cells + 1} cells in 1 grid" not in stdout:
                    raise SystemExit(f"sweep list did not list {cells + 1} cells:\n{stdout[-500:]}")

            def pytest_ok(stdout: str, cells=cells) -> None:
                if not re.search(rf"\b{cells} tests? collected", stdout):
                    raise SystemExit(f"pytest did not collect {cells} tests:\n{stdout[-500:]}")

            sweep = measure([sys.executable, "-m", "sweepkit", "list"], root, env, args.repeats, sweep_ok)
            pytest = measure([sys.executable, "-m", "pytest", "--collect-only", "-q"], root, env,
                             args.repeats, pytest_ok)
            print(f"{cells:>6}  {sweep['min']:>7.3f} ({sweep['median']:.3f}) {sweep['cpu']:>5.2f}  "
                  f"{pytest['min']:>9.3f} ({pytest['median']:.3f}) {pytest['cpu']:>5.2f}  "
                  f"{sweep['min'] / pytest['min']:>10.2f}  {sweep['cpu'] / pytest['cpu']:>9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
