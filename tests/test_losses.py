"""Each loss formula against a reference written a different way (numpy, loops)."""

import itertools
import math

import numpy as np
import pytest
import torch

from trainer import losses


def _generator(seed):
    return torch.Generator().manual_seed(seed)


def _padding_mask(lengths, width):
    return torch.tensor([[1.0 if t < n else 0.0 for t in range(width)] for n in lengths], dtype=torch.float64)


# --- advantages -------------------------------------------------------------


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_group_advantages_match_numpy_per_group(norm_by_std):
    rewards = torch.rand(6 * 5, generator=_generator(0), dtype=torch.float64)
    rewards[5:10] = 1.0  # an all-equal group: std 0 must give A = 0, not nan
    got = losses.group_advantages(rewards, 5, norm_by_std=norm_by_std, eps=1e-6).numpy()
    for start in range(0, 30, 5):
        group = rewards[start : start + 5].numpy()
        centred = group - group.sum() / len(group)
        spread = math.sqrt(((group - group.mean()) ** 2).sum() / (len(group) - 1))  # Bessel
        expected = centred / (spread + 1e-6) if norm_by_std else centred
        np.testing.assert_allclose(got[start : start + 5], expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(got[5:10], 0.0)


def test_group_advantages_std_is_bessel_corrected():
    got = losses.group_advantages(torch.tensor([0.0, 1.0], dtype=torch.float64), 2, eps=0.0)
    # Bessel std of {0, 1} is sqrt(0.5); the population std (0.5) would give +-1.
    np.testing.assert_allclose(got.numpy(), [-0.5 / math.sqrt(0.5), 0.5 / math.sqrt(0.5)])


def test_group_of_one_has_zero_advantage():
    got = losses.group_advantages(torch.tensor([1.0, 0.0, 3.0]), 1)
    assert torch.equal(got, torch.zeros(3))


def test_integer_rewards_give_float_advantages():
    got = losses.group_advantages(torch.tensor([0, 1, 1, 1]), 4, eps=0.0)
    torch.testing.assert_close(got, torch.tensor([-1.5, 0.5, 0.5, 0.5]))


def test_group_advantages_rejects_size_that_does_not_divide():
    with pytest.raises(ValueError, match="group_size=4"):
        losses.group_advantages(torch.zeros(10), 4)


# --- log-probs and entropy ----------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_and_entropy_match_categorical(dtype):
    logits = (3 * torch.randn(3, 7, 11, generator=_generator(1))).to(dtype)
    targets = torch.randint(0, 11, (3, 7), generator=_generator(2))
    reference = torch.distributions.Categorical(logits=logits.float())
    # chunk_size 4 makes chunks straddle sequence boundaries.
    got_logprobs = losses.token_logprobs(logits, targets, chunk_size=4)
    got_entropy = losses.entropy_from_logits(logits, chunk_size=4)
    assert got_logprobs.shape == got_entropy.shape == (3, 7)
    assert got_logprobs.dtype == got_entropy.dtype == torch.float32
    torch.testing.assert_close(got_logprobs, reference.log_prob(targets), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_entropy, reference.entropy(), rtol=1e-5, atol=1e-5)


def test_token_logprobs_gradient_matches_log_softmax():
    logits = torch.randn(2, 5, 9, generator=_generator(3), requires_grad=True)
    targets = torch.randint(0, 9, (2, 5), generator=_generator(4))
    weights = torch.randn(2, 5, generator=_generator(5))
    (losses.token_logprobs(logits, targets, chunk_size=3) * weights).sum().backward()
    chunked_grad = logits.grad.clone()
    logits.grad = None
    direct = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (direct * weights).sum().backward()
    torch.testing.assert_close(chunked_grad, logits.grad)


def test_token_logprobs_rejects_mismatched_targets():
    with pytest.raises(ValueError, match="targets shape"):
        losses.token_logprobs(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))


# --- policy loss ---------------------------------------------------------------


