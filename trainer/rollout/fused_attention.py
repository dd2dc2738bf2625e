"""A decode step's attention with its RoPE and cache write folded into the split-KV kernel.

The ``split-kv`` attention (:mod:`trainer.rollout.split_kv`) runs after three kernels of
the compiled layer step: one rotates q and k, two write k and v into the cache (about
3.9 us a layer together at batch 128 on an H200, ``benchmarks/RESULTS.md``). Here the
split kernel takes the fused qkv projection as the GEMM left it:

* every program rotates the queries of its KV head itself (64 values a head; Qwen3's
  per-head RMS norm first), so no rotated q is written anywhere;
* the program whose split holds the step's column also rotates that token's k, writes k
  and v into the cache, and uses them from registers in place of the column it loaded.
  No other program reads that column, so the write races with nothing;
* the splits' partial outputs are merged by the split-kv merge kernel, as there;
* rows that sample the same prompt share its columns (``share`` > 1): the prompt's K/V are
  the same in each of their rows (the prefill copies them), so a split that lies wholly
  before ``shared_end`` (the chunk's prompt columns) and the step's column is read once,
  by the program of the first of ``share`` rows, for the queries of all of them (one
  tile of ``share`` x group query heads); the others' programs return at once. GRPO's
  samples of a prompt (4 to 16 a prompt) then read its columns once instead of each.

A version that merged inside the kernel as well (the last split of a (row, KV head) to
finish, counted with an atomic, merged them all) took 27.4 us a layer against 12.3 +
2.4 for the split and merge kernels (``benchmarks/RESULTS.md``), and was taken out.

The kernel runs on the CPU under ``TRITON_INTERPRET=1``, which is how CI checks it
against the unfused path.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from trainer.rollout.split_kv import (MIN_GROUP_TILE, NUM_WARPS, SPLIT, _interpreting, merge_splits, split_partials,
                                      triton)

if triton is not None:
    import triton.language as tl

    from trainer.rollout.split_kv import _holds_columns, after_previous


MAX_SHARED_TILE = 64  # query heads in one shared program's tile (share x group, rounded up to a power of two)
#: (columns a program reads, warps) by head dimension: what ``benchmarks/bench_decode_attention.py
#: --fused 4`` timed fastest on an H100 (``benchmarks/RESULTS.md``). At d 64 (the 0.5B shape) the
#: default 128 x 4 was fastest or within 0.1 %; at d 128 (the 1.5B shape) 64 x 4 took 3-9 % less.
TILES = {64: (SPLIT, NUM_WARPS), 128: (64, 4)}


def tile_for(head_dim: int) -> tuple[int, int]:
    """(split, num_warps) for the fused op at this head dimension (the default where none was timed)."""
    return TILES.get(head_dim, (SPLIT, NUM_WARPS))


def shared_rows(owner: list[int], group: int) -> int:
    """How many consecutive rows the fused kernel may treat as one prompt's (``share``): the
    largest power of two whose aligned blocks of ``owner`` (row -> prompt) each hold one
    prompt, that divides the row count, and whose share x group query heads fit one tile."""
    share = 1
    while (len(owner) % (2 * share) == 0 and _tile(2 * share, group) <= MAX_SHARED_TILE
           and all(owner[r] == owner[r + 2 * share - 1] for r in range(0, len(owner), 2 * share))):
        share *= 2  # owner is group-contiguous: a block's first and last rows decide it
    return share


def _tile(share: int, group: int) -> int:
    return max(MIN_GROUP_TILE, 1 << (share * group - 1).bit_length())


@torch.library.custom_op("trainer::fused_decode_attention", mutates_args=("cache",))
def fused_decode_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: torch.Tensor,
                           first_column: torch.Tensor, column: torch.Tensor,
                           q_norm: Optional[torch.Tensor], k_norm: Optional[torch.Tensor],
                           eps: float, q_heads: int, split: int = SPLIT, num_warps: int = NUM_WARPS,
                           shared_end: Optional[torch.Tensor] = None, share: int = 1,
                           pdl: bool = False) -> torch.Tensor:
    """One decode token's attention for b rows, its K/V written into the cache at ``column``.

    qkv (b, (q_heads + 2 kv_heads) * d): the fused projection (bias added), before RoPE;
    cos, sin (b, d): each row's rotation at its position (HF's rotate-half layout);
    cache (2, b, kv_heads, columns, d): K then V, one tensor (two mutated views of one
    buffer would make torch.compile copy one of them whole); first_column (b,) and column
    (1,) long: row r attends to columns [first_column[r], column] (a row with none, first
    column past column, gets zeros and writes nothing); q_norm/k_norm (d,) or None: a
    per-head RMS norm before RoPE (Qwen3); shared_end (1,) long and share: each aligned
    block of ``share`` rows (a power of two dividing b) samples one prompt, so its rows hold
    the same K/V in columns [0, shared_end) (``share`` 1: no row shares any); ``pdl``: both
    kernels launched with programmatic dependent launch (``split_kv.pdl_runs_on``).
    Returns (b, kv_heads, group, d) in qkv's dtype, the queries of a KV head as its rows.
    """
    b = qkv.shape[0]
    _, _, kv_heads, columns, d = cache.shape
    group = q_heads // kv_heads
    # share 1 reads no row's columns for another: only a block of rows takes the shared tile.
    if share < 1 or share & (share - 1) or b % share or (share > 1 and _tile(share, group) > MAX_SHARED_TILE):
        raise ValueError(f"fused_decode_attention: share={share} is not a power of two dividing the {b} rows "
                         f"with share x {group} query heads in {MAX_SHARED_TILE}")
    if share > 1 and shared_end is None:
        raise ValueError("fused_decode_attention: share > 1 needs shared_end")
    if qkv.shape[1] != (q_heads + 2 * kv_heads) * d:
        raise ValueError(f"fused_decode_attention: qkv has {qkv.shape[1]} columns, not "
                         f"({q_heads} + 2 x {kv_heads}) x {d}")
    if any(t.stride(-1) != 1 for t in (qkv, cos, sin, cache)) or cos.stride(0) != sin.stride(0):
        raise ValueError("fused_decode_attention needs the last dimension contiguous (and cos, sin alike)")
    partial, lse = split_partials("fused_decode_attention", (b, kv_heads, group, d), columns, split, qkv.device)
    has_norm = q_norm is not None
    _fused_kernel[(b, kv_heads, partial.shape[2])](
        qkv, qkv.stride(0), cos, sin, cos.stride(0), q_norm if has_norm else qkv, k_norm if has_norm else qkv, eps,
        cache, *cache.stride()[:4], first_column, column, column if shared_end is None else shared_end, partial,
        lse, 1.0 / math.sqrt(d), columns,
        # Triton's CPU interpreter multiplies bf16 tiles wrongly (as of 3.6): it gets fp32 ones.
        UPCAST=qkv.dtype == torch.float32 or _interpreting(),
        PRECISION="ieee" if qkv.dtype == torch.float32 else "tf32", Q_HEADS=q_heads, KV_HEADS=kv_heads,
        GROUP=group, GROUP_TILE=_tile(1, group), D=d, SPLIT=split, HAS_NORM=has_norm, SHARE=share,
        SHARED_TILE=_tile(share, group), PDL=pdl, num_warps=num_warps, launch_pdl=pdl)
    return merge_splits(partial, lse, first_column, column, qkv.dtype, split, pdl)


@fused_decode_attention.register_fake
def _(qkv, cos, sin, cache, first_column, column, q_norm, k_norm, eps, q_heads, split=SPLIT,
      num_warps=NUM_WARPS, shared_end=None, share=1, pdl=False):
    _, _, kv_heads, _, d = cache.shape
    return qkv.new_empty((qkv.shape[0], kv_heads, q_heads // kv_heads, d))


if triton is not None:

    @triton.jit
    def _rotated(row_ptr, offset, d, partner, sign, cos, sin, norm_ptr, eps, mask, D: tl.constexpr,
                 HAS_NORM: tl.constexpr):
        """Heads at ``row_ptr + offset`` (a (heads, D) or (D,) block of offsets), RMS-normed when
        HAS_NORM, rotated: x * cos + rotate_half(x) * sin, in fp32."""
        x = tl.load(row_ptr + offset + d, mask=mask, other=0.0).to(tl.float32)
        x_partner = tl.load(row_ptr + offset + partner, mask=mask, other=0.0).to(tl.float32)
        if HAS_NORM:
            inverse_rms = tl.rsqrt(tl.sum(x * x, axis=-1, keep_dims=True) / D + eps)
            x = x * inverse_rms * tl.load(norm_ptr + d).to(tl.float32)
            x_partner = x_partner * inverse_rms * tl.load(norm_ptr + partner).to(tl.float32)
        return x * cos + sign * x_partner * sin

    @triton.jit
    def _fused_kernel(qkv_ptr, qkv_sb, cos_ptr, sin_ptr, cs_sb, q_norm_ptr, k_norm_ptr, eps,
                      cache_ptr, c_skv, c_sb, c_sh, c_sc, first_ptr, column_ptr, shared_ptr, partial_ptr, lse_ptr,
                      scale, columns,
                      UPCAST: tl.constexpr, PRECISION: tl.constexpr, Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                      GROUP: tl.constexpr, GROUP_TILE: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr,
                      HAS_NORM: tl.constexpr, SHARE: tl.constexpr, SHARED_TILE: tl.constexpr,
                      PDL: tl.constexpr):
        after_previous(PDL)
        row, head, split = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)  # int64 offsets
        splits = tl.num_programs(2)
        k_ptr = cache_ptr + row * c_sb + head * c_sh  # this row's and KV head's (columns, D)
        v_ptr = k_ptr + c_skv
        first = tl.load(first_ptr + row)
        last = tl.load(column_ptr)  # inclusive: this step's column
        g = tl.arange(0, GROUP_TILE)
        d = tl.arange(0, D)
        real = g < GROUP
        # A split wholly inside the shared prompt and before the step's column: the block's first
        # row reads it once for the block's queries; the other rows' programs have nothing to do.
        end = split * SPLIT + SPLIT
        if SHARE > 1:
            in_prefix = (end <= tl.load(shared_ptr)) & (end <= last)
        else:
            in_prefix = end < 0
        if in_prefix:
            if (row % SHARE == 0) & _holds_columns(split * SPLIT, SPLIT, first, last):
                _shared_split(qkv_ptr, qkv_sb, cos_ptr, sin_ptr, cs_sb, q_norm_ptr, eps, k_ptr, v_ptr, c_sc,
                              partial_ptr, lse_ptr, row, head, split, splits, first, last, scale, columns,
                              UPCAST, PRECISION, KV_HEADS, GROUP, D, SPLIT, HAS_NORM, SHARE, SHARED_TILE)
        elif _holds_columns(split * SPLIT, SPLIT, first, last):
            dtype = qkv_ptr.dtype.element_ty
            qkv_row = qkv_ptr + row * qkv_sb
            partner = (d + D // 2) % D
            sign = tl.where(d < D // 2, -1.0, 1.0)
            cos = tl.load(cos_ptr + row * cs_sb + d).to(tl.float32)
            sin = tl.load(sin_ptr + row * cs_sb + d).to(tl.float32)
            q = _rotated(qkv_row, (head * GROUP + g[:, None]) * D, d[None, :], partner[None, :], sign[None, :],
                         cos[None, :], sin[None, :], q_norm_ptr, eps, real[:, None], D, HAS_NORM).to(dtype)
            k_new = _rotated(qkv_row, (Q_HEADS + head) * D, d, partner, sign, cos, sin, k_norm_ptr, eps, d < D, D,
                             HAS_NORM).to(dtype)
            v_new = tl.load(qkv_row + (Q_HEADS + KV_HEADS + head) * D + d)
            # The step's token: the split that holds its column writes it, and every program
            # that holds the column takes it from registers.
            owns = (d * 0 + last) // SPLIT == split  # (D,): this split holds the step's column
            tl.store(k_ptr + last * c_sc + d, k_new, mask=owns)
            tl.store(v_ptr + last * c_sc + d, v_new, mask=owns)

            cols = split * SPLIT + tl.arange(0, SPLIT)
            used = (cols >= first) & (cols <= last) & (cols < columns)
            earlier = used & (cols != last)  # masked loads cost no memory traffic
            k = tl.load(k_ptr + cols[:, None] * c_sc + d[None, :], mask=earlier[:, None], other=0.0)
            v = tl.load(v_ptr + cols[:, None] * c_sc + d[None, :], mask=earlier[:, None], other=0.0)
            is_new = (cols == last)[:, None]
            k = tl.where(is_new, k_new[None, :], k)
            v = tl.where(is_new, v_new[None, :], v)
            line = ((row * KV_HEADS + head) * splits + split) * GROUP + g
            _attend_and_store(q, k, v, used, scale, partial_ptr, lse_ptr, line, real, D, UPCAST, PRECISION)

    @triton.jit
    def _attend_and_store(q, k, v, used, scale, partial_ptr, lse_ptr, line, real, D: tl.constexpr,
                          UPCAST: tl.constexpr, PRECISION: tl.constexpr):
        """Queries (lines, D) against a split's k, v (SPLIT, D), ``used`` columns only (at least
        one): each line's partial output and log-sum-exp, stored at ``line`` where ``real``."""
        if UPCAST:  # an fp32 cache (full fp32 products), or the interpreter
            q, k, v = q.to(tl.float32), k.to(tl.float32), v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (lines, SPLIT), fp32
        scores = tl.where(used[None, :], scores, float("-inf"))
        top = tl.max(scores, axis=1)
        p = tl.exp(scores - top[:, None])  # the split holds a used column: top is finite
        total = tl.sum(p, axis=1)
        acc = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)  # (lines, D)
        d = tl.arange(0, D)
        tl.store(partial_ptr + line[:, None] * D + d[None, :], acc / total[:, None], mask=real[:, None])
        tl.store(lse_ptr + line, top + tl.log(total), mask=real)

    @triton.jit
    def _shared_split(qkv_ptr, qkv_sb, cos_ptr, sin_ptr, cs_sb, q_norm_ptr, eps, k_ptr, v_ptr, c_sc, partial_ptr,
                      lse_ptr, row, head, split, splits, first, last, scale, columns,
                      UPCAST: tl.constexpr, PRECISION: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                      D: tl.constexpr, SPLIT: tl.constexpr, HAS_NORM: tl.constexpr, SHARE: tl.constexpr,
                      SHARED_TILE: tl.constexpr):
        """One split of prompt columns for the queries of rows [row, row + SHARE): line m of the
        tile is query head m % GROUP of row row + m // GROUP. The split holds no step column."""
        m = tl.arange(0, SHARED_TILE)
        real = m < SHARE * GROUP
        rows = row + tl.where(real, m // GROUP, 0)  # (SHARED_TILE,)
        heads = m % GROUP
        d = tl.arange(0, D)
        partner = (d + D // 2) % D
        sign = tl.where(d < D // 2, -1.0, 1.0)
        cos = tl.load(cos_ptr + rows[:, None] * cs_sb + d[None, :]).to(tl.float32)
        sin = tl.load(sin_ptr + rows[:, None] * cs_sb + d[None, :]).to(tl.float32)
        q = _rotated(qkv_ptr + rows[:, None] * qkv_sb, (head * GROUP + heads[:, None]) * D, d[None, :],
                     partner[None, :], sign[None, :], cos, sin, q_norm_ptr, eps, real[:, None], D, HAS_NORM)
        q = q.to(qkv_ptr.dtype.element_ty)
        cols = split * SPLIT + tl.arange(0, SPLIT)
        used = (cols >= first) & (cols <= last) & (cols < columns)
        k = tl.load(k_ptr + cols[:, None] * c_sc + d[None, :], mask=used[:, None], other=0.0)
        v = tl.load(v_ptr + cols[:, None] * c_sc + d[None, :], mask=used[:, None], other=0.0)
        line = ((rows * KV_HEADS + head) * splits + split) * GROUP + heads
        _attend_and_store(q, k, v, used, scale, partial_ptr, lse_ptr, line, real, D, UPCAST, PRECISION)
