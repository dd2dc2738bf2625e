"""A decode layer's work around its attention, for the static engine: norms, projections,
residual adds and the MLP.

Two implementations of one layer step, picked by name (:data:`DECODE_PROJECTIONS`, checked
at import against ``trainer.names.DECODE_PROJECTIONS``, where the config finds the names):

* ``torch``: the ops written out (RMS norm, ``F.linear``, SiLU), which ``compile_decode``
  compiles: the norms and SiLU become Triton kernels of inductor's between cuBLAS's
  projections, ten kernels a layer with the attention's two. Runs anywhere.
* ``fused``: :mod:`trainer.rollout.decode_linear`'s kernels fold each norm into the
  projection after it, the residual add into the out projection and SiLU into gate/up:
  six kernels a layer. Needs Triton (CUDA, or the CPU interpreter).

A layer step takes the residual stream ``h`` before the previous layer's MLP output
``mlp`` is added (zeros at the first layer: one compiled graph serves every layer) and
returns this layer's ``(h, mlp)`` the same way, so each residual add is done by whatever
reads it next.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer import names
from trainer.rollout import decode_linear  # noqa: F401 (registers torch.ops.trainer.norm_linear, linear_residual)
from trainer.rollout.split_kv import triton, triton_runs_on


def mlp(x, layer):
    """SiLU-gated MLP of a layer's fused gate/up and down weights."""
    gate, up = F.linear(x, layer.gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, layer.down)


class TorchProjections:
    name = "torch"
    needs_triton = False

    @staticmethod
    def layer_step(engine, h, mlp_out, layer, cache, cos, sin, context):
        """One layer of one decode step for b rows; writes K/V into its cache (the attention's
        ``layer_cache``) at the step's column. Each residual add is an epilogue of the RMS
        norm that follows it (one kernel when compiled), where ``addmm`` would first copy the
        residual into its output."""
        h = h + mlp_out
        x = F.rms_norm(h, (engine.hidden,), layer.input_norm, engine.eps)
        qkv = F.linear(x, layer.qkv, layer.qkv_bias)  # (b, (q_heads + 2 kv_heads) d), before RoPE
        attended = engine.attention.decode(engine, layer, qkv, cache, cos, sin, context)  # (b, q_heads d)
        # (b, 1, H) through a view: inductor turns add(h, mm) into addmm, which copies h into its
        # output first (a copy a layer); past the view, the add is the norm kernel's prologue.
        h = h + (attended[:, None] @ layer.out.T)[:, 0]
        return h, mlp(F.rms_norm(h, (engine.hidden,), layer.post_norm, engine.eps), layer)


class FusedProjections:
    name = "fused"
    needs_triton = True

    @staticmethod
    def layer_step(engine, h, mlp_out, layer, cache, cos, sin, context):
        """What :meth:`TorchProjections.layer_step` computes, in five kernels and attention's."""
        h, qkv = torch.ops.trainer.norm_linear(h, mlp_out, layer.input_norm, layer.qkv, layer.qkv_bias, engine.eps)
        attended = engine.attention.decode(engine, layer, qkv, cache, cos, sin, context)  # (b, q_heads d)
        h = torch.ops.trainer.linear_residual(attended, layer.out, h)
        _, gated = torch.ops.trainer.norm_linear(h, None, layer.post_norm, layer.gate_up, None, engine.eps,
                                                 silu_mul=True)
        return h, F.linear(gated, layer.down)


DECODE_PROJECTIONS = {impl.name: impl for impl in (TorchProjections, FusedProjections)}
names.DECODE_PROJECTIONS.check(DECODE_PROJECTIONS, registry_name="trainer.rollout.projections.DECODE_PROJECTIONS")


def choose(name: str, device: torch.device):
    """The implementation for ``name`` (``auto``: fused where Triton runs on CUDA, else torch)."""
    if name == "auto":
        name = "fused" if device.type == "cuda" and triton is not None else "torch"
    if name not in DECODE_PROJECTIONS:
        raise ValueError(f"decode projections {name!r}: choose one of "
                         f"{', '.join(names.DECODE_PROJECTIONS.choices())}")
    if DECODE_PROJECTIONS[name].needs_triton and not triton_runs_on(device):
        why = "Triton is not installed" if triton is None else f"Triton does not run on {device.type} tensors"
        raise ValueError(f"decode projections {name!r}: {why} (on the CPU it runs only under TRITON_INTERPRET=1); "
                         f"use 'torch'")
    return DECODE_PROJECTIONS[name]
