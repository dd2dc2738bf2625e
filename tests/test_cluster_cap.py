"""A cluster's cap held across every runs dir of the user (``sweepkit.run.executors.cluster_cap``):
the queue's parsing and count on captured ``squeue`` text, the per-user lock, the command
line's mistakes, and against the real local SLURM the count of one ``squeue`` call, two
drivers on two runs dirs sharing a cap of 2, and a foreign job taking one of its slots.

The test cluster ``capt`` is registered as a cluster plugin registers one
(``sweep_register_clusters``, in the grids' ``sweepconf.py``); its ``max_running`` is 2 so
that the 2-CPU test node could run more. Waits are bounded by deadlines, never asserted.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cell_program import intervals, max_overlap, read_events
from sweepkit.errors import UsageError
from sweepkit.run.executors import squeue
from sweepkit.run.executors.cluster_cap import CapLock, ClusterCap, QueueCount, count_slots, lock_path
from sweepkit.run.executors.slurm_jobs import COMMENT_TAG, job_comment
from sweepkit_plugins import clusters
from test_slurm_executor import background, cluster, on_cluster, script_grid, wait_for  # noqa: F401 (a fixture)

DEADLINE_S = 120
CAP = 2
FOREIGN = "ext_rl_"

SWEEPCONF = f'''
from sweepkit import hookimpl
from sweepkit.run.executors.resources import JobResources
from sweepkit_plugins import clusters

CLUSTER = clusters.ClusterProfile(name="capt", gpus_per_node=0, accelerator="cpu", max_running={CAP},
                                  foreign_job_pattern=r"^{FOREIGN}", max_time_limit="01:00:00",
                                  default_time_limit="00:10:00")


def job_pieces(cell, environ, cell_dir):
    return JobResources(cluster=CLUSTER.name)


@hookimpl
def sweep_register_clusters(register):
    register(clusters.Cluster(profile=CLUSTER, job_pieces=job_pieces))
'''

# -- the queue's text, parsed and counted -----------------------------------------------------

RUNS = "/nonexistent/u/runs_a"
OTHER = "/nonexistent/u/runs b"  # a runs dir with a space
ARRAY = "capb/base,capb/b,capb/c,capb/d,capb/e"

# squeue -h -u UID -o FORMAT on a queue with this runs dir's job and chain, another runs dir's
# array (two tasks running, three waiting for its %2) and a link whose head has just left the
# queue, the user's own jobs named like the pattern, and one not named so.
CAPTURED = (
    f"740\x1fcapa_base\x1fRUNNING\x1fNone\x1f(null)\x1f{COMMENT_TAG} capa/base in {RUNS}\n"
    f"741\x1fcapa_chain\x1fRUNNING\x1fNone\x1f(null)\x1f{COMMENT_TAG} capa/chain in {RUNS}\n"
    f"742\x1fcapa_chain\x1fPENDING\x1fDependency\x1fafterany:741(unfulfilled)\x1f{COMMENT_TAG} capa/chain in {RUNS}\n"
    f"750_[2-4%2]\x1fcapb_base+4\x1fPENDING\x1fJobArrayTaskLimit\x1f(null)\x1f{COMMENT_TAG} {ARRAY} in {OTHER}\n"
    f"750_0\x1fcapb_base+4\x1fRUNNING\x1fNone\x1f(null)\x1f{COMMENT_TAG} {ARRAY} in {OTHER}\n"
    f"750_1\x1fcapb_base+4\x1fRUNNING\x1fNone\x1f(null)\x1f{COMMENT_TAG} {ARRAY} in {OTHER}\n"
    f"760\x1fcapb_long\x1fPENDING\x1fDependency\x1fafterany:759(unfulfilled)\x1f{COMMENT_TAG} capb/long in {OTHER}\n"
    f"781\x1fcapb_own\x1fPENDING\x1fPriority\x1f(null)\x1fmine|x; {COMMENT_TAG} capb/own in {OTHER}\n"
    f"770\x1f{FOREIGN}agent\x1fRUNNING\x1fNone\x1f(null)\x1f(null)\n"
    f"771\x1f{FOREIGN}held\x1fPENDING\x1fJobHeldUser\x1f(null)\x1f(null)\n"
    f"772\x1f{FOREIGN}never\x1fPENDING\x1fDependencyNeverSatisfied\x1fafterok:700(failed)\x1f(null)\n"
    f"780\x1fjupyter | lab\x1fRUNNING\x1fNone\x1f(null)\x1f(null)\n"
    "not a row of this format\n"
)


def test_squeue_text_is_parsed_row_by_row():
    rows = squeue.parse(CAPTURED)
    assert len(rows) == 12  # the line of another format is skipped
    by_id = {row.ids[0]: row for row in rows}
    waiting = by_id["750_2"]
    assert waiting.ids == ("750_2", "750_3", "750_4") and waiting.parallelism == 2 and waiting.array == "750"
    assert by_id["750_0"].array == "750" and by_id["750_0"].parallelism is None
    link = by_id["742"]
    assert (link.state, link.reason, link.dependency_ids()) == ("PENDING", "Dependency", ["741"])
    assert link.array is None and link.comment == f"{COMMENT_TAG} capa/chain in {RUNS}"
    assert by_id["780"].name == "jupyter | lab" and by_id["780"].comment == "" and by_id["780"].dependency == ""
    assert by_id["781"].comment == f"mine|x; {COMMENT_TAG} capb/own in {OTHER}"


def test_the_count_skips_chain_links_waiting_and_counts_arrays_by_their_parallelism():
    rows = squeue.parse(CAPTURED)
    # This runs dir: its job and its chain once (the link waits on its head, still queued).
    # Other runs dirs: the array's %2, the link whose head has left (it starts any moment),
    # the job whose comment begins with its cell's own. Foreign: the running and the held
    # job; the one whose dependency failed never starts; the unmatched name is not counted.
    assert count_slots(rows, Path(RUNS), f"^{FOREIGN}") == QueueCount(this_runs_dir=2, other_runs_dirs=4, foreign=2)
    assert count_slots(rows, Path(RUNS)) == QueueCount(this_runs_dir=2, other_runs_dirs=4, foreign=0)
    assert count_slots(rows, Path(OTHER), "agent$").this_runs_dir == 4
    # Once the head has left the queue, its link is counted in its place: the chain still once.
    without_head = [row for row in rows if row.ids != ("741",)]
    assert count_slots(without_head, Path(RUNS)).this_runs_dir == 2


def test_the_comment_tag_marks_every_sweepkit_job():
    comment = job_comment(Path(RUNS), [Path(RUNS) / "g" / "a", Path(RUNS) / "g" / "b"])
    assert comment == f"{COMMENT_TAG} g/a,g/b in {RUNS}" and COMMENT_TAG == "sweepkit cells"


def test_a_bad_pattern_or_cap_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"ClusterProfile.foreign_job_pattern: '\(rl' is not a regular expression"):
        clusters.ClusterProfile(name="x", gpus_per_node=4, accelerator="a", max_time_limit="01:00:00",
                                default_time_limit="01:00:00", foreign_job_pattern="(rl")
    with pytest.raises(ValueError, match="limit: expected a number of cells of at least 1, got 0"):
        ClusterCap(limit=0, cluster="x")


# -- the per-user lock ------------------------------------------------------------------------


def test_the_lock_is_one_per_user_and_cluster_under_the_cache_dir(tmp_path):
    assert lock_path("jupiter", {"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "sweepkit" / "cap-jupiter.lock"
    assert lock_path("a/b c", {"XDG_CACHE_HOME": "relative", "HOME": str(tmp_path)}) == \
        tmp_path / ".cache" / "sweepkit" / "cap-a_b_c.lock"
    environ = {"XDG_CACHE_HOME": str(tmp_path)}
    first, second, elsewhere = CapLock("capt", environ), CapLock("capt", environ), CapLock("other", environ)
    assert first.acquire()
    try:
        assert not second.acquire(blocking=False)  # another driver waits here
        assert elsewhere.acquire(blocking=False)  # another cluster's cap is another lock
        elsewhere.release()
    finally:
        first.release()
    assert second.acquire(blocking=False)
    second.release()


def test_a_lock_that_cannot_be_made_names_its_file(tmp_path):
    (tmp_path / "sweepkit").write_text("a file where the lock's dir would be")
    with pytest.raises(UsageError, match=re.escape(str(tmp_path / "sweepkit" / "cap-capt.lock"))):
        CapLock("capt", {"XDG_CACHE_HOME": str(tmp_path)}).acquire()


# -- the command line -----------------------------------------------------------------------


def test_bad_cap_options_are_refused_before_anything_is_written(sweeper):
    sweeper.write("grids/sweepconf.py", SWEEPCONF)
    script_grid(sweeper, "capa", "")
    bad = sweeper.run("run", "--cluster", "capt", "--dry-run", "--cap-count-pattern", "(rl")
    assert bad.ret == 4, bad
    assert "--cap-count-pattern '(rl' is not a regular expression" in bad.stderr
    plain = sweeper.run("run", "--executor", "slurm", "--dry-run", "--cap-count-pattern", "rl")
    assert plain.ret == 4, plain
    assert "--cap-count-pattern: no cluster cap applies to this run" in plain.stderr
    sweeper.write("grids/sweepconf.py", "from sweepkit import hookimpl\n\n@hookimpl\n"
                                        "def sweep_job_concurrency_cap(session):\n    return 'six'\n")
    wrong = sweeper.run("run", "--executor", "slurm", "--dry-run")
    assert wrong.ret == 4 and "sweep_job_concurrency_cap answered 'six'" in wrong.stderr, wrong
    assert not (sweeper.path / "runs").exists()


# -- against the cluster ----------------------------------------------------------------------


def mine(runs_dirs: list[Path]) -> list[tuple[str, str, str]]:
    """(job id, state, runs dir) of the queue's jobs of these runs dirs, read independently of sweepkit."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%T|%k"], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        job_id, state, comment = line.split("|", 2)
        for runs in runs_dirs:
            if comment.endswith(f" in {runs.resolve()}"):
                rows.append((job_id, state, str(runs)))
    return rows


