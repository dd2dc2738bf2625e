"""benchmarks/: the parts of the TRL comparison that run without TRL (CI has none)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_trl_stops_before_the_run_when_trl_does_not_import(tmp_path):
    # A trl package that fails to import stands in for a missing or broken install,
    # whether or not the real one is installed on this machine.
    (tmp_path / "trl").mkdir()
    stub = tmp_path / "trl" / "__init__.py"
    stub.write_text("raise ModuleNotFoundError(\"No module named 'datasets'\")\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_trainer.py"), "--compare", "trl", "--steps", "1"],
        capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2, result
    assert "--compare trl: TRL is not importable" in result.stderr
    assert "No module named 'datasets'" in result.stderr
    assert "pip install trl==" in result.stderr
    assert result.stdout == ""  # the trainer's run never started


def test_comparison_lines_name_the_faster_side():
    bench_trainer = _load("bench_trainer")
    ours = {"sec_per_step": 10.0, "timing/generate": 8.0, "peak_memory_gb": 18.2, "backend": "static"}
    theirs = {"sec_per_step": 25.0, "generate_sec_per_step": 20.0, "peak_memory_gb": 30.0,
              "trl_version": "1.16.0", "device": "cuda:0", "dtype": "bfloat16", "steps_measured": 3}
    lines = bench_trainer.comparison_lines(ours, theirs)
    assert "ours 10.000  TRL 25.000" in lines[1]
    assert lines[-1].endswith("2.50: ours is 2.5× faster")
    slower = bench_trainer.comparison_lines({**ours, "sec_per_step": 50.0}, theirs)
    assert slower[-1].endswith("0.50: TRL is 2.0× faster")
    close = bench_trainer.comparison_lines({**ours, "sec_per_step": 25.5}, theirs)
    assert close[-1].endswith("0.98: TRL is 1.02× faster")


def test_prompts_for_trl_are_left_truncated_to_the_prompt_length():
    from trainer.models import byte_tokenizer

    bench_trl = _load("bench_trl")
    tokenizer = byte_tokenizer()
    prompts = ["short", "x" * 300 + " the ask", "€" * 200]
    kept = bench_trl.left_truncated(prompts, tokenizer, 256)
    lengths = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in kept]
    assert kept[0] == "short"
    assert lengths[1] == 256 and kept[1].endswith(" the ask")
    # 256 bytes of 3-byte characters: the cut character is dropped, not sent as U+FFFD.
    assert kept[2] == "€" * 85 and lengths[2] == 255


def test_the_timing_rule_replay_adds_up_what_each_target_would_have_spent(tmp_path, capsys):
    import json

    bench = _load("bench_timing_rule")
    steady = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0]
    noisy = [1.0, 1.6, 0.7, 1.4, 0.6, 1.5, 0.8, 1.3, 0.5, 1.2]
    for name, times in (("steady", [30.0, *steady]), ("noisy", [30.0, *noisy])):
        cell = tmp_path / name
        cell.mkdir()
        records = [{"kind": "info", "step": 0},
                   *({"kind": "train", "step": s, "timing/step": t} for s, t in enumerate(times, 1))]
        (cell / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (cell / "cell.json").write_text(json.dumps({"launch": {"gpus": 4}}))
    assert bench.main([str(tmp_path), "--targets", "0.02", "--budget-minutes", "1"]) == 0
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    # steady: within ±2 % once it has 5 timed steps (step 6, after the 30 s compile step); noisy: never
    assert lines["steady"][1:] == ["4", "11", f"{30 + sum(steady):.1f}", "6", f"{30 + sum(steady[:5]):.1f}"]
    assert lines["noisy"][4] == "-"
    assert lines["GPU-seconds:"][-1] == str(4 * 60 * 2)  # the fixed budget: 2 cells x 4 GPUs x 60 s


def test_profile_update_profiles_the_last_steps_update_and_sums_it_by_kind(capsys, monkeypatch):
    import trainer.loop

    monkeypatch.setattr(trainer.loop, "update_policy", trainer.loop.update_policy)  # restored after the test
    bench = _load("bench_trainer")
    assert bench.main(["--steps", "2", "--prompts", "2", "--samples", "2", "--generate-length", "4",
                       "--device", "cpu", "--profile-update"]) == 0
    err = capsys.readouterr().err
    assert "the update of step 1" not in err  # the second (last) step's update, and only it
    total, kinds, _ = _kinds_and_quarters(err, "the update of step 2: ")
    assert "gemm" in kinds  # the matmuls of the forward and backward, found by name
    assert abs(sum(kinds.values()) - total) <= 0.1 * len(kinds) + 0.05  # the kinds add up to the whole


def _kinds_and_quarters(err: str, title: str) -> tuple[float, dict, dict]:
    """The total, each kind's ms and its four quarters' ms from a print_kernel_kinds block."""
    head, _, rest = err.partition(title)
    assert head is not None and rest, err
    total = float(rest.split(" ms")[0])
    lines = iter(rest.splitlines()[1:])
    kinds, quarters = {}, {}
    for line in lines:
        if line.strip().startswith("by quarter"):
            break
        name, ms, _, _ = line.rsplit(None, 3)  # "  triton (compiled)   36.4 ms   6.7%"
        kinds[name.strip()] = float(ms)
    for line in lines:
        if line.strip().startswith("top "):
            break
        *name, q1, q2, q3, q4 = line.split()
        quarters[" ".join(name)] = [float(q) for q in (q1, q2, q3, q4)]
    return total, kinds, quarters


def test_profile_generate_profiles_the_last_steps_rollout_by_kind_and_quarter(capsys, monkeypatch):
    import trainer.loop

    monkeypatch.setattr(trainer.loop, "set_up", trainer.loop.set_up)  # restored after the test
    bench = _load("bench_trainer")
    assert bench.main(["--steps", "2", "--prompts", "2", "--samples", "2", "--generate-length", "6",
                       "--device", "cpu", "--profile", "generate"]) == 0
    err = capsys.readouterr().err
    assert "the generate of step 1" not in err and "the update of" not in err
    total, kinds, quarters = _kinds_and_quarters(err, "the generate of step 2: ")
    assert "gemm" in kinds  # the engine's projections and lm_head, found by name
    assert abs(sum(kinds.values()) - total) <= 0.1 * len(kinds) + 0.05
    assert set(quarters) == set(kinds)
    for kind, parts in quarters.items():  # each kind's quarters add up to its time
        assert abs(sum(parts) - kinds[kind]) <= 0.2 + 0.05, (kind, parts)


def test_idle_gaps_are_the_stretches_no_kernel_covers():
    bench = _load("bench_trainer")
    kernels = [("c", 30.0, 35.0), ("a", 0.0, 10.0), ("b", 5.0, 20.0), ("d", 100.0, 101.0)]  # b overlaps a
    assert bench.idle_gaps(kernels) == [(10.0, "b", "c"), (65.0, "c", "d")]
    assert bench.idle_gaps(kernels, at_least_us=50) == [(65.0, "c", "d")]
    assert bench.idle_gaps([("a", 0.0, 10.0), ("b", 10.0, 12.0)]) == []  # back to back: no gap


def test_kernel_kinds_tell_gemms_attention_and_compiled_kernels_apart():
    bench = _load("bench_trainer")
    assert bench.kernel_kind("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT") == "gemm"
    assert bench.kernel_kind("triton_tem_fused_flex_attention_backward_transpose_view_5") == "attention"
    assert bench.kernel_kind("triton_poi_fused__to_copy_arange_eq_exp_mul_where_0") == "triton (compiled)"
    assert bench.kernel_kind("void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata>") \
        == "optimizer"
    assert bench.kernel_kind("Memcpy DtoD (Device -> Device)") == "copy/cast"
    # The decode step's Triton kernels (trainer/rollout): attention and the sampler
    assert bench.kernel_kind("_fused_kernel") == bench.kernel_kind("_merge_kernel") == "attention"
    assert bench.kernel_kind("_span_kernel") == bench.kernel_kind("_pick_kernel") == "sampler"
    assert bench.kernel_kind("triton_per_fused_add_mul_rsqrt_0") == "triton (compiled)"


def test_an_ab_verdict_calls_a_difference_only_when_the_steps_cannot_give_it_by_chance():
    verdict = _load("bench_ab").verdict
    assert "too few to tell" in verdict([1.0, 1.01], [0.9, 0.91])  # 2 and 2 steps split so 1 time in 3
    assert "new faster at every one (4 and 4 steps; by chance 2.9%)" in verdict([1.0, 1.01, 1.02, 1.0],
                                                                                [0.9, 0.91, 0.92, 0.9])
    assert "new slower at every one" in verdict([1.0] * 4, [1.1, 1.2, 1.3, 1.4])
    assert "inside the noise" in verdict([1.0, 1.01, 1.02, 1.0], [0.9, 1.005, 0.92, 0.9])
    assert "(3 and 3 runs)" in verdict([30.0, 31.0, 33.0], [29.0, 32.0, 34.0], counted="runs")


def test_an_ab_start_is_the_build_and_the_first_step_together():
    """A change that moves work from the first step into the build (or back) shows in neither alone."""
    start = _load("bench_ab").start_seconds
    assert start({"first_step_s": 30.0, "startup": {"phases": {"build": {"seconds": 5.0, "count": 1}}}}) == 35.0
    assert start({"first_step_s": 30.0, "startup": {"phases": {}}}) == 30.0  # a run that timed no build


def test_ab_rounds_alternate_which_tree_goes_first():
    order = _load("bench_ab").round_order
    trees = {"base": "b", "new": "n"}
    assert [order(trees, r) for r in range(4)] == [["base", "new"], ["new", "base"]] * 2


def test_ab_runs_the_base_trees_trainer_and_this_ones_in_turn(tmp_path):
    """A cold round of the tiny shape on the CPU, the base a copy of this checkout's benchmarks and
    trainer (a tree of its own): each runs its own tree's code, and the verdicts of the steps, the
    starts and the processes follow."""
    import shutil

    root = BENCHMARKS.parent
    base = tmp_path / "base"
    for part in ("benchmarks", "trainer"):
        shutil.copytree(root / part, base / part, ignore=shutil.ignore_patterns("__pycache__"))
    marker = base / "trainer" / "__init__.py"
    marker.write_text(marker.read_text() + "\nimport sys\nprint('the base tree', file=sys.stderr)\n")
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_ab.py"), "--base", str(base), "--model", "tiny-random",
         "--prompts", "2", "--samples", "2", "--prompt-length", "16", "--generate-length", "8", "--steps", "3",
         "--cold", "--device", "cpu", "--logs", str(tmp_path / "logs")], capture_output=True, text=True, timeout=300,
        env=os.environ | {"CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "the base tree" in (tmp_path / "logs" / "tiny-random-base-1.err").read_text()
    assert "the base tree" not in (tmp_path / "logs" / "tiny-random-new-1.err").read_text()
    lines = run.stdout.splitlines()
    assert lines[1].startswith("  base ") and lines[2].startswith("  new ")
    assert all("(cold cache)" in line and " start " in line and " process " in line for line in lines[1:3])
    assert lines[3].startswith("  steps: new / base ") and "2 and 2 steps" in lines[3]
    assert lines[4].startswith("  cold starts: new / base ") and "1 and 1 runs" in lines[4]
    assert lines[5].startswith("  cold processes: new / base ") and "1 and 1 runs" in lines[5]
    missing = subprocess.run([sys.executable, str(BENCHMARKS / "bench_ab.py"), "--base", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no benchmarks/bench_trainer.py there" in missing.stderr
