"""Measure until sure: a timing run (``timing_target``) stops itself once its sec/step is known.

CPU step times are noise, so nothing here asserts a time: the rule (``trainer.timing``) is
fed scripted step times, and the loop runs on a clock that moves only by a scripted time
per step, so that a real run on the tiny model stops at a step known in advance.
"""

from __future__ import annotations

import io
import json
import random
import re

import pytest
import torch

from steadystate import steady_mean
from test_loop import read_metrics, run_trainer
from trainer.timing import TimingRule, earlier_steps

# A run's step times: a compile step, then steps within a few per cent of 1 s.
COMPILE = 6.0
STEADY = (1.00, 1.06, 0.95, 1.03, 0.98, 1.01, 0.99, 1.02, 0.97, 1.00,
          1.01, 0.99, 1.00, 1.02, 0.98, 1.01, 0.99, 1.00, 1.01, 0.99)


def verdicts(times, *, target=0.02, level=0.95, min_steps=5, **history):
    """The rule's verdict after each of ``times``."""
    rule = TimingRule(target=target, level=level, min_steps=min_steps, **history)
    out = []
    for seconds in times:
        rule.add(seconds)
        out.append(rule.verdict())
    return out


def first_stop(verdicts) -> int | None:
    """The 1-based position of the first verdict that stops the run."""
    return next((i for i, verdict in enumerate(verdicts, 1) if verdict.stop), None)


def first_precise_step(times, starts, *, target, min_steps, level=0.95) -> int | None:
    """The rule's definition, straight from steadystate: the first step whose steady-state
    interval is within ``target`` on at least ``min_steps`` timed steps."""
    for k in range(1, len(times) + 1):
        estimate = steady_mean(times[:k], [s for s in starts if s < k])
        interval = estimate.interval(level)
        if interval is not None and estimate.n >= min_steps and interval.relative_half_width <= target:
            return k
    return None


# -- the rule ---------------------------------------------------------------------------


def test_the_rule_leaves_out_the_compile_step_and_waits_for_timing_min_steps():
    tight = [COMPILE] + [1.0] * 12
    five = verdicts(tight, min_steps=5)
    # Alike steps give a zero-width interval at once: only the floor holds the run.
    assert "within the ±2% target but short of timing_min_steps=5" in five[3].reason
    assert first_stop(five) == 6  # 5 timed steps after the compile step
    assert (five[5].timed_steps, five[5].warmup_steps) == (5, 1)
    assert first_stop(verdicts(tight, min_steps=8)) == 9


def test_the_rule_stops_once_the_interval_is_within_the_target_and_says_why():
    times = [COMPILE, *STEADY]
    said = verdicts(times, target=0.02)
    stop = first_stop(said)
    assert stop == first_precise_step(times, [0], target=0.02, min_steps=5) == 13
    assert "not yet within the ±2% target" in said[stop - 2].reason
    verdict = said[stop - 1]
    estimate = steady_mean(times[:stop])
    assert verdict.reason == (f"sec/step {estimate.mean:.4g} ±1.8% (95% interval) over 12 timed steps after "
                              f"1 warm-up step: within the ±2% target")
    assert verdict.record() == {
        "rule": "timing_target", "reason": verdict.reason,
        "timing/sec_per_step": estimate.mean,
        "timing/half_width": estimate.interval(0.95).relative_half_width,
        "timing/timed_steps": 12, "timing/warmup_steps": 1,
    }
    assert verdict.half_width <= 0.02


def test_the_rule_never_stops_on_a_wide_series():
    rng = random.Random(3)
    wide = [COMPILE] + [rng.uniform(0.5, 1.5) for _ in range(30)]
    said = verdicts(wide, target=0.02)
    assert first_stop(said) is None
    assert "not yet within the ±2% target" in said[-1].reason and said[-1].half_width > 0.02


def test_the_rule_says_there_is_no_interval_before_two_timed_steps():
    said = verdicts([COMPILE, 1.0])
    assert [v.reason for v in said] == ["1 timed step after 0 warm-up steps: no interval yet",
                                        "1 timed step after 1 warm-up step: no interval yet"]
    assert not any(v.stop for v in said) and said[-1].record()["timing/half_width"] is None