def cancel_all(runs_dirs: list[Path], *job_ids: str) -> None:
    ids = [*job_ids, *(job_id for job_id, _, _ in mine(runs_dirs))]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)


def stop(drivers) -> None:
    for driver in drivers:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()


def sbatch(output: Path, *args: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", "--cpus-per-task=1", "--mem=100M", f"--output={output}", *args],
                         capture_output=True, text=True, check=True).stdout
    return out.strip().split(";")[0]


@on_cluster
def test_one_squeue_call_counts_the_users_queue(tmp_path):
    runs = tmp_path / "runs"
    comment = f"--comment={job_comment(runs, [runs / 'g' / 'chain'])}"
    log = tmp_path / "slurm-%j.out"
    head = sbatch(log, "--hold", "-J", "cap_head", comment, "--wrap", "true")
    link = sbatch(log, f"--dependency=afterany:{head}", "-J", "cap_link", comment, "--wrap", "true")
    other = tmp_path / "other"
    array = sbatch(log, "--hold", "--array=0-3%2", "-J", "cap_array",
                   f"--comment={job_comment(other, [other / 'g' / str(n) for n in range(4)])}", "--wrap", "true")
    foreign = sbatch(log, "--hold", "-J", f"{FOREIGN}{tmp_path.name}", "--wrap", "true")
    try:
        rows = [row for row in squeue.user_queue() if row.array in (array,) or row.ids[0] in (head, link, foreign)]
        assert {row.ids[0] for row in rows} == {head, link, f"{array}_0", foreign}, rows
        assert next(row for row in rows if row.ids[0] == link).dependency_ids() == [head]
        # The held head once (its link waits on it), the array's %2, the job named like the pattern.
        assert count_slots(rows, runs, f"^{FOREIGN}{tmp_path.name}$") == QueueCount(
            this_runs_dir=1, other_runs_dirs=2, foreign=1)
    finally:
        subprocess.run(["scancel", head, link, array, foreign], capture_output=True)


