"""Seconds per step, tokens/s, the timing split and peak memory of the trainer's loop.

Runs the real loop (``trainer.loop.train``) for a few steps on a throwaway
checkpoint dir and summarises its metrics, leaving out the first ``--warmup``
steps (allocator and kernel warm-up). The H200 run the numbers are wanted for::

    python benchmarks/bench_trainer.py --model random:qwen2.5-0.5b \\
        --dataset /path/to/gsm8k --prompts 32 --samples 4 \\
        --prompt-length 256 --generate-length 512 --steps 4

A random-init model rarely samples its eos token, so every completion runs to
``--generate-length``: the generation numbers are for full-length decodes.
Any other trainer key can be set with ``--set key=value``.

``--compare trl`` then runs ``bench_trl.py`` (TRL's ``GRPOTrainer`` on the same model,
prompts and reward) in its own process with the same shape arguments, and prints both
seconds per step and their ratio. TRL is not a dependency of this project; it is checked
for before the trainer's run, so a missing install fails in seconds.

``--profile update`` runs the last step's policy update under ``torch.profiler`` and prints
its device time by kind of kernel (GEMMs, attention, the compiled Triton kernels, the
optimizer, copies), how busy the device was over the stage's wall time, each kind's time in
each quarter of the stage, and its top kernels: where the update's time goes, measured.
``--profile generate`` does the same for the last step's rollout (prefill, then the decode
steps, whose attention reads more columns in each quarter). A profiled stage's time then
includes the profiler's own, so read sec/step from a run without it::

    python benchmarks/bench_trainer.py --model random:qwen2.5-0.5b --dataset /path/to/gsm8k \
        --prompts 32 --samples 4 --generate-length 512 --steps 4 --set enforce_eager=false \
        --profile generate --profile update

(``--profile-update`` is ``--profile update``.)
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.config import ConfigError, TrainerConfig, parse_value  # noqa: E402

SPLIT = ("timing/generate", "timing/ref", "timing/policy_train", "timing/sync_weights")
TRL_BENCH = Path(__file__).with_name("bench_trl.py")
# The arguments bench_trl.py shares with this script: the shape both runs must have.
SHAPE_ARGUMENTS = ("model", "dataset", "prompts", "samples", "prompt_length", "generate_length",
                   "steps", "warmup", "device")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--dataset", default="synthetic", help="'synthetic' or a GSM8K directory/file")
    parser.add_argument("--prompts", type=int, default=8, help="train_batch_size (prompts per step)")
    parser.add_argument("--samples", type=int, default=4, help="n_samples_per_prompt")
    parser.add_argument("--prompt-length", type=int, default=256, help="max_prompt_length")
    parser.add_argument("--generate-length", type=int, default=64, help="max_generate_length")
    parser.add_argument("--steps", type=int, default=3, help="steps to run, warm-up included")
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the summary")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="any other trainer key (repeatable)")
    parser.add_argument("--memory-gb", type=float, default=None,
                        help="cap this process's share of the GPU's memory at this many GB (as a smaller card "
                             "would hold it: an A100-64GB is --memory-gb 64)")
    parser.add_argument("--profile", action="append", default=[], choices=PROFILED,
                        help="profile this stage of the last step: device time by kind of kernel, top kernels "
                             "(repeatable)")
    parser.add_argument("--profile-update", dest="profile", action="append_const", const="update",
                        help="the same as --profile update")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--compare", choices=("trl",),
                        help="then run TRL's GRPOTrainer on the same shape (bench_trl.py), print the ratio")
    return parser.parse_args(argv)


def bench_config(args) -> TrainerConfig:
    values = {
        "model": args.model, "dataset": args.dataset, "device": args.device,
        "train_batch_size": args.prompts, "policy_mini_batch_size": args.prompts,
        "n_samples_per_prompt": args.samples, "max_prompt_length": args.prompt_length,
        "max_generate_length": args.generate_length, "max_steps": args.steps, "epochs": 1000,
        "eval_before_train": False, "eval_limit": 1, "eval_n_samples_per_prompt": 1,
        "ckpt_interval": 0, "export_final": False, "progress_bar": False,
    }
    for item in args.set:
        key, _, text = item.partition("=")
        values[key] = parse_value(text)
    return TrainerConfig.from_dict(values, source="bench_trainer.py")


def summarise(records: list[dict], warmup: int) -> dict:
    kept = records[warmup:] or records
    mean = lambda key: statistics.fmean(r[key] for r in kept)  # noqa: E731
    summary = {
        "steps_measured": len(kept),
        "sec_per_step": mean("timing/step"),
        "tokens_per_s": sum(r["throughput/tokens_generated"] for r in kept) / sum(r["timing/step"] for r in kept),
        "generate_tokens_per_s": sum(r["throughput/tokens_generated"] for r in kept)
        / sum(r["timing/generate"] for r in kept),
        "response_length_mean": mean("response_length/mean"),
        "peak_memory_gb": max(r["memory/peak_gb"] for r in kept),
        "peak_memory_gb_all_steps": max(r["memory/peak_gb"] for r in records),
        "first_step_s": records[0]["timing/step"],
        "first_step_split": {key: round(records[0][key], 3) for key in SPLIT},
    }
    summary |= {key: mean(key) for key in SPLIT}
    # The host's share: prompts encoded, completions decoded and scored, the batch built.
    summary["outside_stages"] = summary["sec_per_step"] - sum(summary[key] for key in SPLIT)
    summary["each_step"] = [round(r["timing/step"], 4) for r in kept]
    return summary


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cfg = bench_config(args)
    except ConfigError as exc:
        print(f"bench_trainer: {exc}", file=sys.stderr)
        return 2
    if args.compare == "trl":
        problem = trl_problem()
        if problem is not None:
            print(f"bench_trainer: --compare trl: {problem}", file=sys.stderr)
            return 2
    from trainer import startup
    from trainer.loop import train

    if args.memory_gb is not None:
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_gb * 1e9 / total))
    for stage in dict.fromkeys(args.profile):
        PROFILED[stage](cfg.max_steps)
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as scratch:
        metrics = Path(scratch) / "metrics.jsonl"
        with open(Path(scratch) / "stdout.log", "w") as quiet:
            train(cfg, ckpt_dir=Path(scratch) / "ckpt", metrics_path=metrics, stdout=quiet)
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
    train_records = [r for r in records if r["kind"] == "train"]
    info = next(r for r in records if r["kind"] == "info")
    summary = {"model": cfg.model, "device": info["device"], "dtype": info["dtype"],
               "backend": info.get("backend"),
               "prompts": cfg.train_batch_size, "samples": cfg.n_samples_per_prompt,
               **summarise(train_records, args.warmup), "startup": startup.summary()}
    if args.json:
        if args.compare == "trl":
            return compare_with_trl(args, summary, as_json=True)
        print(json.dumps(summary))
        return 0
    print(f"{summary['model']} on {summary['device']} ({summary['dtype']}), "
          f"{cfg.train_batch_size} prompts x {cfg.n_samples_per_prompt} samples, "
          f"prompt <= {cfg.max_prompt_length}, {cfg.max_generate_length} new tokens, "
          f"{summary['steps_measured']} steps measured")
    print(f"  sec/step            {summary['sec_per_step']:.3f}")
    print(f"  tokens/s (step)     {summary['tokens_per_s']:.1f}")
    print(f"  tokens/s (generate) {summary['generate_tokens_per_s']:.1f}")
    for key in SPLIT:
        share = summary[key] / summary["sec_per_step"]
        print(f"  {key:<20}{summary[key]:.3f} s ({share:.0%})")
    print(f"  {'outside the stages':<20}{summary['outside_stages']:.3f} s "
          f"({summary['outside_stages'] / summary['sec_per_step']:.0%})")
    print(f"  each step           {', '.join(f'{t:.3f}' for t in summary['each_step'])}")
    print(f"  response length     {summary['response_length_mean']:.1f}")
    print(f"  peak memory         {summary['peak_memory_gb']:.2f} GB")
    print(f"  start               {startup.describe(summary['first_step_s'])}")
    if args.compare == "trl":
        return compare_with_trl(args, summary, as_json=False)
    return 0


# -- --profile update / generate ---------------------------------------------------------------

# Kinds of kernel by name, first match wins: cuBLAS/CUTLASS GEMMs, attention (flex
# attention's templates, SDPA's flash/efficient kernels, the decode attention's Triton
# kernels), the decode sampler's Triton kernels, the optimizer, the rest of what
# torch.compile generated (fused norms, activations, the log-prob chunks), copies and casts.
KERNEL_KINDS = (
    ("gemm", re.compile(r"gemm|^aten::(mm|addmm|bmm)$|nvjet|cutlass|xmma|sm90_|sm80_|ampere_|hopper", re.I)),
    ("attention", re.compile(r"flex|flash|fmha|attention|triton_tem|^_(fused|split|merge)_kernel", re.I)),
    ("sampler", re.compile(r"^_(span|pick)_kernel")),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach|clip", re.I)),
    ("triton (compiled)", re.compile(r"^triton_", re.I)),
    ("copy/cast", re.compile(r"copy|cast|convert|fill|memset|memcpy|cat|index", re.I)),
)


def kernel_kind(name: str) -> str:
    return next((kind for kind, pattern in KERNEL_KINDS if pattern.search(name)), "other")


def profile_last_update(steps: int) -> None:
    """Profile the ``steps``-th call of the loop's ``update_policy``."""
    import trainer.loop as loop

    loop.update_policy = _profiled(loop.update_policy, steps, "update")


