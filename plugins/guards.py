"""Live guards: stop a running cell whose metrics show it has gone wrong.

A guard reads a cell's metric records as they arrive (``sweep_watch_cell``) and names a
reason to stop it; the runner then stops the cell as ``sweep cancel`` does (the trainer
checkpoints its last step, so nothing is lost) and records the attempt failed with
failure class ``GUARD`` and the rule. A guard never changes a setting: the seeds forbid
altering a cell mid-series, so a cell is stopped, looked at, and rerun or resumed by hand.

Which guards watch a cell is the launch key ``guards`` (a list of the names in
:data:`KNOWN`; default ``["nonfinite_loss", "ceiling_probe"]``; ``[]`` switches them off):

* ``nonfinite_loss``: a train step's ``policy/loss`` is NaN or infinite, or null (how the
  trainer writes those: JSON has neither);
* ``entropy_collapse``: after ``guard_min_steps`` train steps, the mean ``policy/entropy``
  of the last three is below ``COLLAPSE_FRACTION`` of the first three's (the report's
  ``entropy_collapse`` flag, live);
* ``reward_flat``: the last ``guard_flat_steps`` train steps' ``reward/mean`` are all
  equal (a run that learns nothing more, or whose reward is broken);
* ``ceiling_probe``: a ceiling probe whose ceiling another probe of its grid already hit in
  this runs dir (:func:`ceiling_already_failed` states the rule).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import attrs

from sweepkit import hookimpl
from sweepkit.run import failures
from sweepkit.state import records as st

COLLAPSE_FRACTION = 0.2  # as sweepkit.report.tables's entropy_collapse
WINDOW = 3


def nonfinite_loss(train: list[dict], launch: dict) -> Optional[str]:
    for record in train:
        loss = record.get("policy/loss")
        if isinstance(loss, float) and not math.isfinite(loss):
            return f"policy/loss is {loss} at step {record['step']}"
        if loss is None and "policy/loss" in record:  # written as null: JSON has no NaN
            return f"policy/loss is null at step {record['step']} (the trainer writes NaN and inf as null)"
    return None


def entropy_collapse(train: list[dict], launch: dict) -> Optional[str]:
    entropy = [r["policy/entropy"] for r in train if isinstance(r.get("policy/entropy"), (int, float))]
    if len(entropy) < max(launch.get("guard_min_steps") or 0, 2 * WINDOW):
        return None
    first, last = sum(entropy[:WINDOW]) / WINDOW, sum(entropy[-WINDOW:]) / WINDOW
    if first > 0 and last < COLLAPSE_FRACTION * first:
        return (f"entropy collapse: policy/entropy {last:.3g} over the last {WINDOW} steps, below "
                f"{COLLAPSE_FRACTION:g} x its first {WINDOW} steps' {first:.3g} (step {train[-1]['step']})")
    return None


def reward_flat(train: list[dict], launch: dict) -> Optional[str]:
    steps = launch.get("guard_flat_steps") or 0
    rewards = [r["reward/mean"] for r in train if isinstance(r.get("reward/mean"), (int, float))]
    if steps < 2 or len(rewards) < steps:
        return None
    recent = rewards[-steps:]
    if max(recent) - min(recent) < 1e-12:
        return f"reward flat: reward/mean {recent[-1]:.3g} for the last {steps} steps (step {train[-1]['step']})"
    return None


GUARDS = {"nonfinite_loss": nonfinite_loss, "entropy_collapse": entropy_collapse, "reward_flat": reward_flat}
CEILING_PROBE = "ceiling_probe"
KNOWN = (*GUARDS, CEILING_PROBE)
# Failure classes that are a resource's ceiling; a crash (EXCEPTION, NCCL) or a lost node
# says nothing about what a bigger setting would do.
CEILING_CLASSES = (failures.OOM, failures.TIMEOUT)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_json(value: Any) -> Any:
    # cell.json holds the config through JSON: tuples are lists there.
    return json.loads(json.dumps(value, default=repr))


def asks_at_least(config: dict, other: dict) -> str | None:
    """How a cell's ``config`` asks at least as much as the probe whose ``cell.json`` is
    ``other`` (``key=value >= probe's``, joined), or None when it does not: see
    :func:`ceiling_already_failed`."""
    config, probe, diff = _as_json(dict(config)), other.get("config") or {}, other.get("diff") or {}
    for key in (set(config) | set(probe)) - set(diff):
        if config.get(key) != probe.get(key):
            return None  # it differs where the probe did not push: another ceiling
    parts = []
    for key, change in diff.items():
        before, after = change
        mine = config.get(key)
        if mine == after:
            parts.append(f"{key}={json.dumps(mine)}")
        elif all(map(_number, (before, after, mine))) and before != after and (after - before) * (mine - after) > 0:
            parts.append(f"{key}={json.dumps(mine)} {'>' if after > before else '<'} {json.dumps(after)}")
        else:
            return None
    return ", ".join(parts)


def ceiling_already_failed(cell, runs_dir: Path) -> str | None:
    """The reason to stop ``cell``, a ceiling probe, because its ceiling is already known:

    - ``cell`` is marked ``xfail`` (a ceiling probe);
    - another cell of its grid in this runs dir, also marked ``xfail``, failed as expected
      (XFAIL) with a ceiling's failure class (``OOM`` or ``TIMEOUT``; one of the xfail's
      ``raises=`` classes when ``cell``'s mark names them: ``sk.mark.xfail(reason=...,
      raises="OOM")``);
    - ``cell`` asks at least as much as that probe: their configs are equal except in the
      keys the probe's diff against base changes, and in each of those ``cell`` has the
      probe's value or a number further from base in the direction the probe moved
      (``gpu_memory_utilization`` 0.95 after 0.90 failed, up from base's 0.85; a smaller
      ``tensor_parallel_size`` after a smaller one failed). A key that is not a number (a
      model's name) matches only the same value.

    The cell itself is never its own evidence: the plan already skips a probe that failed
    as expected with the same config, so a probe that runs again was asked to
    (``--rerun``). The guard fires at the cell's first metrics record (guards are asked as
    records arrive), so a probe that fails while loading, before any record, meets its
    ceiling first; one that fails at its first steps (FSDP backward, weight sync) is stopped
    before them, with a checkpoint like any guard's stop.
    """
    if cell.xfail is None:
        return None
    raises = cell.xfail.kwargs.get("raises")
    named = set(CEILING_CLASSES) if raises is None else {raises} if isinstance(raises, str) else set(raises)
    expected = named & set(CEILING_CLASSES)
    if not expected:
        return None
    for directory in st.cell_dirs(Path(runs_dir) / cell.grid_name):
        if directory.name == cell.name:
            continue
        view = st.view(directory)
        if view.outcome != "xfailed" or view.attempt is None or view.record is None:
            continue
        setting = asks_at_least(cell.config, view.record)  # in memory, before the logs are read
        if setting is None:
            continue
        kind = failures.attempt_failure(directory, view.attempt, view.state, {}).kind
        if kind in expected:
            return (f"ceiling probe: {view.nodeid} already failed {kind} as expected, and this cell asks at least "
                    f"as much ({setting})")
    return None


@attrs.define(eq=False)  # a plugin is registered by identity
class CeilingGuard:
    """The ``ceiling_probe`` guard of one session's runs dir; it decides once per cell."""

    runs_dir: Path
    decided: dict[str, str | None] = attrs.field(factory=dict)

    @hookimpl
    def sweep_watch_cell(self, cell, records):
        if CEILING_PROBE not in (cell.launch().get("guards") or []):
            return None
        if cell.nodeid not in self.decided:
            self.decided[cell.nodeid] = ceiling_already_failed(cell, self.runs_dir)
        return self.decided[cell.nodeid]


