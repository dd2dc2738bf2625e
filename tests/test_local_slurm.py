"""End-to-end tests of scripts/local-slurm: real jobs on the local cluster, read back through sacct."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "local-slurm"
DAEMONS = ("mariadbd", "munged", "slurmdbd", "slurmctld", "slurmd")
UNFINISHED = {"", "PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED"}
# A guard against hanging forever, not a performance assertion: jobs here
# take seconds; the slow tests set their own bound.
JOB_DEADLINE_S = 120

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        shutil.which("sbatch") is None,
        reason="sbatch is not on PATH: SLURM is not installed (run `sudo scripts/local-slurm start`)",
    ),
]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="starting and restarting daemons needs root")
needs_slow = pytest.mark.skipif(
    os.environ.get("SWEEPKIT_SLOW") != "1",
    reason="waits for a 1-minute time limit to expire; set SWEEPKIT_SLOW=1 to run",
)


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def cluster() -> None:
    status = run_script("status")
    if status.returncode == 0:
        return
    if os.geteuid() != 0:
        pytest.skip(f"local cluster is not healthy and only root can start it:\n{status.stdout}")
    started = run_script("start")
    assert started.returncode == 0, f"scripts/local-slurm start failed:\n{started.stderr}"


def sbatch(*args: str) -> str:
    """Submit; a job without ``--output`` of its own writes nowhere (not slurm-N.out in the cwd)."""
    output = [] if any(arg.startswith("--output") for arg in args) else ["--output=/dev/null"]
    submitted = subprocess.run(["sbatch", "--parsable", *output, *args], capture_output=True, text=True, check=True)
    return submitted.stdout.strip().split(";")[0]


#: How long sacct may fail to reach slurmdbd before a test gives up: on a loaded machine the
#: database can be out of reach for a few seconds around a controller restart.
DBD_GRACE_S = 30


def sacct_row(job_id: str) -> dict[str, str]:
    fields = ("State", "ExitCode", "Elapsed")
    command = ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", ",".join(fields)]
    deadline = time.monotonic() + DBD_GRACE_S
    while True:
        result = subprocess.run(command, capture_output=True, text=True)
        unreachable = "Problem talking to the database" in result.stderr
        if result.returncode == 0 or not unreachable or time.monotonic() > deadline:
            break
        time.sleep(1)
    if result.returncode != 0:
        raise subprocess.CalledProcessError(result.returncode, command, result.stdout, result.stderr)
    out = result.stdout.strip()
    # The last row is the newest: a requeued job, or an id the controller handed out again.
    values = out.splitlines()[-1].split("|") if out else [""] * len(fields)
    row = dict(zip(fields, values))
    # sacct appends " by <uid>" to CANCELLED; only the state word matters here.
    row["State"] = row["State"].split(" ")[0]
    return row


def wait_until_finished(job_id: str, deadline_s: float = JOB_DEADLINE_S) -> dict[str, str]:
    deadline = time.monotonic() + deadline_s
    while True:
        row = sacct_row(job_id)
        if row["State"] not in UNFINISHED:
            return row
        if time.monotonic() > deadline:
            state = row["State"] or "unknown to sacct"
            pytest.fail(f"job {job_id} still {state} after {deadline_s}s; {logs_hint(job_id)}")
        time.sleep(0.5)


def wait_until_state(job_id: str, wanted: str) -> None:
    deadline = time.monotonic() + JOB_DEADLINE_S
    while (state := sacct_row(job_id)["State"]) != wanted:
        if state not in UNFINISHED or time.monotonic() > deadline:
            pytest.fail(f"job {job_id} is {state}, never reached {wanted}; {logs_hint(job_id)}")
        time.sleep(0.5)


def state_dir() -> Path:
    return Path(os.environ.get("SWEEPKIT_SLURM_DIR", "/var/lib/sweepkit-slurm"))


def pid_file(daemon: str) -> Path:
    return state_dir() / "run" / "slurm" / f"{daemon}.pid"


def logs_hint(job_id: str | None = None) -> str:
    """Where the daemons' logs are; with ``job_id``, also their last lines that name the job
    (a CI machine's logs are gone once the run ends)."""
    hint = f"see logs in {state_dir() / 'log'}"
    if job_id is None:
        return hint
    names = re.compile(rf"(JobId=|job |\[){job_id}\b")
    lines = []
    for daemon in ("slurmctld", "slurmd"):
        log = state_dir() / "log" / f"{daemon}.log"
        if log.exists():
            named = [line for line in log.read_text(errors="replace").splitlines() if names.search(line)]
            lines += [f"  {daemon}: {line}" for line in named[-15:]]
    return hint + "; the lines that name the job:\n" + "\n".join(lines)


def daemon_pids(program: str) -> list[int]:
    """Live top-level processes named `program`.

    slurmctld briefly shows its own name in the helper it forks (slurmscriptd),
    which is not a second daemon. Zombies are left out: a daemonizing program's
    intermediate forks, and a stopped daemon, are orphans of PID 1 and stay in
    the process table until it reaps them, which some init processes do only
    every second or two; a zombie has exited and holds no port."""
    out = subprocess.run(["pgrep", "-x", program], capture_output=True, text=True).stdout
    pids = [int(pid) for pid in out.split()]
    live = {pid: stat for pid in pids if (stat := proc_stat(pid)) and stat[0] not in ("Z", "X")}
    return [pid for pid, (_, parent) in live.items() if parent not in pids]


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None once it is gone."""
    try:
        # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may contain spaces.
        state, ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
    except (FileNotFoundError, ProcessLookupError):
        return None
    return state, int(ppid)


def submitit_final_state(job: submitit.Job) -> str:
    """submitit throttles its sacct calls, so `job.state` can still read UNKNOWN
    just after `result()`; force fresh reads until the job is finished."""
    deadline = time.monotonic() + JOB_DEADLINE_S
    while (state := job.get_info(mode="force").get("State", "")) in UNFINISHED | {"UNKNOWN"}:
        if time.monotonic() > deadline:
            pytest.fail(f"submitit job {job.job_id} still {state or 'unknown'}; {logs_hint(job.job_id)}")
        time.sleep(0.5)
    return state


def test_batch_job_completes_and_sacct_reports_completed(cluster: None, tmp_path: Path) -> None:
    output = tmp_path / "job.out"
    job_id = sbatch("--output", str(output), "--wrap", "echo ran-on-$(hostname -s)")

    row = wait_until_finished(job_id)

    assert row["State"] == "COMPLETED"
    assert row["ExitCode"] == "0:0"
    assert output.read_text().strip() == f"ran-on-{os.uname().nodename.split('.')[0]}"


def test_failing_job_is_failed_in_sacct_with_its_exit_code(cluster: None, tmp_path: Path) -> None:
    job_id = sbatch("--output", str(tmp_path / "job.out"), "--wrap", "exit 3")

    row = wait_until_finished(job_id)

    assert row["State"] == "FAILED"
    assert row["ExitCode"] == "3:0"


@needs_root
def test_start_twice_leaves_one_of_each_daemon(cluster: None) -> None:
    first = run_script("start")
    second = run_script("start")

    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert "up in" in second.stdout
    for program in DAEMONS:
        assert len(daemon_pids(program)) == 1, f"{program}: {daemon_pids(program)}"
    assert run_script("status").returncode == 0


def skip_reused_job_ids(most: int = 1000) -> None:
    """Move the controller's job ids past every id the accounting database knows.

    A controller killed with SIGKILL forgets the ids it handed out since its last state save
    and hands them out again. Until a new job reaches the database, ``sacct -j`` shows the
    earlier job of that id, so a later test would read another job's end (CI saw a test's
    ``sleep 6`` job reported FAILED with exit 3 in 16 ms). Held jobs, cancelled at once, take
    the forgotten ids."""
    known = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobIDRaw", "-S", "now-1days"],
                           capture_output=True, text=True, check=True).stdout.split()
    highest = max((int(job_id) for job_id in known if job_id.isdigit()), default=0)
    for _ in range(most):
        job_id = sbatch("--hold", "--job-name", "skip-reused-id", "--wrap", "true")
        subprocess.run(["scancel", job_id], capture_output=True, check=True)
        if int(job_id) > highest:
            return
    pytest.fail(f"{most} new jobs did not pass job id {highest}, the highest the database knows")


@needs_root
def test_start_after_every_daemon_was_killed_brings_the_cluster_back(cluster: None, tmp_path: Path) -> None:
    # As after a machine restart: no daemon runs, and each left its pid file.
    killed = {program: daemon_pids(program) for program in DAEMONS}
    for pids in killed.values():
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + JOB_DEADLINE_S
    while any(daemon_pids(program) for program in DAEMONS):
        assert time.monotonic() < deadline, {program: daemon_pids(program) for program in DAEMONS}
        time.sleep(0.1)
    left_behind = sorted(path.name for path in (state_dir() / "run").rglob("*.pid"))
    assert run_script("status").returncode != 0

    started = run_script("start")

    assert started.returncode == 0, started.stderr
    assert left_behind == ["mariadb.pid", "munged.pid", "slurmctld.pid", "slurmd.pid", "slurmdbd.pid"]
    for program in DAEMONS:
        assert len(daemon_pids(program)) == 1, f"{program}: {daemon_pids(program)}"
        assert daemon_pids(program) != killed[program]
    # A controller killed before it saved its state hands out job ids again, so sacct may
    # still show the earlier job of that id for a moment: wait for this job's own record.
    skip_reused_job_ids()
    output = tmp_path / "job.out"
    job_id = sbatch("--output", str(output), "--wrap", "echo back")
    deadline = time.monotonic() + JOB_DEADLINE_S
    while not (output.is_file() and sacct_row(job_id)["State"] == "COMPLETED"):
        assert time.monotonic() < deadline, f"job {job_id}: {sacct_row(job_id)}; {logs_hint(job_id)}"
        time.sleep(0.5)
    assert output.read_text().strip() == "back"


@needs_root
def test_controller_restart_keeps_a_running_job(cluster: None, tmp_path: Path, restarts_the_controller) -> None:
    output = tmp_path / "job.out"
    job_id = sbatch("--output", str(output), "--wrap", "sleep 6; echo survived")
    wait_until_state(job_id, "RUNNING")
    controller_before = daemon_pids("slurmctld")

    restarted = run_script("restart-ctld")
    row = wait_until_finished(job_id)

    assert restarted.returncode == 0, restarted.stderr
    controller_after = daemon_pids("slurmctld")
    assert controller_after != controller_before
    assert len(controller_after) == 1, f"slurmctld processes after restart-ctld: {controller_after}"
    # `stop` and `status` go by the pid file, so it must name the daemon, not a fork it exited from.
    assert controller_after == [int(pid_file("slurmctld").read_text())]
    assert row["State"] == "COMPLETED", f"job {job_id}: {row}; output {output.read_text()!r}; {logs_hint(job_id)}"
    assert output.read_text().strip() == "survived"


@needs_root
def test_start_during_a_controller_restart_leaves_one_controller(cluster: None, restarts_the_controller) -> None:
    # Both commands stop and start slurmctld by its pid file; they take turns,
    # so neither sees the controller gone and starts a second one.
    restart = subprocess.Popen([str(SCRIPT), "restart-ctld"], stderr=subprocess.PIPE, text=True)
    started = run_script("start")
    _, restart_stderr = restart.communicate(timeout=300)

    assert restart.returncode == 0, restart_stderr
    assert started.returncode == 0, started.stderr
    assert daemon_pids("slurmctld") == [int(pid_file("slurmctld").read_text())]
    assert run_script("status").returncode == 0


def test_submitit_runs_a_function_and_returns_its_result(cluster: None, tmp_path: Path) -> None:
    # Defined inside the test so cloudpickle ships it by value: the job's
    # interpreter cannot import this test module.
    def describe(numbers: list[int]) -> tuple[int, str]:
        import socket

        return sum(n * n for n in numbers), socket.gethostname()

    executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
    executor.update_parameters(timeout_min=5, slurm_partition="debug", cpus_per_task=1)

    job = executor.submit(describe, [1, 2, 3])

    assert job.result() == (14, os.uname().nodename)
    assert submitit_final_state(job) == "COMPLETED"


def test_submitit_surfaces_the_exception_of_a_failing_function(cluster: None, tmp_path: Path) -> None:
    def broken_cell() -> None:
        raise ValueError("learning rate must be positive")

    executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
    executor.update_parameters(timeout_min=5, slurm_partition="debug")

    job = executor.submit(broken_cell)

    with pytest.raises(FailedJobError, match="learning rate must be positive"):
        job.result()
    assert submitit_final_state(job) == "FAILED"


@pytest.mark.slow
@needs_slow
def test_job_past_its_time_limit_ends_as_timeout(cluster: None, tmp_path: Path) -> None:
    job_id = sbatch("--time=1", "--output", str(tmp_path / "job.out"), "--wrap", "sleep 300")

    row = wait_until_finished(job_id, deadline_s=240)

    assert row["State"] == "TIMEOUT"


@pytest.mark.slow
@needs_slow
def test_submitit_signal_before_the_limit_fails_a_non_checkpointable_job(cluster: None, tmp_path: Path) -> None:
    # SLURM may send the --signal warning up to a minute early, so with a
    # 1-minute limit submitit's USR2 handler always runs before TIMEOUT and
    # ends a plain (non-Checkpointable) function as FAILED.
    def sleep_for(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
    executor.update_parameters(timeout_min=1, slurm_partition="debug", slurm_signal_delay_s=15)

    job = executor.submit(sleep_for, 300)

    with pytest.raises(FailedJobError, match="timed-out and not checkpointable"):
        job.result()
    assert submitit_final_state(job) == "FAILED"


@pytest.mark.slow
@needs_slow
def test_submitit_without_signal_delay_lets_slurm_time_the_job_out(cluster: None, tmp_path: Path) -> None:
    # With no warning signal the job is simply killed at the limit, so sacct
    # (and submitit) report TIMEOUT rather than a failure.
    def sleep_for(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
    executor.update_parameters(timeout_min=1, slurm_partition="debug", slurm_signal_delay_s=0)

    job = executor.submit(sleep_for, 300)

    with pytest.raises(UncompletedJobError, match="state: TIMEOUT"):
        job.result()
    assert submitit_final_state(job) == "TIMEOUT"
