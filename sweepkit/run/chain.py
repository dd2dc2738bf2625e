"""Chains past the wall limit: a head job and ``max_restarts`` links, each a SLURM job
that depends on the one before with ``afterany``, and each resuming the cell from its
latest checkpoint.

Why ``afterany`` links and not submitit's requeue of a ``Checkpointable``: requeueing
needs submitit's warning signal, which on a short limit arrives at the controller's
first check whatever delay was asked (so the job is requeued or, for anything not
checkpointable, failed as "timed-out and not checkpointable" long before its limit; see
docs/local-slurm.md); a requeued job keeps its id, so a link's ``TIMEOUT`` is never seen
in ``sacct``; and a requeue is decided by a process inside the dying job. All links of
an ``afterany`` chain are in the queue from the start, so the chain goes on without the
driver and across a controller restart, every link has its own id and final state, and
the normal end of a link that ran out of time is plain ``TIMEOUT``. This is also what the
clusters' own launchers do.

What each link does (:func:`run_link`, the function submitit runs):

- a link after the head first reads the cell's state: a completed cell (an earlier link
  finished the run) is not trained again; the link exits at once and cancels the links
  after it. A cell that another submission took over, or that ``sweep cancel`` marked
  cancelled, is left alone too;
- otherwise it runs the cell as a resume (:func:`sweepkit.run.job.resumed`): ``SWEEP_RESUME=1``,
  the job's resumed command (``CellJob.resume_argv``: the plugins' arguments for a resume,
  such as SkyRL's ``++trainer.resume_mode=latest``) and its resumed config
  (``CellJob.resume_config``: the plugins' ``sweep_cell_start_config`` for a resume, such
  as ``resume_mode=latest`` for a target with that key), which the job writes as it starts,
  so the step count continues from the latest checkpoint and nothing is trained twice;
- when the cell completes it cancels the links still queued behind it; when it fails or
  times out and a link is still to come, the cell is recorded as ``submitted`` again
  (waiting for that link, :func:`sweepkit.state.transitions.waiting_for_link`) rather than
  ``failed``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from sweepkit.run.executors import sacct
from sweepkit.run.executors import sbatch as sb
from sweepkit.run.job import CellJob, resumed, run_cell
from sweepkit.state import records as st
from sweepkit.state import transitions as tr


def chain_ids(state: st.CellState | None, token: str) -> list[str]:
    """The job ids of the chain that ``token``'s submission recorded (head first)."""
    if state is None or state.submission is None or state.submission.token != token:
        return []
    return sacct.split_ids([state.submission.job_id])


def _cancel_after(job: CellJob, link: int) -> None:
    later = chain_ids(st.read_state(Path(job.cell_dir)), job.token)[link + 1:]
    if later:
        sacct.cancel(later)


def run_link(job: CellJob, link: int = 0, links: int = 1) -> str:
    """Run link ``link`` (0: the head) of a chain of ``links`` jobs; returns the cell's
    state after it, ``superseded`` or ``skipped`` when the link had nothing to do."""
    directory = Path(job.cell_dir)
    name_array_task(job)
    if link > 0:
        state = st.read_state(directory)
        if state is None or state.submission is None or state.submission.token != job.token:
            return "superseded"
        if state.state in ("completed", "cancelled"):
            if state.state == "completed":
                _cancel_after(job, link)
            return "skipped"
        job = resumed(job)
    final = run_cell(job)
    if final == "completed":
        _cancel_after(job, link)
    elif final in ("failed", "cancelled") and link < links - 1:
        tr.waiting_for_link(job)
    return final


def name_array_task(job: CellJob, environ=os.environ) -> None:
    """An array's tasks share the array's name (``<grid>_<first cell>+N``); a running task
    is its own job to SLURM, so it takes its cell's name, ``<grid>_<cell>``, for squeue and
    sacct. Best effort: a task that cannot rename itself runs all the same."""
    task = environ.get("SLURM_ARRAY_TASK_ID")
    array = environ.get("SLURM_ARRAY_JOB_ID")
    if not task or not array or shutil.which("scontrol") is None:
        return
    directory = Path(job.cell_dir)
    name = sb.job_name(directory.parent.name, directory.name)
    try:
        subprocess.run(["scontrol", "update", f"JobId={array}_{task}", f"JobName={name}"],
                       capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pass
