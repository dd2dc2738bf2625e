"""``sweep status``'s health: each rule over synthetic records, then real cells across two
runs dirs (a trainer run whose loss went NaN, an entropy that collapses, a cell stopped with
SIGSTOP while it holds its lock), ``--check``'s exit status, globs, and ``--watch``."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cell_program import read_events
from conftest import Sweeper
from test_run import script_grid
from sweepkit.errors import ExitCode
from sweepkit.report import health
from sweepkit.report.status import status_rows
from sweepkit.report.status_scope import short_labels
from sweepkit.run import failures as fl
from sweepkit.run.executors import sacct
from sweepkit.state import records as st


def steps(n: int, **metrics) -> list[dict]:
    """``n`` train records, each metric's value a function of the step or a constant."""
    return [{"step": step, **{key.replace("__", "/"): value(step) if callable(value) else value
                              for key, value in metrics.items()}} for step in range(1, n + 1)]


# -- each rule ---------------------------------------------------------------------------


def test_nan_flags_a_non_finite_or_null_loss_reward_or_grad_norm_in_the_last_records():
    records = steps(6, policy__loss=0.5, reward__mean=0.2, policy__grad_norm=1.0)
    assert health.nan_flag(records) is None
    records[-1]["policy/loss"] = None  # the trainer writes NaN as null
    flag = health.nan_flag(records)
    assert flag.name == "nan" and "policy/loss is null at step 6" in flag.reason
    records[-1]["policy/loss"] = 0.5
    records[-2]["policy/grad_norm"] = math.inf
    assert "policy/grad_norm is inf at step 5" in health.nan_flag(records).reason
    records[-2]["policy/grad_norm"] = 1.0
    records[-1]["reward/mean"] = math.nan  # a WANDB_MIRROR line may carry NaN itself
    assert "reward/mean is nan at step 6" in health.nan_flag(records).reason


def test_nan_looks_at_the_last_records_only_and_at_keys_the_cell_logs():
    records = steps(8, policy__loss=0.5)
    records[2]["policy/loss"] = None  # long ago: the trainer skipped that update and went on
    assert health.nan_flag(records) is None
    assert health.nan_flag(steps(8, reward__mean=0.2)) is None  # no loss logged: nothing to judge
    assert health.nan_flag(steps(8, **{"timing__step": 1.0})) is None
    starts_later = steps(4, policy__loss=lambda step: None if step < 3 else 0.5)
    assert health.nan_flag(starts_later) is None  # the steps before its first loss logged none yet


def test_nan_flags_a_loss_never_finite_from_the_first_step(tmp_path):
    """The trainer writes NaN as null; a loss null at every step is a column of nulls in the
    per-step frame (a key never written has no column), and health flags it."""
    from trainer.metrics import MetricsLogger
    from sweepkit.report.status import cell_metrics

    with MetricsLogger(tmp_path / "metrics.jsonl", stdout=io.StringIO()) as logger:
        for step in (1, 2, 3):
            logger.log("train", step, {"reward/mean": 0.0, "timing/step": 0.1, "policy/loss": float("nan")})
    _, records = cell_metrics(tmp_path)
    assert [record["policy/loss"] for record in records] == [None, None, None]
    flag = health.nan_flag(records)
    assert flag.name == "nan" and "policy/loss has no finite value in 3 steps" in flag.reason
    assert "policy/grad_norm" not in records[0]  # never written: no column, no flag


def test_collapse_is_the_reports_entropy_collapse_rule():
    from sweepkit.report.tables import COLLAPSE_FRACTION

    collapsing = steps(12, policy__entropy=lambda step: 1.0 / step)
    flag = health.collapse_flag(collapsing)
    assert flag.name == "collapse" and "0.0833" in flag.reason and f"{COLLAPSE_FRACTION:g}" in flag.reason
    assert health.collapse_flag(steps(12, policy__entropy=lambda step: 1.0 - 0.01 * step)) is None
    # The report's windows: a tenth of the steps (one to ten), so a drop inside the last window counts.
    assert health.collapse_flag(steps(30, policy__entropy=lambda step: 1.0 if step < 28 else 0.1)) is not None
    assert health.collapse_flag(steps(5, reward__mean=0.5)) is None  # no entropy logged


