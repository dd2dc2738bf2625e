"""The static engine's Triton kernels, on a GPU and under Triton's CPU interpreter.

The split-KV decode attention against masked SDPA, the fused decode attention against
RoPE, the cache write and masked SDPA written out in torch, and the fused sampler
against the softmax it samples from. The kernel tests run where Triton can run them: on CUDA
(``gpu``), and on the CPU when ``TRITON_INTERPRET=1`` was set before Triton was
imported. CI has no GPU, so ``test_the_kernel_tests_pass_under_the_triton_interpreter``
runs this file's kernel tests again in a child pytest with that variable set.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch

from trainer.config import TrainerConfig
from trainer.models import byte_tokenizer, load_model_and_tokenizer, random_model
from trainer.rollout import BackendUnavailable, SamplingParams
from trainer.rollout import split_kv
from trainer.rollout.attention import choose
from trainer.rollout.split_kv import SPLIT, split_kv_decode, split_kv_reference
from trainer.rollout import fused_attention
from trainer.rollout.fused_attention import fused_decode_attention, shared_rows
from trainer.rollout.fused_sampling import softmax_sample
from trainer.rollout.static import PLAIN, StaticEngine

from test_static_engine import QWEN3_TINY, allocated_shapes, chi_square_p_value, sharpen

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and split_kv.triton is not None
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1"),
                        id="interpreted"),
           pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
               not torch.cuda.is_available() or split_kv.triton is None, reason="needs CUDA and Triton")],
                        id="cuda")]
COLUMNS = 2 * SPLIT + 64  # three splits, the last one partly past the cache's end


def cache_and_queries(device, dtype, rows=4, kv_heads=2, group=7, d=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    cache = torch.randn((2, rows, kv_heads, COLUMNS, d), generator=generator).to(device, dtype)
    # The engine's queries: a view of the fused qkv projection, (b, kv_heads, group, d), not contiguous.
    qkv = torch.randn((rows, (kv_heads * group + 2 * kv_heads) * d), generator=generator).to(device, dtype)
    q = qkv[:, : kv_heads * group * d].reshape(rows, kv_heads, group, d)
    return q, cache[0], cache[1]


# (each row's first column, the step's column): splits wholly unused, a first column inside a
# split and inside a block, a column on a split's last and first columns, one column in use.
SPANS = [([0, 5, 70, 130], 200), ([0, 0, 0, 0], 0), ([3, 64, 127, 127], 127), ([0, 1, 2, 128], 128),
         ([10, 20, 250, 300], COLUMNS - 1), ([0, 0, 0, 0], SPLIT - 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_split_kv_equals_masked_sdpa(device, dtype):
    q, cache_k, cache_v = cache_and_queries(device, dtype)
    tolerance = 1e-5 if dtype == torch.float32 else 1.6e-2  # bf16: an output rounding or two
    for first, column in SPANS:
        first = torch.tensor(first, device=device)
        column = torch.tensor([column], device=device)
        ours = split_kv_decode(q, cache_k, cache_v, first, column)
        reference = split_kv_reference(q, cache_k, cache_v, first, column)
        assert ours.shape == q.shape and ours.dtype == dtype and ours.is_contiguous()
        error = (ours.float() - reference.float()).abs().max().item()
        assert error <= tolerance, (first.tolist(), column.item(), error)


@pytest.mark.parametrize("device", DEVICES)
def test_columns_a_row_does_not_use_do_not_reach_its_output(device):
    q, cache_k, cache_v = cache_and_queries(device, torch.float32, rows=2)
    first, column = torch.tensor([5, 140], device=device), torch.tensor([190], device=device)
    before = split_kv_decode(q, cache_k, cache_v, first, column)
    cache_k, cache_v = cache_k.clone(), cache_v.clone()
    for tensor in (cache_k, cache_v):
        tensor[0, :, :5] = float("nan")  # left padding
        tensor[1, :, :140] = float("nan")
        tensor[:, :, 191:] = float("nan")  # columns not written yet
    after = split_kv_decode(q, cache_k, cache_v, first, column)
    assert torch.equal(after, before)


@pytest.mark.parametrize("device", DEVICES)
def test_a_row_with_no_column_in_use_attends_to_nothing(device):
    q, cache_k, cache_v = cache_and_queries(device, torch.float32, rows=2)
    first, column = torch.tensor([300, 0], device=device), torch.tensor([200], device=device)  # row 0: 300 > 200
    out = split_kv_decode(q, cache_k, cache_v, first, column)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    torch.testing.assert_close(out[1], split_kv_reference(q, cache_k, cache_v, first, column)[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_the_engine_decodes_the_same_text_with_either_attention(device):
    model, tokenizer = tiny_policy(device)
    long = "Tom has 3 apples and buys 4 more; then he gives half of them to Ann, who eats one. " * 2
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in (long, "x", "12 * 7 =")]
    assert SPLIT < len(prompts[0]) < 2 * SPLIT  # the long row's columns span two splits, the others' one
    args = dict(device=device, dtype=torch.float32, max_rows=4, max_columns=2 * SPLIT + 64)
    split = StaticEngine(model, tokenizer, attention="split-kv", **args)
    sdpa = StaticEngine(model, tokenizer, attention="sdpa", **args)
    assert split.attention.name == "split-kv" and sdpa.attention.name == "sdpa"
    greedy = SamplingParams(n=1, max_new_tokens=8, temperature=0.0)
    ours, theirs = split.generate(prompts, greedy), sdpa.generate(prompts, greedy)
    assert ours.token_lists() == theirs.token_lists()
    torch.testing.assert_close(ours.logprobs, theirs.logprobs, atol=1e-4, rtol=0)


def rotated(x, cos, sin, norm=None, eps=1e-6):
    """HF's RoPE (rotate-half) of x (b, heads, d), RMS-normed per head first when ``norm`` is given."""
    if norm is not None:
        x = torch.nn.functional.rms_norm(x, (x.shape[-1],), norm, eps)
    half = x.shape[-1] // 2
    return x * cos[:, None] + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin[:, None]


