"""A decode step's projections with their norms, residual adds and SiLU folded in (Triton).

At batch 128 a decode layer's projections are small-M GEMMs (128 rows against a 0.5B
shape's 896-wide weights): cuBLAS runs each as its own kernel, and the compiled layer step
puts the RMS norm before each and the SiLU-and-multiply after gate/up in kernels of their
own, ten kernels a layer with the attention's two. On an H200 each kernel is a few
microseconds, and the gaps between kernels of a CUDA graph add about one more each
(``benchmarks/RESULTS.md``). Here one kernel does what three did:

* :func:`norm_linear`: ``rms_norm(x [+ add]) @ W.T [+ bias]``, and with ``silu_mul`` the
  gate/up pair's ``silu(gate) * up`` (W holds gate's rows, then up's). The sum ``x + add``
  (the residual stream after the previous layer's MLP) is written once, by the programs of
  the first column block. A program computes its rows' norm itself: its K is the model's
  hidden size, which it reads whole for its GEMM anyway.
* :func:`linear_residual`: ``residual + x @ W.T``, the add in the GEMM's epilogue.

Every value is rounded where the unfused ops round: the residual sum and the GEMM's output
to the compute dtype, the normed input to it before the product. The kernels run on the
CPU under ``TRITON_INTERPRET=1``, which is how CI checks them against the torch ops.
"""

from __future__ import annotations

from typing import Optional

import torch

from trainer.rollout.split_kv import _interpreting, triton

if triton is not None:
    import triton.language as tl

#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of each kernel; see the benchmark.
NORM_TILES = (128, 32, 64, 4, 3)
SILU_TILES = (128, 32, 64, 4, 3)
RESIDUAL_TILES = (64, 32, 64, 4, 3)


def _check(x, weight, op):
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"{op}: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not multiply as x @ W.T")
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError(f"{op} needs the last dimension of x and weight contiguous")


def _launch(x, add, summed, norm, weight, bias, residual, out, eps, silu_mul, tiles):
    m, k = x.shape
    n = out.shape[1]
    block_m, block_n, block_k, warps, stages = tiles
    block_m = max(16, min(block_m, triton.next_power_of_2(m)))
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    _kernel[grid](
        x, add if add is not None else x, summed if summed is not None else x, norm if norm is not None else x,
        weight, bias if bias is not None else x, residual if residual is not None else x, out,
        m, n, k, x.stride(0), weight.stride(0), out.stride(0), eps,
        HAS_ADD=add is not None, HAS_NORM=norm is not None, HAS_BIAS=bias is not None, SILU_MUL=silu_mul,
        HAS_RESIDUAL=residual is not None,
        # Triton's CPU interpreter multiplies bf16 tiles wrongly (as of 3.6): it gets fp32 ones.
        UPCAST=x.dtype == torch.float32 or _interpreting(),
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)