def profile_last_generate(steps: int) -> None:
    """Profile the ``steps``-th call of the run's rollout engine's ``generate`` (the loop's set_up
    is wrapped to reach the engine it builds)."""
    import trainer.loop as loop

    inner_set_up = loop.set_up

    def set_up(*args, **kwargs):
        run = inner_set_up(*args, **kwargs)
        run.engine.generate = _profiled(run.engine.generate, steps, "generate")
        return run

    loop.set_up = set_up


def _profiled(inner, steps: int, stage: str):
    """``inner`` whose ``steps``-th call runs under torch.profiler, its kernels printed by kind
    (stderr) as it returns. On a CPU: its ops, by self time."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    calls = []
    cuda = torch.cuda.is_available()

    def wrapper(*args, **kwargs):
        calls.append(None)
        if len(calls) != steps:  # the last step's call only (a run's final evaluation generates too)
            return inner(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            started = time.perf_counter()
            out = inner(*args, **kwargs)
            if cuda:
                torch.cuda.synchronize()
            wall_us = (time.perf_counter() - started) * 1e6
        print_kernel_kinds(prof.events(), cuda=cuda, title=f"the {stage} of step {len(calls)}", wall_us=wall_us)
        return out

    return wrapper


PROFILED = {"update": profile_last_update, "generate": profile_last_generate}


def print_kernel_kinds(events, *, cuda: bool, title: str, top: int = 25, wall_us: float | None = None) -> None:
    """Device time (CPU: self time) by kind of kernel; the device's busy share of ``wall_us``; each
    kind's time in each quarter of the span from the first kernel's start to the last one's end
    (by start time); the ``top`` kernels by time."""
    if cuda:
        kernels = [event for event in events if event.device_type.name == "CUDA"]
        timed = [(event.name, event.device_time_total, event.time_range.start) for event in kernels]
    else:
        timed = [(event.name, event.self_cpu_time_total, event.time_range.start) for event in events]
    kinds_of = {name: kernel_kind(name) for name, _, _ in timed}  # once a name: a rollout launches 100k+
    total = sum(time_us for _, time_us, _ in timed) or 1.0
    by_kind, by_name = {}, {}
    for name, time_us, _ in timed:
        kind = kinds_of[name]
        by_kind[kind] = by_kind.get(kind, 0.0) + time_us
        name_us, count = by_name.get(name, (0.0, 0))
        by_name[name] = (name_us + time_us, count + 1)
    what = "kernels" if cuda else "CPU ops (self time)"
    busy = f" over {wall_us / 1e3:.1f} ms of wall time ({total / wall_us:.0%} busy)" if wall_us and cuda else ""
    print(f"{title}: {total / 1e3:.1f} ms of {what}, {len(timed)} launches{busy}", file=sys.stderr)
    kinds = sorted(by_kind, key=lambda kind: -by_kind[kind])
    for kind in kinds:
        print(f"  {kind:<18} {by_kind[kind] / 1e3:8.1f} ms  {by_kind[kind] / total:6.1%}", file=sys.stderr)
    quarters = _by_quarter([(kinds_of[name], time_us, start) for name, time_us, start in timed])
    print("  by quarter (ms):   " + " ".join(f"{f'Q{q + 1}':>7}" for q in range(4)), file=sys.stderr)
    for kind in kinds:
        print(f"  {kind:<18} " + " ".join(f"{quarters[q].get(kind, 0.0) / 1e3:7.1f}" for q in range(4)),
              file=sys.stderr)
    print(f"  top {top} (ms, launches, kind):", file=sys.stderr)
    for name, (time_us, count) in sorted(by_name.items(), key=lambda item: -item[1][0])[:top]:
        print(f"  {time_us / 1e3:8.2f} {count:6d}  {kinds_of[name]:<18} {name[:110]}", file=sys.stderr)
    if cuda:
        print_gaps([(event.name, event.time_range.start, event.time_range.end) for event in kernels])


def idle_gaps(kernels, at_least_us: float = 0.0) -> list[tuple[float, str, str]]:
    """The stretches where no kernel ran, between the first kernel's start and the last one's
    end: (us, the kernel before, the kernel after) of each of at least ``at_least_us``, from
    ``kernels`` (name, start us, end us) in any order."""
    gaps, busy_until, before = [], None, None
    for name, start, end in sorted(kernels, key=lambda kernel: kernel[1]):
        if busy_until is not None and start - busy_until >= max(at_least_us, 1e-9):
            gaps.append((start - busy_until, before, name))
        if busy_until is None or end >= busy_until:
            busy_until, before = end, name
    return gaps


def print_gaps(kernels, *, at_least_us: float = 50.0, top: int = 8) -> None:
    """The idle stretches of ``at_least_us`` or more: how many, their sum, the longest and the
    kernels around them (where the host held the device up: a sync, a host-side loop)."""
    gaps = idle_gaps(kernels)
    long = [gap for gap in gaps if gap[0] >= at_least_us]
    print(f"  idle between kernels: {sum(gap[0] for gap in gaps) / 1e3:.1f} ms in {len(gaps)} gaps; "
          f"{sum(gap[0] for gap in long) / 1e3:.1f} ms of it in {len(long)} gaps of {at_least_us:.0f} us or more",
          file=sys.stderr)
    for us, before, after in sorted(long, reverse=True)[:top]:
        print(f"  {us / 1e3:8.2f} ms after {before[:60]} before {after[:60]}", file=sys.stderr)


def _by_quarter(timed) -> list[dict[str, float]]:
    """Each kind's time in each quarter of the span of start times of ``timed`` (kind, us, start)."""
    quarters = [{} for _ in range(4)]
    if not timed:
        return quarters
    first = min(start for _, _, start in timed)
    span = (max(start for _, _, start in timed) - first) or 1.0
    for kind, time_us, start in timed:
        part = quarters[min(3, int(4 * (start - first) / span))]
        part[kind] = part.get(kind, 0.0) + time_us
    return quarters


