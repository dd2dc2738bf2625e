"""The static-KV-cache engine against HF generate, the model's own forward, and the softmax.

Everything here runs eagerly on the CPU (CI); the ``gpu`` tests check what only a
CUDA device has: captured decode graphs against eager steps, and bf16.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from trainer.config import TrainerConfig
from trainer.models import byte_tokenizer, load_model_and_tokenizer, random_model
from trainer.rollout import BackendUnavailable, SamplingParams
from trainer.rollout.hf import HFEngine
from trainer.rollout.sampling import sample_tokens
from trainer.rollout.static import CHECK_EVERY, StaticEngine

QWEN3_TINY = dict(architecture="qwen3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, intermediate_size=128, tie_word_embeddings=False)
LLAMA_TINY = dict(architecture="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=1, intermediate_size=128, tie_word_embeddings=False)


def sharpen(model, scale=8.0):
    """Random init gives near-uniform, repetitive greedy text; larger weights give varied text."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.mul_(scale)
    return model


@pytest.fixture(scope="module", params=["qwen2", "qwen3", "llama"])
def policy(request):
    torch.set_num_threads(1)
    if request.param == "qwen2":
        model, tokenizer = load_model_and_tokenizer(TrainerConfig(seed=3, dataset="gsm8k"), device="cpu",
                                                    dtype="float32")
    else:
        tokenizer = byte_tokenizer()
        shape = QWEN3_TINY if request.param == "qwen3" else LLAMA_TINY
        model = random_model(shape, tokenizer, seed=3, vocab_size=len(tokenizer))
    return sharpen(model.eval()), tokenizer


def prompts_of(tokenizer, *texts):
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def engine_for(model, tokenizer, **overrides):
    args = dict(device="cpu", dtype=torch.float32, max_rows=64, max_columns=96) | overrides
    return StaticEngine(model, tokenizer, **args)


def test_greedy_completions_equal_hf_generate(policy):
    model, tokenizer = policy
    prompts = prompts_of(tokenizer, "Tom has 3 apples", "x", "What is 12 times 7? Think.")
    params = SamplingParams(n=2, max_new_tokens=24, temperature=0.0)
    ours = engine_for(model, tokenizer).generate(prompts, params)
    theirs = HFEngine(model, tokenizer, device="cpu").generate(prompts, params)
    assert ours.token_lists() == theirs.token_lists()
    assert len({tuple(row) for row in ours.token_lists()}) == 3  # distinct prompts, distinct text
    assert all(len(set(row)) > 3 for row in ours.token_lists())  # not one token repeated
    assert torch.equal(ours.stopped, theirs.stopped)


def test_reported_logprobs_equal_the_models_forward(policy):
    model, tokenizer = policy
    prompts = prompts_of(tokenizer, "Tom has 3 apples", "x", "What is 12 times 7?")
    temperature = 0.7
    out = engine_for(model, tokenizer).generate(
        prompts, SamplingParams(n=3, max_new_tokens=16, temperature=temperature, seed=5))
    rows = out.token_lists()
    worst = 0.0
    for row, (prompt, completion) in enumerate(zip([p for p in prompts for _ in range(3)], rows)):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / temperature
        expected = torch.log_softmax(logits.double(), dim=-1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1)
        got = out.logprobs[row, : len(completion)].double()
        worst = max(worst, (got - expected).abs().max().item())
        assert out.logprobs[row, len(completion):].abs().sum() == 0  # zero off the mask
    assert worst < 1e-4  # fp32 on the CPU; the left padding of a short prompt changes nothing


def chi_square_p_value(counts, probs):
    """p-value of Pearson's chi-square statistic (df = categories - 1), from the regularised gamma."""
    expected = probs * counts.sum()
    keep = expected > 0
    statistic = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), statistic / 2.0))


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, -1, None), (0.6, -1, None), (1.3, 3, None),
                                                       (1.0, -1, 0.7), (0.8, 4, 0.9)])
