"""The step's host-side text work, on the bench_trainer shape (the 0.5B shape's padded byte
tokenizer):

- sampled ids to text (128 rows x 512 ids): transformers' batch_decode against the
  tokenizers library's own batch decode (what ``trainer.models.decode_texts`` uses);
- a step's prompts to ids (32 GSM8K prompts, chat template applied): a tokenizer call a
  prompt against ``trainer.models.encode_prompts``, one call for the batch (what the loop
  does)::

    python benchmarks/bench_decode_texts.py [--dataset <gsm8k dir>]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from trainer.config import TrainerConfig  # noqa: E402
from trainer.models import RANDOM_SHAPES, byte_tokenizer, decode_texts, encode_prompts  # noqa: E402
from trainer.tasks import load_task  # noqa: E402

GSM8K = os.environ.get("SWEEPKIT_GSM8K", str(Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"))


def best_of(repeats, call):
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--dataset", default=GSM8K, help="a GSM8K directory (train.jsonl) for the prompts")
    args = parser.parse_args(argv)
    tokenizer = byte_tokenizer(vocab_size=RANDOM_SHAPES["qwen2.5-0.5b"]["vocab_size"])
    rows = torch.randint(0, len(tokenizer), (args.rows, args.length), generator=torch.Generator().manual_seed(0))
    rows = rows.tolist()
    assert decode_texts(tokenizer, rows) == tokenizer.batch_decode(rows, skip_special_tokens=True)
    theirs = best_of(args.repeats, lambda: tokenizer.batch_decode(rows, skip_special_tokens=True))
    ours = best_of(args.repeats, lambda: decode_texts(tokenizer, rows))
    print(f"{args.rows} x {args.length} ids, best of {args.repeats}: batch_decode {theirs * 1e3:.1f} ms, "
          f"decode_texts {ours * 1e3:.1f} ms, {theirs / ours:.2f}x")
    if not (Path(args.dataset) / "train.jsonl").exists():
        print(f"no {args.dataset}/train.jsonl: the prompt encode is not measured")
        return 0
    task = load_task(TrainerConfig(model="random:qwen2.5-0.5b", dataset=args.dataset), tokenizer)
    prompts = [example.prompt for example in list(task.train)[: args.prompts]]
    length = TrainerConfig().max_prompt_length

    def one_by_one():
        return [tokenizer(p, add_special_tokens=False)["input_ids"][-length:] for p in prompts]

    assert encode_prompts(tokenizer, prompts, length) == one_by_one()
    theirs = best_of(args.repeats, one_by_one)
    ours = best_of(args.repeats, lambda: encode_prompts(tokenizer, prompts, length))
    print(f"{len(prompts)} prompts, best of {args.repeats}: a call each {theirs * 1e3:.2f} ms, "
          f"one batch call {ours * 1e3:.2f} ms, {theirs / ours:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
