"""The decode layer's pointwise kernels in Triton: the residual add with the RMS norm after it,
and SiLU(gate) x up.

In the compiled decode step inductor fuses these into three kernels a layer, between the
cuBLAS projections and the attention's kernels, and launches them plainly. Written as the
engine's own Triton kernels they compute the same (the rounding of HF's modules: the sum
rounded to the compute dtype before its norm, the norm rounded before its weight, SiLU
rounded before the product) and launch with programmatic dependent launch like the
attention's and the sampler's (``pdl``): each starts while the projection before it drains.
The ops are opaque to torch.compile. The kernels also run on the CPU under
``TRITON_INTERPRET=1``, which is how CI checks them against :func:`add_rms_norm_reference`
and :func:`silu_mul_reference`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.rollout.split_kv import triton

if triton is not None:
    import triton.language as tl

    from trainer.rollout.split_kv import after_previous

SILU_BLOCK = 1024  # entries of a row per program of silu_mul


class TorchPointwise:
    """The layer step's pointwise work in torch ops (inductor fuses them when the step is compiled)."""

    name = "torch"

    @staticmethod
    def add_norm(engine, h, delta, weight):
        """The residual stream h + delta (b, H), and its RMS norm times ``weight``."""
        h = h + delta
        return h, F.rms_norm(h, (engine.hidden,), weight, engine.eps)

    @staticmethod
    def silu_mul(engine, gate_up):
        """(b, 2 I), gate then up -> SiLU(gate) x up (b, I)."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class TritonPointwise:
    """The same in this module's kernels, launched with the engine's ``pdl``."""

    name = "triton"

    @staticmethod
    def add_norm(engine, h, delta, weight):
        return torch.ops.trainer.add_rms_norm(h, delta, weight, engine.eps, pdl=engine.pdl)

    @staticmethod
    def silu_mul(engine, gate_up):
        return torch.ops.trainer.silu_mul(gate_up, pdl=engine.pdl)


def choose(use_triton: bool):
    return TritonPointwise if use_triton else TorchPointwise


def add_rms_norm_reference(h, delta, weight, eps: float):
    """What :func:`add_rms_norm` computes, in torch (HF's RMSNorm on the rounded sum)."""
    h = h + delta
    x = h.float()
    normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    return h, weight * normed


def silu_mul_reference(gate_up):
    """What :func:`silu_mul` computes, in torch: (b, 2 I) -> (b, I)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@torch.library.custom_op("trainer::add_rms_norm", mutates_args=())
def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                 pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """h, delta (b, H), weight (H,) -> (h + delta, its RMS norm times weight), both (b, H) in
    h's dtype; ``pdl``: launched with programmatic dependent launch (``split_kv.pdl_runs_on``)."""
    rows, hidden = h.shape
    if delta.shape != h.shape or weight.shape != (hidden,) or h.stride(-1) != 1 or delta.stride(-1) != 1:
        raise ValueError(f"add_rms_norm: h {tuple(h.shape)} and delta {tuple(delta.shape)} must be alike with "
                         f"their rows contiguous, weight ({hidden},), not {tuple(weight.shape)}")
    total, normed = torch.empty_like(h, memory_format=torch.contiguous_format), torch.empty_like(
        h, memory_format=torch.contiguous_format)
    _add_rms_norm_kernel[(rows,)](h, h.stride(0), delta, delta.stride(0), weight, total, normed, hidden, eps,
                                  BLOCK=triton.next_power_of_2(hidden), PDL=pdl, num_warps=4, launch_pdl=pdl)
    return total, normed


@add_rms_norm.register_fake
def _(h, delta, weight, eps, pdl=False):
    return torch.empty_like(h, memory_format=torch.contiguous_format), torch.empty_like(
        h, memory_format=torch.contiguous_format)


@torch.library.custom_op("trainer::silu_mul", mutates_args=())
def silu_mul(gate_up: torch.Tensor, block: int = SILU_BLOCK, pdl: bool = False) -> torch.Tensor:
    """gate_up (b, 2 I), gate then up -> SiLU(gate) x up (b, I), each program ``block`` entries
    of a row; ``pdl`` as for :func:`add_rms_norm`."""
    rows, width = gate_up.shape
    if width % 2 or gate_up.stride(-1) != 1 or block & (block - 1):
        raise ValueError(f"silu_mul: gate_up {tuple(gate_up.shape)} needs an even, contiguous last dimension "
                         f"and block={block} a power of two")
    inner = width // 2
    out = gate_up.new_empty((rows, inner))
    _silu_mul_kernel[(rows, triton.cdiv(inner, block))](gate_up, gate_up.stride(0), out, inner, BLOCK=block,
                                                        PDL=pdl, num_warps=4, launch_pdl=pdl)
    return out


@silu_mul.register_fake
def _(gate_up, block=SILU_BLOCK, pdl=False):
    return gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))


if triton is not None:

    @triton.jit
    def _add_rms_norm_kernel(h_ptr, h_sb, delta_ptr, delta_sb, weight_ptr, total_ptr, normed_ptr, hidden, eps,
                             BLOCK: tl.constexpr, PDL: tl.constexpr):
        # One program a row: the whole row in registers (H <= a few thousand).
        after_previous(PDL)
        row = tl.program_id(0).to(tl.int64)
        i = tl.arange(0, BLOCK)
        inside = i < hidden
        h = tl.load(h_ptr + row * h_sb + i, mask=inside, other=0.0)
        delta = tl.load(delta_ptr + row * delta_sb + i, mask=inside, other=0.0)
        total = (h.to(tl.float32) + delta.to(tl.float32)).to(h.dtype)  # the residual stream, rounded
        tl.store(total_ptr + row * hidden + i, total, mask=inside)
        x = total.to(tl.float32)
        scale = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
        normed = (x * scale).to(h.dtype).to(tl.float32) * tl.load(weight_ptr + i, mask=inside, other=0.0).to(
            tl.float32)
        tl.store(normed_ptr + row * hidden + i, normed.to(h.dtype), mask=inside)

    @triton.jit
    def _silu_mul_kernel(gate_up_ptr, row_stride, out_ptr, inner, BLOCK: tl.constexpr, PDL: tl.constexpr):
        after_previous(PDL)
        row, part = tl.program_id(0).to(tl.int64), tl.program_id(1)
        i = part * BLOCK + tl.arange(0, BLOCK)
        inside = i < inner
        gate = tl.load(gate_up_ptr + row * row_stride + i, mask=inside, other=0.0)
        up = tl.load(gate_up_ptr + row * row_stride + inner + i, mask=inside, other=0.0)
        g = gate.to(tl.float32)
        silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
        tl.store(out_ptr + row * inner + i, (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype), mask=inside)
