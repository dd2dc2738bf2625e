"""Sampling from the full softmax in two light passes over the logits, in Triton.

The static engine's plain mode (a temperature, no top-k or top-p) draws each token from
the tempered softmax. Written with torch ops that is an Exp(1) draw per vocabulary entry
written to memory and read back, then two or three passes over the (rows, vocabulary)
scores; for a 152k vocabulary that is most of a decode step's time outside the layers.
A Gumbel-max kernel that draws its noise in registers still spends a Philox call and two
logarithms on every entry. Here the draw is by the inverse CDF, with one uniform a row:

1. each program takes one span of one row's logits and keeps its running log-sum-exp
   (one exponential an entry, nothing random);
2. a program a row merges the spans' sums, draws ``u`` from Philox (keyed by a seed that
   lives on the device), finds the span where ``u`` times the row's total falls, and
   walks that span's cumulative sums to the entry. An entry of weight zero (a ``-inf``
   logit) is never taken: the entry is the first whose cumulative sum passes the target.

The result: the token, and its log-prob under the tempered softmax (what truncated
importance sampling compares). The seed is a (1,) int64 tensor the caller advances after
each draw, so a captured CUDA graph replays fresh noise. The kernels also run on the CPU
under ``TRITON_INTERPRET=1``, which is how CI tests them.
"""

from __future__ import annotations

import torch

from trainer.rollout.attention import triton

if triton is not None:
    import triton.language as tl

    from trainer.rollout.split_kv import after_previous

# The fastest of five tilings on an H200 at batch 128 and 256 (benchmarks/bench_sampler.py).
SPAN = 4096  # vocabulary entries per program of the first pass (and walked by the second)
BLOCK = 1024  # entries per inner step


