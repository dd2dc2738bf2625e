"""The split-KV decode attention op (flash decoding) in Triton, and what the fused op shares of it.

SDPA's fused kernels give one thread block to each (row, KV head) and read all the cache's
columns, so a decode step of 128 rows keeps a few hundred blocks busy on a 132-SM GPU and
reads padding and unused columns. Here each program takes one (row, KV head, split of
``SPLIT`` columns), reads only the columns its row uses (``[first_column[row], column]``; a
split past the step's column returns at once), and a second kernel merges the splits'
partial outputs by their log-sum-exp. The query heads of a KV head are the rows of one
tile (GQA without repeating K/V).

:mod:`trainer.rollout.fused_attention` builds its op on this module's tiles, partial
buffers, split test and merge kernel; :mod:`trainer.rollout.attention` picks between the
decode attentions. Importing this module registers ``torch.ops.trainer.split_kv_decode``.
The kernels also run on the CPU under ``TRITON_INTERPRET=1``, which is how CI checks them
against :func:`split_kv_reference`.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU-only install: sdpa is the only decode attention
    triton = None

SPLIT = 128  # cache columns per program: one tile of K and one of V
NUM_WARPS = 4
MIN_GROUP_TILE = 16  # tl.dot's smallest tile: the query heads of a KV head are padded to it


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_runs_on(device: torch.device) -> bool:
    """Whether the Triton kernels can run on tensors of this device."""
    if triton is None:
        return False
    return device.type == "cuda" or _interpreting()


def pdl_runs_on(device: torch.device) -> bool:
    """Whether kernels on this device may use programmatic dependent launch (PDL): CUDA from
    Hopper (compute capability 9) on, compiled Triton (not the interpreter).

    With PDL a kernel's programs may be launched while the kernel before it in the stream
    still runs; they wait (``griddepcontrol.wait``) for its writes before reading anything,
    so only the launch and the previous kernel's tail overlap. The decode step's kernels
    are a few microseconds each, a few hundred a token, so that launch is a share of them."""
    if triton is None or device.type != "cuda" or _interpreting():
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def split_kv_reference(q, cache_k, cache_v, first_column, column):
    """What ``split_kv_decode`` computes, in plain torch (the tests' reference)."""
    columns = torch.arange(cache_k.shape[2], device=q.device)
    valid = (columns[None, :] >= first_column[:, None]) & (columns[None, :] <= column)
    mask = valid[:, None, None, :]
    return F.scaled_dot_product_attention(q.float(), cache_k.float(), cache_v.float(), attn_mask=mask).to(q.dtype)


@torch.library.custom_op("trainer::split_kv_decode", mutates_args=())
def split_kv_decode(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, first_column: torch.Tensor,
                    column: torch.Tensor, split: int = SPLIT, num_warps: int = NUM_WARPS,
                    skip_empty: bool = True, pdl: bool = False) -> torch.Tensor:
    """q (b, kv_heads, group, d); cache_k/v (b, kv_heads, columns, d), d contiguous;
    first_column (b,) and column (1,) long: row r attends to columns [first_column[r], column].
    ``split`` (a power of two, at least 16) columns per program, on ``num_warps`` warps;
    ``skip_empty``: a program whose split holds none of its row's columns returns at once;
    ``pdl``: both kernels launched with programmatic dependent launch (:func:`pdl_runs_on`)."""
    b, kv_heads, group, d = q.shape
    columns = cache_k.shape[2]
    if cache_k.stride(-1) != 1 or cache_v.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("split_kv_decode needs the head dimension contiguous")
    partial, lse = split_partials("split_kv_decode", (b, kv_heads, group, d), columns, split, q.device)
    _split_kernel[(b, kv_heads, partial.shape[2])](
        q, cache_k, cache_v, first_column, column, partial, lse,
        *q.stride()[:3], *cache_k.stride()[:3], *cache_v.stride()[:3],
        1.0 / math.sqrt(d), columns,
        # Triton's CPU interpreter multiplies bf16 tiles wrongly (as of 3.6): it gets fp32 ones.
        UPCAST=q.dtype == torch.float32 or _interpreting(), PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        GROUP=group, GROUP_TILE=max(MIN_GROUP_TILE, triton.next_power_of_2(group)), D=d, SPLIT=split,
        SKIP_EMPTY=skip_empty, PDL=pdl, num_warps=num_warps, launch_pdl=pdl)
    return merge_splits(partial, lse, first_column, column, q.dtype, split, pdl)


def split_partials(op: str, heads: tuple, columns: int, split: int, device):
    """Check the tiles of a split-KV kernel and allocate its splits' partial outputs
    (b, kv_heads, splits, group, d) and log-sum-exps (b, kv_heads, splits, group), fp32."""
    b, kv_heads, group, d = heads
    if d & (d - 1) or d < 16:
        raise ValueError(f"{op} needs a power-of-two head dimension of at least 16, not {d}")
    if split & (split - 1) or split < 16:
        raise ValueError(f"{op}: split={split} is not a power of two of at least 16")
    splits = -(-columns // split)
    return (torch.empty((b, kv_heads, splits, group, d), dtype=torch.float32, device=device),
            torch.empty((b, kv_heads, splits, group), dtype=torch.float32, device=device))


def merge_splits(partial, lse, first_column, column, dtype, split: int, pdl: bool = False) -> torch.Tensor:
    """The splits' partial outputs weighted by their share of the softmax: (b, kv_heads, group, d)."""
    b, kv_heads, splits, group, d = partial.shape
    out = torch.empty((b, kv_heads, group, d), dtype=dtype, device=partial.device)
    _merge_kernel[(b, kv_heads, group)](partial, lse, out, first_column, column, splits, SPLIT=split, D=d,
                                        SPLITS_TILE=triton.next_power_of_2(splits), PDL=pdl, num_warps=1,
                                        launch_pdl=pdl)
    return out


@split_kv_decode.register_fake
def _(q, cache_k, cache_v, first_column, column, split=SPLIT, num_warps=NUM_WARPS, skip_empty=True, pdl=False):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


if triton is not None:

    @triton.jit
    def after_previous(PDL: tl.constexpr):
        """A PDL-launched kernel's first step: wait for the previous kernel's writes, then let
        the next kernel's programs launch (they wait in turn); nothing without PDL."""
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def _holds_columns(start, SPLIT: tl.constexpr, first, last):
        """Whether the split of columns [start, start + SPLIT) holds any of [first, last]."""
        return tl.minimum(start + SPLIT, last + 1) > tl.maximum(start, first)

    @triton.jit
    def _split_kernel(q_ptr, k_ptr, v_ptr, first_ptr, column_ptr, partial_ptr, lse_ptr,
                      q_sb, q_sh, q_sg, k_sb, k_sh, k_sc, v_sb, v_sh, v_sc, scale, columns,
                      UPCAST: tl.constexpr, PRECISION: tl.constexpr, GROUP: tl.constexpr,
                      GROUP_TILE: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr,
                      SKIP_EMPTY: tl.constexpr, PDL: tl.constexpr):
        # One tile of SPLIT columns per program, K and V loaded together: the kernel is bound by
        # reading the cache, and a whole split in flight at once keeps the memory system busy.
        after_previous(PDL)
        row, head, split = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)  # int64 offsets
        first = tl.load(first_ptr + row)
        last = tl.load(column_ptr)  # inclusive
        cols = split * SPLIT + tl.arange(0, SPLIT)
        used = (cols >= first) & (cols <= last) & (cols < columns)  # masked loads cost no memory traffic
        g = tl.arange(0, GROUP_TILE)
        d = tl.arange(0, D)
        # A split with no column of this row writes nothing (the merge skips it): early in a
        # decode most splits lie past the step's column, and they then cost a launch only.
        if SKIP_EMPTY:
            has_columns = _holds_columns(split * SPLIT, SPLIT, first, last)
        else:
            has_columns = split >= 0
        if has_columns:
            q = tl.load(q_ptr + row * q_sb + head * q_sh + g[:, None] * q_sg + d[None, :],
                        mask=g[:, None] < GROUP, other=0.0)
            k = tl.load(k_ptr + row * k_sb + head * k_sh + cols[:, None] * k_sc + d[None, :], mask=used[:, None],
                        other=0.0)
            v = tl.load(v_ptr + row * v_sb + head * v_sh + cols[:, None] * v_sc + d[None, :], mask=used[:, None],
                        other=0.0)
            if UPCAST:  # an fp32 cache (full fp32 products), or the interpreter
                q, k, v = q.to(tl.float32), k.to(tl.float32), v.to(tl.float32)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (GROUP_TILE, SPLIT), fp32
            scores = tl.where(used[None, :], scores, float("-inf"))
            top = tl.max(scores, axis=1)
            top_safe = tl.where(top == float("-inf"), 0.0, top)  # a split with no column of this row
            p = tl.exp(scores - top_safe[:, None])
            total = tl.sum(p, axis=1)
            acc = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)  # (GROUP_TILE, D)
            # A split with no column: log-sum-exp -inf, weight 0 in the merge.
            empty = total == 0.0
            out = acc / tl.where(empty, 1.0, total)[:, None]
            lse = tl.where(empty, float("-inf"), top_safe + tl.log(tl.where(empty, 1.0, total)))
            base = ((row * tl.num_programs(1) + head) * tl.num_programs(2) + split) * GROUP
            tl.store(partial_ptr + (base + g[:, None]) * D + d[None, :], out, mask=g[:, None] < GROUP)
            tl.store(lse_ptr + base + g, lse, mask=g < GROUP)

    @triton.jit
    def _merge_kernel(partial_ptr, lse_ptr, out_ptr, first_ptr, column_ptr, splits, SPLIT: tl.constexpr,
                      D: tl.constexpr, SPLITS_TILE: tl.constexpr, PDL: tl.constexpr):
        # One program per (row, KV head, query head of the group): the splits' outputs, weighted
        # by each one's share of the softmax mass.
        after_previous(PDL)
        row, head, g = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
        group = tl.num_programs(2)
        s = tl.arange(0, SPLITS_TILE)
        d = tl.arange(0, D)
        line = ((row * tl.num_programs(1) + head) * splits + s) * group + g  # (SPLITS_TILE,)
        first = tl.load(first_ptr + row)
        last = tl.load(column_ptr)
        in_use = (s < splits) & _holds_columns(s * SPLIT, SPLIT, first, last)  # the splits that wrote
        lse = tl.load(lse_ptr + line, mask=in_use, other=float("-inf"))
        top = tl.max(lse, axis=0)
        weight = tl.exp(lse - tl.where(top == float("-inf"), 0.0, top))  # a row with no column: all 0
        total = tl.sum(weight, axis=0)
        weight = weight / tl.where(total == 0.0, 1.0, total)
        part = tl.load(partial_ptr + line[:, None] * D + d[None, :], mask=in_use[:, None], other=0.0)
        out = tl.sum(weight[:, None] * part, axis=0)
        dest = out_ptr + ((row * tl.num_programs(1) + head) * group + g) * D + d
        tl.store(dest, out.to(out_ptr.dtype.element_ty))