def _ppo_reference(logprobs, old, advantages, eps_low, eps_high):
    """Piecewise form of the clipped surrogate, token by token."""
    loss = np.zeros(logprobs.shape)
    clipped = np.zeros(logprobs.shape)
    for b in range(logprobs.shape[0]):
        for t in range(logprobs.shape[1]):
            a = advantages[b, t]
            r = math.exp(logprobs[b, t] - old[b, t])
            if a > 0:
                loss[b, t] = -a * min(r, 1 + eps_high)
                clipped[b, t] = r > 1 + eps_high
            elif a < 0:
                loss[b, t] = -a * max(r, 1 - eps_low)
                clipped[b, t] = r < 1 - eps_low
    return loss, clipped


def _policy_inputs(seed, per_token_advantages):
    g = _generator(seed)
    old = -torch.rand(6, 8, generator=g, dtype=torch.float64) * 3
    logprobs = old + 0.6 * torch.randn(6, 8, generator=g, dtype=torch.float64)  # ratios well outside [0.8, 1.28]
    shape = (6, 8) if per_token_advantages else (6,)
    return logprobs, old, torch.randn(shape, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("per_token_advantages", [False, True])
def test_ppo_clips_both_sides_with_asymmetric_eps(per_token_advantages):
    logprobs, old, advantages = _policy_inputs(6, per_token_advantages)
    loss, stats = losses.policy_loss(logprobs, old, advantages, eps_clip_low=0.2, eps_clip_high=0.28)
    full_advantages = advantages if per_token_advantages else advantages[:, None].expand(6, 8)
    expected_loss, expected_clipped = _ppo_reference(logprobs.numpy(), old.numpy(), full_advantages.numpy(), 0.2, 0.28)
    np.testing.assert_allclose(loss.numpy(), expected_loss, rtol=1e-12)
    np.testing.assert_array_equal(stats["clip_frac"].numpy(), expected_clipped)
    assert stats["clip_frac_low"].sum() > 0 and stats["clip_frac_high"].sum() > 0
    torch.testing.assert_close(stats["clip_frac"], stats["clip_frac_low"] + stats["clip_frac_high"])
    torch.testing.assert_close(stats["ratio"], torch.exp(logprobs - old))
    mask = _padding_mask([8, 5, 3, 8, 1, 6], 8)
    expected_fraction = (expected_clipped * mask.numpy()).sum() / mask.sum().item()
    assert losses.masked_mean(stats["clip_frac"], mask).item() == pytest.approx(expected_fraction)


def test_importance_sampling_is_unclipped_ratio_times_advantage():
    logprobs, old, advantages = _policy_inputs(7, per_token_advantages=True)
    loss, stats = losses.policy_loss(
        logprobs, old, advantages, eps_clip_low=0.2, eps_clip_high=0.2, loss_type="importance_sampling"
    )
    expected = -np.exp(logprobs.numpy() - old.numpy()) * advantages.numpy()
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-12)
    assert stats["clip_frac"].sum() == 0


def test_log_ratio_is_clamped_to_20():
    old = torch.zeros(1, 2, dtype=torch.float64)
    logprobs = torch.tensor([[50.0, -50.0]], dtype=torch.float64)
    _, stats = losses.policy_loss(logprobs, old, torch.ones(1), eps_clip_low=0.2, eps_clip_high=0.2)
    np.testing.assert_allclose(stats["ratio"].numpy(), [[math.exp(20), math.exp(-20)]])


def test_truncated_importance_sampling_weights_are_capped():
    logprobs, old, advantages = _policy_inputs(8, per_token_advantages=False)
    rollout = old + 0.8 * torch.randn(6, 8, generator=_generator(9), dtype=torch.float64)
    plain, _ = losses.policy_loss(logprobs, old, advantages, eps_clip_low=0.2, eps_clip_high=0.28)
    corrected, stats = losses.policy_loss(
        logprobs, old, advantages, eps_clip_low=0.2, eps_clip_high=0.28, rollout_logprobs=rollout, tis_cap=2.0
    )
    weights = np.minimum(np.exp(old.numpy() - rollout.numpy()), 2.0)
    assert (weights == 2.0).any() and (weights < 1.0).any()
    np.testing.assert_allclose(stats["tis_weight"].numpy(), weights, rtol=1e-12)
    np.testing.assert_allclose(corrected.numpy(), plain.numpy() * weights, rtol=1e-12)
    with pytest.raises(ValueError, match="rollout_logprobs is None"):
        losses.policy_loss(logprobs, old, advantages, eps_clip_low=0.2, eps_clip_high=0.2, tis_cap=2.0)