def test_flat_needs_ten_rewards_spanning_less_than_a_millionth():
    flag = health.flat_flag(steps(12, reward__mean=0.25))
    assert flag.name == "flat" and "from step 3 to 12" in flag.reason
    assert health.flat_flag(steps(9, reward__mean=0.25)) is None  # too few steps to say
    assert health.flat_flag(steps(12, reward__mean=lambda step: 0.25 + 1e-3 * step)) is None
    assert health.flat_flag(steps(20, reward__mean=lambda step: min(step, 12) / 10)) is None  # rose at step 12
    assert health.flat_flag(steps(20, reward__mean=lambda step: min(step, 10) / 10)) is not None  # none since 10
    with_gaps = steps(12, reward__mean=0.0)
    for record in with_gaps[::3]:
        record["reward/mean"] = None  # steps that logged none do not count: 8 rewards
    assert health.flat_flag(with_gaps) is None
    assert health.flat_flag(with_gaps + [{"step": 13, "reward/mean": 0.0}, {"step": 14, "reward/mean": 0.0}])


def test_stalled_needs_the_lock_and_a_silence_past_its_own_pace_and_the_floor():
    records = steps(4, timing__step=0.5)
    rule = health.StallRule(factor=10, min_s=2)
    now = 1000.0
    assert health.stall_flag(records, running=True, updated=now - 4.9, now=now, rule=rule) is None  # < 10 x 0.5
    flag = health.stall_flag(records, running=True, updated=now - 6, now=now, rule=rule)
    assert flag.name == "stalled" and "after step 4" in flag.reason and "10 x its median 0.5 s/step" in flag.reason
    assert health.stall_flag(records, running=False, updated=now - 600, now=now, rule=rule) is None  # ended
    assert health.stall_flag([], running=True, updated=now - 600, now=now, rule=rule) is None  # still loading
    fast = steps(4, timing__step=0.01)
    assert health.stall_flag(fast, running=True, updated=now - 1.5, now=now, rule=rule) is None  # the floor
    assert health.stall_flag(steps(4), running=True, updated=now - 3, now=now, rule=rule).reason.endswith(
        "the limit is 2 s (it logs no timing/step)")
    assert health.StallRule().limit(1.0) == 60 and health.StallRule().limit(30.0) == 300
    with pytest.raises(ValueError, match="factor"):
        health.StallRule(factor=0)


def test_a_failed_cell_is_unhealthy_a_timeout_link_with_a_later_link_is_ok(tmp_path):
    assert health.failed_flag("failed", "OOM: CUDA out of memory").reason == "OOM: CUDA out of memory"
    assert health.failed_flag("xfailed", "XFAIL (OOM)") is None
    # A chain whose first link (job 11) ran out of time; job 12 waits to resume it.
    attempt = st.Attempt(n=1, executor=fl.SLURM, job_id="11", failure="killed by SIGTERM")
    state = st.CellState(nodeid="grids/g.py::long", state="submitted", config_hash="h", attempts=(attempt,),
                         submission=st.Submission(executor=fl.SLURM, token="t", job_id="11:12"))
    view = st.CellView(directory=tmp_path, nodeid=state.nodeid, name="long", record=None, state=state,
                       effective="submitted", outcome=st.outcome("submitted", None))
    jobs = {"11": sacct.JobRecord(job_id="11", state="TIMEOUT"), "12": sacct.JobRecord(job_id="12", state="PENDING")}
    failure = fl.failure_text(view, jobs)
    assert "TIMEOUT" in failure and "normal for a chain link" in failure
    records = steps(5, reward__mean=lambda step: step / 10)
    flags = health.cell_health(records, outcome=view.outcome, failure=failure, now=0.0)
    assert flags == () and health.health_text(flags) == "ok"
    # The chain's last link timed out too: the cell failed.
    assert [flag.name for flag in health.cell_health(records, outcome="failed", failure="TIMEOUT", now=0.0)] == \
        ["failed"]


def test_health_text_and_the_runs_labels():
    flags = (health.Flag(name="nan", reason="r"), health.Flag(name="stalled", reason="r"))
    assert health.health_text(flags) == "nan,stalled"
    assert health.health_text((), judged=False) == ""  # nothing to judge yet: no "ok"
    assert short_labels([Path("/scratch/alice/runs"), Path("/scratch/bob/runs")]) == \
        {Path("/scratch/alice/runs"): "alice/runs", Path("/scratch/bob/runs"): "bob/runs"}
    assert short_labels([Path("/a/runs"), Path("/a/other")]) == {Path("/a/runs"): "runs", Path("/a/other"): "other"}


