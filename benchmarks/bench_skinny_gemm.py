"""The decode step's skinny GEMMs in Triton with the operands swapped, against cuBLAS.

At batch 128 a decode projection ``y (128, N) = x (128, K) @ W.T`` puts few output tiles
on the card: the down projection of the 0.5B shape (N = 896) is 7 tiles of 128 x 128,
and cuBLAS reads its weights at about 1 TB/s (``bench_decode_gemm.py``). Here the kernel
computes ``y.T = W @ x.T`` instead ("swap AB"): the weight's rows are the tile's long
side (BN = 64 or 128 of them, the tensor core's M), the 128 batch rows its short side,
and K may be cut into ``split`` chunks whose fp32 partial sums meet in ``y`` by atomic adds
(``y`` zeroed first, as part of the timed call). Each projection is timed over its
layers' own weights in one CUDA graph, as in ``bench_decode_gemm.py``, for every tile of a
small sweep; the best tile is checked against ``F.linear``.

    python3 benchmarks/bench_skinny_gemm.py --shape qwen2.5-0.5b qwen2.5-1.5b

Only ratios within one run mean anything. On an H100 no tile beat cuBLAS on any projection
(``RESULTS.md``, 2026-12-06): the kernel is a measurement, not part of the trainer.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench_decode_attention import timed_graph  # noqa: E402
from bench_decode_gemm import projections  # noqa: E402
from trainer.shapes import RANDOM_SHAPES  # noqa: E402

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", nargs="+", default=["qwen2.5-0.5b"], choices=sorted(RANDOM_SHAPES))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--gemms", nargs="+", default=["qkv", "out", "gate_up", "down"])
    return parser.parse_args(argv)


if triton is not None:

    @triton.jit
    def _swap_ab_kernel(w_ptr, x_ptr, y_ptr, M, N, K, k_chunk, stride_w, stride_x, stride_y,
                        BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, ATOMIC: tl.constexpr):
        n = tl.program_id(0) * BN + tl.arange(0, BN)
        m = tl.arange(0, BM)
        start = tl.program_id(1) * k_chunk
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        for k0 in range(start, start + k_chunk, BK):
            k = k0 + tl.arange(0, BK)
            w = tl.load(w_ptr + n[:, None] * stride_w + k[None, :], mask=n[:, None] < N, other=0.0)
            x = tl.load(x_ptr + m[:, None] * stride_x + k[None, :], mask=m[:, None] < M, other=0.0)
            acc = tl.dot(w, tl.trans(x), acc)
        out = y_ptr + m[None, :] * stride_y + n[:, None]
        mask = (n[:, None] < N) & (m[None, :] < M)
        if ATOMIC:
            tl.atomic_add(out, acc, mask=mask, sem="relaxed")
        else:
            tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=mask)


def swap_ab(x, weight, y, bn, bk, split, warps, stages):
    """y (M, N) = x (M, K) @ weight (N, K).T; with split > 1, y is fp32 and added into."""
    m, k = x.shape
    n = weight.shape[0]
    _swap_ab_kernel[(triton.cdiv(n, bn), split)](
        weight, x, y, m, n, k, k // split, weight.stride(0), x.stride(0), y.stride(0),
        BN=bn, BM=max(16, triton.next_power_of_2(m)), BK=bk, ATOMIC=split > 1, num_warps=warps, num_stages=stages)
    return y


def tiles(k: int):
    """(BN, BK, split, warps, stages) to try for a K: splits whose chunks are whole BK tiles."""
    for bn, bk, stages in itertools.product((64, 128), (64, 128), (3, 4)):
        warps = 4 if bn == 64 else 8
        if k % bk:
            continue
        for split in (1, 2, 4, 7, 8, 14, 16):
            if (k // bk) % split == 0:
                yield bn, bk, split, warps, stages


def calls_for(tile, x, weights):
    """One call per weight, each returning its output: in x's dtype, or in fp32 and zeroed
    first with split-K, whose partial sums are added into it."""
    split = tile[2]
    dtype = x.dtype if split == 1 else torch.float32
    outs = [torch.empty(x.shape[0], weights[0].shape[0], device=x.device, dtype=dtype) for _ in weights]
    prepare = (lambda y: y) if split == 1 else torch.Tensor.zero_
    return [lambda w=w, y=y: swap_ab(x, w, prepare(y), *tile) for w, y in zip(weights, outs)]


def main(argv=None) -> int:
    args = parse_args(argv)
    if triton is None or not torch.cuda.is_available():
        print("bench_skinny_gemm: needs CUDA and Triton", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"batch {args.batch}")
    print(f"{'shape':<14}{'gemm':>9}{'N x K':>14}{'cuBLAS us':>11}{'swap-AB us':>12}{'ratio':>7}"
          f"{'GB/s':>7}  best tile (BN, BK, split, warps, stages); max error")
    for name in args.shape:
        shape = RANDOM_SHAPES[name]
        totals = [0.0, 0.0]
        for gemm, (n, k, _bias, count) in projections(shape).items():
            if gemm not in args.gemms:
                continue
            x = torch.randn(args.batch, k, device="cuda", dtype=torch.bfloat16)
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(count)]
            cublas = timed_graph([lambda w=w: F.linear(x, w) for w in weights], args.repeats)
            found = {}
            for tile in tiles(k):
                try:
                    found[tile] = timed_graph(calls_for(tile, x, weights), args.repeats)
                except Exception as error:  # a tile the card cannot hold (shared memory): skipped
                    print(f"  {gemm} {tile}: {type(error).__name__}: {str(error)[:120]}", file=sys.stderr)
            best = min(found, key=found.get)
            ours = found[best]
            check = calls_for(best, x, weights[:1])[0]()
            error = (check.float() - F.linear(x.float(), weights[0].float())).abs().max().item()
            totals[0] += cublas * count
            totals[1] += ours * count
            print(f"{name:<14}{gemm:>9}{f'{n} x {k}':>14}{cublas:>11.2f}{ours:>12.2f}{cublas / ours:>7.2f}"
                  f"{n * k * 2 / ours / 1e3:>7.0f}  {best}; {error:.2e}", flush=True)
            ranked = sorted(found.items(), key=lambda item: item[1])[:5]
            print("    fastest five: " + ", ".join(f"{tile} {us:.2f}" for tile, us in ranked), flush=True)
        print(f"{name:<14}{'a step':>9}{'':>14}{totals[0]:>11.1f}{totals[1]:>12.1f}"
              f"{totals[0] / max(totals[1], 1e-9):>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
