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
import getpass
import os
import shutil
import subprocess
import sys
import textwrap
import time
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


def pytest_configure(config):
    """Under pytest-xdist each worker's torch (and every trainer its tests start) takes its
    share of the cores, not all of them: two workers of two threads each would share two
    cores, OpenMP's threads waiting for each other. An OMP_NUM_THREADS of the caller's own
    is kept."""
    if hasattr(config, "workerinput"):
        share = (os.cpu_count() or 1) // int(config.workerinput["workercount"])
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, share)))


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n 2 --dist loadgroup``, the default options): a test file's tests
    run on one worker (its module fixtures are built once), and every test that submits to
    the local SLURM cluster on one worker too, one after another, as that cluster's tests
    expect a queue of their own."""
    for item in items:
        group = "slurm" if on_slurm(item) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
    # The SLURM tests that run alone come first, so that they make one row and it starts with the
    # suite: the other worker then waits for one row, and the SLURM worker for its lock once and
    # for no more than the other worker's first test (later, that test could be the interpreter's
    # minute and a half). Those that run beside others go last.
    items.sort(key=lambda item: 0 if runs_alone(item) else 2 if on_slurm(item) else 1)


def runs_alone(item) -> bool:
    """A SLURM test runs alone, but for a ``slurm_sleeps`` one: its jobs spend their time asleep."""
    return on_slurm(item) and not item.get_closest_marker("slurm_sleeps")


class SlurmTestsLock:
    """Under pytest-xdist a SLURM test (its jobs run on this machine, against deadlines)
    never shares the CPUs with another test, while the other tests run side by side: a
    SLURM test holds an exclusive lock, every other test a shared one.

    The worker that runs the SLURM tests (they are one xdist group) keeps the exclusive
    lock from the first of a row of them to the last, and each lock is taken through a
    turnstile, held by whoever waits for the lock: once the SLURM worker waits, the other
    worker's next test waits for the row to end, and the row does not wait, test after
    test, for a moment when the other worker holds no shared lock."""

    def __init__(self, directory: Path):
        self.lock = open(directory / "slurm-tests.lock", "a")  # noqa: SIM115 - the worker's whole life
        self.turnstile = open(directory / "slurm-tests.turnstile", "a")  # noqa: SIM115
        self.exclusive = False

    def take(self, alone: bool) -> None:
        if alone and self.exclusive:
            return  # the row goes on
        fcntl.flock(self.turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)
        self.exclusive = alone

    def release(self) -> None:
        fcntl.flock(self.lock, fcntl.LOCK_UN)
        self.exclusive = False


SLURM_TESTS_LOCK = pytest.StashKey[SlurmTestsLock]()


@pytest.fixture(autouse=True)
def _slurm_tests_run_alone(request, tmp_path_factory):
    """See :class:`SlurmTestsLock`; one process (no xdist) runs one test at a time anyway."""
    if not hasattr(request.config, "workerinput"):
        yield
        return
    stash = request.config.stash
    if SLURM_TESTS_LOCK not in stash:
        stash[SLURM_TESTS_LOCK] = SlurmTestsLock(tmp_path_factory.getbasetemp().parent)  # the workers' shared dir
    lock = stash[SLURM_TESTS_LOCK]
    alone = runs_alone(request.node)
    lock.take(alone)
    yield
    if not alone:
        lock.release()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    lock = item.config.stash.get(SLURM_TESTS_LOCK, None)
    if lock is not None and lock.exclusive and (nextitem is None or not runs_alone(nextitem)):
        lock.release()  # the row of SLURM tests ends here


@pytest.fixture(autouse=True)
def _no_slurm_output_in_the_checkout(request):
    """A job submitted without ``--output`` writes ``slurm-<id>.out`` into the submitting
    process's cwd, the checkout, where the suite must leave nothing: a SLURM test fails if
    one appears while it runs (its own job's, or a job an earlier test left to start)."""
    if not on_slurm(request.node):
        yield
        return
    root = request.config.rootpath
    before = set(root.glob("slurm-*.out"))
    yield
    leaked = sorted(path.name for path in set(root.glob("slurm-*.out")) - before)
    assert not leaked, f"SLURM job output written into the checkout {root}: {leaked} (submit with --output)"


@pytest.fixture
def restarts_the_controller():
    """For a test that restarts slurmctld: afterwards, cancel what the restart requeued.

    A restarted controller can requeue jobs that had completed before it went down (their
    completion was not yet saved); such a job would wait for its begin time and then hold a
    CPU of the two-CPU node, so a later test's two cells would never run at once. SLURM tests
    run one at a time (SlurmTestsLock), so nothing else of the suite is in the queue then.
    """
    yield
    if shutil.which("scancel") is None:
        return
    subprocess.run(["scancel", "--user", getpass.getuser()], capture_output=True, timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        queue = subprocess.run(["squeue", "--noheader", "--user", getpass.getuser()], capture_output=True,
                               text=True, timeout=60)
        if queue.returncode == 0 and not queue.stdout.strip():
            return
        time.sleep(1)


# A real tiny trainer cell that checkpoints and evaluates at every one of its 3 steps
# (the grid of tests/test_export.py and tests/test_clean.py).
CHECKPOINTED_TINY_GRID = """
import sweepkit as sk
base = sk.base(model="tiny-random", dataset="synthetic", device="cpu", backend="hf", num_gpus=0,
               train_batch_size=4, policy_mini_batch_size=4, n_samples_per_prompt=2, max_generate_length=4,
               max_steps=3, eval_limit=4, ckpt_interval=1, eval_interval=1, eval_before_train=False,
               synthetic_size=64, export_final=False, lr=1e-3)
"""
