"""The shared-prompt forward (trainer/shared_prompt.py): a group's prompt run once, its samples
attending to that copy; the same log-probs and the same update as every row on its own."""

from __future__ import annotations

import attrs
import pytest
import torch

from trainer import shared_prompt
from trainer.batch import Batch
from trainer.config import TrainerConfig
from trainer.packing import Packing
from trainer.rollout import Generation


def grouped_batch(prompts, responses, *, n, pad_id=0, device="cpu") -> Batch:
    generation = Generation.from_rows(responses, stopped=[True] * len(responses), pad_id=pad_id, device=device)
    return Batch.from_generation(prompts, generation, n=n, pad_id=pad_id, device=device)


def two_groups() -> Batch:
    """Prompts [1, 2] and [3, 4, 9], two samples each: responses of 3, 1, 2 and 2 tokens."""
    return grouped_batch([[1, 2], [3, 4, 9]], [[5, 6, 7], [8], [10, 11], [12, 13]], n=2)


def test_groups_are_runs_of_rows_that_sample_one_prompt():
    batch = two_groups()
    assert shared_prompt.prompt_groups(batch) == [2, 2]
    assert shared_prompt.prompt_groups(batch.rows([0, 2, 3])) == [1, 2]  # a slice that cuts a group
    # Without the prompt index (a batch built by hand), equal prompt tokens make the group.
    assert shared_prompt.prompt_groups(attrs.evolve(batch, prompt_index=None)) == [2, 2]
    # Two draws of the same prompt stay two groups: the packing counted them apart.
    same = grouped_batch([[1, 2], [1, 2]], [[5], [6], [7], [8]], n=2)
    assert shared_prompt.prompt_groups(same) == [2, 2]
    assert shared_prompt.prompt_groups(attrs.evolve(same, prompt_index=None)) == [4]


def test_a_group_is_one_row_of_prompt_then_each_response_at_its_own_positions():
    batch = two_groups()
    layout = shared_prompt.Layout(batch, [2, 2])
    assert layout.width == shared_prompt.BLOCK  # padded to flex attention's block
    assert layout.ids[0, :6].tolist() == [1, 2, 5, 6, 7, 8]
    assert layout.positions[0, :6].tolist() == [0, 1, 2, 3, 4, 2]
    assert layout.segments[0, :7].tolist() == [0, 0, 1, 1, 1, 2, -1]
    assert layout.ids[1, :7].tolist() == [3, 4, 9, 10, 11, 12, 13]
    assert layout.positions[1, :7].tolist() == [0, 1, 2, 3, 4, 3, 4]
    assert layout.segments[1, :8].tolist() == [0, 0, 0, 1, 1, 2, 2, -1]
    # What predicts each sampled token: the prompt's last token for every response's first.
    width = layout.width
    assert layout.predictors.tolist() == [1, 2, 3, 1, width + 2, width + 3, width + 2, width + 5]


def test_a_response_sees_the_prompt_and_itself_never_another_response():
    layout = shared_prompt.Layout(two_groups(), [2, 2])
    mask = layout.dense_mask()[0, 0]  # group 0: prompt 0-1, response 1 at 2-4, response 2 at 5
    assert mask[5, :6].tolist() == [True, True, False, False, False, True]
    assert mask[4, :6].tolist() == [True, True, True, True, True, False]
    assert mask[1, :3].tolist() == [True, True, False]  # the prompt is causal
    assert mask[6, :7].tolist() == [True, True, False, False, False, False, True]  # padding: prompt and itself
    assert mask.sum(dim=1).min() >= 1  # no query sees nothing


