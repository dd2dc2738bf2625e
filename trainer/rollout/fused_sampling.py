"""Sampling from the full softmax in one pass over the logits, in Triton.

The static engine's plain mode (a temperature, no top-k or top-p) draws each token with
the Gumbel-max trick, as :func:`trainer.rollout.sampling.sample_tokens` does. Written
with torch ops, that is an Exp(1) draw per vocabulary entry written to memory and read
back, then two or three passes over the (rows, vocabulary) scores; for a 152k
vocabulary that is most of a decode step's time outside the layers. Here each program
takes one span of one row's logits and, in one read, keeps the running log-sum-exp and
the best ``logit / T + Gumbel`` (the noise drawn in registers by Philox, keyed by a seed
that lives on the device); a second kernel merges the spans. The result: the token, and
its log-prob under the tempered softmax (what truncated importance sampling compares).

The seed is a (1,) int64 tensor the caller advances after each draw, so a captured CUDA
graph replays fresh noise. The kernels also run on the CPU under ``TRITON_INTERPRET=1``,
which is how CI tests them.
"""

from __future__ import annotations

import torch

from trainer.rollout.attention import triton
from trainer.rollout.sampling import NOISE_FLOOR

if triton is not None:
    import triton.language as tl

SPAN = 8192  # vocabulary entries per program
BLOCK = 2048  # entries per inner step


