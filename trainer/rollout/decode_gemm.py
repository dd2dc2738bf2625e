"""Split-K projections for the decode step: a few rows against a whole weight matrix.

At batch 128 a decode step's projections are skinny GEMMs: cuBLAS tiles the 128 rows
once and the output's few columns into a handful of tiles, so a down projection (896
outputs from 4,864 inputs on the 0.5B shape) runs on about 7 of an H100's 132 SMs and
reads its weights at a third of the card's bandwidth (``benchmarks/bench_decode_gemm.py``).
:func:`split_k_linear` cuts the reduction dimension K into ``splits`` chunks too, one
program a (column tile, chunk), and returns each chunk's fp32 partial product; whoever
takes the result sums the chunks, which inside the compiled layer step is the epilogue
of the residual add and RMS norm that follow (no kernel of its own). The sum runs in a
fixed order, so the result is the same every run.

``glu=True`` also folds the MLP's ``silu(gate) * up`` into the loads of the down
projection: x is then the gate/up projection's output (M, 2K), and the kernel computes
the activation of each tile it reads (in the dtype torch's ops round to), so that
elementwise kernel goes too.

The kernel also runs on the CPU under ``TRITON_INTERPRET=1``, which is how CI checks it
against :func:`split_k_reference`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.rollout.split_kv import _interpreting, triton

BLOCK_K = 64  # reduction columns per tile
MIN_BLOCK_M = 16  # tl.dot's smallest tile


@torch.library.custom_op("trainer::split_k_linear", mutates_args=())
def split_k_linear(x: torch.Tensor, weight: torch.Tensor, splits: int, glu: bool = False,
                   block_n: int = 64, num_warps: int = 4) -> torch.Tensor:
    """(splits, M, N) fp32 partial products of ``x @ weight.T`` over ``splits`` chunks of K;
    their sum is the product.

    x (M, K), or with ``glu`` (M, 2K) whose halves are gate and up (the product is then
    ``(silu(gate) * up) @ weight.T``); weight (N, K), contiguous. A chunk past K (more
    ``splits`` than tiles) holds zeros.
    """
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    if x.shape[1] != (2 * k if glu else k):
        raise ValueError(f"split_k_linear: x has {x.shape[1]} columns, weight {k}" + (" (glu: 2 x K)" if glu else ""))
    if splits < 1 or block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"split_k_linear: splits={splits} must be >= 1 and block_n={block_n} a power of two >= 16")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("split_k_linear needs x and weight contiguous in their last dimension")
    per_split = -(-k // splits)
    chunk = -(-per_split // BLOCK_K) * BLOCK_K  # K per split, whole tiles
    out = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    block_m = min(128, max(MIN_BLOCK_M, 1 << (m - 1).bit_length()))
    grid = (triton.cdiv(n, block_n), splits, triton.cdiv(m, block_m))
    _split_k_kernel[grid](
        x, x.stride(0), weight, weight.stride(0), out, m, n, k, chunk,
        GLU=glu, UPCAST=x.dtype == torch.float32 or _interpreting(),
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK_K, num_warps=num_warps)
    return out


@split_k_linear.register_fake
def _(x, weight, splits, glu=False, block_n=64, num_warps=4):
    return x.new_empty((splits, x.shape[0], weight.shape[0]), dtype=torch.float32)


def split_k_reference(x: torch.Tensor, weight: torch.Tensor, *, glu: bool = False) -> torch.Tensor:
    """What the sum of :func:`split_k_linear`'s partials is, in torch's ops: (M, N) fp32."""
    if glu:
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    return F.linear(x.float(), weight.float())


if triton is not None:
    import triton.language as tl

    @triton.jit
    def _split_k_kernel(x_ptr, x_sm, w_ptr, w_sn, out_ptr, M, N, K, CHUNK, GLU: tl.constexpr,
                        UPCAST: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_n, split, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok, col_ok = rows < M, cols < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        start = split * CHUNK
        for offset in range(0, CHUNK, BLOCK_K):
            ks = start + offset + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            a_mask = row_ok[:, None] & k_ok[None, :]
            a = tl.load(x_ptr + rows[:, None] * x_sm + ks[None, :], mask=a_mask, other=0.0)
            if GLU:
                up = tl.load(x_ptr + rows[:, None] * x_sm + K + ks[None, :], mask=a_mask, other=0.0)
                gate = a.to(tl.float32)
                # torch's bf16 ops: silu rounded to the dtype, then the product rounded again.
                silu = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)
                a = (silu.to(tl.float32) * up.to(tl.float32)).to(up.dtype)
            w = tl.load(w_ptr + cols[None, :] * w_sn + ks[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0.0)
            if UPCAST:
                a, w = a.to(tl.float32), w.to(tl.float32)
            acc += tl.dot(a, w, input_precision=PRECISION)
        out = out_ptr + split * M * N + rows[:, None] * N + cols[None, :]
        tl.store(out, acc, mask=row_ok[:, None] & col_ok[None, :])


def choose_splits(n: int, k: int, *, block_n: int, programs: int) -> int:
    """Splits of K that give about ``programs`` programs over ``n`` output columns in tiles of
    ``block_n``: each split whole tiles of K, none empty."""
    wanted = max(1, min(-(-k // BLOCK_K), round(programs / -(-n // block_n))))
    chunk = -(-(-(-k // wanted)) // BLOCK_K) * BLOCK_K
    return -(-k // chunk)


class TorchProjections:
    """The decode step's out and down projections as torch ops (cuBLAS), each output added to
    the residual stream as the compute dtype."""

    name = "torch"

    @staticmethod
    def out(h, attended, layer):
        # (b, 1, H) through a view: inductor turns add(h, mm) into addmm, which copies h into its
        # output first (a copy a layer); past the view, the add is the next norm's prologue.
        return h + (attended[:, None] @ layer.out.T)[:, 0]

    @staticmethod
    def mlp(x, layer):
        gate, up = F.linear(x, layer.gate_up).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, layer.down)

    @staticmethod
    def add(h, mlp):
        return h + mlp

    @staticmethod
    def no_mlp(h):
        return torch.zeros_like(h)


class SplitKProjections:
    """The out and down projections through :func:`split_k_linear`; the down projection also
    takes the activation. Their fp32 partials are summed where they are added to the residual
    stream, so the MLP's output stays (splits, b, H) until the next layer adds it."""

    name = "split-k"

    def __init__(self, *, hidden: int, attended: int, intermediate: int, programs: int,
                 block_n: int = 64, num_warps: int = 4):
        self.block_n, self.num_warps = block_n, num_warps
        self.out_splits = choose_splits(hidden, attended, block_n=block_n, programs=programs)
        self.down_splits = choose_splits(hidden, intermediate, block_n=block_n, programs=programs)

    def out(self, h, attended, layer):
        partials = split_k_linear(attended, layer.out, self.out_splits, False, self.block_n, self.num_warps)
        return (h + partials.sum(0)).to(h.dtype)

    def mlp(self, x, layer):
        return split_k_linear(F.linear(x, layer.gate_up), layer.down, self.down_splits, True, self.block_n,
                              self.num_warps)

    @staticmethod
    def add(h, mlp):
        return (h + mlp.sum(0)).to(h.dtype)

    def no_mlp(self, h):
        return h.new_zeros((self.down_splits, *h.shape), dtype=torch.float32)
