"""Reading metrics from metrics.jsonl and WANDB_MIRROR stdout lines."""

from __future__ import annotations

import json

import pytest

from sweepkit.state import metrics


def rows(directory) -> list[dict]:
    """The cell's per-step frame (the one reader's), as dicts."""
    return metrics.scan(directory).collect().to_dicts()


def mirror(kind: str, step: int, **values) -> str:
    return f"WANDB_MIRROR kind={kind} step={step} metrics={json.dumps(values)}\n"


def test_stdout_lines_with_noise_and_a_cut_last_line(tmp_path):
    (tmp_path / "stdout.log").write_text(
        "loading model...\n"
        + mirror("train", 1, **{"timing/step": 4.0, "reward/mean": 0.1})
        + "(RayWorker pid=77) " + mirror("train", 2, **{"timing/step": 1.0, "reward/mean": 0.2})
        + mirror("eval", 2, **{"eval/pass_at_k": 0.5})
        + 'WANDB_MIRROR kind=train step=3 metrics={"timing/st'
    )
    records = rows(tmp_path)
    assert [(r["kind"], r["step"]) for r in records] == [("train", 1), ("train", 2), ("eval", 2)]
    assert records[1]["reward/mean"] == 0.2
    summary = metrics.summary(tmp_path)
    assert (summary.step, summary.reward) == (2, 0.2)
    assert summary.sec_per_step == 1.0  # step 1 is warm-up


def test_metrics_jsonl_is_preferred_and_repeated_steps_keep_the_last(tmp_path):
    (tmp_path / "stdout.log").write_text(mirror("train", 1, **{"reward/mean": 9.0}))
    lines = [{"kind": "train", "step": 1, "reward/mean": 0.1}, {"kind": "train", "step": 2, "reward/mean": 0.2},
             # a resumed run repeats step 2 after its checkpoint at step 1
             {"kind": "train", "step": 2, "reward/mean": 0.25}, {"kind": "info", "step": 0, "model": "x"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"kind": "tr')
    records = rows(tmp_path)
    assert [(r["kind"], r["step"], r.get("reward/mean")) for r in records] == [
        ("info", 0, None), ("train", 1, 0.1), ("train", 2, 0.25)]
    assert metrics.source(tmp_path)[0] == "jsonl"


def test_follower_reads_only_complete_lines_and_sees_a_restarted_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    follower = metrics.Follower(tmp_path)
    assert follower.summary().step is None
    path.write_text(json.dumps({"kind": "train", "step": 1, "timing/step": 2.0}) + "\n" + '{"kind": "train", "st')
    assert follower.summary().step == 1
    with open(path, "a") as handle:  # the writer finishes its line
        handle.write('ep": 2, "timing/step": 1.0, "reward/mean": 0.5}\n')
    summary = follower.summary()
    assert (summary.step, summary.sec_per_step, summary.reward) == (2, 1.0, 0.5)
    path.write_text(json.dumps({"kind": "train", "step": 1, "timing/step": 3.0}) + "\n")  # a fresh run
    assert follower.summary().step == 1


def test_sec_per_step_leaves_out_each_process_warm_up_as_the_report_does(tmp_path):
    # A run resumed at step 4: each process compiled at its first step (30 s, 25 s).
    times = {1: 30.0, 2: 1.0, 3: 1.2, 4: 1.1, 5: 25.0, 6: 0.9, 7: 1.0, 8: 1.2}
    lines = [{"kind": "info", "step": 0}, *({"kind": "train", "step": s, "timing/step": t} for s, t in times.items()
                                          if s <= 4),
             {"kind": "info", "step": 4}, *({"kind": "train", "step": s, "timing/step": t} for s, t in times.items()
                                            if s > 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    steady = [1.0, 1.2, 1.1, 0.9, 1.0, 1.2]
    assert metrics.summary(tmp_path).sec_per_step == pytest.approx(sum(steady) / len(steady))
    # Without the second info record, step 5 is no process's first: a slow step of the run, kept.
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines
                                                   if line != {"kind": "info", "step": 4}))
    kept = [*steady, 25.0]
    assert metrics.summary(tmp_path).sec_per_step == pytest.approx(sum(kept) / len(kept))


def test_a_record_whose_step_is_no_integer_is_left_out_and_named(tmp_path):
    lines = [{"kind": "train", "step": 1, "reward/mean": 0.1}, {"kind": "train", "step": "five", "reward/mean": 0.5},
             {"kind": "train", "step": True, "reward/mean": 0.6}, {"kind": 3, "step": 2},
             {"kind": "train", "step": 2, "reward/mean": 0.2}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    records = rows(tmp_path)
    assert [(r["kind"], r["step"]) for r in records] == [("train", 1), ("train", 2)]
    assert metrics.summary(tmp_path).step == 2
    problems = metrics.bad_lines(tmp_path)
    assert problems == [(2, "step 'five' is not an integer"), (3, "step True is not an integer"),
                        (4, "kind 3 is not a string")]


def test_status_and_report_skip_a_bad_metrics_line_and_name_it(sweeper):
    from test_run import script_grid

    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    script_grid(sweeper, "g", "other = sk.cell(steps=2)", steps=3, sleep=0.0)
    assert sweeper.run("run").ret == 0
    path = sweeper.path / "runs/g/base/metrics.jsonl"
    with open(path, "a") as handle:
        handle.write(json.dumps({"kind": "train", "step": "five", "timing/step": 1.0}) + "\n")
    n = len(path.read_text().splitlines())
    for command in (("status",), ("report", "--format", "csv", "--table", "throughput")):
        result = sweeper.run(*command)
        assert result.ret == 0, result
        assert "Traceback" not in result.output, result
        assert f"runs/g/base/metrics.jsonl:{n}: step 'five' is not an integer; the line is left out" in result.stderr
    report = sweeper.run("report", "--format", "json")
    rows = {row["cell"]: row for row in json.loads(report.stdout)["tables"]["throughput"]}
    assert rows["base"]["steps"] == 3 and rows["other"]["steps"] == 2