@on_cluster
def test_two_drivers_on_two_runs_dirs_hold_the_clusters_cap_together(sweeper):
    sweeper.write("grids/sweepconf.py", SWEEPCONF)
    sweeper.env["XDG_CACHE_HOME"] = str(sweeper.path / "cache")  # the user's cap lock, shared by both drivers
    # Different memory requests keep every cell its own job, each counted once against the cap.
    for grid in ("capa", "capb"):
        script_grid(sweeper, grid, "b = sk.cell(mem_gb=0.26)\nc = sk.cell(mem_gb=0.27)", steps=2, sleep=1.5)
    runs_dirs = [sweeper.path / "runs_a", sweeper.path / "runs_b"]
    drivers = [background(sweeper, "run", f"grids/{grid}.py", "--cluster", "capt", "--runs-dir", str(runs))
               for grid, runs in zip(("capa", "capb"), runs_dirs)]
    queued = running = 0
    try:
        deadline = time.monotonic() + DEADLINE_S
        while any(driver.poll() is None for driver in drivers) and time.monotonic() < deadline:
            rows = mine(runs_dirs)
            queued = max(queued, len(rows))
            running = max(running, sum(state == "RUNNING" for _, state, _ in rows))
            time.sleep(0.1)
    finally:
        stop(drivers)
        cancel_all(runs_dirs)
    logs = "\n".join(path.read_text() for path in sorted(sweeper.path.glob("driver-*.log")))
    assert [driver.returncode for driver in drivers] == [0, 0], logs
    assert logs.count("3 passed") == 2, logs
    # Both runs dirs' jobs together, pending ones included, never above the cluster's cap.
    assert running <= CAP and queued == CAP, (queued, running)
    spans = intervals(read_events(sweeper.path / "events.jsonl"))
    assert len(spans) == 6 and max_overlap(spans) <= CAP
    # A driver waited for slots the other runs dir held, and said so.
    assert re.search(r"waiting +run +cap: 2 cell\(s\) of this user running at once on cluster capt.*"
                     r"taken: \d by this runs dir, [12] by other runs dirs, 0 by foreign jobs; 0 free", logs), logs


