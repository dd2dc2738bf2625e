"""Sampled ids to text, the step's host-side decode: transformers' batch_decode against
the tokenizers library's own batch decode (what ``trainer.models.decode_texts`` uses), on
the bench_trainer shape (128 rows x 512 ids, the 0.5B shape's padded byte tokenizer)::

    python benchmarks/bench_decode_texts.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from trainer.models import RANDOM_SHAPES, byte_tokenizer, decode_texts  # noqa: E402


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
    args = parser.parse_args(argv)
    tokenizer = byte_tokenizer(vocab_size=RANDOM_SHAPES["qwen2.5-0.5b"]["vocab_size"])
    rows = torch.randint(0, len(tokenizer), (args.rows, args.length), generator=torch.Generator().manual_seed(0))
    rows = rows.tolist()
    assert decode_texts(tokenizer, rows) == tokenizer.batch_decode(rows, skip_special_tokens=True)
    theirs = best_of(args.repeats, lambda: tokenizer.batch_decode(rows, skip_special_tokens=True))
    ours = best_of(args.repeats, lambda: decode_texts(tokenizer, rows))
    print(f"{args.rows} x {args.length} ids, best of {args.repeats}: batch_decode {theirs * 1e3:.1f} ms, "
          f"decode_texts {ours * 1e3:.1f} ms, {theirs / ours:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
