"""The concurrency cap's count (``sweepkit.run.executors.slurm_jobs``) against the real local
SLURM: a pending job takes a slot, a chain takes one however many of its links wait on a
dependency, an array takes ``min(unfinished tasks, %N)``, and an ended job takes none."""

from __future__ import annotations

import time

import attrs

from sweepkit.state import files as fs
from sweepkit.state import records as st
from sweepkit.state import transitions as tr
from sweepkit.run.executors import sacct, squeue
from sweepkit.run.executors.slurm_follow import settle_orphans
from sweepkit.run.executors.slurm_jobs import (ARRAY, CHAIN, JOB, REUSED_ID_MARGIN_S, UNKNOWN_GRACE_S, Registry,
                                               Submission, alive, job_comment, orphan_slots)
from test_local_slurm import sbatch
from test_slurm_executor import cluster, on_cluster, wait_for  # noqa: F401 (cluster: a fixture)


def held(*extra: str) -> str:
    """A job submitted on hold: it stays PENDING until released or cancelled."""
    return sbatch("--hold", "--cpus-per-task=1", "--mem=100M", "--job-name=sweepkit_test_slots", *extra,
                  "--wrap", "true")


def entry(kind: str, job_id: str, **fields) -> Submission:
    return Submission(kind=kind, job_id=job_id, cells=[{"nodeid": f"g::{job_id}", "cell_dir": "",
                                                        "token": job_id, "job_id": job_id}],
                      submitted=time.time(), **fields)


@on_cluster
def test_pending_jobs_take_slots_and_ended_ones_free_them(tmp_path):
    registry = Registry(tmp_path / "runs")
    lone = held()
    head = held()
    link = held(f"--dependency=afterany:{head}")
    array = held("--array=0-3%2")
    ids = [lone, head, link, array]
    try:
        registry.append(entry(JOB, lone))
        registry.append(entry(CHAIN, f"{head},{link}"))
        registry.append(entry(ARRAY, array, tasks=4, parallelism=2))
        wait_for("sacct to list the held jobs as PENDING", lambda: all(
            record.state == "PENDING" for record in sacct.query(ids).values()) and len(sacct.query(ids)) >= 4)
        assert registry.slots_used() == 1 + 1 + 2
    finally:
        sacct.cancel(ids)
    wait_for("sacct to list the cancelled jobs as ended",
             lambda: all(not record.alive for record in sacct.query(ids).values()))
    assert registry.slots_used() == 0
    assert registry.read() == []  # entries whose jobs all ended are dropped


def queued(*extra: str) -> str:
    """A job that waits in the queue: on hold unless it waits on a dependency."""
    hold = [] if any(arg.startswith("--dependency") for arg in extra) else ["--hold"]
    return sbatch(*hold, "--cpus-per-task=1", "--mem=100M", "--job-name=sweepkit_test_orphans", *extra,
                  "--wrap", "true")


@on_cluster
def test_orphans_are_the_runs_dirs_unrecorded_jobs_and_the_driver_of_their_cell_settles_them(tmp_path):
    runs = (tmp_path / "runs").resolve()
    registry = Registry(runs)

    def comment(*cells: str, runs_dir=runs) -> str:
        return f"--comment={job_comment(runs_dir, [runs / 'g' / cell for cell in cells])}"

    recorded = queued(comment("a"))
    lone = queued(comment("b"))
    array = queued(comment("c", "d", "e"), "--array=0-2%2")
    head = queued(comment("h"))
    link = queued(comment("h"), f"--dependency=afterany:{head}")
    elsewhere = queued(comment("f", runs_dir=tmp_path / "other-runs"))
    running = queued(comment("r"))
    ids = [recorded, lone, array, head, link, elsewhere, running]
    try:
        registry.append(entry(JOB, recorded))
        found = {orphan.job_id: orphan for orphan in registry.orphans()}
        assert set(found) == {lone, f"{array}_0", f"{array}_1", f"{array}_2", head, link, running}
        assert found[f"{array}_2"].cell_dir == runs / "g" / "e" and found[link].cell_dir == runs / "g" / "h"
        # A job each, the array its %2, the link waiting on its head none.
        assert orphan_slots(list(found.values())) == 1 + 2 + 1 + 0 + 1

        # The driver of cells b, c, h and r: r's orphan runs its cell (it holds the lock and
        # recorded the attempt), so it is adopted; its other cells' orphans are cancelled.
        cell = runs / "g" / "r"
        cell.mkdir(parents=True)
        tr.write_state(cell, st.CellState(nodeid="grids/g.py::r", state="running", config_hash="h",
                                          attempts=[st.Attempt(n=1, executor="slurm", job_id=running)],
                                          submission=st.Submission(executor="slurm", token="t")))
        lock = fs.CellLock(cell)
        lock.acquire()
        try:
            settle_orphans(registry, {str(runs / "g" / name) for name in ("b", "c", "h", "r")})
        finally:
            lock.release()
        assert [entry.job_id for entry in registry.read()] == [recorded, running]
        # (A pending array task cancelled before it started leaves no record in sacct.)
        wait_for("the cancelled orphans to leave the queue", lambda: {
            job_id for row in squeue.user_queue() for job_id in row.ids if sacct.array_id(job_id) in ids} == {
            recorded, f"{array}_1", f"{array}_2", elsewhere, running})
        assert {orphan.job_id for orphan in registry.orphans()} == {f"{array}_1", f"{array}_2"}  # d, e: not its
    finally:
        sacct.cancel(ids)


@on_cluster
def test_an_earlier_jobs_record_under_a_reused_id_is_not_taken_for_the_new_jobs_end(tmp_path):
    # A controller that died before saving its state hands an id out again; until the new job
    # reaches the database, sacct shows the earlier job of that id. Here the registry records
    # an ended job's id as submitted now, which is how such a reuse looks from the runs dir.
    earlier = sbatch("--job-name=sweepkit_test_reused", "--wrap", "exit 3")
    pending = held()
    try:
        wait_for("sacct to list the failed job with its end", lambda: (
            (record := sacct.query([earlier]).get(earlier)) is not None and record.state == "FAILED"
            and record.end is not None))
        record = sacct.query([earlier])[earlier]
        assert abs(time.time() - record.end) < 60  # sacct's local time read as this clock's
        wait_for("sacct to list the held job", lambda: pending in sacct.query([pending]))
        assert sacct.query([pending])[pending].end is None  # has not ended
        time.sleep(max(0.0, record.end + REUSED_ID_MARGIN_S + 1 - time.time()))
        now = time.time()

        assert alive(record, now, now)  # another job's end: this one may not be in the database yet
        assert not alive(record, record.end - 1, now)  # submitted before it ended: its own end
        assert not alive(record, now - UNKNOWN_GRACE_S - 1, now)  # after the grace time, taken as it is
        assert not alive(record, 0.0, now)  # submission time unknown: taken as it is

        reused, own = Registry(tmp_path / "reused"), Registry(tmp_path / "own")
        reused.append(entry(JOB, earlier))
        own.append(attrs.evolve(entry(JOB, earlier), submitted=record.end - 1))
        assert (reused.slots_used(), own.slots_used()) == (1, 0)
    finally:
        sacct.cancel([earlier, pending])
