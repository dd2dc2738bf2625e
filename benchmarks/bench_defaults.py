"""The trainer at its defaults, side by side in one run: what a grid cell gets with nothing
hand-set but ``enforce_eager=false``.

For each model shape, ``bench_trainer.py`` runs in its own process once for each of these runs:

* ``cold``: the default (micro-batches packed by tokens), with an empty compile cache: the
  first step a sweep's first cell pays;
* ``warm``: the same again, the cache now filled: the first step of every later cell;
* ``micro8``: the old default, a hand-set micro-batch of 8 rows;
* ``cap64``: the default in a process capped at 64 GB of the card (an A100-64GB's worth):
  the packing must fit it, never OOM;
* ``perrow``: ``share_prompts=false``, each sample's row running its own copy of the prompt
  in the update (the default before 2026-12-06);

and, with ``--compare trl``, TRL's GRPOTrainer on the same shape (``bench_trl.py``). It
prints each run's sec/step (steady steps), first step, peak memory and each step's time, and
the ratios measured in this run: default over micro8, TRL over default. The H200 run::

    python benchmarks/bench_defaults.py --dataset /path/to/gsm8k \\
        --shape random:qwen2.5-0.5b --shape random:qwen2.5-1.5b --compare trl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).with_name("bench_trainer.py")
TRL = Path(__file__).with_name("bench_trl.py")
RUNS = {
    "cold": [],
    "warm": [],
    "micro8": ["--set", "micro_train_batch_size_per_gpu=8"],
    "cap64": ["--memory-gb", "64"],
    "perrow": ["--set", "share_prompts=false"],
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append", default=[], help="a model (repeatable); default the 0.5B shape")
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--compare", choices=("trl",))
    parser.add_argument("--trl-steps", type=int, default=4, help="TRL's steps (its first is warm-up)")
    parser.add_argument("--logs", type=Path, help="keep each run's stderr here, as SHAPE-RUN.err")
    parser.add_argument("--runs", default=",".join(RUNS), help="which of " + ", ".join(RUNS))
    return parser.parse_args(argv)


def shape_args(args, model: str, steps: int) -> list[str]:
    return ["--model", model, "--dataset", args.dataset, "--prompts", "32", "--samples", "4",
            "--prompt-length", "256", "--generate-length", "512", "--steps", str(steps)]


def log_path(args, model: str, run: str) -> Path | None:
    return args.logs / f"{model.replace(':', '_').replace('/', '_')}-{run}.err" if args.logs else None


def run_json(command: list[str], env: dict, log: Path | None = None, cwd: Path | None = None) -> dict | None:
    """The JSON summary a benchmark prints last, or None (its error printed) when it fails;
    its stderr kept in ``log``."""
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(done.stderr)
    if done.returncode != 0:
        where = f" in {cwd}" if cwd is not None else ""
        print(f"  {' '.join(command[1:4])}{where}: exit {done.returncode}: {done.stderr.strip()[-400:]}",
              file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    import os

    args = parse_args(argv)
    runs = args.runs.split(",")
    for model in args.shape or ["random:qwen2.5-0.5b"]:
        print(f"{model}: 32 prompts x 4 samples, prompt 256, 512 new tokens, enforce_eager=false")
        results = {}
        with tempfile.TemporaryDirectory(prefix="bench-defaults-") as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)  # cold for the first run only
            for name in runs:
                command = [sys.executable, str(BENCH), *shape_args(args, model, args.steps),
                           "--set", "enforce_eager=false", "--json", *RUNS[name]]
                results[name] = summary = run_json(command, env, log_path(args, model, name))
                if summary is not None:
                    print(f"  {name:<7} {summary['sec_per_step']:.3f} s/step  first {summary['first_step_s']:.1f} s  "
                          f"peak {summary['peak_memory_gb_all_steps']:.1f} GB  "
                          f"generate {summary['generate_tokens_per_s']:.0f} tok/s  steps {summary['each_step']}")
                    print(f"          a step's stages: generate {summary['timing/generate']:.3f} s, "
                          f"update {summary['timing/policy_train']:.3f} s, sync {summary['timing/sync_weights']:.3f} s")
                    start = summary.get("startup", {})
                    phases = ", ".join(f"{phase} {entry['seconds']:.1f} s"
                                       for phase, entry in start.get("phases", {}).items())
                    print(f"          first step split {summary['first_step_split']}; {phases}; compile "
                          f"{start.get('compile_seconds', 0):.1f} s over {start.get('compiled_graphs', 0)} graphs")
            if args.compare == "trl":
                trl = [sys.executable, str(TRL), "--json", *shape_args(args, model, args.trl_steps)]
                results["trl"] = theirs = run_json(trl, env, log_path(args, model, "trl"))
                if theirs is not None:
                    print(f"  trl     {theirs['sec_per_step']:.3f} s/step  peak {theirs['peak_memory_gb']:.1f} GB  "
                          f"steps {theirs.get('each_step')}")
        default = results.get("warm") or results.get("cold")
        if default and results.get("micro8"):
            print(f"  micro8 / default: {results['micro8']['sec_per_step'] / default['sec_per_step']:.2f}x")
        if default and results.get("perrow"):
            print(f"  perrow / default: {results['perrow']['sec_per_step'] / default['sec_per_step']:.2f}x")
        if default and results.get("trl"):
            print(f"  trl / default: {results['trl']['sec_per_step'] / default['sec_per_step']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