def test_sampled_frequencies_match_the_softmax(temperature, top_k, top_p):
    logits = torch.tensor([2.0, 1.5, 1.0, 0.2, -0.5, -1.0, 0.0, 0.7], dtype=torch.float64)
    draws = 40_000
    torch.manual_seed(0)
    tokens, logprobs = sample_tokens(logits.expand(draws, -1), temperature=temperature, top_k=top_k, top_p=top_p)
    scores = logits / temperature
    allowed = torch.ones_like(scores, dtype=torch.bool)
    if top_k > 0:
        allowed &= scores >= scores.topk(top_k).values[-1]
    if top_p is not None:
        masked = scores.masked_fill(~allowed, float("-inf"))
        probs = masked.softmax(-1)
        order = probs.argsort(descending=True)
        before = probs[order].cumsum(0) - probs[order]
        keep = torch.zeros_like(allowed)
        keep[order] = before < top_p
        allowed &= keep
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    counts = torch.bincount(tokens, minlength=logits.numel()).double()
    assert counts[~allowed].sum() == 0  # nothing outside top-k / the nucleus
    assert chi_square_p_value(counts, probs) > 1e-3
    # Each token's reported log-prob is its log-probability under that same distribution.
    assert torch.allclose(logprobs.double(), probs.log()[tokens], atol=1e-5)


def test_first_token_frequencies_match_the_models_softmax():
    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer(TrainerConfig(seed=3), device="cpu", dtype="float32")
    sharpen(model, 3.0)
    prompt = prompts_of(tokenizer, "1 2 3 0")
    engine = engine_for(model, tokenizer, max_rows=4096)
    out = engine.generate(prompt, SamplingParams(n=4000, max_new_tokens=1, temperature=0.9, seed=2))
    with torch.no_grad():
        probs = (model(input_ids=torch.tensor(prompt)).logits[0, -1].double() / 0.9).softmax(-1)
    counts = torch.bincount(out.response_ids[:, 0], minlength=probs.numel()).double()
    assert chi_square_p_value(counts, probs) > 1e-3


def test_same_seed_same_completions_and_the_global_rng_untouched(policy):
    model, tokenizer = policy
    engine = engine_for(model, tokenizer)
    prompts = prompts_of(tokenizer, "Tom has 3 apples", "x")
    params = SamplingParams(n=3, max_new_tokens=12, temperature=1.0, seed=11)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = engine.generate(prompts, params).token_lists()
    assert torch.equal(torch.get_rng_state(), before)
    assert engine.generate(prompts, params).token_lists() == first
    other = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=12, temperature=1.0, seed=12))
    assert other.token_lists() != first


def test_rows_stop_at_their_first_eos_and_the_rest_run_to_the_limit():
    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer(TrainerConfig(seed=3), device="cpu", dtype="float32")
    eos = tokenizer.eos_token_id
    engine = engine_for(model, tokenizer)
    out = engine.generate(prompts_of(tokenizer, "1 2 3 4", "0 0", "3 2 1 0 1"),
                          SamplingParams(n=6, max_new_tokens=7, temperature=1.0, seed=0))
    lengths = out.response_mask.sum(dim=1).long()
    for row, tokens in enumerate(out.token_lists()):
        assert 1 <= len(tokens) <= 7
        assert eos not in tokens[:-1]  # nothing after a stop
        assert bool(out.stopped[row]) == (tokens[-1] == eos)
        assert out.stopped[row] or len(tokens) == 7
        assert (out.response_ids[row, lengths[row]:] == tokenizer.pad_token_id).all()
    assert set(out.stopped.tolist()) == {True, False}  # both happen at this size


def test_a_batch_that_stops_early_ends_early(monkeypatch):
    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer(TrainerConfig(seed=3), device="cpu", dtype="float32")
    engine = engine_for(model, tokenizer)
    engine.stop_tensor = torch.arange(model.config.vocab_size)  # every token is a stop token
    steps = []
    original = engine._decode_step
    monkeypatch.setattr(engine, "_decode_step", lambda *a: steps.append(1) or original(*a))
    out = engine.generate(prompts_of(tokenizer, "1 2", "3"), SamplingParams(n=2, max_new_tokens=80))
    assert out.stopped.all() and out.response_ids.shape == (4, 1)
    assert len(steps) < CHECK_EVERY  # the done flags were read after a few steps, not 79


