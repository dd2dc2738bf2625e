"""Rollout engines: the HF engine's sampling contract, and vLLM's clear absence."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from trainer.config import TrainerConfig
from trainer.models import load_model_and_tokenizer
from trainer.rollout import BackendUnavailable, Completion, make_engine, require_backend
from trainer.rollout.hf import HFEngine, left_pad

NEAR_GREEDY = 1e-4  # temperature at which sampling is the argmax for any realistic logit gap


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer(TrainerConfig(seed=3), device="cpu", dtype="float32")
    return model, tokenizer


def prompts_of(tokenizer, *texts):
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def sample(engine, prompts, **overrides):
    args = dict(n=3, max_new_tokens=6, temperature=1.0, top_p=1.0, seed=0) | overrides
    return engine.generate(prompts, **args)


def test_group_contiguous_completions_end_at_the_first_stop(policy):
    model, tokenizer = policy
    engine = HFEngine(model, tokenizer, device="cpu")
    out = sample(engine, prompts_of(tokenizer, "1 2 3 4", "0 0", "4 3 2 1 0 1"), n=5, max_new_tokens=7)
    assert len(out) == 15
    eos = tokenizer.eos_token_id
    for c in out:
        assert 1 <= len(c.token_ids) <= 7
        assert c.logprobs is None and not engine.reports_logprobs
        assert eos not in c.token_ids[:-1]  # nothing after a stop
        assert (c.finish_reason == "stop") == (c.token_ids[-1] == eos)
        assert c.finish_reason == "stop" or len(c.token_ids) == 7
    assert {c.finish_reason for c in out} == {"stop", "length"}  # both happen at this size


def test_same_seed_same_samples_and_the_global_rng_untouched(policy):
    model, tokenizer = policy
    engine = HFEngine(model, tokenizer, device="cpu")
    prompts = prompts_of(tokenizer, "1 2 3 4", "0 0")
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = sample(engine, prompts, seed=11)
    assert torch.equal(torch.get_rng_state(), before)
    assert sample(engine, prompts, seed=11) == first
    assert sample(engine, prompts, seed=12) != first


def test_padding_and_chunking_do_not_change_what_a_prompt_gets(policy):
    model, tokenizer = policy
    short, long = prompts_of(tokenizer, "3", "1 2 3 4 0 1 2")
    alone = sample(HFEngine(model, tokenizer, device="cpu"), [short], n=1, temperature=NEAR_GREEDY)
    # One sequence per chunk, and the short prompt left-padded next to the long one.
    tiny_chunks = HFEngine(model, tokenizer, device="cpu", tokens_per_chunk=1)
    batched = sample(tiny_chunks, [long, short], n=2, temperature=NEAR_GREEDY)
    assert batched[2] == batched[3] == alone[0]
    assert batched[0] == batched[1]


def test_top_p_keeps_only_the_likeliest_tokens(policy):
    model, tokenizer = policy
    engine = HFEngine(model, tokenizer, device="cpu")
    prompt = prompts_of(tokenizer, "2 2 2")
    narrow = sample(engine, prompt, n=12, max_new_tokens=1, top_p=1e-6)
    wide = sample(engine, prompt, n=12, max_new_tokens=1)
    assert len({c.token_ids for c in narrow}) == 1
    assert len({c.token_ids for c in wide}) > 1


def test_sync_weights_accepts_only_the_policy_it_samples_from(policy):
    model, tokenizer = policy
    engine = make_engine(TrainerConfig(backend="hf"), model=model, tokenizer=tokenizer, device="cpu")
    engine.sync_weights(model)
    engine.sleep()
    engine.wake()
    other, _ = load_model_and_tokenizer(TrainerConfig(seed=4), device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="another model"):
        engine.sync_weights(other)


def test_left_pad_layout():
    ids, mask = left_pad([[5], [6, 7, 8]], 0, "cpu")
    assert ids.tolist() == [[0, 0, 5], [6, 7, 8]]
    assert mask.tolist() == [[0, 0, 1], [1, 1, 1]]


def test_completion_rejects_an_unknown_finish_reason():
    with pytest.raises(ValueError):
        Completion(token_ids=[1], finish_reason="abort")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_backend_without_vllm_says_so():
    with pytest.raises(BackendUnavailable, match=r"vllm package.*backend='hf'"):
        require_backend("vllm")
    require_backend("hf")


def test_nothing_imports_vllm_unless_selected():
    # vLLM is not installed here, so an import of it anywhere would fail these imports outright.
    import trainer.checkpoint, trainer.cli, trainer.loop, trainer.metrics  # noqa: E401, F401

    assert "trainer.rollout.vllm" not in sys.modules and "vllm" not in sys.modules