def test_the_block_mask_lists_every_visible_block_and_runs_only_whole_ones_unmasked():
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 200, (n,), generator=generator).tolist() for n in (150, 40)]
    responses = [torch.randint(1, 200, (n,), generator=generator).tolist() for n in (130, 200, 7, 90)]
    layout = shared_prompt.Layout(grouped_batch(prompts, responses, n=2), [2, 2])
    dense = layout.dense_mask()[:, 0]  # (G, L, L)
    blocks = layout.width // shared_prompt.BLOCK
    tiles = dense.view(2, blocks, shared_prompt.BLOCK, blocks, shared_prompt.BLOCK)
    seen, whole = tiles.any(dim=4).any(dim=2), tiles.all(dim=4).all(dim=2)
    block_mask = layout.block_mask()
    listed = block_mask.to_dense()[:, 0].bool()  # partial and full blocks
    assert torch.equal(listed, seen)
    counts, indices = block_mask.full_kv_num_blocks[:, 0], block_mask.full_kv_indices[:, 0]
    full = torch.zeros_like(whole)
    for g in range(2):
        for q in range(blocks):
            full[g, q, indices[g, q, : counts[g, q]].long()] = True
    assert torch.equal(full, whole) and whole.any() and (seen & ~whole).any()


def small_model(dtype):
    from trainer.models import load_model_and_tokenizer

    cfg = TrainerConfig(model="tiny-random", dataset="gsm8k")
    model, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype=dtype)
    return model, tokenizer


def random_groups(tokenizer, *, prompt_lengths, response_lengths, n, seed=1, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 256, (k,), generator=generator).tolist() for k in prompt_lengths]
    responses = [torch.randint(0, 256, (k,), generator=generator).tolist() for k in response_lengths]
    return grouped_batch(prompts, responses, n=n, pad_id=tokenizer.pad_token_id, device=device)


def test_shared_log_probs_are_each_rows_own():
    from trainer.forward import response_logprobs

    torch.set_num_threads(1)
    model, tokenizer = small_model(torch.float64)
    batch = random_groups(tokenizer, prompt_lengths=(9, 3, 5), response_lengths=(3, 6, 1, 4, 7, 2), n=2)
    with torch.no_grad():
        alone, alone_entropy = response_logprobs(model, batch, 0.7, with_entropy=True)
        model.share_prompts = True
        shared, shared_entropy = response_logprobs(model, batch, 0.7, with_entropy=True)
    torch.testing.assert_close(shared, alone, rtol=0, atol=1e-12)
    torch.testing.assert_close(shared_entropy, alone_entropy, rtol=0, atol=1e-12)
    assert (alone != 0).sum() == batch.response_mask.sum()


def test_the_per_row_forward_leaves_transformers_no_mask_to_prepare_and_gives_its_result(monkeypatch):
    """Under SDPA the per-row forward runs its causal kernel with no mask either way; called
    without a mask transformers first checks the position ids it makes up for packed sequences
    (an ``if`` on a device tensor: a sync each forward on a GPU). The forward skips that and
    computes exactly what transformers' own path computes, gradients too."""
    import contextlib

    import transformers.masking_utils

    from trainer import forward

    torch.set_num_threads(1)
    checks = []
    real_check = transformers.masking_utils.find_packed_sequence_indices
    monkeypatch.setattr(transformers.masking_utils, "find_packed_sequence_indices",
                        lambda positions: checks.append(positions.shape) or real_check(positions))
    model, tokenizer = small_model(torch.float64)
    batch = random_groups(tokenizer, prompt_lengths=(9, 3, 5), response_lengths=(3, 6, 1, 4, 7, 2), n=2)
    results = []
    for transformers_path in (False, True):
        if transformers_path:
            monkeypatch.setattr(forward, "causal_without_mask", lambda config: contextlib.nullcontext())
        model.zero_grad()
        logprobs, entropy = forward.response_logprobs(model, batch, 0.7, with_entropy=True)
        (logprobs.sum() + entropy.sum()).backward()
        results.append((logprobs.detach(), [p.grad.clone() for p in model.parameters()], len(checks)))
    (ours, our_grads, our_checks), (theirs, their_grads, their_checks) = results
    assert our_checks == 0 and their_checks == 1  # transformers' path checks once, ours never
    assert torch.equal(ours, theirs)
    assert all(torch.equal(a, b) for a, b in zip(our_grads, their_grads))
    assert model.config._attn_implementation == "sdpa"  # set back after the forward


def test_bodies_that_need_their_mask_keep_transformers_path():
    from trainer.forward import causal_without_mask

    model, _ = small_model(torch.float32)
    model.config._attn_implementation = "eager"  # eager attention needs the causal mask built
    with causal_without_mask(model.config):
        assert model.config._attn_implementation == "eager"
    model.config._attn_implementation = "sdpa"
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    with causal_without_mask(model.config):
        assert model.config._attn_implementation == "sdpa"