def test_the_compiled_finish_of_a_step_writes_the_step_state_in_place():
    """The final norm, lm_head, draw and bookkeeping compiled as one graph equal the eager ops,
    and write the step's column of the outputs in place: a buffer the size of the outputs would
    be a copy of them at every step."""
    from torch._inductor.utils import run_and_get_code

    from trainer.rollout.static import _finish_step

    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer(TrainerConfig(seed=3), device="cpu", dtype="float32")
    engine = engine_for(model, tokenizer, max_rows=6)
    engine.generate(prompts_of(tokenizer, "1 2", "3"), SamplingParams(n=3, max_new_tokens=5, seed=0))
    engine.stop_tensor = torch.arange(0, model.config.vocab_size, 2)  # some rows stop at this step, some not
    b, mode = 6, (-1, False, False)
    engine.done[:b] = torch.tensor([True, False, False, False, False, True])
    generator = torch.Generator().manual_seed(0)
    h, mlp = torch.randn(b, engine.hidden, generator=generator), torch.randn(b, engine.hidden, generator=generator)
    noise = torch.empty(b, engine.vocab).exponential_(generator=generator)
    state = ("out_tokens", "out_logprobs", "done", "tokens", "positions", "column", "out_index")
    before = {name: getattr(engine, name).clone() for name in state}
    _finish_step(engine, h, mlp, noise, mode, b)
    eager = {name: getattr(engine, name).clone() for name in state}
    for name in state:
        getattr(engine, name).copy_(before[name])
    _, codes = run_and_get_code(torch.compile(_finish_step, dynamic=False), engine, h, mlp, noise, mode, b)
    for name in state:
        torch.testing.assert_close(getattr(engine, name), eager[name], rtol=1e-5, atol=1e-5, msg=name)
    written = int(before["out_index"])
    assert (eager["out_tokens"][[0, 5], written] == engine.pad_id).all()  # done rows wrote padding
    assert not torch.equal(eager["done"], before["done"]) and int(eager["out_index"]) == written + 1
    shapes = allocated_shapes("\n".join(codes))
    assert shapes and all(math.prod(shape) < engine.out_tokens[:b].numel() for shape in shapes), shapes


def test_stop_ids_are_compared_without_a_sort_whatever_their_number():
    """``is_stop`` marks what ``torch.isin`` marks, for a handful of eos ids as for half the vocabulary
    (where ``isin`` would sort, which a CUDA graph capture refuses: the GPU test below replays it)."""
    from trainer.rollout.static import is_stop

    generator = torch.Generator().manual_seed(0)
    token = torch.randint(0, 1000, (128,), generator=generator)
    for stop_ids in (torch.tensor([7]), token[:3], torch.arange(0, 1000, 2), torch.tensor([-1])):
        assert torch.equal(is_stop(token, stop_ids), torch.isin(token, stop_ids))
    assert is_stop(token, torch.arange(0, 1000, 2)).any() and not is_stop(token, torch.tensor([-1])).any()


def allocated_shapes(code: str) -> list[list[int]]:
    """The shapes of the buffers inductor's generated ``code`` allocates."""
    return [[int(n) for n in dims.split(",") if n.strip()]
            for dims in re.findall(r"empty_strided_\w+\(\(([\d, ]*)\)", code)]


def test_chunks_smaller_than_the_batch_give_the_same_completions(policy):
    model, tokenizer = policy
    prompts = prompts_of(tokenizer, "Tom has 3 apples", "x", "What is 12 times 7?", "ok")
    params = SamplingParams(n=3, max_new_tokens=10, temperature=0.0)
    whole = engine_for(model, tokenizer).generate(prompts, params)
    chunked = engine_for(model, tokenizer, max_rows=5)  # chunks cut through groups
    assert chunked.rows == 5
    assert chunked.generate(prompts, params).token_lists() == whole.token_lists()


def test_sync_weights_copies_in_place_and_generation_follows(policy):
    model, tokenizer = policy
    engine = engine_for(model, tokenizer)
    prompts = prompts_of(tokenizer, "Tom has 3 apples")
    params = SamplingParams(n=1, max_new_tokens=8, temperature=0.0)
    before = engine.generate(prompts, params).token_lists()
    pointers = [dst.data_ptr() for dst, _ in engine._copies]
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * parameter.abs().mean())
        engine.sync_weights(model)
        assert [dst.data_ptr() for dst, _ in engine._copies] == pointers
        after = engine.generate(prompts, params).token_lists()
        assert after != before
        assert after == HFEngine(model, tokenizer, device="cpu").generate(prompts, params).token_lists()
    finally:
        model.load_state_dict(saved)


