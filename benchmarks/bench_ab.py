"""The trainer's step from two checkouts, side by side in one run: what a change does.

Step times differ between machines by more than most changes do (host-bound code ran 2x
apart on two calls of the same GPU kind), so a change is timed against its base on one
machine, in one run. This runs ``benchmarks/bench_trainer.py`` of the base tree (the project
at the base commit, e.g. ``git archive <commit> | tar -x -C DIR``) and of this checkout in
turn, each in its own process with its own compile cache (cold in the first round, warm
after), and prints each run's steps, stages and start, then new over base with the
steps it rests on: a difference whose steps' ranges overlap is inside the noise::

    python benchmarks/bench_ab.py --base /tmp/base --dataset /path/to/gsm8k \\
        --model random:qwen2.5-0.5b --model random:qwen2.5-1.5b --rounds 2

A run's start is its build and first step together (a change may move work from one into
the other), and its process the whole run's wall time, interpreter start included. With
``--cold`` every round starts from empty compile caches (inductor's and Triton's), so the
rounds repeat the cold start and a start verdict over them follows the steps' own. Rounds
alternate which tree goes first (base, new, then new, base), so a drift of the machine
weighs on both alike.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_defaults import run_json  # noqa: E402

HERE = Path(__file__).resolve().parents[1]
BENCH = Path("benchmarks") / "bench_trainer.py"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the base checkout (a directory)")
    parser.add_argument("--model", action="append", default=[], help="a model (repeatable); default the 0.5B shape")
    parser.add_argument("--dataset", default="synthetic", help="'synthetic', 'gsm8k' or a GSM8K directory/file")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--generate-length", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5, help="steps a run, its first left out")
    parser.add_argument("--rounds", type=int, default=1, help="both trees this many times, the order alternating")
    parser.add_argument("--cold", action="store_true", help="empty compile caches for every run, not the first only")
    parser.add_argument("--set", action="append", default=["enforce_eager=false"], metavar="KEY=VALUE",
                        help="a trainer key for both runs (repeatable; enforce_eager=false is always set)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--logs", type=Path, help="keep each run's stderr here, as MODEL-TREE-ROUND.err")
    return parser.parse_args(argv)


def trainer_command(args, model: str) -> list[str]:
    dataset = args.dataset
    if Path(dataset).exists():
        dataset = str(Path(dataset).resolve())  # each run starts in its own tree
    command = [sys.executable, str(BENCH), "--model", model, "--dataset", dataset, "--prompts", str(args.prompts),
               "--samples", str(args.samples), "--prompt-length", str(args.prompt_length),
               "--generate-length", str(args.generate_length), "--steps", str(args.steps),
               "--device", args.device, "--json"]
    for item in args.set:
        command += ["--set", item]
    return command


def verdict(base_steps: list[float], new_steps: list[float], *, counted: str = "steps") -> str:
    """new over base by the median step, and whether it is more than noise: every step of one
    side under every step of the other, and too rarely so by chance (if the steps were
    exchangeable, 2 in C(n + m, n) orders split so) to be one: under 5 %. ``counted`` names
    what the values are (steps, or runs' starts)."""
    ratio = statistics.median(new_steps) / statistics.median(base_steps)
    n, m = len(new_steps), len(base_steps)
    chance = 2 / math.comb(n + m, n)
    rests = f"{n} and {m} {counted}"
    if max(new_steps) < min(base_steps) or min(new_steps) > max(base_steps):
        side = "faster" if max(new_steps) < min(base_steps) else "slower"
        if chance < 0.05:
            return f"new / base {ratio:.3f}: new {side} at every one ({rests}; by chance {chance:.1%})"
        return (f"new / base {ratio:.3f}: new {side} at every one, but {rests} are too few to tell it from "
                f"noise (by chance {chance:.0%}): run more steps or rounds")
    return f"new / base {ratio:.3f}: the ranges overlap, inside the noise ({rests})"


def start_seconds(summary: dict) -> float:
    """The run's build and first step (the build as the trainer timed it; 0 where it did not)."""
    build = summary.get("startup", {}).get("phases", {}).get("build", {}).get("seconds", 0.0)
    return build + summary["first_step_s"]


def round_order(trees: dict, round_: int) -> list[str]:
    """The trees in the order this round (counted from 0) runs them: as given, then reversed."""
    names = list(trees)
    return names if round_ % 2 == 0 else names[::-1]


def describe(name: str, summary: dict) -> str:
    return (f"  {name:<5} {summary['sec_per_step']:.4f} s/step  steps {summary['each_step']}  "
            f"generate {summary['timing/generate']:.3f} s ({summary['generate_tokens_per_s']:.0f} tok/s)  "
            f"update {summary['timing/policy_train']:.3f} s  start {start_seconds(summary):.1f} s (first step "
            f"{summary['first_step_s']:.1f} s)  process {summary['process_s']:.1f} s  "
            f"peak {summary['peak_memory_gb_all_steps']:.1f} GB")


def main(argv=None) -> int:
    args = parse_args(argv)
    base = args.base.resolve()
    if not (base / BENCH).is_file():
        print(f"bench_ab: --base {args.base}: no {BENCH} there (a checkout of the base commit?)", file=sys.stderr)
        return 2
    trees = {"base": base, "new": HERE}
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as scratch:
        for model in args.model or ["random:qwen2.5-0.5b"]:
            print(f"{model}: {args.prompts} prompts x {args.samples} samples, prompt {args.prompt_length}, "
                  f"{args.generate_length} new tokens, {args.steps} steps a run, {args.rounds} round(s)")
            command = trainer_command(args, model)
            steps = {name: [] for name in trees}
            starts = {name: [] for name in trees}  # cold runs' build + first step
            processes = {name: [] for name in trees}  # cold runs' whole process
            for round_ in range(args.rounds):
                cold = round_ == 0 or args.cold
                for name in round_order(trees, round_):
                    label = f"{model.replace(':', '_').replace('/', '_')}-{name}"
                    log = args.logs / f"{label}-{round_ + 1}.err" if args.logs else None
                    caches = Path(scratch) / (f"{label}-{round_ + 1}" if args.cold else label)
                    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"))
                    if args.cold:
                        env["TRITON_CACHE_DIR"] = str(caches / "triton")
                    began = time.perf_counter()
                    summary = run_json(command, env, log, cwd=trees[name])
                    if summary is None:
                        failed = True
                        continue
                    summary["process_s"] = time.perf_counter() - began
                    steps[name] += summary["each_step"]
                    if cold:
                        starts[name].append(start_seconds(summary))
                        processes[name].append(summary["process_s"])
                    print(describe(name, summary) + ("  (cold cache)" if cold else ""), flush=True)
            if steps["base"] and steps["new"]:
                print(f"  steps: {verdict(steps['base'], steps['new'])}")
            if args.cold and starts["base"] and starts["new"]:
                print(f"  cold starts: {verdict(starts['base'], starts['new'], counted='runs')}")
                print(f"  cold processes: {verdict(processes['base'], processes['new'], counted='runs')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
