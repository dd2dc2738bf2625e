"""Live guards: stop a running cell whose metrics show it has gone wrong.

A guard reads a cell's metric records as they arrive (``sweep_watch_cell``) and names a
reason to stop it; the runner then stops the cell as ``sweep cancel`` does (the trainer
checkpoints its last step, so nothing is lost) and records the attempt failed with
failure class ``GUARD`` and the rule. A guard never changes a setting: the seeds forbid
altering a cell mid-series, so a cell is stopped, looked at, and rerun or resumed by hand.

Which guards watch a cell is the launch key ``guards`` (a list of the names in
:data:`GUARDS`; default ``["nonfinite_loss"]``; ``[]`` switches them off):

* ``nonfinite_loss``: a train step's ``policy/loss`` is NaN or infinite;
* ``entropy_collapse``: after ``guard_min_steps`` train steps, the mean ``policy/entropy``
  of the last three is below ``COLLAPSE_FRACTION`` of the first three's (the report's
  ``entropy_collapse`` flag, live);
* ``reward_flat``: the last ``guard_flat_steps`` train steps' ``reward/mean`` are all
  equal (a run that learns nothing more, or whose reward is broken).
"""

from __future__ import annotations

import math
from typing import Optional

from sweepkit import hookimpl

COLLAPSE_FRACTION = 0.2  # as sweepkit.report's entropy_collapse
WINDOW = 3


def nonfinite_loss(train: list[dict], launch: dict) -> Optional[str]:
    for record in train:
        loss = record.get("policy/loss")
        if isinstance(loss, float) and not math.isfinite(loss):
            return f"policy/loss is {loss} at step {record['step']}"
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


@hookimpl
def sweep_register_keys(register):
    register("guards", Optional[list], ["nonfinite_loss"],
             f"live guards that stop the running cell (sweepkit_plugins.guards): any of {', '.join(GUARDS)}")
    register("guard_min_steps", int, 10, "train steps before entropy_collapse may fire")
    register("guard_flat_steps", int, 20, "reward_flat: how many equal rewards in a row stop the cell")


@hookimpl
def sweep_validate_cell(cell, session):
    names = cell.launch().get("guards") or []
    unknown = [name for name in names if name not in GUARDS]
    if unknown:
        return [f"guards: unknown {', '.join(map(repr, unknown))}; known: {', '.join(GUARDS)}"]
    return []


@hookimpl
def sweep_watch_cell(cell, records):
    launch = cell.launch()
    train = [record for record in records if record.get("kind") == "train"]
    for name in launch.get("guards") or []:
        reason = GUARDS[name](train, launch)
        if reason:
            return reason
    return None