@torch.library.custom_op("trainer::softmax_sample", mutates_args=())
def softmax_sample(logits: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor, span: int = SPAN,
                   block: int = BLOCK, rows_per_program: int = 1,
                   pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, V) logits, (1,) temperature, (1,) int64 seed -> tokens (b,) long, log-probs (b,) float32.

    Each program reads ``span`` entries of ``rows_per_program`` rows, ``block`` at a time
    (``span`` a multiple of ``block``, both powers of two); ``pdl``: both kernels launched
    with programmatic dependent launch (``split_kv.pdl_runs_on``)."""
    rows, vocab = logits.shape
    if logits.stride(-1) != 1:
        raise ValueError("softmax_sample needs each row of logits contiguous")
    if span % block or block & (block - 1):
        raise ValueError(f"softmax_sample: span={span} must be a multiple of block={block}, a power of two")
    if rows_per_program & (rows_per_program - 1):
        raise ValueError(f"softmax_sample: rows_per_program={rows_per_program} is not a power of two")
    parts = -(-vocab // span)
    stats = torch.empty((rows, parts, 2), dtype=torch.float32, device=logits.device)
    tiles = -(-rows // rows_per_program)
    _span_kernel[(tiles, parts)](logits, logits.stride(0), temperature, rows, vocab, stats,
                                 ROWS=rows_per_program, SPAN=span, BLOCK=block, PDL=pdl, num_warps=8, launch_pdl=pdl)
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    _pick_kernel[(tiles,)](logits, logits.stride(0), temperature, seed, stats, tokens, logprobs, rows, vocab, parts,
                           ROWS=rows_per_program, PARTS_TILE=triton.next_power_of_2(parts), SPAN=span, BLOCK=block,
                           PDL=pdl, num_warps=8, launch_pdl=pdl)
    return tokens, logprobs


@softmax_sample.register_fake
def _(logits, temperature, seed, span=SPAN, block=BLOCK, rows_per_program=1, pdl=False):
    rows = logits.shape[0]
    return (logits.new_empty(rows, dtype=torch.int64), logits.new_empty(rows, dtype=torch.float32))


if triton is not None:

    @triton.jit
    def _span_kernel(logits_ptr, row_stride, temperature_ptr, rows, vocab, stats_ptr,
                     ROWS: tl.constexpr, SPAN: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        after_previous(PDL)
        # A tile of ROWS rows x BLOCK entries (ROWS is 1 on the GPU; the interpreter's tests take
        # many rows per program, where its per-program cost dominates).
        block, part = tl.program_id(0), tl.program_id(1)
        parts = tl.num_programs(1)
        inverse = 1.0 / tl.load(temperature_ptr)
        r = block * ROWS + tl.arange(0, ROWS)
        row_ok = r < rows
        row_at = r.to(tl.int64) * row_stride  # int64: rows x vocabulary may pass 2**31
        # Per-lane accumulators, reduced once at the end (a reduction per block would cost a
        # shared-memory round trip each).
        top = tl.full((ROWS, BLOCK), float("-inf"), tl.float32)  # running max of the scores
        total = tl.zeros((ROWS, BLOCK), tl.float32)  # running sum of exp(score - top)
        lanes = tl.arange(0, BLOCK)
        for step in range(SPAN // BLOCK):
            cols = part * SPAN + step * BLOCK + lanes
            valid = row_ok[:, None] & (cols < vocab)[None, :]
            scores = tl.load(logits_ptr + row_at[:, None] + cols[None, :], mask=valid,
                             other=float("-inf")).to(tl.float32) * inverse
            # Online log-sum-exp with one exp per entry: exp(-|s - top|) scales the smaller side.
            # A -inf logit (a masked entry) adds nothing, and must not meet a -inf top.
            live = scores > float("-inf")
            gap = tl.where(live, scores - top, 0.0)
            shrink = tl.exp(-tl.abs(gap))
            total = tl.where(live, tl.where(gap > 0, total * shrink + 1.0, total + shrink), total)
            top = tl.where(live, tl.maximum(top, scores), top)
        row_top = tl.max(top, axis=1)
        safe = tl.where(row_top == float("-inf"), 0.0, row_top)
        row_total = tl.sum(total * tl.exp(top - safe[:, None]), axis=1)
        out = stats_ptr + (r * parts + part) * 2
        tl.store(out, row_top, mask=row_ok)
        tl.store(out + 1, row_total, mask=row_ok)

    @triton.jit
    def _pick_kernel(logits_ptr, row_stride, temperature_ptr, seed_ptr, stats_ptr, tokens_ptr, logprobs_ptr,
                     rows, vocab, parts, ROWS: tl.constexpr, PARTS_TILE: tl.constexpr, SPAN: tl.constexpr,
                     BLOCK: tl.constexpr, PDL: tl.constexpr):
        after_previous(PDL)
        r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        row_ok = r < rows
        row_at = r.to(tl.int64) * row_stride
        inverse = 1.0 / tl.load(temperature_ptr)
        # The spans' sums on one scale, exp(score - the row's max): which span the draw falls in.
        p = tl.arange(0, PARTS_TILE)
        here = row_ok[:, None] & (p < parts)[None, :]
        line = stats_ptr + (r[:, None] * parts + p[None, :]) * 2
        top = tl.load(line, mask=here, other=float("-inf"))
        overall = tl.max(top, axis=1)
        overall = tl.where(overall == float("-inf"), 0.0, overall)  # a row of -inf logits
        weight = tl.where(top > float("-inf"), tl.load(line + 1, mask=here, other=0.0)
                          * tl.exp(top - overall[:, None]), 0.0)
        row_total = tl.sum(weight, axis=1)
        target = tl.rand(tl.load(seed_ptr), r) * row_total  # u in [0, 1): one uniform a row
        before = tl.cumsum(weight, axis=1)
        # The first span whose cumulative sum passes the target; past the last (rounding), the
        # last span that holds any weight.
        chosen = tl.sum((before <= target[:, None]).to(tl.int32), axis=1)
        last_live = tl.max(tl.where(weight > 0, p[None, :], 0), axis=1)
        chosen = tl.minimum(chosen, last_live)
        at_chosen = p[None, :] == chosen[:, None]
        remaining = target - tl.sum(tl.where(at_chosen, before - weight, 0.0), axis=1)
        # Walk the chosen span's entries, their weights on the same scale, to the target.
        lanes = tl.arange(0, BLOCK)
        running = tl.zeros((ROWS,), tl.float32)
        token = tl.full((ROWS,), -1, tl.int32)
        last = tl.zeros((ROWS,), tl.int32)  # the span's last entry of weight, should rounding overshoot
        for step in range(SPAN // BLOCK):
            cols = chosen[:, None] * SPAN + step * BLOCK + lanes[None, :]
            valid = row_ok[:, None] & (cols < vocab)
            scores = tl.load(logits_ptr + row_at[:, None] + cols, mask=valid, other=float("-inf")).to(tl.float32)
            entry = tl.where(valid, tl.exp(scores * inverse - overall[:, None]), 0.0)
            cumulative = running[:, None] + tl.cumsum(entry, axis=1)
            passed = tl.sum((cumulative <= remaining[:, None]).to(tl.int32), axis=1)
            found = (token < 0) & (passed < BLOCK)
            token = tl.where(found, chosen * SPAN + step * BLOCK + passed, token)
            last = tl.maximum(last, tl.max(tl.where(entry > 0, cols, 0), axis=1))
            running = tl.max(cumulative, axis=1)
        token = tl.where(token < 0, last, token)
        score = tl.load(logits_ptr + row_at + token, mask=row_ok, other=0.0).to(tl.float32) * inverse
        log_total = overall + tl.log(row_total)
        tl.store(tokens_ptr + r, token.to(tl.int64), mask=row_ok)
        tl.store(logprobs_ptr + r, score - log_total, mask=row_ok)