@on_cluster
def test_a_foreign_job_named_by_the_pattern_takes_a_slot(sweeper):
    sweeper.write("grids/sweepconf.py", SWEEPCONF)
    sweeper.env["XDG_CACHE_HOME"] = str(sweeper.path / "cache")
    script_grid(sweeper, "capa", "b = sk.cell(mem_gb=0.26)\nc = sk.cell(mem_gb=0.27)", steps=2, sleep=1.0)
    runs_dirs = [sweeper.path / "runs"]
    foreign = sbatch(sweeper.path / "foreign.out", "-J", f"{FOREIGN}probe", "--wrap", "sleep 60")
    driver = None
    try:
        wait_for("the foreign job to run", lambda: subprocess.run(
            ["squeue", "-h", "-j", foreign, "-o", "%T"], capture_output=True, text=True).stdout.strip() == "RUNNING")
        shown = sweeper.run("run", "grids/capa.py", "--cluster", "capt", "--dry-run")
        assert shown.ret == 0, shown
        assert "cap: 2 cell(s) of this user running at once on cluster capt" in shown.stdout, shown
        assert "jobs named like '^ext_rl_'; taken: 0 by this runs dir, 0 by other runs dirs, 1 by foreign jobs; " \
               "1 free" in shown.stdout, shown
        other = sweeper.run("run", "grids/capa.py", "--cluster", "capt", "--dry-run", "--cap-count-pattern", "^none$",
                            "--max-parallel", "3")
        assert "1 by foreign jobs" not in other.stdout and "0 by foreign jobs; 2 free" in other.stdout, other
        assert "cap: 3 cell(s) of this runs dir at once (--max-parallel; other runs dirs are not counted)" \
            in other.stdout, other

        driver = background(sweeper, "run", "grids/capa.py", "--cluster", "capt")
        most = 0
        deadline = time.monotonic() + DEADLINE_S
        # While the foreign job holds one of the 2 slots, one cell at a time; two of them run so.
        while len([event for event in read_events(sweeper.path / "events.jsonl") if event["event"] == "end"]) < 2:
            assert driver.poll() is None and time.monotonic() < deadline, "the driver ended or hung"
            most = max(most, len(mine(runs_dirs)))
            time.sleep(0.1)
        assert most == 1
        subprocess.run(["scancel", foreign], check=True)
        assert driver.wait(timeout=DEADLINE_S) == 0
    finally:
        stop([driver] if driver else [])
        cancel_all(runs_dirs, foreign)
    assert len(intervals(read_events(sweeper.path / "events.jsonl"))) == 3
