"""Decode attention for the static engine: one query token per row against its KV cache.

Three implementations behind one call, picked by name (:data:`DECODE_ATTENTION`, checked
at import against ``trainer.names.DECODE_ATTENTIONS``, where the config finds the names):

* ``sdpa``: ``F.scaled_dot_product_attention`` with an additive mask over every cache
  column, built once a step. Runs anywhere; on the CPU it is the only choice.
* ``split-kv``: flash decoding in Triton (:mod:`trainer.rollout.split_kv`): each program
  takes one (row, KV head, split of ``SPLIT`` columns) and reads only the columns its row
  uses, and a second kernel merges the splits' partial outputs by their log-sum-exp; the
  query heads of a KV head are the rows of one tile (GQA without repeating K/V).
* ``fused``: the split-kv kernels with the layer's RoPE and its cache write folded into
  the split kernel (:mod:`trainer.rollout.fused_attention`): two kernels a layer where
  split-kv takes five (the rotation and the two cache writes run in the layer step
  before it). It also reads the columns of a prompt once for the rows that sample it
  (``shares_prompts``: the engine gives it the chunk's ``share`` and prompt columns).

Each implementation's :meth:`decode` takes the fused qkv projection of one decode token
(before RoPE) and returns the attended heads, the token's K/V written into the cache.
All take the step's state from device tensors, so a CUDA graph replays any of them. The
ops live in their own modules, which this one imports to register them (the fused op
builds on split-kv's; neither imports this module). The Triton kernels also run on the
CPU under ``TRITON_INTERPRET=1``, which is how CI checks them against ``sdpa``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer import names
from trainer.rollout import fused_attention  # (importing it registers torch.ops.trainer.fused_decode_attention)
# Registers torch.ops.trainer.split_kv_decode (benchmarks/bench_decode_attention.py imports the op from here).
from trainer.rollout.split_kv import pdl_runs_on, split_kv_decode, triton, triton_runs_on  # noqa: F401


class UnfusedDecode:
    """RoPE and the cache write in the (compiled) layer step, then the attention of ``attend``."""

    needs_triton = False  # whether its kernels are Triton's (CUDA, or the CPU interpreter)

    @staticmethod
    def layer_cache(cache, layer: int, b: int):
        """What :meth:`decode` takes of the engine's cache (layers, 2, rows, kv_heads, columns, d):
        K and V of one layer's first b rows, as two views (a view of both, unbound inside the
        compiled step, made torch.compile copy the whole cache at every write)."""
        return cache[layer, 0, :b], cache[layer, 1, :b]

    @classmethod
    def decode(cls, engine, layer, qkv, cache, cos, sin, context):
        """qkv (b, (q_heads + 2 kv_heads) d) before RoPE -> the attended heads (b, q_heads d);
        writes the token's K/V into the layer's cache at the step's column."""
        b = qkv.shape[0]
        cache_k, cache_v = cache  # each (b, kv_heads, columns, d)
        q, k, v = engine._rotary(qkv, layer, cos, sin)  # (b, heads, d)
        cache_k.index_copy_(2, engine.column, k[:, :, None])
        cache_v.index_copy_(2, engine.column, v[:, :, None])
        grouped = q.reshape(b, engine.kv_heads, engine.q_heads // engine.kv_heads, engine.head_dim)
        return cls.attend(grouped, cache_k, cache_v, context).reshape(b, -1)


class SdpaDecode(UnfusedDecode):
    """SDPA over every column, with an additive mask for the columns a row does not use."""

    name = "sdpa"

    @staticmethod
    def prepare(engine, b: int):
        columns = engine.all_columns[None, :]
        valid = (columns >= engine.first_column[:b, None]) & (columns <= engine.column)
        # An additive mask, built once a step: SDPA would turn a boolean one into this in every layer.
        mask = torch.zeros(valid.shape, dtype=engine.dtype, device=engine.device).masked_fill_(~valid, float("-inf"))
        return mask[:, None, None, :]  # (b, 1, 1, columns)

    @staticmethod
    def attend(q, cache_k, cache_v, context):
        """q (b, kv_heads, group, d) against the cache's (b, kv_heads, columns, d) -> q's shape."""
        return F.scaled_dot_product_attention(q, cache_k, cache_v, attn_mask=context)


class SplitKvDecode(UnfusedDecode):
    """Flash decoding: the columns in use, split across programs, merged by log-sum-exp."""

    name = "split-kv"
    needs_triton = True

    @staticmethod
    def prepare(engine, b: int):
        return engine.first_column[:b], engine.column, engine.pdl

    @staticmethod
    def attend(q, cache_k, cache_v, context):
        first_column, column, pdl = context
        return torch.ops.trainer.split_kv_decode(q, cache_k, cache_v, first_column, column, pdl=pdl)


class FusedDecode:
    """split-kv with the layer's RoPE and cache write in its split kernel; a prompt's columns
    read once for the rows that sample it."""

    name = "fused"
    needs_triton = True
    shares_prompts = True

    @staticmethod
    def layer_cache(cache, layer: int, b: int):
        """One view (2, b, kv_heads, columns, d): the op mutates one tensor (two views of one
        buffer, both mutated, would make torch.compile copy one of them whole)."""
        return cache[layer, :, :b]

    @staticmethod
    def prepare(engine, b: int):
        return engine.first_column[:b], engine.column, engine.shared_end, engine.share, \
            fused_attention.tile_for(engine.head_dim), engine.pdl

    @staticmethod
    def decode(engine, layer, qkv, cache, cos, sin, context):
        first_column, column, shared_end, share, (split, num_warps), pdl = context
        b = qkv.shape[0]
        attended = torch.ops.trainer.fused_decode_attention(
            qkv, cos.reshape(b, -1), sin.reshape(b, -1), cache, first_column, column,
            layer.q_norm, layer.k_norm, engine.eps, engine.q_heads, split=split, num_warps=num_warps,
            shared_end=shared_end, share=share, pdl=pdl)
        return attended.reshape(b, -1)


DECODE_ATTENTION = {impl.name: impl for impl in (SdpaDecode, SplitKvDecode, FusedDecode)}
names.DECODE_ATTENTIONS.check(DECODE_ATTENTION, registry_name="trainer.rollout.attention.DECODE_ATTENTION")


def choose(name: str, device: torch.device):
    """The implementation for ``name`` (``auto``: fused where Triton runs on CUDA, else sdpa)."""
    if name == "auto":
        name = "fused" if device.type == "cuda" and triton is not None else "sdpa"
    if name not in DECODE_ATTENTION:
        raise ValueError(f"decode attention {name!r}: choose one of {', '.join(names.DECODE_ATTENTIONS.choices())}")
    if DECODE_ATTENTION[name].needs_triton and not triton_runs_on(device):
        why = "Triton is not installed" if triton is None else f"Triton does not run on {device.type} tensors"
        raise ValueError(f"decode attention {name!r}: {why} (on the CPU it runs only under TRITON_INTERPRET=1); "
                         f"use 'sdpa'")
    return DECODE_ATTENTION[name]
