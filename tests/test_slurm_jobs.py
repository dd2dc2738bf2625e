"""The concurrency cap's count (``sweepkit.executors.slurm_jobs``) against the real local
SLURM: a pending job takes a slot, a chain takes one however many of its links wait on a
dependency, an array takes ``min(unfinished tasks, %N)``, and an ended job takes none."""

from __future__ import annotations

import subprocess
import time

from sweepkit.executors import sacct
from sweepkit.executors.slurm_jobs import ARRAY, CHAIN, JOB, Registry, Submission
from test_slurm_executor import cluster, on_cluster, wait_for  # noqa: F401 (cluster: a fixture)


def held(*extra: str) -> str:
    """A job submitted on hold: it stays PENDING until released or cancelled."""
    out = subprocess.run(["sbatch", "--parsable", "--hold", "--cpus-per-task=1", "--mem=100M",
                          "--job-name=sweepkit_test_slots", *extra, "--wrap", "true"],
                         capture_output=True, text=True, check=True).stdout
    return out.strip().split(";")[0]


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