# -- --compare trl ------------------------------------------------------------------------------


def trl_problem() -> str | None:
    """None when bench_trl.py can import TRL's GRPOTrainer with this Python, else why not."""
    check = subprocess.run([sys.executable, str(TRL_BENCH), "--check"], capture_output=True, text=True)
    if check.returncode == 0:
        return None
    lines = check.stderr.strip().splitlines()
    if not lines:
        return f"{TRL_BENCH.name} --check exited {check.returncode}"
    return lines[-1].removeprefix("bench_trl: ")


def compare_with_trl(args, ours: dict, *, as_json: bool) -> int:
    """Run bench_trl.py on the same shape in its own process; print both and the ratio."""
    if args.set:
        print("bench_trainer: --set applies to the trainer's run only, not to TRL's", file=sys.stderr)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()  # the child gets the memory our run held
    shape = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in SHAPE_ARGUMENTS]
    # TRL's stderr (its logs, warnings, a traceback) passes through; stdout is its JSON summary.
    command = [sys.executable, str(TRL_BENCH), "--json", *shape]
    run = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if run.returncode != 0:
        print(f"bench_trainer: --compare trl: {TRL_BENCH.name} exited {run.returncode}", file=sys.stderr)
        return run.returncode
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    ratio = theirs["sec_per_step"] / ours["sec_per_step"]
    if as_json:
        print(json.dumps({**ours, "trl": theirs, "trl_over_ours_sec_per_step": ratio}))
        return 0
    for line in comparison_lines(ours, theirs):
        print(line)
    return 0


