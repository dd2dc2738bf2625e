"""Live guards: a cell whose entropy collapses is stopped, with a checkpoint, and says why."""

from __future__ import annotations

import json
import math

import pytest

from sweepkit_plugins.guards import entropy_collapse, nonfinite_loss, reward_flat
from test_run import script_grid, started


def _train(**series):
    length = len(next(iter(series.values())))
    return [{"kind": "train", "step": i + 1, **{key.replace("_", "/", 1): values[i] for key, values in series.items()}}
            for i in range(length)]


def test_entropy_collapse_fires_only_past_the_min_steps_and_the_fraction():
    falling = _train(policy_entropy=[2.0 / (i + 1) for i in range(12)])
    assert entropy_collapse(falling[:9], {"guard_min_steps": 10}) is None  # too early
    reason = entropy_collapse(falling, {"guard_min_steps": 10})
    assert reason.startswith("entropy collapse: policy/entropy") and "(step 12)" in reason
    steady = _train(policy_entropy=[2.0 - 0.05 * i for i in range(12)])
    assert entropy_collapse(steady, {"guard_min_steps": 10}) is None


def test_nonfinite_loss_and_flat_reward():
    assert nonfinite_loss(_train(policy_loss=[0.1, math.nan]), {}) == "policy/loss is nan at step 2"
    assert nonfinite_loss(_train(policy_loss=[0.1, 0.2]), {}) is None
    assert reward_flat(_train(reward_mean=[0.1, 0.5, 0.5, 0.5]), {"guard_flat_steps": 3}).startswith("reward flat")
    assert reward_flat(_train(reward_mean=[0.1, 0.5, 0.5, 0.5]), {"guard_flat_steps": 4}) is None


@pytest.fixture
def cpu_sweeper(sweeper):
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    return sweeper


def test_a_cell_whose_entropy_collapses_is_stopped_with_a_checkpoint(cpu_sweeper):
    # tests/cell_program.py logs policy/entropy = 1/step: it collapses by step 10
    script_grid(cpu_sweeper, "g", """
        unguarded = sk.cell(guards=[], steps=12)
    """, steps=40, sleep=0.15, guards=["entropy_collapse"])
    result = cpu_sweeper.run("run")
    assert result.ret == 1, result
    assert "STOPPING      grids/g.py::base  guard: entropy collapse" in result.stdout
    state = json.loads((cpu_sweeper.path / "runs" / "g" / "base" / "state.json").read_text())
    attempt = state["attempts"][-1]
    assert state["state"] == "failed" and attempt["failure_class"] == "GUARD"
    assert attempt["failure"].startswith("guard: entropy collapse")
    steps = [int(p.name.split("_")[1]) for p in (cpu_sweeper.path / "runs/g/base/ckpt").iterdir()]
    assert 10 <= max(steps) < 40  # stopped soon after the rule fired, its steps checkpointed
    assert "FAILED grids/g.py::base - guard: entropy collapse" in result.stdout  # the short summary
    unguarded = json.loads((cpu_sweeper.path / "runs" / "g" / "unguarded" / "state.json").read_text())
    assert unguarded["state"] == "completed"
    status = cpu_sweeper.run("status")
    assert "guard: entropy collapse" in status.stdout
    assert sorted(started(cpu_sweeper)) == ["base", "unguarded"]


def test_an_unknown_guard_is_refused_naming_it(cpu_sweeper):
    script_grid(cpu_sweeper, "g", "", guards=["entropy_colapse"])
    result = cpu_sweeper.run("run", "--dry-run")
    assert result.ret == 4
    assert "guards: unknown 'entropy_colapse'; known: nonfinite_loss, entropy_collapse, reward_flat" in result.stderr
