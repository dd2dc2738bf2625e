"""How the suite schedules its own tests (tests/conftest.py), checked on a collection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_slurm_tests_that_run_alone_come_first_and_those_that_run_beside_others_last() -> None:
    """The lone SLURM tests make one row at the suite's start (tests/conftest.py): the other
    worker waits for the SLURM tests once, and the SLURM worker for its lock once, for no more
    than the other worker's first test; a lone test after a shared one made two waits."""
    here = Path(__file__).parent
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "-m", "not gpu", str(here / "test_batch.py"), str(here / "test_slurm_executor.py")],
        cwd=here.parent, capture_output=True, text=True, timeout=120)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    order = [line.split("[")[0] for line in collected.stdout.splitlines() if "::" in line]
    files = [name.split("::")[0].rsplit("/", 1)[-1] for name in order]
    beside = "test_failure_classes_and_a_chain_past_the_wall_limit"  # the file's slurm_sleeps test
    row = files.index("test_batch.py")  # the first test of another file ends the row
    assert row > 10 and set(files[:row]) == {"test_slurm_executor.py"}, files
    assert order[-1].endswith(beside) and beside not in "".join(order[:-1]), order