def test_a_resumed_rule_counts_the_earlier_steps_and_each_process_warms_up_anew():
    # The metrics a resume keeps: a process that started at step 0 and ran 7 steps (read in
    # step order whatever the order of the lines), then the info of one that started at step 7.
    first = [COMPILE, *STEADY[:6]]
    records = [{"kind": "info", "step": 0}]
    records += [{"kind": "train", "step": step, "timing/step": seconds} for step, seconds in enumerate(first, 1)]
    records[2], records[3] = records[3], records[2]
    records += [{"kind": "eval", "step": 7, "eval/pass_at_1": 0.5}, {"kind": "stop", "step": 7, "rule": "x"},
                {"kind": "info", "step": 7}]
    times, starts = earlier_steps(records)
    assert times == first and starts == [0, 7]

    second = [COMPILE, *STEADY[6:10]]
    said = verdicts(second, target=0.03, earlier_times=times, earlier_starts=starts)
    stop = first_stop(said)
    everything = first + second
    # Alone, the second process's 2 timed steps would be far from ±3 %.
    assert 7 + stop == first_precise_step(everything, [0, 7], target=0.03, min_steps=5) == 10
    assert (said[stop - 1].timed_steps, said[stop - 1].warmup_steps) == (8, 2)  # a compile step each


# -- the loop -------------------------------------------------------------------------

# One quick step (one update of 2 prompts x 2 samples of 4 tokens) on the tiny model; the
# rule on at ±5 %, the cap far away.
TIMED = {
    "model": "tiny-random", "dataset": "synthetic", "seed": 7, "device": "cpu", "backend": "hf",
    "train_batch_size": 2, "policy_mini_batch_size": 2, "n_samples_per_prompt": 2,
    "micro_train_batch_size_per_gpu": 4, "micro_forward_batch_size_per_gpu": 4, "max_generate_length": 4,
    "epochs": 100, "max_steps": 20, "ckpt_interval": 0, "eval_before_train": False, "eval_limit": 2,
    "eval_n_samples_per_prompt": 2, "export_final": True,
    "timing_target": 0.05, "timing_level": 0.95, "timing_min_steps": 5,
}


class ScriptedClock:
    """``trainer.loop``'s ``time``: its clock moves only as a step draws its prompts (once a
    step, between the two readings that time the step), by that step's scripted time."""

    def __init__(self, step_times):
        self.step_times = list(step_times)
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += self.step_times.pop(0)


@pytest.fixture
def scripted_steps(monkeypatch):
    """Run ``trainer.loop.train`` with its step times scripted: ``scripted_steps(times)``."""
    from trainer import loop
    from trainer.data import PromptSampler

    draw = PromptSampler.next_batch
    clock = None

    def drawn_on_the_clock(sampler):
        clock.step()
        return draw(sampler)

    monkeypatch.setattr(PromptSampler, "next_batch", drawn_on_the_clock)
    torch.set_num_threads(1)

    def script(step_times) -> ScriptedClock:
        nonlocal clock
        clock = ScriptedClock(step_times)
        monkeypatch.setattr(loop, "time", clock)
        return clock

    return script


def train(tmp_path, **overrides):
    from trainer.config import TrainerConfig
    from trainer.loop import train

    stderr = io.StringIO()
    last = train(TrainerConfig(**{**TIMED, **overrides}), ckpt_dir=tmp_path / "ckpt",
                 metrics_path=tmp_path / "metrics.jsonl", stdout=io.StringIO(), stderr=stderr)
    return last, stderr.getvalue()


def test_a_timing_run_stops_once_sure_complete_and_goes_on_when_resumed_with_a_tighter_target(
        tmp_path, scripted_steps):
    metrics = tmp_path / "metrics.jsonl"
    ckpt = tmp_path / "ckpt"
    scripted_steps([COMPILE, *STEADY])
    last, stderr = train(tmp_path)  # returns: the run ended normally, complete

    train_steps = [r["step"] for r in read_metrics(metrics, "train")]
    logged = [r["timing/step"] for r in read_metrics(metrics, "train")]
    stop = first_precise_step(logged, [0], target=0.05, min_steps=5)
    assert stop == 7 and train_steps == list(range(1, stop + 1))  # 7 of max_steps=20
    [record] = read_metrics(metrics, "stop")
    assert record["step"] == stop and record["rule"] == "timing_target"
    assert record["reason"].endswith("over 6 timed steps after 1 warm-up step: within the ±5% target")
    assert (record["timing/timed_steps"], record["timing/warmup_steps"]) == (6, 1)
    assert record["timing/half_width"] <= 0.05
    assert record["timing/sec_per_step"] == pytest.approx(sum(STEADY[:6]) / 6)
    assert f"sweep-train: {record['reason']}; the run is complete at step 7" in stderr
    # As at a last step: its eval, its checkpoint, the export.
    assert [r["step"] for r in read_metrics(metrics, "eval")] == [stop]
    assert (ckpt / "latest").read_text().strip() == f"global_step_{stop}"
    assert (ckpt / "export").is_dir()
    assert last["timing/step"] == pytest.approx(STEADY[5])

    # Resumed with a tighter target: on from step 7, the first process's steps still counted
    # (the second process alone would have 2 timed steps at step 10), each process warming up.
    scripted_steps([COMPILE, *STEADY[6:]])
    _, stderr = train(tmp_path, resume_mode="latest", timing_target=0.03)

    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "info"] == [0, stop]
    logged = [r["timing/step"] for r in records if r["kind"] == "train"]
    resumed_stop = first_precise_step(logged, [0, stop], target=0.03, min_steps=5)
    assert resumed_stop == 10
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, resumed_stop + 1))
    assert logged[:stop] == pytest.approx([COMPILE, *STEADY[:6]])  # the first process's, kept
    first_record, second = read_metrics(metrics, "stop")
    assert first_record == record
    assert second["step"] == resumed_stop and "within the ±3% target" in second["reason"]
    assert (second["timing/timed_steps"], second["timing/warmup_steps"]) == (8, 2)
    assert (ckpt / "latest").read_text().strip() == f"global_step_{resumed_stop}"
    assert "resuming from" in stderr and f"the run is complete at step {resumed_stop}" in stderr

    # Resumed again as it is: it has measured enough, so it is complete without another step.
    scripted_steps([])
    _, stderr = train(tmp_path, resume_mode="latest", timing_target=0.03)
    assert [r["step"] for r in read_metrics(metrics, "train")] == list(range(1, resumed_stop + 1))
    assert f"the run is complete at step {resumed_stop}" in stderr


