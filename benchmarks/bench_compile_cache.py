"""The compiled update body's first forward + backward, with a cold and a warm compile cache.

``compile_update`` compiles the policy's body once per shape, in every process: a
chain link that resumes a cell, and every other cell of the same shape, compile
again unless they find the compiled code on disk. sweepkit points trainer cells at
one cache in the runs dir (``TORCHINDUCTOR_CACHE_DIR``, see ``plugins/trainer.py``).
This runs the same first micro-batch in two fresh processes, one after the other,
over one new cache dir: the first compiles into it, the second loads from it.
Each prints its first step (compilation included) and a second one (compiled)::

    python benchmarks/bench_compile_cache.py                       # CPU, tiny-random
    python benchmarks/bench_compile_cache.py --model random:qwen2.5-0.5b --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=40)
    parser.add_argument("--response-length", type=int, default=40)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def child(args) -> dict:
    """One process: build the policy, compile its body, time two forward + backward passes."""
    sys.path.insert(0, str(ROOT))
    import torch

    from trainer.batch import Batch
    from trainer.config import TrainerConfig
    from trainer.forward import compile_body, response_logprobs
    from trainer.models import load_model_and_tokenizer
    from trainer.precision import Precision

    device = torch.device(args.device)
    cfg = TrainerConfig(model=args.model, dataset="gsm8k")
    model, _ = load_model_and_tokenizer(cfg, device=device, dtype="float32")
    precision = Precision.for_run(cfg, device)  # the trainer's: bf16 autocast on CUDA
    compile_body(model)
    generator = torch.Generator().manual_seed(0)
    rows, prompt, response = args.rows, args.prompt_length, args.response_length
    vocab = model.config.vocab_size
    batch = Batch(prompt_ids=torch.randint(0, vocab, (rows, prompt), generator=generator).to(device),
                  prompt_mask=torch.ones(rows, prompt, dtype=torch.long, device=device),
                  response_ids=torch.randint(0, vocab, (rows, response), generator=generator).to(device),
                  response_mask=torch.ones(rows, response, device=device))
    times = []
    for _ in range(2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with precision.autocast():
            logprobs, _ = response_logprobs(model, batch, 1.0)
        logprobs.sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return {"first_s": times[0], "second_s": times[1]}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    forwarded = list(argv if argv is not None else sys.argv[1:])
    results = {}
    with tempfile.TemporaryDirectory(prefix="compile-cache-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        for name in ("cold", "warm"):
            proc = subprocess.run([sys.executable, __file__, *forwarded, "--child"], env=env,
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return proc.returncode
            results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{args.model} on {args.device}, {args.rows} rows x ({args.prompt_length} + {args.response_length}) tokens")
    print(f"{'cache':<6} {'first step s':>13} {'second step s':>14}")
    for name, row in results.items():
        print(f"{name:<6} {row['first_s']:>13.2f} {row['second_s']:>14.3f}")
    print(f"cold / warm first step: {results['cold']['first_s'] / results['warm']['first_s']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