def test_prompts_longer_than_the_cache_are_refused(policy):
    model, tokenizer = policy
    engine = engine_for(model, tokenizer, max_columns=16)
    assert engine.columns == 64  # rounded up to a multiple of 64
    with pytest.raises(ValueError, match="exceeds the engine's 64 columns"):
        engine.generate([[5] * 60], SamplingParams(n=1, max_new_tokens=8))


def test_an_unsupported_architecture_is_refused_by_name():
    tokenizer = byte_tokenizer()
    model = random_model(dict(architecture="qwen2", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                              num_key_value_heads=1, intermediate_size=64), tokenizer, seed=0,
                         vocab_size=len(tokenizer))
    model.config.model_type = "gpt_neox"
    with pytest.raises(BackendUnavailable, match="not 'gpt_neox'.*backend='hf'"):
        StaticEngine(model, tokenizer, device="cpu", dtype=torch.float32, max_rows=2, max_columns=8)


# -- CUDA only ----------------------------------------------------------------------------


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_programmatic_dependent_launch_only_where_it_runs(policy):
    model, tokenizer = policy
    assert engine_for(model, tokenizer).pdl is False  # auto: not on the CPU
    with pytest.raises(BackendUnavailable, match="pdl=True needs compiled Triton on a CUDA device"):
        engine_for(model, tokenizer, pdl=True)


def test_decode_pdl_false_launches_plainly_where_pdl_would_run(policy, monkeypatch):
    # Whether the device runs PDL is a query of its compute capability; said yes here, the
    # config decides (building the engine launches no kernel).
    from trainer.rollout import attention

    model, tokenizer = policy
    monkeypatch.setattr(attention, "pdl_runs_on", lambda device: True)
    built = {on: StaticEngine.from_config(TrainerConfig(decode_pdl=on, device="cpu", max_prompt_length=32,
                                                        max_generate_length=32), model=model, tokenizer=tokenizer,
                                          device=torch.device("cpu"), max_rows=8) for on in (True, False)}
    assert built[True].pdl is True and built[False].pdl is False