@hookimpl
def sweep_configure(session):
    # The guard needs the runs dir, which sweep_watch_cell is not given: a plugin object
    # bound to this session's, as pytest's plugins that need the config are.
    session.pm.register(CeilingGuard(runs_dir=session.runs_dir), name="sweepkit_plugins.guards.ceiling_probe")


@hookimpl
def sweep_register_keys(register):
    register("guards", Optional[list], ["nonfinite_loss", CEILING_PROBE],
             f"live guards that stop the running cell (sweepkit_plugins.guards): any of {', '.join(KNOWN)}")
    register("guard_min_steps", int, 10, "train steps before entropy_collapse may fire")
    register("guard_flat_steps", int, 20, "reward_flat: how many equal rewards in a row stop the cell")


@hookimpl
def sweep_validate_cell(cell, session):
    names = cell.launch().get("guards") or []
    unknown = [name for name in names if name not in KNOWN]
    if unknown:
        return [f"guards: unknown {', '.join(map(repr, unknown))}; known: {', '.join(KNOWN)}"]
    return []


@hookimpl
def sweep_watch_cell(cell, records):
    launch = cell.launch()
    train = [record for record in records if record.get("kind") == "train"]
    for name in launch.get("guards") or []:
        reason = GUARDS[name](train, launch) if name in GUARDS else None
        if reason:
            return reason
    return None