@torch.library.custom_op("trainer::norm_linear", mutates_args=())
def norm_linear(x: torch.Tensor, add: Optional[torch.Tensor], norm: torch.Tensor, weight: torch.Tensor,
                bias: Optional[torch.Tensor], eps: float, silu_mul: bool = False,
                tiles: Optional[list[int]] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + add, rms_norm(x + add, norm) @ weight.T + bias): x, add (b, K); norm (K,);
    weight (N, K), or with ``silu_mul`` (2 N, K), gate's rows then up's, and the output is
    ``silu(gate) * up`` (b, N). Without ``add`` the first result is empty (x is the sum)."""
    _check(x, weight, "norm_linear")
    n = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    summed = torch.empty_like(x) if add is not None else x.new_empty(0)
    tiles = tuple(tiles) if tiles else (SILU_TILES if silu_mul else NORM_TILES)
    _launch(x, add, summed if add is not None else None, norm, weight, bias, None, out, eps, silu_mul, tiles)
    return summed, out


@norm_linear.register_fake
def _(x, add, norm, weight, bias, eps, silu_mul=False, tiles=None):
    n = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    return (torch.empty_like(x) if add is not None else x.new_empty(0)), x.new_empty((x.shape[0], n))


@torch.library.custom_op("trainer::linear_residual", mutates_args=())
def linear_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor,
                    tiles: Optional[list[int]] = None) -> torch.Tensor:
    """residual + x @ weight.T: x (b, K), weight (N, K), residual (b, N)."""
    _check(x, weight, "linear_residual")
    out = torch.empty_like(residual, memory_format=torch.contiguous_format)
    _launch(x, None, None, None, weight, None, residual.contiguous(), out, 0.0, False,
            tuple(tiles) if tiles else RESIDUAL_TILES)
    return out


@linear_residual.register_fake
def _(x, weight, residual, tiles=None):
    return torch.empty_like(residual, memory_format=torch.contiguous_format)


if triton is not None:

    @triton.jit
    def _kernel(x_ptr, add_ptr, sum_ptr, norm_ptr, w_ptr, bias_ptr, res_ptr, out_ptr, M, N, K, x_sm, w_sn, out_sm,
                eps, HAS_ADD: tl.constexpr, HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr,
                HAS_RESIDUAL: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_n, pid_m = tl.program_id(0), tl.program_id(1)
        dtype = x_ptr.dtype.element_ty
        rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        row_ok = rm < M
        col_ok = rn < N
        if HAS_NORM:
            # First pass: each row's mean square (of the residual sum, which the first column
            # block of programs writes out).
            squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                ok = row_ok[:, None] & (rk < K)[None, :]
                x = tl.load(x_ptr + rm[:, None] * x_sm + rk[None, :], mask=ok, other=0.0)
                if HAS_ADD:
                    x = (x.to(tl.float32) + tl.load(add_ptr + rm[:, None] * x_sm + rk[None, :], mask=ok,
                                                    other=0.0).to(tl.float32)).to(dtype)
                    if pid_n == 0:
                        tl.store(sum_ptr + rm[:, None] * x_sm + rk[None, :], x, mask=ok)
                xf = x.to(tl.float32)
                squares += tl.sum(xf * xf, axis=1)
            inverse_rms = tl.rsqrt(squares / K + eps)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            k_ok = rk < K
            ok = row_ok[:, None] & k_ok[None, :]
            x = tl.load(x_ptr + rm[:, None] * x_sm + rk[None, :], mask=ok, other=0.0)
            if HAS_ADD:
                x = (x.to(tl.float32) + tl.load(add_ptr + rm[:, None] * x_sm + rk[None, :], mask=ok,
                                                other=0.0).to(tl.float32)).to(dtype)
            if HAS_NORM:
                scale = tl.load(norm_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)
                x = (x.to(tl.float32) * inverse_rms[:, None] * scale[None, :]).to(dtype)
            w_ok = k_ok[:, None] & col_ok[None, :]
            w = tl.load(w_ptr + rn[None, :] * w_sn + rk[:, None], mask=w_ok, other=0.0)  # (BLOCK_K, BLOCK_N)
            if UPCAST:
                x, w = x.to(tl.float32), w.to(tl.float32)
            acc = tl.dot(x, w, acc, input_precision=PRECISION)
            if SILU_MUL:
                w_up = tl.load(w_ptr + (rn + N)[None, :] * w_sn + rk[:, None], mask=w_ok, other=0.0)
                if UPCAST:
                    w_up = w_up.to(tl.float32)
                acc_up = tl.dot(x, w_up, acc_up, input_precision=PRECISION)
        out_ok = row_ok[:, None] & col_ok[None, :]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        acc = acc.to(dtype).to(tl.float32)  # the GEMM's own output, rounded as the op rounds it
        if SILU_MUL:
            up = acc_up.to(dtype).to(tl.float32)
            acc = acc * tl.sigmoid(acc) * up
        if HAS_RESIDUAL:
            acc += tl.load(res_ptr + rm[:, None] * out_sm + rn[None, :], mask=out_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + rm[:, None] * out_sm + rn[None, :], acc.to(dtype), mask=out_ok)