def fused_inputs(device, dtype, *, norm: bool, rows=4, kv_heads=2, group=7, d=64, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(shape, generator=generator).to(device, dtype)

    q_heads = kv_heads * group
    angles = torch.rand((rows, d // 2), generator=generator).repeat(1, 2) * 6.3  # HF's layout: the halves alike
    return dict(qkv=draw(rows, (q_heads + 2 * kv_heads) * d), cos=angles.cos().to(device, dtype),
                sin=angles.sin().to(device, dtype),
                cache=draw(2, rows, kv_heads, COLUMNS, d), q_norm=draw(d) if norm else None,
                k_norm=draw(d) if norm else None, q_heads=q_heads)


def unfused(inputs, first, column, eps=1e-6):
    """What fused_decode_attention computes, in torch: (output, the cache after the step)."""
    qkv, cos, sin, q_heads = inputs["qkv"].float(), inputs["cos"].float(), inputs["sin"].float(), inputs["q_heads"]
    cache = inputs["cache"].clone()
    _, rows, kv_heads, _, d = cache.shape
    norms = [None if inputs[key] is None else inputs[key].float() for key in ("q_norm", "k_norm")]
    q = rotated(qkv[:, : q_heads * d].unflatten(1, (q_heads, d)), cos, sin, norms[0], eps)
    k = rotated(qkv[:, q_heads * d : (q_heads + kv_heads) * d].unflatten(1, (kv_heads, d)), cos, sin, norms[1], eps)
    v = qkv[:, (q_heads + kv_heads) * d :].unflatten(1, (kv_heads, d))
    cache[0, :, :, column] = k.to(cache.dtype)
    cache[1, :, :, column] = v.to(cache.dtype)
    grouped = q.to(cache.dtype).reshape(rows, kv_heads, q_heads // kv_heads, d)
    out = split_kv_reference(grouped, cache[0], cache[1], torch.tensor(first, device=cache.device),
                             torch.tensor([column], device=cache.device))
    return out, cache


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("norm", [False, True], ids=["qwen2", "qwen3-norms"])
def test_fused_attention_equals_rope_the_cache_write_and_masked_sdpa(device, dtype, norm):
    inputs = fused_inputs(device, dtype, norm=norm)
    # bf16: an output rounding or two, relative to the value (a row of one column returns its v)
    tolerance = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1.6e-2, rtol=8e-3)
    for first, column in SPANS:
        expected, expected_cache = unfused(inputs, first, column)
        cache = inputs["cache"].clone()
        ours = fused_decode_attention(inputs["qkv"], inputs["cos"], inputs["sin"], cache,
                                      torch.tensor(first, device=device), torch.tensor([column], device=device),
                                      inputs["q_norm"], inputs["k_norm"], 1e-6, inputs["q_heads"])
        assert ours.shape == expected.shape and ours.dtype == dtype
        torch.testing.assert_close(ours.float(), expected.float(), **tolerance, msg=lambda m: f"{first, column}: {m}")
        # The step's column holds the rotated k and the v; every other column is as it was.
        written = torch.zeros(COLUMNS, dtype=torch.bool)
        written[column] = True
        assert torch.equal(cache[:, :, :, ~written], inputs["cache"][:, :, :, ~written])
        torch.testing.assert_close(cache[:, :, :, column].float(), expected_cache[:, :, :, column].float(),
                                   **tolerance)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [d for d, tile in sorted(fused_attention.TILES.items())
                                      if tile != (SPLIT, split_kv.NUM_WARPS)])
def test_the_fused_attention_at_each_head_dimensions_tile_equals_the_unfused_step(device, head_dim):
    """The engine runs the op with the tile :func:`fused_attention.tile_for` names for its head
    dimension (fewer columns a program at d 128): the result is the unfused step's there too
    (the default tile's is the other tests')."""
    split, num_warps = fused_attention.tile_for(head_dim)
    inputs = fused_inputs(device, torch.float32, norm=True, group=6, d=head_dim)
    for first, column in SPANS[0:5:2]:  # several splits; split edges at 64 and 128; the cache's end (CI's time)
        expected, expected_cache = unfused(inputs, first, column)
        cache = inputs["cache"].clone()
        ours = fused_decode_attention(inputs["qkv"], inputs["cos"], inputs["sin"], cache,
                                      torch.tensor(first, device=device), torch.tensor([column], device=device),
                                      inputs["q_norm"], inputs["k_norm"], 1e-6, inputs["q_heads"], split=split,
                                      num_warps=num_warps)
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5, msg=lambda m: f"{first, column}: {m}")
        torch.testing.assert_close(cache, expected_cache, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_attention_rows_without_columns_and_columns_a_row_does_not_use(device):
    inputs = fused_inputs(device, torch.float32, norm=False, rows=3)
    first, column = [5, 140, 300], 190  # row 2 has no column in use (300 > 190)

    def run(cache):
        return fused_decode_attention(inputs["qkv"], inputs["cos"], inputs["sin"], cache,
                                      torch.tensor(first, device=device), torch.tensor([column], device=device),
                                      None, None, 1e-6, inputs["q_heads"])

    before = run(inputs["cache"].clone())
    poisoned = inputs["cache"].clone()
    poisoned[:, 0, :, :5] = float("nan")  # left padding
    poisoned[:, 1, :, :140] = float("nan")
    poisoned[:, :, :, 190:] = float("nan")  # the step's column (written by the step) and the unwritten ones
    after = run(poisoned)
    assert torch.equal(after, before)
    assert torch.equal(after[2], torch.zeros_like(after[2]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("norm", [False, True], ids=["qwen2", "qwen3-norms"])
def test_rows_that_share_a_prompt_read_its_columns_once(device, dtype, norm):
    """Blocks of four rows sample one prompt (the same K/V in its 200 columns): with share=4
    the kernel gives what it gives each row alone, and reads the prompt's whole splits from
    the block's first row only (the others' copies can hold anything)."""
    inputs = fused_inputs(device, dtype, norm=norm, rows=8)
    prompt, share = 200, 4
    cache = inputs["cache"]
    for row in range(8):
        cache[:, row, :, :prompt] = cache[:, row // share * share, :, :prompt]
    first = torch.tensor([3] * 4 + [60] * 4, device=device)
    tolerance = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1.6e-2, rtol=8e-3)

    def run(cache, column, **shared):
        return fused_decode_attention(inputs["qkv"], inputs["cos"], inputs["sin"], cache, first,
                                      torch.tensor([column], device=device), inputs["q_norm"], inputs["k_norm"],
                                      1e-6, inputs["q_heads"], **shared)

    poisoned = cache.clone()
    for row in range(8):
        if row % share:
            poisoned[:, row, :, :SPLIT] = float("nan")  # the prompt's one whole split, in the other rows
    shared = dict(shared_end=torch.tensor([prompt], device=device), share=share)
    for column in (prompt, SPLIT + 100, COLUMNS - 1):
        alone_cache, shared_cache, poisoned_cache = cache.clone(), cache.clone(), poisoned.clone()
        alone = run(alone_cache, column)
        together = run(shared_cache, column, **shared)
        torch.testing.assert_close(together, alone, **tolerance, msg=lambda m: f"column {column}: {m}")
        assert torch.equal(shared_cache, alone_cache)  # the step's K/V written as without sharing
        assert torch.equal(run(poisoned_cache, column, **shared), together)
        assert run(poisoned.clone(), column).isnan().any()  # without sharing each row reads its own copy
    with pytest.raises(ValueError, match="share=3"):
        run(cache.clone(), prompt, shared_end=shared["shared_end"], share=3)


def test_the_rows_a_prompt_shares_are_aligned_blocks_of_one_prompt():
    assert shared_rows([0, 0, 0, 0, 1, 1, 1, 1], group=7) == 4
    assert shared_rows([0] * 16, group=7) == 8  # 8 x 7 query heads fill a 64-line tile
    assert shared_rows([0] * 16, group=2) == 16
    assert shared_rows([0, 0, 0, 1, 1, 1], group=7) == 1  # blocks of 2 would mix prompts 0 and 1
    assert shared_rows([0, 0, 1, 1, 1, 1, 2, 2], group=7) == 2
    assert shared_rows([5, 5, 5, 5, 6, 6], group=7) == 2  # 6 rows: blocks of 4 do not divide them
    assert shared_rows([0, 1, 2, 3], group=7) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_the_fused_engine_with_samples_sharing_prompts_decodes_what_sdpa_does(device):
    model, tokenizer = tiny_policy(device)
    long = "Tom has 3 apples and buys 4 more; then he gives half of them to Ann, who eats one. " * 2
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in (long, "12 * 7 =")]
    assert len(prompts[0]) > SPLIT  # a whole split of prompt columns, read once for its four samples
    args = dict(device=device, dtype=torch.float32, max_rows=8, max_columns=2 * SPLIT + 64)
    fused = StaticEngine(model, tokenizer, attention="fused", **args)
    sdpa = StaticEngine(model, tokenizer, attention="sdpa", **args)
    greedy = SamplingParams(n=4, max_new_tokens=6, temperature=0.0)
    ours, theirs = fused.generate(prompts, greedy), sdpa.generate(prompts, greedy)
    assert fused.share == 4 and sdpa.share == 1
    assert ours.token_lists() == theirs.token_lists()
    torch.testing.assert_close(ours.logprobs, theirs.logprobs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("architecture", ["qwen2", "qwen3"])
def test_the_fused_engine_decodes_what_the_sdpa_engine_does(device, architecture):
    if architecture == "qwen2":
        model, tokenizer = tiny_policy(device)
    else:
        tokenizer = byte_tokenizer()
        model = sharpen(random_model(QWEN3_TINY, tokenizer, seed=3, vocab_size=len(tokenizer)).eval()).to(device)
    long = "Tom has 3 apples and buys 4 more; then he gives half of them to Ann, who eats one. " * 2
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in (long, "x", "12 * 7 =")]
    args = dict(device=device, dtype=torch.float32, max_rows=4, max_columns=2 * SPLIT + 64)
    fused = StaticEngine(model, tokenizer, attention="fused", **args)
    sdpa = StaticEngine(model, tokenizer, attention="sdpa", **args)
    assert fused.attention.name == "fused"
    greedy = SamplingParams(n=1, max_new_tokens=8, temperature=0.0)
    ours, theirs = fused.generate(prompts, greedy), sdpa.generate(prompts, greedy)
    assert ours.token_lists() == theirs.token_lists()
    torch.testing.assert_close(ours.logprobs, theirs.logprobs, atol=1e-4, rtol=0)
    torch.testing.assert_close(fused.cache, sdpa.cache, atol=1e-5, rtol=0)  # the same K/V written


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["split-kv", "fused"])
def test_the_compiled_layer_step_writes_the_cache_in_place(device, name):
    """torch.compile must write the step's K/V into the cache itself: a mutation it cannot
    do in place becomes a copy of the layer's whole cache at every step (a 3x slower decode
    step on an H200, seen when the unfused path took K and V as one view and unbound it);
    and it must not add the attention's output to the residual through addmm."""
    from torch._inductor.utils import run_and_get_code

    from trainer.rollout.static import _decode_layer

    model, tokenizer = tiny_policy(device)
    engine = StaticEngine(model, tokenizer, device=device, dtype=torch.float32, max_rows=4, max_columns=64,
                          attention=name)
    engine.generate([[5, 6, 7]] * 4, SamplingParams(n=1, max_new_tokens=3, temperature=0.0))  # a decode state
    b, layer = 4, engine.layers[0]
    h = torch.randn(b, engine.hidden, device=device)
    cos, sin = engine.cos[engine.positions[:b]][:, None], engine.sin[engine.positions[:b]][:, None]
    context = engine.attention.prepare(engine, b)
    expected_cache = engine.cache.clone()
    expected, _ = _decode_layer(engine, h, torch.zeros_like(h), layer,
                                engine.attention.layer_cache(expected_cache, 0, b), cos, sin, context)
    (out, _), codes = run_and_get_code(torch.compile(_decode_layer, dynamic=False), engine, h, torch.zeros_like(h),
                                       layer, engine.attention.layer_cache(engine.cache, 0, b), cos, sin, context)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(engine.cache, expected_cache, atol=1e-5, rtol=1e-5)  # the write reached the cache
    code = "\n".join(codes)
    layer_k = engine.cache[0, 0, :b].numel()
    shapes = allocated_shapes(code)
    assert shapes and all(math.prod(shape) < layer_k for shape in shapes), shapes
    # One addmm, the qkv projection's bias: a residual added through addmm is copied into its
    # output first (a copy a layer, 35 us a step at batch 128 on an H200).
    assert code.count("addmm(") == 1, code


def tiny_policy(device):
    model, tokenizer = load_model_and_tokenizer(TrainerConfig(seed=3, dataset="gsm8k"), device=device,
                                                dtype="float32")
    return sharpen(model.eval()), tokenizer  # varied text


# The fused sampler. The tests take many rows per program, where the interpreter's cost per
# program dominates; spans much smaller than the vocabulary put the entries that matter in
# different programs.
SAMPLER_TILES = dict(span=64, block=16, rows_per_program=256)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature, span, masked", [
    (1.0, 64, False), (0.6, 64, False),
    (1.0, 128, False),  # eight blocks in each program
    (0.8, 64, True),  # -inf logits: a whole block at a span's start, and a ragged tail
])
def test_fused_sampler_frequencies_match_the_tempered_softmax(device, temperature, span, masked):
    vocab, draws = 200, 3000
    logits = torch.full((vocab,), -4.0)
    likely = torch.tensor([3, 70, 130, 199])  # in different spans, the last one ragged
    logits[likely] = torch.tensor([1.0, 0.5, 0.0, 1.2])
    if masked:
        logits[64:80] = float("-inf")
        logits[150:199] = float("-inf")
    probs = (logits.double() / temperature).softmax(-1)
    tokens, logprobs = softmax_sample(logits.to(device).expand(draws, -1).contiguous(),
                                     torch.tensor([temperature], device=device), torch.tensor([7], device=device),
                                     **(SAMPLER_TILES | dict(span=span)))
    tokens, logprobs = tokens.cpu(), logprobs.cpu()
    counts = torch.bincount(tokens, minlength=vocab).double()
    rare = torch.ones(vocab, dtype=torch.bool)
    rare[likely] = False
    # The 196 unlikely entries pooled into one category (about 13 % of the mass at T=1).
    pooled_counts = torch.cat([counts[likely], counts[rare].sum()[None]])
    pooled_probs = torch.cat([probs[likely], probs[rare].sum()[None]])
    assert counts[probs == 0].sum() == 0  # never a masked entry
    assert chi_square_p_value(pooled_counts, pooled_probs) > 1e-3
    assert torch.isfinite(logprobs).all()
    assert torch.allclose(logprobs.double(), probs.log()[tokens], atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_sampler_takes_the_only_live_entry_wherever_it_is(device):
    # One finite logit a row, the rest -inf: at a span's first and last entries, inside a
    # block, and the vocabulary's last; the rows' draws land anywhere in [0, 1).
    vocab = 200
    live = torch.tensor([0, 63, 64, 127, 131, 199]).repeat(50)
    logits = torch.full((len(live), vocab), float("-inf"))
    logits[torch.arange(len(live)), live] = torch.randn(len(live)) * 5
    tokens, logprobs = softmax_sample(logits.to(device), torch.tensor([0.7], device=device),
                                      torch.tensor([11], device=device), **SAMPLER_TILES)
    assert torch.equal(tokens.cpu(), live)
    assert torch.allclose(logprobs.cpu(), torch.zeros(len(live)), atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_sampler_draws_follow_the_seed_and_each_row_draws_its_own(device):
    logits = torch.zeros((512, 40), device=device)  # uniform: every draw is the noise's
    temperature = torch.ones(1, device=device)
    first, _ = softmax_sample(logits, temperature, torch.tensor([3], device=device), **SAMPLER_TILES)
    again, _ = softmax_sample(logits, temperature, torch.tensor([3], device=device), **SAMPLER_TILES)
    other, _ = softmax_sample(logits, temperature, torch.tensor([4], device=device), **SAMPLER_TILES)
    assert torch.equal(first, again)
    assert (first != other).float().mean() > 0.9  # 1/40 agree by chance
    assert chi_square_p_value(torch.bincount(first.cpu(), minlength=40).double(), torch.full((40,), 1 / 40)) > 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_the_engine_with_the_fused_sampler_reports_the_models_log_probs(device):
    model, tokenizer = tiny_policy(device)
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("Tom has 3 apples", "x")]
    engine = StaticEngine(model, tokenizer, device=device, dtype=torch.float32, max_rows=4, max_columns=48,
                          fused_sampler=True)
    temperature = 0.7
    params = SamplingParams(n=2, max_new_tokens=8, temperature=temperature, seed=5)
    assert engine._mode(params) == PLAIN
    out = engine.generate(prompts, params)
    assert engine.generate(prompts, params).token_lists() == out.token_lists()
    assert engine.generate(prompts, attrs.evolve(params, seed=6)).token_lists() != out.token_lists()
    for row, (prompt, completion) in enumerate(zip([p for p in prompts for _ in range(2)], out.token_lists())):
        ids = torch.tensor([prompt + completion], device=device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / temperature
        expected = torch.log_softmax(logits.double(), dim=-1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1)
        torch.testing.assert_close(out.logprobs[row, : len(completion)].double(), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_each_decode_step_of_the_fused_sampler_draws_fresh_noise(device):
    model, tokenizer = tiny_policy(device)
    engine = StaticEngine(model, tokenizer, device=device, dtype=torch.float32, max_rows=2, max_columns=32,
                          fused_sampler=True)
    engine.lm_head.zero_()  # uniform logits: every token is the noise's
    engine.stop_tensor = torch.tensor([-1], device=device)  # nothing stops
    out = engine.generate([[5, 6, 7]], SamplingParams(n=2, max_new_tokens=12, temperature=1.0, seed=1))
    for row in out.token_lists():  # noise reused across steps would repeat one token
        assert len(row) == 12 and len(set(row)) >= 9, row
    assert out.token_lists()[0] != out.token_lists()[1]


def test_auto_is_sdpa_on_the_cpu_and_split_kv_there_is_refused_by_name():
    cpu = torch.device("cpu")
    if not INTERPRETED:
        assert choose("auto", cpu).name == "sdpa"
        for name in ("split-kv", "fused"):
            with pytest.raises(ValueError, match=f"'{name}'.*TRITON_INTERPRET=1.*'sdpa'"):
                choose(name, cpu)
    with pytest.raises(ValueError, match="'flash'.*auto, sdpa, split-kv, fused"):
        choose("flash", cpu)


def test_an_engine_asked_for_split_kv_where_it_cannot_run_says_so():
    if INTERPRETED:
        pytest.skip("the interpreter runs split-kv on the CPU")
    model, tokenizer = load_model_and_tokenizer(TrainerConfig(seed=3, dataset="gsm8k"), device="cpu",
                                                dtype="float32")
    for name in ("split-kv", "fused"):
        with pytest.raises(BackendUnavailable, match=name):
            StaticEngine(model, tokenizer, device="cpu", dtype=torch.float32, max_rows=2, max_columns=64,
                         attention=name)


# The most shared memory a block may use (opt-in), by compute capability: A100, H100/H200.
SHARED_MEMORY_A_BLOCK = {80: 163 * 1024, 90: 227 * 1024}


@pytest.mark.skipif(split_kv.triton is None, reason="Triton is not installed")
@pytest.mark.skipif(INTERPRETED, reason="the interpreter replaces the compiler")
@pytest.mark.parametrize("capability", [80, 90], ids=["sm80-a100", "sm90-h100"])
def test_the_kernels_compile_for_the_clusters_gpus_without_one(capability):
    """Triton's own compiler and ptxas, for an A100 (sm_80, Leonardo's cards) and an H100/H200
    (sm_90, Jupiter's GH200 too): a kernel that the GPU would refuse to build fails here, in
    CI, rather than on a cluster's first step, and so does one whose shared memory the card
    would refuse at launch. On sm_90 each kernel is built with and without programmatic
    dependent launch; with it, its PTX waits for the previous kernel and releases the next. An
    A100 has no PDL (the engine never asks for it there: ``pdl_runs_on``), and there the fused
    attention is built in the variants that differ in their tiles only (14 s with Triton's
    cache empty, where sm_90's full set takes about 90 s)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from trainer.rollout import fused_attention, fused_sampling

    def build(fn, signature, constexprs, num_warps, pdl=False):
        if pdl and capability < 90:
            return
        constexprs = constexprs | {"PDL": pdl}
        source = ASTSource(fn=fn, signature=signature | dict.fromkeys(constexprs, "constexpr"), constexprs=constexprs)
        kernel = split_kv.triton.compile(source, target=GPUTarget("cuda", capability, 32),
                                         options={"num_warps": num_warps, "launch_pdl": pdl})
        assert kernel.asm["cubin"], fn.__name__
        # Shared memory is checked at launch, not by the compiler: the card's limit a block.
        assert kernel.metadata.shared <= SHARED_MEMORY_A_BLOCK[capability], (fn.__name__, kernel.metadata.shared)
        ptx = kernel.asm["ptx"]
        assert (("griddepcontrol.wait" in ptx) == pdl and ("griddepcontrol.launch_dependents" in ptx) == pdl
                and kernel.metadata.launch_pdl == pdl), (fn.__name__, pdl)

    strides = dict.fromkeys(("q_sb", "q_sh", "q_sg", "k_sb", "k_sh", "k_sc", "v_sb", "v_sh", "v_sc"), "i32")
    for dtype, upcast, precision, pdl in (("*bf16", False, "tf32", False), ("*fp32", True, "ieee", False),
                                          ("*bf16", False, "tf32", True)):
        build(split_kv._split_kernel,
              dict(q_ptr=dtype, k_ptr=dtype, v_ptr=dtype, first_ptr="*i64", column_ptr="*i64", partial_ptr="*fp32",
                   lse_ptr="*fp32", **strides, scale="fp32", columns="i32"),
              dict(UPCAST=upcast, PRECISION=precision, GROUP=7, GROUP_TILE=16, D=64, SPLIT=split_kv.SPLIT,
                   SKIP_EMPTY=True), split_kv.NUM_WARPS, pdl)
    for pdl in (False, True):
        build(split_kv._merge_kernel, dict(partial_ptr="*fp32", lse_ptr="*fp32", out_ptr="*bf16", first_ptr="*i64",
                                            column_ptr="*i64", splits="i32"),
              dict(SPLIT=split_kv.SPLIT, D=64, SPLITS_TILE=8), 1, pdl)

    def fused_signature(dtype):
        return dict(qkv_ptr=dtype, qkv_sb="i32", cos_ptr=dtype, sin_ptr=dtype, cs_sb="i32", q_norm_ptr=dtype,
                    k_norm_ptr=dtype, eps="fp32", cache_ptr=dtype, c_skv="i32", c_sb="i32", c_sh="i32", c_sc="i32",
                    first_ptr="*i64", column_ptr="*i64", shared_ptr="*i64", partial_ptr="*fp32", lse_ptr="*fp32",
                    scale="fp32", columns="i32")

    every_variant = capability >= 90
    for dtype, upcast, precision in (("*bf16", False, "tf32"), ("*fp32", True, "ieee")):
        for norm in (False, True) if every_variant else (False,):
            for share, shared_tile in ((1, 16), (4, 32), (8, 64)):
                if not every_variant and dtype == "*fp32" and share > 1:
                    continue
                build(fused_attention._fused_kernel, fused_signature(dtype),
                      dict(UPCAST=upcast, PRECISION=precision, Q_HEADS=14, KV_HEADS=2, GROUP=7, GROUP_TILE=16,
                           D=64, SPLIT=split_kv.SPLIT, HAS_NORM=norm, SHARE=share, SHARED_TILE=shared_tile),
                      split_kv.NUM_WARPS)
    for d, (split, num_warps) in fused_attention.TILES.items():  # the tile the engine takes at each head dim
        for pdl in (False, True):
            build(fused_attention._fused_kernel, fused_signature("*bf16"),
                  dict(UPCAST=False, PRECISION="tf32", Q_HEADS=12, KV_HEADS=2, GROUP=6, GROUP_TILE=16, D=d,
                       SPLIT=split, HAS_NORM=False, SHARE=4, SHARED_TILE=32), num_warps, pdl)
        build(split_kv._merge_kernel, dict(partial_ptr="*fp32", lse_ptr="*fp32", out_ptr="*bf16", first_ptr="*i64",
                                            column_ptr="*i64", splits="i32"),
              dict(SPLIT=split, D=d, SPLITS_TILE=16), 1)
    tiles = dict(SPAN=fused_sampling.SPAN, BLOCK=fused_sampling.BLOCK)
    for pdl in (False, True):
        build(fused_sampling._span_kernel, dict(logits_ptr="*bf16", row_stride="i32", temperature_ptr="*fp32",
                                                rows="i32", vocab="i32", stats_ptr="*fp32"), dict(ROWS=1, **tiles), 8,
              pdl)
        build(fused_sampling._pick_kernel, dict(logits_ptr="*bf16", row_stride="i32", temperature_ptr="*fp32",
                                                seed_ptr="*i64", stats_ptr="*fp32", tokens_ptr="*i64",
                                                logprobs_ptr="*fp32", rows="i32", vocab="i32", parts="i32"),
              dict(ROWS=1, PARTS_TILE=32, **tiles), 8, pdl)


@pytest.mark.skipif(split_kv.triton is None, reason="Triton is not installed")
@pytest.mark.skipif(INTERPRETED, reason="this is the outer run")
@pytest.mark.timeout(600)
def test_the_kernel_tests_pass_under_the_triton_interpreter():
    here = Path(__file__)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", str(here),
         "-k", "interpreted"],
        cwd=here.parents[1], env=os.environ | {"TRITON_INTERPRET": "1"}, capture_output=True, text=True,
        timeout=580)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    # Every test the child selected ran under the interpreter and passed: none skipped.
    summary = run.stdout.strip().splitlines()[-1]
    assert re.search(r"\b[1-9]\d* passed", summary) and "skipped" not in summary, run.stdout[-2000:]