@pytest.mark.parametrize("loss_type", ["ppo", "importance_sampling"])
def test_gradient_flows_only_through_logprobs(loss_type):
    logprobs, old, advantages = (x.clone().requires_grad_(True) for x in _policy_inputs(10, False))
    rollout = (old.detach() - 0.1).requires_grad_(True)
    ref = (old.detach() + 0.1).requires_grad_(True)
    options = {"eps_clip_low": 0.2, "eps_clip_high": 0.28, "rollout_logprobs": rollout, "tis_cap": 2.0}
    loss, stats = losses.policy_loss(logprobs, old, advantages, loss_type=loss_type, **options)
    (loss.sum() + losses.kl_penalty(logprobs, ref).sum()).backward()
    assert logprobs.grad is not None and logprobs.grad.abs().sum() > 0
    assert old.grad is None and rollout.grad is None and ref.grad is None and advantages.grad is None
    assert all(not value.requires_grad for value in stats.values())


def test_ppo_gradient_is_zero_on_clipped_tokens():
    logprobs, old, advantages = _policy_inputs(11, per_token_advantages=False)
    logprobs.requires_grad_(True)
    loss, stats = losses.policy_loss(logprobs, old, advantages, eps_clip_low=0.2, eps_clip_high=0.28)
    loss.sum().backward()
    # d/dlogp of -r A is -r A where the unclipped branch is active, else 0.
    expected = torch.where(stats["clip_frac"] > 0, 0.0, -stats["ratio"] * advantages[:, None])
    torch.testing.assert_close(logprobs.grad, expected)


# --- KL ------------------------------------------------------------------------


def test_kl_estimators_match_formulas_including_clamps():
    logprobs = torch.tensor([[-1.0, -0.5, -30.0, -0.1, -3.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.2, -0.5, -1.0, -25.0, -0.2]], dtype=torch.float64)
    diff = logprobs.numpy() - ref.numpy()
    np.testing.assert_allclose(losses.kl_penalty(logprobs, ref, estimator="k1").numpy(), diff)
    np.testing.assert_allclose(losses.kl_penalty(logprobs, ref, estimator="k2").numpy(), 0.5 * diff**2)
    d = np.clip(-diff, -20, 20)
    expected_k3 = np.minimum(np.exp(d) - d - 1, 10.0)
    got_k3 = losses.kl_penalty(logprobs, ref, estimator="k3").numpy()
    np.testing.assert_allclose(got_k3, expected_k3)
    assert got_k3[0, 2] == 10.0  # d = 29 -> clamped to 20, then e^20 clamped to 10
    assert got_k3[0, 0] == pytest.approx(math.exp(-0.2) + 0.2 - 1)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_estimator_expectation_is_exact_kl(estimator):
    policy = torch.log_softmax(torch.randn(7, generator=_generator(12), dtype=torch.float64), -1)
    ref = torch.log_softmax(torch.randn(7, generator=_generator(13), dtype=torch.float64), -1)
    per_token = losses.kl_penalty(policy[None], ref[None], estimator=estimator)[0]
    expected = sum(math.exp(p) * (p - q) for p, q in zip(policy.tolist(), ref.tolist()))
    assert (policy.exp() * per_token).sum().item() == pytest.approx(expected, rel=1e-10)


# --- aggregation -----------------------------------------------------------------

LENGTHS = [7, 3, 5, 1, 7, 2, 4, 6]


def _aggregate_reference(per_token, lengths, reduction, max_len):
    rows = [[per_token[b][t] for t in range(n)] for b, n in enumerate(lengths)]
    if reduction == "token_mean":
        return sum(sum(row) for row in rows) / sum(lengths)
    if reduction == "seq_mean_token_mean":
        return sum(sum(row) / len(row) for row in rows) / len(rows)
    return sum(sum(row) for row in rows) / (len(rows) * max_len)


@pytest.mark.parametrize("reduction", losses.REDUCTIONS)
def test_aggregate_matches_loops_with_padding(reduction):
    per_token = torch.randn(8, 9, generator=_generator(14), dtype=torch.float64)
    mask = _padding_mask(LENGTHS, 9)
    got = losses.aggregate(per_token, mask, reduction)
    expected = _aggregate_reference(per_token.tolist(), LENGTHS, reduction, max_len=9)
    assert got.item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("reduction", losses.REDUCTIONS)
