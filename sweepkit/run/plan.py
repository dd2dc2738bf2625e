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
(:func:`sweepkit.state.records.checkpoint_entries`): the plugin names it through
``sweep_cell_ckpt_dir`` (:func:`checkpoint_dir`), the same answer its guarded wipe acts on.
Only ``--rerun`` deletes checkpoints, and a ``--rerun`` of a cell whose ``ckpt/`` is a
symlink out of its cell dir is refused (nothing is deleted through it).

Nothing of a cell's earlier run is deleted when it is planned or prepared: the job that
starts the fresh attempt deletes it (``sweepkit.run.job.FreshStart``), so a sweep stopped
before it got to a cell leaves that cell's run whole, and a driver that gives up a
pending attempt puts the cell's earlier state back (:func:`mark_cancelled`).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import attrs

from sweepkit.run.job import CellJob, FreshStart
from sweepkit.state import records as st

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
              checkpoints: Path | None = None, preview: bool = False) -> Plan:
    """``queued(submission)`` says whether a submitted job is still alive in its
    executor's queue (a cluster job that has not started, or a chain between links); a
    cell whose lock is free is then still taken, not a dead run. ``checkpoints`` is the
    cell's checkpoint dir outside its cell dir (:func:`checkpoint_dir`), if it has one.

    ``preview`` (``--dry-run``): a cell the state on disk refuses (completed under another
    profile or config, say a local smoke run, or holding checkpoints) is shown as the
    fresh run ``--rerun`` would start, its note saying what a real run needs, so that a
    dry run for a cluster shows every cell's job script; a running cell is still refused."""
    try:
        return _plan_cell(cell, runs_dir, rerun=rerun, resume=resume, queued=queued, checkpoints=checkpoints)
    except PlanError as error:
        if not preview or st.is_locked(st.cell_dir(runs_dir, cell)):
            raise
        return Plan(cell=cell, directory=st.cell_dir(runs_dir, cell), action=FRESH,
                    note=f"previewed; a real run refuses it: {error}")


def _plan_cell(cell, runs_dir: Path, *, rerun: bool, resume: bool,
               queued: Callable[[st.Submission], bool] | None,
               checkpoints: Path | None) -> Plan:
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
        refusal = st.ckpt_link_refusal(directory)
        if refusal is not None:
            raise PlanError(refusal)
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


def cell_gpus(cell, session) -> int:
    """The GPUs the cell's job gets: its ``gpus`` launch key, else the plugins' answer
    (``sweep_cell_gpus``: the trainer's ``num_gpus``), else none."""
    gpus = cell.launch().get("gpus")
    if gpus is None:
        gpus = session.hook.sweep_cell_gpus(cell=cell, session=session)
    return int(gpus or 0)


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
        gpus=cell_gpus(cell, session),
        resume=resume,
        token=uuid.uuid4().hex,
        executor=executor,
        # The plugins' checkpoint dirs to empty are added once the cell is prepared.
        fresh=None if resume else FreshStart(rerun=plan.rerun, files=cell_files(plan),
                                             config_hash=cell.config_hash(), profile=cell.profile),
    )


def cell_files(plan: Plan) -> dict[str, object]:
    """The files that describe the cell's coming attempt, by name: ``cell.json``, ``config.json``."""
    return {st.CELL_FILE: st.cell_record(plan.cell), st.CONFIG_FILE: target_config(plan.cell, plan.action == RESUME)}


def write_cell_files(plan: Plan, state: st.CellState) -> None:
    """Create the cell dir, its ``ckpt/`` and its ``cell.json`` / ``config.json``, unless the
    dir holds an earlier run that a fresh attempt replaces (``state.previous``): that run's
    files describe it until the job starts the attempt, which writes them then. Nothing is
    deleted here (the job does that too)."""
    directory = plan.directory
    directory.mkdir(parents=True, exist_ok=True)
    if state.previous is None:
        for name, data in cell_files(plan).items():
            st.write_json(directory / name, data)
    if not (directory / st.CKPT_DIR).is_symlink():
        (directory / st.CKPT_DIR).mkdir(exist_ok=True)


def _earlier_run(state: st.CellState | None) -> str | None:
    """The state of the earlier run whose files a fresh attempt will start over, if any."""
    if state is None or not state.attempts:
        return None
    return state.previous or state.state  # a fresh attempt that never started leaves the run before it


def mark_pending(plan: Plan, driver: Path) -> st.CellState | None:
    """Record that this driver (holding the lock file ``driver``) will run the cell; returns
    the state written, None when a job took its lock meanwhile. A fresh attempt over an
    earlier run leaves the run's ``config_hash`` and ``profile`` (they describe its files
    until the job starts the attempt) and remembers its state in ``previous``."""
    cell = plan.cell
    written: list[st.CellState] = []

    def change(state: st.CellState | None) -> st.CellState | None:
        if st.is_locked(plan.directory):
            return None
        previous = _earlier_run(state) if plan.action == FRESH else None
        written.append(st.CellState(
            nodeid=cell.nodeid, state="pending",
            config_hash=state.config_hash if previous else cell.config_hash(),
            profile=state.profile if previous else cell.profile,
            attempts=state.attempts if state else (), submission=None,
            driver=str(driver), previous=previous,
        ))
        return written[0]

    st.update_state(plan.directory, change)
    return written[0] if written else None


def mark_cancelled(plan: Plan, driver: Path) -> None:
    """Record as cancelled a cell this driver marked pending and never started; one whose
    earlier run the attempt was to start over is that run again (its files are untouched)."""

    def change(state: st.CellState | None) -> st.CellState | None:
        if state is None or state.state != "pending" or state.driver != str(driver):
            return None
        if state.previous in (*st.FINISHED, "running"):  # "running": its lock is free, so interrupted
            return attrs.evolve(state, state=state.previous, previous=None, driver=None)
        return attrs.evolve(state, state="cancelled")

    st.update_state(plan.directory, change)


def mark_submitted(job: CellJob, driver: Path | None = None) -> bool:
    """Write the job's token before it starts (see ``sweepkit.run.job``); False when another
    process holds the cell's lock, so this job must not be submitted. With ``driver`` (the
    lock of the driver that marked the cell pending), also False unless the cell is still
    pending under that driver: another driver that took the cell since (marked it pending
    itself, submitted it, or finished it) keeps it, and a completed cell is not run again."""
    directory = Path(job.cell_dir)
    taken = []

    def change(state: st.CellState | None) -> st.CellState | None:
        if state is None or st.is_locked(directory) or (
                driver is not None and (state.state != "pending" or state.driver != str(driver))):
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
