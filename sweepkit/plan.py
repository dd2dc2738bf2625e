"""What ``sweep run`` does with each selected cell, decided from the cell's state on disk.

=======================================  ==========  ===================  ==================
state on disk                            plain run   ``--rerun``          ``--resume``
=======================================  ==========  ===================  ==================
never run, or failed without checkpoints  fresh       fresh                fresh
completed, same config                   skip        fresh                skip
completed, config changed since          error       fresh                error
failed as expected (xfail), same config   skip        fresh                skip
failed / cancelled / interrupted, with   error       fresh (checkpoints   resume from latest
checkpoints                                          deleted)             checkpoint
running (its ``.lock`` is held)          attach      error                attach
submitted or running, its job still in   attach      fresh (the old jobs  attach
a cluster's queue (``queued``)                       are cancelled)
=======================================  ==========  ===================  ==================

"attach" means waiting for the run some other driver started, never starting a second one.
A cell with checkpoints is never silently started over nor silently resumed. Its
checkpoints are what its cell dir's ``ckpt/`` holds and, for a cell whose checkpoints a
plugin keeps elsewhere (a SkyRL cell's ``$CHECKPOINTS_DIR/<grid>/<cell>``), the
``global_step_*`` entries and latest-step pointer of that directory
(:func:`sweepkit.state.checkpoint_entries`): the plugin names it through
``sweep_cell_ckpt_dir`` (:func:`checkpoint_dir`), the same answer its guarded wipe acts on.
Only ``--rerun`` deletes checkpoints.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import attrs

from sweepkit import state as st
from sweepkit.job import CellJob

FRESH, RESUME, SKIP, ATTACH = "fresh", "resume", "skip", "attach"

# A target whose schema has this key gets "latest" on a resume and None on a fresh run.
RESUME_KEY = "resume_mode"
RESUME_ENV = "SWEEP_RESUME"  # "1" in a cell's environment when it is to continue from its checkpoint


@attrs.frozen(kw_only=True)
class Plan:
    cell: object
    directory: Path
    action: str
    note: str = ""
    rerun: bool = False  # the user asked to start over: the cell's checkpoints are deleted


class PlanError(Exception):
    """A cell cannot be run with the options given; the message says which option to pass."""


def checkpoint_dir(cell, session) -> Path | None:
    """Where a plugin keeps the cell's checkpoints (``sweep_cell_ckpt_dir``); None when
    they stay in the cell dir's ``ckpt/``."""
    found = session.hook.sweep_cell_ckpt_dir(cell=cell, session=session)
    return None if found is None else Path(found)


def plan_cell(cell, runs_dir: Path, *, rerun: bool, resume: bool,
              queued: Callable[[st.Submission], bool] | None = None,
              checkpoints: Path | None = None) -> Plan:
    """``queued(submission)`` says whether a submitted job is still alive in its
    executor's queue (a cluster job that has not started, or a chain between links); a
    cell whose lock is free is then still taken, not a dead run. ``checkpoints`` is the
    cell's checkpoint dir outside its cell dir (:func:`checkpoint_dir`), if it has one."""
    directory = st.cell_dir(runs_dir, cell)
    state = st.read_state(directory)
    if st.is_locked(directory):
        holder = st.lock_holder(directory)
        if rerun:
            raise PlanError(f"is running now ({holder}); wait for it to end before --rerun")
        return Plan(cell=cell, directory=directory, action=ATTACH, note=f"already running ({holder})")
    submission = state.submission if state is not None else None
    if (not rerun and queued is not None and submission is not None and submission.job_id
            and state.state in ("submitted", "running") and queued(submission)):
        return Plan(cell=cell, directory=directory, action=ATTACH,
                    note=f"queued as {submission.executor} job {submission.job_id}")
    changed = state is not None and state.config_hash != cell.config_hash()
    if rerun:
        return Plan(cell=cell, directory=directory, action=FRESH, note="--rerun", rerun=True)
    if state is not None and state.state == "completed":
        if changed and state.profile != cell.profile:
            raise PlanError(f"completed under {_profile(state.profile)}, not {_profile(cell.profile)}; "
                            "pass --rerun to run it again as it is now")
        if changed:
            raise PlanError("completed with a different config than the grid has now; "
                            "pass --rerun to run it again with the new config")
        return Plan(cell=cell, directory=directory, action=SKIP, note="completed")
    if state is not None and state.state == "failed" and cell.xfail is not None and not changed:
        # An expected failure is a probe's answer (a ceiling probe can take an hour to give it).
        return Plan(cell=cell, directory=directory, action=SKIP, note="xfailed as expected; --rerun probes it again")
    holding = [directory / st.CKPT_DIR] if st.has_checkpoints(directory / st.CKPT_DIR) else []
    if checkpoints is not None and st.checkpoint_entries(checkpoints):
        holding.append(Path(checkpoints))
    if holding:
        effective = st.effective_state(directory, state)
        if not resume:
            raise PlanError(f"was {effective} and has checkpoints in {' and '.join(map(str, holding))}; pass "
                            "--resume to continue from the latest one or --rerun to delete them and start over")
        if changed:
            raise PlanError("has checkpoints written with a different config than the grid has now; "
                            "pass --rerun to delete them and start over")
        return Plan(cell=cell, directory=directory, action=RESUME, note=f"resuming a {effective} run")
    return Plan(cell=cell, directory=directory, action=FRESH)


def _profile(name: str | None) -> str:
    return f"--profile {name}" if name else "no profile"



def paths(directory: Path) -> dict[str, str]:
    """Placeholders of a target's argv, and the values of the ``SWEEP_*`` variables."""
    return {
        "python": sys.executable,
        "config": str(directory / st.CONFIG_FILE),
        "ckpt_dir": str(directory / st.CKPT_DIR),
        "metrics": str(directory / st.METRICS_FILE),
        "cell_dir": str(directory),
    }


def target_config(cell, resume: bool) -> dict:
    config = cell.target_config()
    if cell.target.schema is not None and RESUME_KEY in cell.target.schema:
        config[RESUME_KEY] = "latest" if resume else None
    return config


def cell_env(cell, directory: Path, resume: bool, hook_env: list[dict]) -> dict[str, str]:
    """The variables a cell's process gets on top of the inherited environment: hooks'
    first, then the cell's own ``env`` launch key, then the ``SWEEP_*`` contract."""
    where = paths(directory)
    env: dict[str, str] = {}
    for extra in hook_env:
        env.update({str(key): str(value) for key, value in (extra or {}).items()})
    env.update({str(key): str(value) for key, value in (cell.launch().get("env") or {}).items()})
    env.update({
        "SWEEP_CELL": cell.nodeid,
        "SWEEP_CELL_DIR": where["cell_dir"],
        "SWEEP_CONFIG": where["config"],
        "SWEEP_CKPT_DIR": where["ckpt_dir"],
        "SWEEP_METRICS": where["metrics"],
        RESUME_ENV: "1" if resume else "0",
    })
    # SWEEP_ROOT, SWEEP_GRID_DIR
    env.update({f"SWEEP_{key.upper()}": value for key, value in cell.target.places.items()})
    return env


def cell_args(cell, resume: bool, session) -> list[str]:
    """What the plugins append to the cell's command (``sweep_cell_args``), in order."""
    return [str(arg) for args in session.hook.sweep_cell_args(cell=cell, resume=resume, session=session)
            for arg in args or ()]


def make_job(plan: Plan, executor: str, session) -> CellJob:
    """The job of a planned cell: the target's argv with the plugins' arguments appended
    (and, as ``resume_argv``, with those of a resumed run, which a chain link runs)."""
    resume = plan.action == RESUME
    cell = plan.cell
    command = cell.target.render_argv(**paths(plan.directory))
    resume_args = cell_args(cell, True, session)
    return CellJob(
        nodeid=cell.nodeid,
        cell_dir=str(plan.directory),
        argv=command + (resume_args if resume else cell_args(cell, False, session)),
        resume_argv=command + resume_args,
        env=cell_env(cell, plan.directory, resume, session.hook.sweep_cell_env(cell=cell, session=session)),
        gpus=int(cell.launch().get("gpus") or 0),
        resume=resume,
        token=uuid.uuid4().hex,
        executor=executor,
    )


def write_cell_files(plan: Plan) -> list[Path]:
    """Create the cell dir and its ``cell.json`` / ``config.json``; for a fresh run empty
    the checkpoint dir and the metrics file. Returns the checkpoint entries deleted."""
    directory = plan.directory
    directory.mkdir(parents=True, exist_ok=True)
    resume = plan.action == RESUME
    st.write_json(directory / st.CELL_FILE, st.cell_record(plan.cell))
    st.write_json(directory / st.CONFIG_FILE, target_config(plan.cell, resume))
    deleted: list[Path] = []
    if plan.rerun:  # checkpoints that appeared after a plain run's plan found none are kept
        deleted = st.wipe_checkpoints(directory)
    if not resume:
        (directory / st.METRICS_FILE).unlink(missing_ok=True)
    (directory / st.CKPT_DIR).mkdir(exist_ok=True)
    return deleted


def mark_pending(plan: Plan, driver: Path) -> bool:
    """Record that this driver (holding the lock file ``driver``) will run the cell; False
    when a job took its lock meanwhile."""
    cell = plan.cell
    taken = []

    def change(state: st.CellState | None) -> st.CellState | None:
        if st.is_locked(plan.directory):
            taken.append(True)
            return None
        return st.CellState(
            nodeid=cell.nodeid, state="pending", config_hash=cell.config_hash(), profile=cell.profile,
            attempts=state.attempts if state else (), submission=None,
            driver=str(driver),
        )

    st.update_state(plan.directory, change)
    return not taken


def mark_cancelled(plan: Plan, driver: Path) -> None:
    """Record as cancelled a cell this driver marked pending and never started."""

    def change(state: st.CellState | None) -> st.CellState | None:
        if state is None or state.state != "pending" or state.driver != str(driver):
            return None
        return attrs.evolve(state, state="cancelled")

    st.update_state(plan.directory, change)


def mark_submitted(job: CellJob) -> bool:
    """Write the job's token before it starts (see ``sweepkit.job``); False when another
    process holds the cell's lock, so this job must not be submitted."""
    directory = Path(job.cell_dir)
    taken = []

    def change(state: st.CellState | None) -> st.CellState | None:
        if state is None or st.is_locked(directory):
            taken.append(True)
            return None
        submission = st.Submission(executor=job.executor, token=job.token, submitted=time.time(),
                                   resume=job.resume)
        return attrs.evolve(state, state="submitted", submission=submission)

    st.update_state(directory, change)
    return not taken


def record_job_id(job: CellJob, job_id: str) -> None:
    """Store the executor's job id next to the token, so ``status`` can find the job."""

    def change(state: st.CellState | None) -> st.CellState | None:
        if state is None or state.submission is None or state.submission.token != job.token:
            return None
        return attrs.evolve(state, submission=attrs.evolve(state.submission, job_id=job_id))

    st.update_state(Path(job.cell_dir), change)


def record_lost_job(job: CellJob, failure: str) -> st.CellState | None:
    """A job that ended without recording its end (its process was killed, or it crashed
    before running the cell): mark the cell failed so the state stays truthful."""

    def change(state: st.CellState | None) -> st.CellState | None:
        if state is None or state.submission is None or state.submission.token != job.token:
            return None
        if state.state not in ("submitted", "running"):
            return None
        if state.state == "running" and state.attempts:
            last = attrs.evolve(state.attempts[-1], failure=failure, ended=time.time())
        else:  # it never got as far as recording its start
            last = st.Attempt(n=len(state.attempts) + 1, executor=job.executor,
                              job_id=state.submission.job_id, failure=failure, ended=time.time())
            return attrs.evolve(state, state="failed", attempts=(*state.attempts, last))
        return attrs.evolve(state, state="failed", attempts=(*state.attempts[:-1], last))

    return st.update_state(Path(job.cell_dir), change)