# -- real cells, two runs dirs -------------------------------------------------------------

TRAINER_GRID = """
    import sweepkit as sk
    base = sk.base(model="tiny-random", dataset="synthetic", device="cpu", backend="hf", num_gpus=0,
                   train_batch_size=4, policy_mini_batch_size=4, n_samples_per_prompt=2,
                   max_generate_length=4, max_steps=2, eval_limit=4, ckpt_interval=1,
                   synthetic_size=64, export_final=False)
"""


def project(parent: Path) -> Sweeper:
    parent.mkdir()
    sweeper = Sweeper.new(parent)
    sweeper.env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return sweeper


def append_nan_step(cell: Path, key: str = "policy/loss") -> None:
    """A next train step whose ``key`` is NaN, written by the trainer's own metrics writer
    (which writes it as null)."""
    from trainer.metrics import MetricsLogger

    metrics = cell / "metrics.jsonl"
    last = max(json.loads(line)["step"] for line in metrics.read_text().splitlines())
    with MetricsLogger(metrics, stdout=io.StringIO(), resume_step=last) as logger:
        logger.log("train", last + 1, {"reward/mean": 0.0, "timing/step": 0.1, key: float("nan")})


def train_steps(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    return sum('"train"' in line for line in metrics.read_text().splitlines() if line.endswith("}"))


def health_rows(result) -> dict[tuple[str, str], str]:
    """(runs label, cell) -> the row's line, of a table with a runs column."""
    return {(line.split()[0], line.split()[1]): line for line in result.stdout.splitlines()
            if len(line.split()) > 1 and "::" in line.split()[1]}


@pytest.fixture(scope="module")
def two_runs_dirs(tmp_path_factory):
    """Runs dir ``a``: a trainer cell whose last loss is NaN and a cell whose entropy
    collapses; runs dir ``b``: a cell stopped (SIGSTOP) while its job holds its lock;
    runs dir ``c``: two healthy cells."""
    root = tmp_path_factory.mktemp("health")
    a, b, c = project(root / "a"), project(root / "b"), project(root / "c")
    a.grid("tiny", TRAINER_GRID)
    script_grid(a, "g", "", steps=12, sleep=0.0)  # cell_program logs policy/entropy = 1/step
    script_grid(c, "ok", "other = sk.cell(steps=4)", steps=3, sleep=0.0)
    script_grid(b, "s", "", steps=10_000, sleep=0.2, t=0.01)
    for sweeper in (a, c):
        result = sweeper.run("run")
        assert result.ret == 0, result
    append_nan_step(a.path / "runs/tiny/base")
    driver = subprocess.Popen([sys.executable, "-m", "sweepkit", "run"], cwd=b.path, env={**os.environ, **b.env},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    pids = []
    try:
        deadline = time.monotonic() + 60
        while train_steps(b.path / "runs/s/base/metrics.jsonl") < 2:
            assert driver.poll() is None and time.monotonic() < deadline, "the cell to stop never logged two steps"
            time.sleep(0.05)
        (start,) = [event for event in read_events(b.path / "events.jsonl") if event["event"] == "start"]
        pids = [start["pid"]]
        os.kill(start["pid"], signal.SIGSTOP)
        yield root, a, b, c
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        os.killpg(driver.pid, signal.SIGKILL)  # the driver, its local job and the cell
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        driver.wait(timeout=60)


STALL = ("--stall-factor", "10", "--stall-min-s", "1")


def test_status_across_two_runs_dirs_flags_nan_collapse_and_a_stopped_cell(two_runs_dirs):
    root, a, b, _ = two_runs_dirs
    args = ("status", "--runs-dir", str(a.path / "runs"), "--runs-dir", str(b.path / "runs"), *STALL, "--check")
    deadline = time.monotonic() + 30
    result = a.run(*args)
    while "stalled" not in result.stdout and time.monotonic() < deadline:  # 1 s of silence, at least
        time.sleep(0.3)
        result = a.run(*args)
    assert result.ret == ExitCode.UNHEALTHY == 6, result
    rows = health_rows(result)
    assert set(rows) == {("a/project/runs", "grids/tiny.py::base"), ("a/project/runs", "grids/g.py::base"),
                         ("b/project/runs", "grids/s.py::base")}, result.stdout
    words = {key: line.split() for key, line in rows.items()}  # runs, cell, status, try, step, health, ...
    assert words["a/project/runs", "grids/tiny.py::base"][5] == "nan", result.stdout
    assert words["a/project/runs", "grids/g.py::base"][5] == "collapse", result.stdout
    assert words["b/project/runs", "grids/s.py::base"][2] == "running", result.stdout
    assert "stalled" in words["b/project/runs", "grids/s.py::base"][5].split(","), result.stdout
    assert "grids/tiny.py::base (a/project/runs): nan: policy/loss is null at step 3" in result.stderr
    assert "grids/s.py::base (b/project/runs): stalled: running, but no new metrics line for" in result.stderr
    header = next(line for line in result.stdout.splitlines() if line.startswith("runs "))
    for column in ("health", "entropy", "logratio", "grad_norm"):
        assert column in header.split(), header
    # The trainer cell's mandatory numbers: its last entropy, log-ratio and grad norm.
    (trainer,) = [row for row in status_rows(a.path / "runs", ["grids/tiny.py"])]
    assert None not in (trainer["entropy"], trainer["logratio"], trainer["grad_norm"]), trainer
    assert [flag.name for flag in trainer["health"]] == ["nan"], trainer
    # The report calls the same cell collapsed, by the same rule.
    report = a.run("report", "grids/g.py", "--format", "json")
    (accuracy,) = json.loads(report.stdout)["tables"]["accuracy"]
    assert accuracy["entropy_collapse"] is True, accuracy


def test_a_healthy_set_exits_0_and_a_glob_names_every_runs_dir(two_runs_dirs):
    root, a, b, c = two_runs_dirs
    healthy = c.run("status", "--check")
    assert healthy.ret == 0, healthy
    assert [line.split()[4] for line in healthy.stdout.splitlines() if "::" in line] == ["ok", "ok"], healthy
    assert "unhealthy" not in healthy.output
    glob = a.run("status", "--runs-dir", f"{root}/*/project/runs", *STALL, "--check")
    assert glob.ret == ExitCode.UNHEALTHY, glob
    assert {runs for runs, _ in health_rows(glob)} == {"a/project/runs", "b/project/runs", "c/project/runs"}
    assert "grids/g.py::base (a/project/runs): collapse:" in glob.stderr
    # Without --check status reads as before: its exit says the table was printed.
    assert a.run("status", "--runs-dir", f"{root}/*/project/runs").ret == 0


def test_a_runs_dir_that_is_not_there_is_named_and_nothing_is_printed(two_runs_dirs):
    root, a, _, _ = two_runs_dirs
    missing = ((str(root / "gone" / "runs"), "no such directory"), (f"{root}/*/nothing", "matches no directory"))
    for spec, why in missing:
        result = a.run("status", "--runs-dir", str(a.path / "runs"), "--runs-dir", spec, "--check")
        assert result.ret == ExitCode.USAGE_ERROR, result
        assert f"ERROR: --runs-dir {spec}: {why}" in result.stderr and result.stdout == "", result
    bad = a.run("status", "--stall-factor", "0")
    assert bad.ret == ExitCode.USAGE_ERROR and "--stall-factor 0: expected a number above 0" in bad.stderr, bad


def test_watch_prints_only_the_rows_that_changed(two_runs_dirs, tmp_path):
    _, _, _, c = two_runs_dirs
    watched = shutil.copytree(c.path, tmp_path / "watched")  # the other tests' runs stay as they are
    watch = subprocess.Popen([sys.executable, "-m", "sweepkit", "status", "--watch", "2", "--watch-count", "2"],
                             cwd=watched, env={**os.environ, **c.env, "COLUMNS": "200"}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        first = [watch.stdout.readline() for _ in range(4)]  # the title, the header, two rows
        assert "2 of 2 cells changed" in first[0], first
        append_nan_step(watched / "runs/ok/other", "reward/mean")  # between the rounds: step and health change
        rest, errors = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
    assert watch.returncode == ExitCode.UNHEALTHY, (first, rest, errors)
    second = rest.splitlines()
    assert "1 of 2 cells changed" in second[0], rest
    assert [line.split()[0] for line in second if line.startswith("grids/")] == ["grids/ok.py::other"], rest
    assert " 5 " in second[2] and " nan " in second[2], rest  # step 4 -> 5, ok -> nan
    assert "grids/ok.py::other: nan: reward/mean is null at step 5" in errors, errors
