"""A ``pytester``-like fixture: run the real ``sweep`` command in a temp dir.

    def test_something(sweeper):
        sweeper.grid("g", '''
            import sweepkit as sk
            target = sk.command("{python}", "-c", "pass")
            base = sk.base(lr=1.0)
        ''')
        result = sweeper.run("list")
        assert result.ret == 0
        assert "grids/g.py::base" in result.stdout
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest


@attrs.frozen
class SweepResult:
    ret: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def __str__(self) -> str:
        return f"exit {self.ret}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


class Sweeper:
    """A scratch project: write grid files and other files into it, run ``sweep`` there."""

    def __init__(self, path: Path):
        self.path = path
        self.env = {}

    @classmethod
    def new(cls, parent: Path) -> "Sweeper":
        """A fresh project in ``parent/project``."""
        project = parent / "project"
        project.mkdir()
        return cls(project)

    def write(self, relpath: str, text: str) -> Path:
        """Write ``text`` (dedented) to ``relpath`` under the project; returns the path."""
        path = self.path / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return path

    def grid(self, name: str, text: str) -> Path:
        """Write ``grids/<name>.py``."""
        return self.write(f"grids/{name}.py", text)

    def run(self, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> SweepResult:
        """Run ``python -m sweepkit ARGS`` (the ``sweep`` command) with the project as cwd."""
        # Not the test process's compile cache: torch sets TORCHINDUCTOR_CACHE_DIR in
        # os.environ on its first compile, and sweep would then leave it to the cell.
        inherited = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
        full_env = {**inherited, "COLUMNS": "200", "PYTHONDONTWRITEBYTECODE": "1",
                    **self.env, **(env or {})}
        # The project dir goes on PYTHONPATH so `-p module` finds modules the test writes.
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(self.path), full_env.get("PYTHONPATH", "")) if p)
        proc = subprocess.run(
            [sys.executable, "-m", "sweepkit", *map(str, args)],
            cwd=self.path, env=full_env, capture_output=True, text=True, timeout=timeout,
        )
        return SweepResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def sweeper(tmp_path: Path) -> Sweeper:
    return Sweeper.new(tmp_path)


def on_slurm(item) -> bool:
    """Whether a test submits to (or restarts) the local SLURM cluster."""
    return bool(item.get_closest_marker("slurm")) or "cluster" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n 2 --dist loadgroup``, the default options): a test file's tests
    run on one worker (its module fixtures are built once), and every test that submits to
    the local SLURM cluster on one worker too, one after another, as that cluster's tests
    expect a queue of their own."""
    for item in items:
        group = "slurm" if on_slurm(item) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _slurm_tests_run_alone(request, tmp_path_factory):
    """Under pytest-xdist a SLURM test holds an exclusive lock and every other test a shared
    one, so the cluster's tests (their jobs run on this machine, against deadlines) never
    share the CPUs with another test, while the other tests run side by side. A
    ``slurm_sleeps`` test takes the shared lock: its jobs spend their time asleep."""
    if not hasattr(request.config, "workerinput"):  # one process: nothing runs beside it
        yield
        return
    lock = tmp_path_factory.getbasetemp().parent / "slurm-tests.lock"  # shared by the workers
    with open(lock, "a") as handle:
        alone = on_slurm(request.node) and not request.node.get_closest_marker("slurm_sleeps")
        fcntl.flock(handle, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield
