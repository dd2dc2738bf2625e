"""Micro-batches packed by tokens (trainer/packing.py): how rows are cut, what the budget
counts, and that packing changes no gradient."""

from __future__ import annotations

import types

import attrs
import pytest
import torch

from trainer.config import ConfigError, TrainerConfig
from trainer.packing import (
    CPU_TOKENS,
    SATURATING_TOKENS,
    Packing,
    activation_bytes_per_token,
    held_bytes,
    plan_packing,
)


def test_a_row_count_cuts_evenly_and_the_last_takes_the_rest():
    assert Packing(rows=4).cut([100] * 10) == [4, 4, 2]


def test_a_token_budget_gives_short_rows_more_company():
    # longest first: a micro-batch is as wide as its first row; 768-wide ones hold 4 rows in
    # 3072 tokens, 256-wide ones 12 (rounded down to 8)
    assert Packing(tokens=3072).cut([768] * 5 + [256] * 20) == [4, 4, 8, 8, 1]


def test_a_row_wider_than_the_budget_goes_alone():
    assert Packing(tokens=100).cut([300, 300, 50]) == [1, 1, 1]
    assert Packing(tokens=100).cut([300, 40, 40]) == [1, 2]


def test_row_counts_from_eight_on_are_multiples_of_eight():
    sizes = Packing(tokens=1000).cut([50] * 60)  # 20 rows fit: 16 a micro-batch
    assert sizes == [16, 16, 16, 12]
    assert sum(sizes) == 60


def test_the_activation_count_errs_high_of_the_measured_0_5b():
    # Qwen2.5-0.5B's shape; an H200 measured about 1.05 MB a token in the update.
    shape = types.SimpleNamespace(hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                                  intermediate_size=4864, num_hidden_layers=24)
    assert 1.05e6 < activation_bytes_per_token(shape) < 1.6e6


def test_held_bytes_count_the_gradients_and_moments_the_first_update_will_allocate():
    model = torch.nn.Linear(10, 10)  # 110 parameters
    optimizer = torch.optim.AdamW(model.parameters())
    assert held_bytes(model, optimizer, allocated=1000) == 1000 + 12 * 110
    model(torch.ones(1, 10)).sum().backward()
    optimizer.step()
    assert held_bytes(model, optimizer, allocated=1000) == 1000


def test_the_plan_prefers_explicit_keys_and_on_the_cpu_takes_its_default():
    cpu = torch.device("cpu")
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert plan_packing(TrainerConfig(micro_train_batch_size_per_gpu=5), model, optimizer, cpu).rows == 5
    explicit = TrainerConfig(micro_train_batch_size_per_gpu=5, micro_train_tokens_per_gpu=99)
    assert plan_packing(explicit, model, optimizer, cpu) == Packing(rows=5, why="micro_train_batch_size_per_gpu")
    assert plan_packing(TrainerConfig(micro_train_tokens_per_gpu=99), model, optimizer, cpu).tokens == 99
    assert plan_packing(TrainerConfig(), model, optimizer, cpu).tokens == CPU_TOKENS
    assert CPU_TOKENS <= SATURATING_TOKENS


@pytest.mark.parametrize("key", ["micro_train_tokens_per_gpu", "train_memory_gb", "micro_train_batch_size_per_gpu"])
def test_a_budget_of_zero_is_refused_naming_the_key(key):
    with pytest.raises(ConfigError, match=key):
        TrainerConfig(**{key: 0})


def _rollout(model, tokenizer, cfg):
    from trainer.batch import Batch
    from trainer.losses import group_advantages
    from trainer.rollout import SamplingParams
    from trainer.rollout.hf import HFEngine

    texts = ("1 2 3 4 0 1 2 3 4", "0 0", "4 3 2 1 0", "3")  # prompts of four lengths
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    n = cfg.n_samples_per_prompt
    generation = HFEngine(model, tokenizer, device="cpu").generate(
        prompts, SamplingParams(n=n, max_new_tokens=cfg.max_generate_length, seed=11))
    batch = Batch.from_generation(prompts, generation, n=n, pad_id=tokenizer.pad_token_id, device="cpu")
    rewards = torch.arange(batch.size, dtype=torch.float64) % 3
    return attrs.evolve(batch, advantages=group_advantages(rewards, n).to(torch.float64))


@pytest.mark.parametrize("reduction", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_packed_and_unpacked_updates_agree_in_fp64(reduction):
    from trainer.models import load_model_and_tokenizer
    from trainer.update import update_policy

    torch.set_num_threads(1)
    cfg = TrainerConfig(train_batch_size=4, policy_mini_batch_size=4, n_samples_per_prompt=4,
                        max_generate_length=8, loss_reduction=reduction, use_entropy_loss=True)
    packings = (Packing(rows=16, why="one micro-batch"), Packing(tokens=40, why="packed"),
                Packing(rows=1, why="a row at a time"))
    results = []
    for packing in packings:
        model, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype=torch.float64)
        batch = _rollout(model, tokenizer, cfg)
        widths = sorted((batch.prompt_mask.sum(1) + batch.response_mask.sum(1)).long().tolist(), reverse=True)
        cuts = packing.cut(widths)
        # Plain SGD keeps the update linear in the gradient.
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 1.0)
        stats = update_policy(model, optimizer, scheduler, batch, cfg, packing=packing)
        results.append((cuts, [p.detach().clone() for p in model.parameters()], stats))
    (whole_cuts, whole, whole_stats), (packed_cuts, packed, packed_stats), _ = results
    assert whole_cuts == [16]
    assert 2 < len(packed_cuts) < 16 and len(set(packed_cuts)) > 1  # packing really cut unevenly
    for cuts, weights, stats in results[1:]:
        assert stats["policy/loss"] == pytest.approx(whole_stats["policy/loss"], abs=1e-10)
        for a, b in zip(whole, weights):
            assert torch.allclose(a, b, atol=1e-6, rtol=0)
