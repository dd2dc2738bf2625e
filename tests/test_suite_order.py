"""How the suite schedules its own tests (tests/conftest.py), checked on a collection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_slurm_tests_that_run_alone_come_before_those_that_run_beside_others() -> None:
    """They make one row (tests/conftest.py): the other worker waits for the SLURM tests once,
    and the SLURM worker for its lock once, where a lone test after a shared one made two."""
    here = Path(__file__).parent
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "-m", "not gpu", str(here / "test_slurm_executor.py")],
        cwd=here.parent, capture_output=True, text=True, timeout=120)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    order = [line.split("::")[1].split("[")[0] for line in collected.stdout.splitlines() if "::" in line]
    beside = "test_failure_classes_and_a_chain_past_the_wall_limit"  # the file's slurm_sleeps test
    assert len(order) > 10 and order[-1] == beside, order  # after the lone tests that follow it in the file