def test_the_forward_runs_one_row_a_group_under_the_mask(monkeypatch):
    from trainer.forward import response_logprobs

    torch.set_num_threads(1)
    model, tokenizer = small_model(torch.float32)
    model.share_prompts = True
    batch = random_groups(tokenizer, prompt_lengths=(9, 3), response_lengths=(3, 6, 1, 4), n=2)
    calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(query, key, value, attn_mask=None, **kwargs):
        calls.append((query.shape[0], None if attn_mask is None else tuple(attn_mask.shape)))
        return real_sdpa(query, key, value, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    before = model.config._attn_implementation
    with torch.no_grad():
        response_logprobs(model, batch, 1.0)
    width = shared_prompt.BLOCK
    assert calls == [(2, (2, 1, width, width))] * model.config.num_hidden_layers
    assert model.config._attn_implementation == before  # restored for the engine and everything else


def test_flex_attention_forward_matches_the_dense_mask():
    """The block mask (flex attention's forward; the CPU has no flex backward) against SDPA
    under the dense mask, on rows that span several blocks."""
    from trainer.forward import split_head

    torch.set_num_threads(1)
    model, tokenizer = small_model(torch.float32)
    batch = random_groups(tokenizer, prompt_lengths=(150, 40), response_lengths=(130, 200, 7, 90), n=2)
    body, _ = split_head(model)
    with torch.no_grad():
        dense = shared_prompt.hidden(body, batch, [2, 2], mask="dense")
        flex = shared_prompt.hidden(body, batch, [2, 2], mask="flex")
    torch.testing.assert_close(flex, dense, rtol=1e-4, atol=1e-4)


def test_micro_batches_keep_groups_whole():
    from trainer.update import micro_units

    batch = two_groups()
    units, widths = micro_units(batch, share_prompts=True, width_multiple=1)
    assert units == [[2, 3], [0, 1]] and widths == [128, 128]  # 3 + 2 + 2 and 2 + 3 + 1 tokens, a block each
    units, widths = micro_units(batch, share_prompts=False, width_multiple=1)
    assert units == [[0], [2], [3], [1]] and widths == [5, 5, 5, 3]


def test_a_group_wider_than_the_token_budget_is_cut_into_runs_of_its_rows_that_fit():
    from trainer.update import micro_units

    # One prompt of 2 tokens, four samples of 100, 100, 100 and 300 tokens: one row of 602
    # tokens, 640 padded to flex attention's blocks of 128.
    batch = grouped_batch([[1, 2]], [[5] * 100, [6] * 100, [7] * 100, [8] * 300], n=4)
    assert micro_units(batch, share_prompts=True, width_multiple=1) == ([[0, 1, 2, 3]], [640])
    assert micro_units(batch, share_prompts=True, width_multiple=1, max_width=640) == ([[0, 1, 2, 3]], [640])
    # 2 + 100 + 100 fits 256; the third sample would make 302 (384 padded); the 300-token sample
    # is wider than 256 alone and goes alone (its micro-batch is one row: nothing narrower exists).
    units, widths = micro_units(batch, share_prompts=True, width_multiple=1, max_width=256)
    assert units == [[3], [0, 1], [2]] and widths == [384, 256, 128]
    # The forward then lays the runs out as cut, not as the prompt's one group.
    regrouped = batch.rows([row for unit in units for row in unit]).grouped_as([len(unit) for unit in units])
    assert shared_prompt.prompt_groups(regrouped) == [1, 2, 1]
    assert shared_prompt.prompt_groups(batch.rows([3, 0, 1, 2])) == [4]
    with pytest.raises(ValueError, match="groups of 3 rows for a batch of 4"):
        batch.grouped_as([1, 2])


def test_no_micro_batch_of_the_shared_forward_is_wider_than_the_token_budget(monkeypatch):
    """The update under a token budget narrower than a group's row: every layout the forward
    builds fits the budget, and the update is the per-row update (the fp64 test below)."""
    from trainer.losses import group_advantages
    from trainer.update import update_policy

    torch.set_num_threads(1)
    widths = []
    layout = shared_prompt.Layout.__init__

    def record(self, batch, sizes, **kwargs):
        layout(self, batch, sizes, **kwargs)
        widths.append(self.ids.shape[0] * self.width)  # padded tokens: groups x width

    monkeypatch.setattr(shared_prompt.Layout, "__init__", record)
    cfg = TrainerConfig(train_batch_size=2, policy_mini_batch_size=2, n_samples_per_prompt=4, max_generate_length=80)
    model, tokenizer = small_model(torch.float32)
    model.share_prompts = True
    batch = random_groups(tokenizer, prompt_lengths=(30, 10), n=4, response_lengths=[70, 60, 50, 40, 30, 20, 10, 5])
    batch = attrs.evolve(batch, advantages=group_advantages(torch.arange(8.0) % 3, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 1.0)
    update_policy(model, optimizer, scheduler, batch, cfg, packing=Packing(tokens=128, why="test"))
    # Group rows of 250 and 75 tokens: the first in runs of 128 padded tokens, each a micro-batch.
    assert widths and max(widths) <= 128, widths


def test_a_row_count_is_met_in_whole_groups_and_a_token_budget_counts_a_groups_row():
    assert Packing(rows=8).cut([1024] * 5, unit_rows=[4, 4, 4, 2, 2]) == [2, 3]
    assert Packing(rows=3).cut([1024] * 2, unit_rows=[4, 4]) == [1, 1]  # a group wider than the count goes alone
    assert Packing(tokens=5120).cut([2048] * 4 + [512] * 10, unit_rows=[4] * 14) == [2, 2, 10]  # not rounded to 8


@pytest.mark.parametrize("packing", [Packing(rows=16, why="one micro-batch"), Packing(tokens=300, why="packed"),
                                     Packing(rows=4, why="a group at a time"),
                                     Packing(tokens=128, why="the widest group cut in runs")])
def test_shared_and_per_row_updates_agree_in_fp64(packing):
    """The same update with the prompt shared as with every row's own copy: SGD (linear in the
    gradient) from the same weights gives the same weights to 1e-6."""
    from trainer.losses import group_advantages
    from trainer.update import update_policy

    torch.set_num_threads(1)
    cfg = TrainerConfig(train_batch_size=4, policy_mini_batch_size=4, n_samples_per_prompt=4,
                        max_generate_length=40, loss_reduction="token_mean", use_entropy_loss=True)
    results = []
    for share in (False, True):
        model, tokenizer = small_model(torch.float64)
        model.share_prompts = share
        batch = random_groups(tokenizer, prompt_lengths=(60, 3, 20, 9), n=4,
                              response_lengths=[7 + 2 * i for i in range(16)])
        batch = attrs.evolve(batch, advantages=group_advantages(torch.arange(16.0) % 3, 4).to(torch.float64))
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 1.0)
        stats = update_policy(model, optimizer, scheduler, batch, cfg, packing=packing)
        results.append(([p.detach().clone() for p in model.parameters()], stats))
    (alone, alone_stats), (shared, shared_stats) = results
    assert shared_stats["policy/loss"] == pytest.approx(alone_stats["policy/loss"], abs=1e-10)
    assert shared_stats["policy/entropy"] == pytest.approx(alone_stats["policy/entropy"], abs=1e-10)
    for a, b in zip(alone, shared):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_setup_turns_it_on_for_models_it_supports():
    model, _ = small_model(torch.float32)
    assert shared_prompt.supports(model)
    model.config.sliding_window = 16
    assert not shared_prompt.supports(model)


@pytest.mark.parametrize("keys, shared", [({}, True), ({"share_prompts": False}, False),
                                          ({"gradient_checkpointing": True}, False)])
def test_a_run_shares_prompts_by_default_but_not_under_gradient_checkpointing(tmp_path, keys, shared):
    import io

    from trainer.parallel import SINGLE
    from trainer.setup import set_up

    torch.set_num_threads(1)
    cfg = TrainerConfig(max_steps=1, **keys)
    run = set_up(cfg, SINGLE, ckpt_dir=tmp_path / "ckpt", metrics_path=tmp_path / "metrics.jsonl", stdout=None,
                 stderr=io.StringIO())
    assert run.model.share_prompts is shared and run.policy is run.model


@pytest.mark.gpu
def test_shared_log_probs_and_gradients_match_per_row_on_cuda():
    """The flex-attention path (forward and backward) against each row's own copy, in bf16
    autocast over fp32 weights as the update runs, compiled as the trainer compiles it."""
    from trainer.forward import compile_body, response_logprobs
    from trainer.models import load_model_and_tokenizer

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cfg = TrainerConfig(model="tiny-random", dataset="gsm8k")
    results = []
    for share in (False, True):
        model, tokenizer = load_model_and_tokenizer(cfg, device="cuda", dtype=torch.float32)
        compile_body(model)
        model.share_prompts = share
        batch = random_groups(tokenizer, prompt_lengths=(150, 40, 77), n=4,
                              response_lengths=[30 + 17 * i for i in range(12)], device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logprobs, _ = response_logprobs(model, batch, 1.0)
        (logprobs * batch.response_mask).sum().backward()
        results.append((logprobs.detach(), [p.grad.detach().clone() for p in model.parameters()]))
    (alone, alone_grads), (shared, shared_grads) = results
    torch.testing.assert_close(shared, alone, rtol=0, atol=0.05)
    for a, b in zip(alone_grads, shared_grads):
        assert torch.linalg.vector_norm(a - b) <= 0.05 * torch.linalg.vector_norm(a) + 1e-6


def test_a_run_with_the_prompt_shared_learns_as_one_without(tmp_path):
    """Two steps of the built-in task from one seed, shared and per-row: the same samples, and
    the same update up to fp32 rounding, so the metrics agree."""
    import json

    from trainer.loop import train

    torch.set_num_threads(1)
    logged = {}
    for share in (True, False):
        cfg = TrainerConfig(max_steps=2, share_prompts=share, eval_before_train=False, eval_limit=4)
        metrics = tmp_path / f"{share}.jsonl"
        train(cfg, ckpt_dir=tmp_path / f"ckpt-{share}", metrics_path=metrics, stdout=None)
        logged[share] = [json.loads(line) for line in metrics.read_text().splitlines()
                         if json.loads(line)["kind"] == "train"]
    assert len(logged[True]) == len(logged[False]) == 2
    for shared, alone in zip(logged[True], logged[False]):
        for key in ("reward/mean", "policy/loss", "policy/entropy", "policy/grad_norm"):
            assert shared[key] == pytest.approx(alone[key], rel=1e-4, abs=1e-6), key


@pytest.mark.gpu
@pytest.mark.parametrize("share", [False, True], ids=["per-row", "shared"])
def test_a_micro_batch_is_cut_run_and_differentiated_without_waiting_for_the_gpu(share):
    """Once a batch's row lengths are read (one sync a step), cutting a micro-batch, its
    layout, forward and backward never synchronise with the device: torch's sync debug mode
    raises on the first that would (each stalled the GPU queue for the host's launch time).
    The per-row forward relies on :func:`trainer.forward.causal_without_mask` for it."""
    from trainer.forward import compile_body, response_logprobs
    from trainer.models import load_model_and_tokenizer

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cfg = TrainerConfig(model="tiny-random", dataset="gsm8k")
    model, tokenizer = load_model_and_tokenizer(cfg, device="cuda", dtype=torch.float32)
    compile_body(model)
    model.share_prompts, model.fused_logprobs = share, True
    batch = random_groups(tokenizer, prompt_lengths=(150, 40, 77, 9), n=4,
                          response_lengths=[30 + 17 * i for i in range(16)], device="cuda")
    batch.row_lengths()
    for mode in ("default", "error"):  # the first pass compiles, which may sync
        torch.cuda.set_sync_debug_mode(mode)
        try:
            ordered = batch.rows([4, 5, 6, 7, 12, 13, 14, 15, 0, 1, 2, 3, 8, 9, 10, 11])
            micro = ordered.rows(slice(0, 8))
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logprobs, entropy = response_logprobs(model, micro, 1.0, with_entropy=True)
            ((logprobs + 0.01 * entropy) * micro.response_mask).sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    rows = [4, 5, 6, 7, 12, 13, 14, 15]
    assert torch.equal(micro.response_ids, batch.response_ids[rows, : micro.response_ids.shape[1]])