def test_micro_batch_losses_sum_to_mini_batch_loss(reduction):
    per_token = torch.randn(8, 9, generator=_generator(15), dtype=torch.float64, requires_grad=True)
    mask = _padding_mask(LENGTHS, 9)
    totals = {"num_sequences": 8, "num_tokens": int(mask.sum()), "max_len": 9}
    whole = losses.aggregate(per_token, mask, reduction, **totals)
    (whole_grad,) = torch.autograd.grad(whole, per_token)
    micro_sum = 0.0
    for rows in (slice(0, 3), slice(3, 6), slice(6, 8)):
        width = max(LENGTHS[rows])  # each micro-batch padded only to its own longest sequence
        micro_sum = micro_sum + losses.aggregate(per_token[rows, :width], mask[rows, :width], reduction, **totals)
    (micro_grad,) = torch.autograd.grad(micro_sum, per_token)
    assert micro_sum.item() == pytest.approx(whole.item(), rel=1e-12)
    torch.testing.assert_close(micro_grad, whole_grad)
    assert whole.item() == pytest.approx(losses.aggregate(per_token, mask, reduction).item(), rel=1e-12)


def test_aggregate_rejects_unknown_reduction():
    with pytest.raises(ValueError, match="seq_mean_token_sum'"):
        losses.aggregate(torch.zeros(2, 3), torch.ones(2, 3), "seq_mean_token_sum")


def test_masked_mean_of_empty_mask_is_zero():
    assert losses.masked_mean(torch.ones(2, 3), torch.zeros(2, 3)).item() == 0.0
    per_row = losses.masked_mean(torch.arange(6.0).view(2, 3), torch.tensor([[1, 1, 0], [0, 0, 0]]), dim=-1)
    assert per_row.tolist() == [0.5, 0.0]


@pytest.mark.parametrize("reduction", losses.REDUCTIONS)
def test_non_finite_values_at_masked_positions_reach_neither_loss_nor_gradient(reduction):
    lengths = [3, 1]
    mask = _padding_mask(lengths, 4)
    values = torch.rand(2, 4, generator=_generator(7), dtype=torch.float64)
    clean = losses.aggregate(values, mask, reduction)
    poisoned = values.clone()
    poisoned[0, 3], poisoned[1, 1:] = float("nan"), float("inf")  # only where the mask is 0
    poisoned.requires_grad_(True)
    loss = losses.aggregate(poisoned, mask, reduction)
    loss.backward()
    assert loss.item() == pytest.approx(clean.item())
    assert torch.isfinite(poisoned.grad).all() and (poisoned.grad[mask == 0] == 0).all()
    assert losses.masked_mean(poisoned.detach(), mask).item() == pytest.approx(losses.masked_mean(values, mask).item())


# --- pass@k and distillation ---------------------------------------------------------


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 1, 6), (7, 4, 4), (8, 3, 2)])
def test_pass_at_k_matches_subset_enumeration(n, c, k):
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    expected = sum(any(subset) for subset in subsets) / len(subsets)
    assert losses.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="c=6"):
        losses.pass_at_k(5, 6, 1)


def test_distillation_advantages_drive_student_towards_teacher():
    student = -torch.rand(3, 4, generator=_generator(16), dtype=torch.float64)
    teacher = -torch.rand(3, 4, generator=_generator(17), dtype=torch.float64)
    advantages = losses.distillation_advantages(student, teacher, coef=0.5)
    np.testing.assert_allclose(advantages.numpy(), -0.5 * (student.numpy() - teacher.numpy()))
    assert not losses.distillation_advantages(student.clone().requires_grad_(True), teacher).requires_grad
    # On-policy (ratio 1) the importance-sampling gradient per token is -A: raise where teacher > student.
    logprobs = student.clone().requires_grad_(True)
    loss, _ = losses.policy_loss(
        logprobs, student, advantages, eps_clip_low=0.2, eps_clip_high=0.2, loss_type="importance_sampling"
    )
    loss.sum().backward()
    torch.testing.assert_close(logprobs.grad, 0.5 * (student - teacher))