@pytest.fixture(scope="module")
def cuda_policy():
    model, tokenizer = load_model_and_tokenizer(TrainerConfig(seed=3, dataset="gsm8k"), device="cuda",
                                                dtype="float32")
    return sharpen(model.eval()), tokenizer


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("compiled", [False, True], ids=["plain", "compiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replays_equal_eager_steps(cuda_policy, dtype, compiled):
    model, tokenizer = cuda_policy
    prompts = prompts_of(tokenizer, "Tom has 3 apples", "x", "What is 12 times 7? Think.")
    args = dict(device="cuda", dtype=dtype, max_rows=64, max_columns=96, compile_step=compiled)
    eager = StaticEngine(model, tokenizer, cuda_graphs=False, **args)
    graphs = StaticEngine(model, tokenizer, cuda_graphs=True, **args)
    greedy = SamplingParams(n=2, max_new_tokens=40, temperature=0.0)
    assert graphs.generate(prompts, greedy).token_lists() == eager.generate(prompts, greedy).token_lists()
    sampled = SamplingParams(n=4, max_new_tokens=40, temperature=1.0, seed=7)
    first = graphs.generate(prompts, sampled)
    assert graphs.generate(prompts, sampled).token_lists() == first.token_lists()  # seeded, graphs replayed
    assert graphs.generate(prompts, SamplingParams(n=4, max_new_tokens=40, seed=8)).token_lists() \
        != first.token_lists()
    assert torch.isfinite(first.logprobs).all()


@pytest.mark.gpu
@cuda
def test_programmatic_dependent_launch_changes_no_token_nor_logprob(cuda_policy):
    """PDL changes when a kernel's programs launch, not what they compute: the compiled, captured
    step gives the same tokens and log-probs bit for bit with it and without it."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9 or more")
    model, tokenizer = cuda_policy
    prompts = prompts_of(tokenizer, "Tom has 3 apples", "x", "What is 12 times 7? Think.")
    args = dict(device="cuda", dtype=torch.bfloat16, max_rows=64, max_columns=96, cuda_graphs=True,
                compile_step=True)
    engines = [StaticEngine(model, tokenizer, pdl=pdl, **args) for pdl in (False, True)]
    assert [engine.pdl for engine in engines] == [False, True]
    sampled = SamplingParams(n=4, max_new_tokens=40, temperature=1.0, seed=7)
    without, with_pdl = (engine.generate(prompts, sampled) for engine in engines)
    assert with_pdl.token_lists() == without.token_lists()
    assert torch.equal(with_pdl.logprobs, without.logprobs)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("compiled", [False, True], ids=["plain", "compiled"])
def test_a_large_stop_set_is_captured_and_replayed(cuda_policy, compiled):
    # Half the vocabulary as stop ids: torch.isin would sort a set this large, and the capture of
    # the decode graph refused the sort (cudaErrorStreamCaptureUnsupported).
    model, tokenizer = cuda_policy
    prompts = prompts_of(tokenizer, "Tom has 3 apples", "x", "What is 12 times 7? Think.")
    args = dict(device="cuda", dtype=torch.float32, max_rows=64, max_columns=96, compile_step=compiled)
    eager = StaticEngine(model, tokenizer, cuda_graphs=False, **args)
    graphs = StaticEngine(model, tokenizer, cuda_graphs=True, **args)
    for engine in (eager, graphs):
        engine.stop_tensor = torch.arange(1, model.config.vocab_size, 2, device="cuda")
    greedy = SamplingParams(n=2, max_new_tokens=40, temperature=0.0)
    ours = graphs.generate(prompts, greedy)
    assert ours.token_lists() == eager.generate(prompts, greedy).token_lists()
    assert len(graphs.graphs) >= 1 and ours.stopped.all()  # the decode graph ran until every row stopped


@pytest.mark.gpu
@cuda
def test_a_new_bucket_captured_after_a_full_length_chunk_stays_inside_the_cache(cuda_policy):
    # A chunk that filled every column leaves the step state at the cache's end; capturing the
    # graph of another batch size then warmed up from there and indexed past the RoPE table.
    model, tokenizer = cuda_policy
    engine = StaticEngine(model, tokenizer, device="cuda", dtype=torch.bfloat16, max_rows=8, max_columns=64,
                          cuda_graphs=True)
    engine.stop_tensor = torch.tensor([-1], device="cuda")  # nothing stops: every row runs to the end
    full = engine.generate([[5] * 32] * 8, SamplingParams(n=1, max_new_tokens=32, seed=0))
    assert full.response_ids.shape == (8, 32)
    one = engine.generate([[5] * 32], SamplingParams(n=1, max_new_tokens=32, seed=0))
    torch.cuda.synchronize()
    assert one.response_ids.shape == (1, 32) and len(engine.graphs) == 2


@pytest.mark.gpu
@cuda
def test_bf16_greedy_follows_hf_generate_until_a_near_tie(cuda_policy):
    model, tokenizer = cuda_policy
    prompts = prompts_of(tokenizer, "Tom has 3 apples", "x", "What is 12 times 7? Think.", "ok ok")
    params = SamplingParams(n=1, max_new_tokens=32, temperature=0.0)
    ours = StaticEngine(model, tokenizer, device="cuda", dtype=torch.float32, max_rows=8,
                        max_columns=96, cuda_graphs=True).generate(prompts, params)
    theirs = HFEngine(model, tokenizer, device="cuda").generate(prompts, params)
    assert ours.token_lists() == theirs.token_lists()  # fp32 on the GPU: the same argmax
    compiled = StaticEngine(model, tokenizer, device="cuda", dtype=torch.float32, max_rows=8,
                            max_columns=96, cuda_graphs=True, compile_step=True).generate(prompts, params)
    assert compiled.token_lists() == theirs.token_lists()


@pytest.mark.gpu
@cuda
def test_the_memory_budget_sizes_the_cache_and_refuses_when_nothing_fits(cuda_policy):
    model, tokenizer = cuda_policy
    free, total = torch.cuda.mem_get_info()
    used = (total - free) / total
    with pytest.raises(BackendUnavailable, match="gpu_memory_utilization"):
        StaticEngine(model, tokenizer, device="cuda", dtype=torch.bfloat16, max_rows=8, max_columns=64,
                     memory_fraction=max(used - 0.01, 0.001))
    engine = StaticEngine(model, tokenizer, device="cuda", dtype=torch.bfloat16, max_rows=10**9,
                          max_columns=64, memory_fraction=min(used + 0.01, 1.0))
    assert 1 <= engine.rows < 10**9
