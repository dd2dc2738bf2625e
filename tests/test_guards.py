"""Live guards: a cell whose entropy collapses is stopped, with a checkpoint, and says why."""

from __future__ import annotations

import json
import math

import pytest

from sweepkit_plugins.guards import asks_at_least, entropy_collapse, nonfinite_loss, reward_flat
from test_run import script_grid, started, state_of


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
    # The trainer writes NaN as null: a loss NaN from the first step on is one too.
    assert nonfinite_loss(_train(policy_loss=[None, None]), {}).startswith("policy/loss is null at step 1")
    assert nonfinite_loss([{"kind": "train", "step": 1, "reward/mean": 0.1}], {}) is None  # no loss logged
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
    assert ("guards: unknown 'entropy_colapse'; known: nonfinite_loss, entropy_collapse, reward_flat, "
            "ceiling_probe") in result.stderr


PROBE = '''
import json, os, sys, time
config = json.loads(open(os.environ["SWEEP_CONFIG"]).read())
with open(os.environ["SWEEP_METRICS"], "a") as metrics:
    for step in range(1, config["steps"] + 1):
        time.sleep(config["sleep"])
        metrics.write(json.dumps({"kind": "train", "step": step, "timing/step": 1.0}) + "\\n")
        metrics.flush()
        if step == config["steps"] and config["gpu_memory_utilization"] >= 0.9:
            sys.exit("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
'''


def test_asks_at_least_follows_the_direction_the_failed_probe_moved():
    failed = {"config": {"gmu": 0.9, "tp": 2, "model": "m"}, "diff": {"gmu": [0.8, 0.9]}}
    assert asks_at_least({"gmu": 0.95, "tp": 2, "model": "m"}, failed) == "gmu=0.95 > 0.9"
    assert asks_at_least({"gmu": 0.9, "tp": 2, "model": "m"}, failed) == "gmu=0.9"
    assert asks_at_least({"gmu": 0.85, "tp": 2, "model": "m"}, failed) is None  # asks less
    assert asks_at_least({"gmu": 0.95, "tp": 4, "model": "m"}, failed) is None  # another setting
    shrunk = {"config": {"tp": 2, "model": "m"}, "diff": {"tp": [4, 2]}}
    assert asks_at_least({"tp": 1, "model": "m"}, shrunk) == "tp=1 < 2"
    assert asks_at_least({"tp": 8, "model": "m"}, shrunk) is None
    bigger = {"config": {"model": "32b"}, "diff": {"model": ["7b", "32b"]}}
    assert asks_at_least({"model": "72b"}, bigger) is None  # names are only ever the same


def test_a_probe_whose_ceiling_already_failed_is_stopped_and_says_which(cpu_sweeper):
    program = cpu_sweeper.write("probe.py", PROBE)
    cpu_sweeper.grid("g", f"""
        import sweepkit as sk
        target = sk.command("{{python}}", {str(program)!r})
        base = sk.base(steps=4, sleep=0.25, gpu_memory_utilization=0.8)
        gmu090 = sk.cell(gpu_memory_utilization=0.9, marks=sk.mark.xfail(reason="OOMs"))
        gmu095 = sk.cell(gpu_memory_utilization=0.95, marks=sk.mark.xfail(reason="OOMs"))
    """)
    result = cpu_sweeper.run("run", "-k", "not base")
    assert result.ret == 0, result  # every probe failed as expected
    rule = "ceiling probe: grids/g.py::gmu090 already failed OOM as expected, and this cell asks at least as much"
    assert f"STOPPING      grids/g.py::gmu095  guard: {rule} (gpu_memory_utilization=0.95 > 0.9)" in result.stdout
    stopped = state_of(cpu_sweeper, "g", "gmu095")["attempts"][-1]
    assert stopped["failure_class"] == "GUARD" and stopped["failure"].startswith(f"guard: {rule}")
    steps = (cpu_sweeper.path / "runs/g/gmu095/metrics.jsonl").read_text().splitlines()
    assert len(steps) < 4  # stopped before the step at which it would have hit the ceiling
    # the probe that ran to its ceiling (a probe differing elsewhere would too: asks_at_least)
    assert len((cpu_sweeper.path / "runs/g/gmu090/metrics.jsonl").read_text().splitlines()) == 4
    status = {line.split()[0]: line for line in cpu_sweeper.run("status").stdout.splitlines() if line.split()}
    assert "XFAIL (GUARD: guard: ceiling probe: grids/g.py::gmu090" in status["grids/g.py::gmu095"]
    assert "XFAIL (OOM" in status["grids/g.py::gmu090"]
    report = json.loads(cpu_sweeper.run("report", "--format", "json").stdout)
    failure = {row["cell"]: row["failure"] for row in report["tables"]["throughput"]}
    assert failure["gmu095"].startswith(f"XFAIL (GUARD: guard: {rule}") and failure["gmu090"].startswith("XFAIL (OOM")