def test_a_timing_run_resumed_with_the_rule_off_runs_to_max_steps(tmp_path, scripted_steps):
    scripted_steps([COMPILE, *STEADY])
    train(tmp_path, export_final=False)
    [record] = read_metrics(tmp_path / "metrics.jsonl", "stop")

    scripted_steps(STEADY)
    train(tmp_path, export_final=False, resume_mode="latest", timing_target=None, max_steps=record["step"] + 3)
    steps = [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl", "train")]
    assert steps == list(range(1, record["step"] + 4))
    assert read_metrics(tmp_path / "metrics.jsonl", "stop") == [record]  # no second stop


def test_a_timing_run_that_reaches_max_steps_first_says_how_far_it_got(tmp_path, scripted_steps):
    scripted_steps([COMPILE, *STEADY])
    _, stderr = train(tmp_path, export_final=False, max_steps=6, timing_target=0.01)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl", "train")] == list(range(1, 7))
    assert read_metrics(tmp_path / "metrics.jsonl", "stop") == []
    assert re.search(r"timing_target not reached by the last step: sec/step \S+ ±[\d.]+% \(95% interval\) over "
                     r"5 timed steps after 1 warm-up step: not yet within the ±1% target", stderr), stderr


@pytest.mark.slow
def test_two_ranks_stop_at_rank_zeros_step(tmp_path):
    # Real CPU times, so a target no run misses (a 1 % interval is a sliver): the rule stops as
    # soon as 2 steps are timed, at step 2 or 3 (after at most one warm-up step); the ranks must
    # stop together, or the one left would wait in a collective until the test's timeout.
    config = {**TIMED, "num_cpu_ranks": 2, "export_final": False, "timing_target": 0.5, "timing_level": 0.01,
              "timing_min_steps": 2, "max_steps": 8}
    result = run_trainer(tmp_path, config)
    assert result.returncode == 0, result.stderr
    [record] = read_metrics(tmp_path / "metrics.jsonl", "stop")
    assert record["step"] in (2, 3) and record["timing/timed_steps"] + record["timing/warmup_steps"] == record["step"]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl", "train")] == list(range(1, record["step"] + 1))
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == f"global_step_{record['step']}"
    assert result.stderr.count("the run is complete at step") == 1  # rank 0 speaks for the run


# -- before anything runs ------------------------------------------------------------------


def test_sweep_run_names_a_bad_timing_key_before_anything_runs(sweeper):
    sweeper.grid("g", '''
import sweepkit as sk
base = sk.base(model="tiny-random", timing_target=0.02, timing_min_steps=12, max_steps=10)
wide = sk.cell(timing_target=1.5, max_steps=20)
sure = sk.cell(timing_level=1.0, max_steps=20)
''')
    result = sweeper.run("run")
    assert result.ret == 4, result
    err = result.stderr
    assert "base: timing_min_steps: 12 is above max_steps=10: the run would end before the rule could stop it" in err
    assert "wide: timing_target: must be in (0, 1), got 1.5" in err
    assert "sure: timing_level: must be in (0, 1), got 1.0" in err
    assert "3 errors found; nothing was run" in err
    runs = sweeper.path / "runs"
    assert not runs.exists() or not any(runs.rglob("state.json"))