@torch.library.custom_op("trainer::gumbel_sample", mutates_args=())
def gumbel_sample(logits: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor, span: int = SPAN,
                  block: int = BLOCK, rows_per_program: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, V) logits, (1,) temperature, (1,) int64 seed -> tokens (b,) long, log-probs (b,) float32.

    Each program reads ``span`` entries of ``rows_per_program`` rows, ``block`` at a time
    (``span`` a multiple of four blocks)."""
    rows, vocab = logits.shape
    if logits.stride(-1) != 1:
        raise ValueError("gumbel_sample needs each row of logits contiguous")
    if span % (4 * block) or block & (block - 1):
        raise ValueError(f"gumbel_sample: span={span} must be a multiple of four blocks of a power of two "
                         f"(block={block})")
    if rows_per_program & (rows_per_program - 1):
        raise ValueError(f"gumbel_sample: rows_per_program={rows_per_program} is not a power of two")
    parts = -(-vocab // span)
    stats = torch.empty((rows, parts, 4), dtype=torch.float32, device=logits.device)
    index = torch.empty((rows, parts), dtype=torch.int64, device=logits.device)
    tiles = -(-rows // rows_per_program)
    _span_kernel[(tiles, parts)](logits, logits.stride(0), temperature, seed, rows, vocab, stats, index,
                                 ROWS=rows_per_program, SPAN=span, BLOCK=block, NOISE_FLOOR=NOISE_FLOOR, num_warps=8)
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    merge_rows = max(rows_per_program, 16)
    _merge_kernel[(-(-rows // merge_rows),)](stats, index, tokens, logprobs, rows, parts, ROWS=merge_rows,
                                             PARTS_TILE=triton.next_power_of_2(parts), num_warps=1)
    return tokens, logprobs


@gumbel_sample.register_fake
def _(logits, temperature, seed, span=SPAN, block=BLOCK, rows_per_program=1):
    rows = logits.shape[0]
    return (logits.new_empty(rows, dtype=torch.int64), logits.new_empty(rows, dtype=torch.float32))


if triton is not None:

    @triton.jit
    def _span_kernel(logits_ptr, row_stride, temperature_ptr, seed_ptr, rows, vocab, stats_ptr, index_ptr,
                     ROWS: tl.constexpr, SPAN: tl.constexpr, BLOCK: tl.constexpr, NOISE_FLOOR: tl.constexpr):
        # A tile of ROWS rows x BLOCK entries (ROWS is 1 on the GPU; the interpreter's tests take
        # many rows per program, where its per-program cost dominates).
        block, part = tl.program_id(0), tl.program_id(1)
        parts = tl.num_programs(1)
        temperature = tl.load(temperature_ptr)
        seed = tl.load(seed_ptr)
        r = block * ROWS + tl.arange(0, ROWS)
        row_ok = r < rows
        row_at = r.to(tl.int64) * row_stride  # int64: rows x vocabulary may pass 2**31
        # Per-lane accumulators, reduced once at the end: a reduction per block would cost a
        # shared-memory round trip each; one Philox call gives the noise of four blocks.
        top = tl.full((ROWS, BLOCK), float("-inf"), tl.float32)  # running max of the scores
        total = tl.zeros((ROWS, BLOCK), tl.float32)  # running sum of exp(score - top)
        best = tl.full((ROWS, BLOCK), float("-inf"), tl.float32)  # the best perturbed score, entry, score
        best_at = tl.zeros((ROWS, BLOCK), tl.int32)
        best_score = tl.zeros((ROWS, BLOCK), tl.float32)
        lanes = tl.arange(0, BLOCK)
        for group in range(SPAN // (4 * BLOCK)):
            start = part * SPAN + group * 4 * BLOCK
            # Unique per (seed, row, entry): entry e of the four blocks is lane e % BLOCK of draw e // BLOCK.
            u0, u1, u2, u3 = tl.rand4x(seed, r[:, None] * vocab + start + lanes[None, :])
            for j in tl.static_range(4):
                uniform = u0 if j == 0 else (u1 if j == 1 else (u2 if j == 2 else u3))
                cols = start + j * BLOCK + lanes
                valid = row_ok[:, None] & (cols < vocab)[None, :]
                scores = tl.load(logits_ptr + row_at[:, None] + cols[None, :], mask=valid,
                                 other=float("-inf")).to(tl.float32) / temperature
                # Online log-sum-exp with one exp per entry: exp(-|s - top|) scales the smaller side.
                # A -inf logit (a masked entry) adds nothing, and must not meet a -inf top.
                live = valid & (scores > float("-inf"))
                gap = tl.where(live, scores - top, 0.0)
                shrink = tl.exp(-tl.abs(gap))
                total = tl.where(live, tl.where(gap > 0, total * shrink + 1.0, total + shrink), total)
                top = tl.where(live, tl.maximum(top, scores), top)
                # Gumbel-max: argmax(score - log E), E = -log U ~ Exp(1).
                noise = tl.maximum(-tl.log(uniform), NOISE_FLOOR)
                perturbed = tl.where(valid, scores - tl.log(noise), float("-inf"))
                take = perturbed > best
                best = tl.where(take, perturbed, best)
                best_at = tl.where(take, cols[None, :], best_at)
                best_score = tl.where(take, scores, best_score)
        # Rows of lanes -> one (max, sum, best, its entry, its score) per row.
        row_top = tl.max(top, axis=1)
        safe = tl.where(row_top == float("-inf"), 0.0, row_top)
        row_total = tl.sum(total * tl.exp(top - safe[:, None]), axis=1)
        winner = tl.argmax(best, axis=1)
        at_winner = lanes[None, :] == winner[:, None]
        row_best = tl.max(best, axis=1)
        row_entry = tl.sum(tl.where(at_winner, best_at, 0), axis=1)
        row_score = tl.sum(tl.where(at_winner, best_score, 0.0), axis=1)
        out = stats_ptr + (r * parts + part) * 4
        tl.store(out, row_top, mask=row_ok)
        tl.store(out + 1, row_total, mask=row_ok)
        tl.store(out + 2, row_best, mask=row_ok)
        tl.store(out + 3, row_score, mask=row_ok)
        tl.store(index_ptr + r * parts + part, row_entry.to(tl.int64), mask=row_ok)

    @triton.jit
    def _merge_kernel(stats_ptr, index_ptr, tokens_ptr, logprobs_ptr, rows, parts, ROWS: tl.constexpr,
                      PARTS_TILE: tl.constexpr):
        r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        p = tl.arange(0, PARTS_TILE)
        here = (r < rows)[:, None] & (p < parts)[None, :]
        line = stats_ptr + (r[:, None] * parts + p[None, :]) * 4
        top = tl.load(line, mask=here, other=float("-inf"))
        total = tl.load(line + 1, mask=here, other=0.0)
        best = tl.load(line + 2, mask=here, other=float("-inf"))
        best_score = tl.load(line + 3, mask=here, other=0.0)
        overall = tl.max(top, axis=1)
        overall_safe = tl.where(overall == float("-inf"), 0.0, overall)  # masked rows
        log_total = overall_safe + tl.log(tl.sum(total * tl.exp(top - overall_safe[:, None]), axis=1))
        winner = p[None, :] == tl.argmax(best, axis=1)[:, None]
        token = tl.sum(tl.where(winner, tl.load(index_ptr + r[:, None] * parts + p[None, :], mask=here, other=0), 0),
                       axis=1)
        score = tl.sum(tl.where(winner, best_score, 0.0), axis=1)
        tl.store(tokens_ptr + r, token, mask=r < rows)
        tl.store(logprobs_ptr + r, score - log_total, mask=r < rows)
