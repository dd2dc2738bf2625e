"""A decode step's GEMMs alone: weight layout and BLAS library, side by side.

The rollout engine's decode step multiplies ``batch`` rows by each layer's projections
(qkv with its bias, out, gate/up, down) and, once a step, by the lm_head. At batch 128
these GEMMs are far from both the card's bandwidth and its tensor cores: their time is
how cuBLAS tiles a 128-row problem. This times each projection for every layer of a
shape (each layer its own weights, so they come from memory, not L2), captured in one
CUDA graph, in four ways:

* ``nk/cublas``: ``F.linear(x, W)`` with W (N, K), as the engine stores it, torch's default
  library (cuBLAS; cuBLASLt for the bias epilogue);
* ``kn/cublas``: ``x @ Wt`` with Wt (K, N) contiguous, the weight stored transposed;
* ``nk/cublaslt`` and ``kn/cublaslt``: the same with
  ``torch.backends.cuda.preferred_blas_library("cublaslt")``.

Prints microseconds per layer and the weight bytes read per second. On the H200::

    python3 benchmarks/bench_decode_gemm.py --shape qwen2.5-0.5b qwen2.5-1.5b --batch 128

Only ratios within one run mean anything.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench_decode_attention import timed_graph  # noqa: E402
from trainer.shapes import RANDOM_SHAPES  # noqa: E402

LAYOUTS = ("nk", "kn")
LIBRARIES = ("cublas", "cublaslt")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", nargs="+", default=["qwen2.5-0.5b"], choices=sorted(RANDOM_SHAPES))
    parser.add_argument("--batch", type=int, nargs="+", default=[128])
    parser.add_argument("--repeats", type=int, default=20)
    return parser.parse_args(argv)


def projections(shape: dict) -> dict[str, tuple[int, int, bool, int]]:
    """name -> (N, K, has bias, how many a step) of a decode step's GEMMs."""
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    d = shape.get("head_dim", hidden // heads)
    layers = shape["num_hidden_layers"]
    return {"qkv": ((heads + 2 * kv) * d, hidden, shape["architecture"] == "qwen2", layers),
            "out": (hidden, heads * d, False, layers),
            "gate_up": (2 * inter, hidden, False, layers),
            "down": (hidden, inter, False, layers),
            "lm_head": (shape["vocab_size"], hidden, False, 1)}


def gemm_calls(layout: str, batch: int, n: int, k: int, bias: bool, count: int):
    """``count`` GEMMs of (batch, k) by a (n, k) weight each, in ``layout``, into fixed outputs."""
    x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
    calls = []
    for _ in range(count):
        weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
        if layout == "nk":
            calls.append(lambda w=weight, b=b: F.linear(x, w, b))
        else:
            transposed = weight.T.contiguous()
            calls.append(lambda w=transposed, b=b: torch.addmm(b, x, w) if b is not None else x @ w)
    return calls


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_decode_gemm: needs CUDA", file=sys.stderr)
        return 1
    default = torch.backends.cuda.preferred_blas_library()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, default BLAS {default}")
    print(f"{'shape':<14}{'batch':>6}{'gemm':>9}{'N x K':>14}"
          + "".join(f"{f'{lay}/{lib} us':>16}" for lay in LAYOUTS for lib in LIBRARIES) + f"{'best GB/s':>11}")
    for name in args.shape:
        shape = RANDOM_SHAPES[name]
        for batch in args.batch:
            step = {key: 0.0 for key in (f"{lay}/{lib}" for lay in LAYOUTS for lib in LIBRARIES)}
            for gemm, (n, k, bias, count) in projections(shape).items():
                times = {}
                for layout in LAYOUTS:
                    calls = gemm_calls(layout, batch, n, k, bias, max(count, 8))
                    for library in LIBRARIES:
                        torch.backends.cuda.preferred_blas_library(library)
                        times[f"{layout}/{library}"] = timed_graph(calls, args.repeats)
                    del calls
                torch.backends.cuda.preferred_blas_library(default)
                for key, us in times.items():
                    step[key] += us * count
                best = min(times.values())
                print(f"{name:<14}{batch:>6}{gemm:>9}{f'{n} x {k}':>14}"
                      + "".join(f"{times[key]:>16.2f}" for key in step) + f"{n * k * 2 / best / 1e3:>11.0f}")
            print(f"{name:<14}{batch:>6}{'a step':>9}{'':>14}" + "".join(f"{us:>16.1f}" for us in step.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