def comparison_lines(ours: dict, theirs: dict) -> list[str]:
    """Both seconds per step and who is faster, by the ratio TRL / ours."""
    ratio = theirs["sec_per_step"] / ours["sec_per_step"]
    faster, factor = ("ours", ratio) if ratio >= 1 else ("TRL", 1 / ratio)
    # Two decimals where one would print a tie ("1.0x faster") for a 2-4% difference.
    verdict = f"{faster} is {factor:.1f}× faster" if factor >= 1.05 else f"{faster} is {factor:.2f}× faster"
    return [
        f"TRL {theirs['trl_version']} GRPOTrainer (HF generate; ours: the {ours.get('backend')} engine), "
        f"same shape on {theirs['device']} ({theirs['dtype']}), {theirs['steps_measured']} steps measured",
        f"  sec/step            ours {ours['sec_per_step']:.3f}  TRL {theirs['sec_per_step']:.3f}",
        f"  generate            ours {ours['timing/generate']:.3f}  "
        f"TRL {theirs['generate_sec_per_step']:.3f}",
        f"  peak memory         ours {ours['peak_memory_gb']:.2f} GB  TRL {theirs['peak_memory_gb']:.2f} GB",
        f"  TRL / ours          {ratio:.2f}: {verdict}",
    ]


if __name__ == "__main__":
    sys.exit(main())
