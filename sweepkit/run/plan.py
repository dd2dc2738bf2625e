"""What ``sweep run`` does with each selected cell, decided from the cell's state on disk:
a pure plan per cell, made once per command (:class:`sweepkit.run.context.RunContext`) and
used by validation, ``--dry-run`` and the run itself; and the job a planned cell runs.

=======================================  ==========  ===================  ==================
state on disk                            plain run   ``--rerun``          ``--resume``
=======================================  ==========  ===================  ==================
never run, or failed without checkpoints  fresh       fresh                fresh
completed, same config                   skip        fresh                skip
completed, config changed since          error       fresh                error
failed as expected (xfail), same config   skip        fresh                skip
failed / cancelled / interrupted, with   error       fresh (checkpoints   resume from latest
checkpoints                                          deleted)             checkpoint
failed / cancelled, every checkpoint     fresh       fresh                error (nothing to
deleted by ``sweep clean --keep none``                                     resume from)
running (its ``.lock`` is held)          attach      error                attach
submitted or running, its job still in   attach      fresh (the old jobs  attach
a cluster's queue (``queued``)                       are cancelled)
=======================================  ==========  ===================  ==================

"attach" means waiting for the run some other driver started, never starting a second one.
A cell with checkpoints is never silently started over nor silently resumed. Its
checkpoints are the entries of its cell dir's ``ckpt/`` and, for a cell whose checkpoints
a plugin keeps elsewhere (a SkyRL cell's ``$CHECKPOINTS_DIR/<grid>/<cell>``, named
through ``sweep_cell_ckpt_dir``: :func:`checkpoint_dir`), of that directory, which the
plugins say are checkpoints (``sweep_cell_checkpoints``: :func:`checkpoints_in`; without
an answer, every entry). Only ``--rerun`` deletes checkpoints, and a ``--rerun`` of a cell
whose ``ckpt/`` is a symlink out of its cell dir is refused (nothing is deleted through it).

Nothing here writes: the driver marks a planned cell pending and prepares its dir
(:mod:`sweepkit.run.prepare`), and the job that starts a fresh attempt deletes the cell's
earlier run (``sweepkit.run.job.FreshStart``), so a sweep stopped before it got to a cell
leaves that cell's run whole.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import attrs

from sweepkit.run.job import RESUME_ENV, CellJob, FreshStart
from sweepkit.state import checkpoints as ck
from sweepkit.state import files as fs
from sweepkit.state import records as st

FRESH, RESUME, SKIP, ATTACH = "fresh", "resume", "skip", "attach"


@attrs.frozen(kw_only=True)
class Plan:
    """What to do with one cell (``action``: fresh, resume, skip or attach) and why (``note``)."""

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


def checkpoints_in(cell, directory: Path, session) -> list[Path]:
    """The entries of ``directory`` that are the cell's checkpoints (``sweep_cell_checkpoints``;
    without a plugin's answer, every entry), in the order they were written."""
    directory = Path(directory)
    found = session.hook.sweep_cell_checkpoints(cell=cell, directory=directory, session=session)
    if found is not None:
        return [Path(entry) for entry in found]
    return sorted(directory.iterdir()) if directory.is_dir() else []


def holding_checkpoints(cell, runs_dir: Path, session) -> list[Path]:
    """The cell's checkpoint dirs that hold checkpoints: its ``ckpt/``, then its plugin's dir."""
    dirs = [st.cell_dir(runs_dir, cell) / st.CKPT_DIR, checkpoint_dir(cell, session)]
    return [directory for directory in dirs if directory is not None and checkpoints_in(cell, directory, session)]


def plan_cell(cell, runs_dir: Path, *, rerun: bool, resume: bool,
              queued: Callable[[st.Submission], bool] | None = None,
              holding: Callable[[], list[Path]] | None = None, preview: bool = False) -> Plan:
    """``queued(submission)`` says whether a submitted job is still alive in its
    executor's queue (a cluster job that has not started, or a chain between links); a
    cell whose lock is free is then still taken, not a dead run. ``holding()`` lists the
    cell's checkpoint dirs that hold checkpoints (:func:`holding_checkpoints`), asked only
    where the answer decides.

    ``preview`` (``--dry-run``): a cell the state on disk refuses (completed under another
    profile or config, say a local smoke run, or holding checkpoints) is shown as the
    fresh run ``--rerun`` would start, its note saying what a real run needs, so that a
    dry run for a cluster shows every cell's job script; a running cell is still refused."""
    try:
        return _plan_cell(cell, runs_dir, rerun=rerun, resume=resume, queued=queued, holding=holding)
    except PlanError as error:
        if not preview or st.is_locked(st.cell_dir(runs_dir, cell)):
            raise
        return Plan(cell=cell, directory=st.cell_dir(runs_dir, cell), action=FRESH,
                    note=f"previewed; a real run refuses it: {error}")


def _plan_cell(cell, runs_dir: Path, *, rerun: bool, resume: bool,
               queued: Callable[[st.Submission], bool] | None,
               holding: Callable[[], list[Path]] | None) -> Plan:
    directory = st.cell_dir(runs_dir, cell)
    state = st.read_state(directory)
    if st.is_locked(directory):
        holder = fs.lock_holder(directory)
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
        refusal = ck.ckpt_link_refusal(directory)
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
    found = holding() if holding is not None else []
    if resume and not found and state is not None and state.cleaned and state.cleaned.get("kept") is None:
        raise PlanError("its checkpoints were deleted by sweep clean --keep none, so --resume has nothing to "
                        "continue from; pass --rerun to start it over")
    if found:
        effective = st.effective_state(directory, state)
        if not resume:
            raise PlanError(f"was {effective} and has checkpoints in {' and '.join(map(str, found))}; pass "
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


def start_config(cell, resume: bool, session) -> dict:
    """The ``config.json`` of a fresh or resumed start: the target's config, then each plugin's
    changes for that start (``sweep_cell_start_config``: ``resume_mode`` for a target that
    has the key), in pluggy's call order."""
    config = cell.target_config()
    for changes in session.hook.sweep_cell_start_config(cell=cell, config=dict(config), resume=resume,
                                                        session=session):
        config.update(changes or {})
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
    """The job of a planned cell: the target's argv with the plugins' arguments appended, and
    its config for this start (and, as ``resume_argv`` / ``resume_config``, those of a
    resumed run, which a chain link runs). Checkpoint entries a fresh start deletes outside
    the cell dir are added once the cell is prepared (:mod:`sweepkit.run.prepare`)."""
    resume = plan.action == RESUME
    cell = plan.cell
    command = cell.target.render_argv(**paths(plan.directory))
    resume_args = cell_args(cell, True, session)
    resume_config = start_config(cell, True, session)
    return CellJob(
        nodeid=cell.nodeid,
        cell_dir=str(plan.directory),
        argv=command + (resume_args if resume else cell_args(cell, False, session)),
        resume_argv=command + resume_args,
        env=cell_env(cell, plan.directory, resume, session.hook.sweep_cell_env(cell=cell, session=session)),
        config=resume_config if resume else start_config(cell, False, session),
        resume_config=resume_config,
        gpus=cell_gpus(cell, session),
        resume=resume,
        token=uuid.uuid4().hex,
        executor=executor,
        fresh=None if resume else FreshStart(rerun=plan.rerun, record=st.cell_record(cell),
                                             config_hash=cell.config_hash(), profile=cell.profile),
    )
