"""GRPO and on-policy-distillation loss math: torch only, no model.

Shapes: B sequences (prompts x samples, group-contiguous), T response tokens,
V vocabulary. Masks are (B, T) with 1 on response tokens that count.

The variant implemented
-----------------------
* Advantage: outcome reward per sequence, normalised within its group of G
  samples, A_i = (r_i - mean(r)) / (std(r) + eps), std Bessel-corrected,
  eps = 1e-6; ``norm_by_std=False`` gives Dr.GRPO's A_i = r_i - mean(r).
  A group of one gets A = 0: it has no baseline, so it carries no signal.
* Ratio rho_t = exp(clamp(log pi - log pi_old, -20, 20)).
* ``ppo``: L_t = -min(rho_t A, clip(rho_t, 1 - eps_low, 1 + eps_high) A);
  DAPO clip-higher is eps_high > eps_low. ``importance_sampling``:
  L_t = -rho_t A, no clip (the on-policy distillation loss).
* Truncated importance sampling (token level): L_t *= min(exp(log pi_old -
  log mu_rollout), cap), detached, when rollout log-probs and a cap are given.
* KL to a reference is a separate (B, T) term the caller adds to the loss
  (GRPO's "KL in the loss", not in the reward); k3 follows SkyRL and verl.
* Reductions: token_mean, seq_mean_token_mean, seq_mean_token_sum_norm, each
  able to normalise by whole-mini-batch totals for gradient accumulation.
* Distillation: per-token advantage -coef (log pi_student - log pi_teacher) on
  the sampled token (reverse KL, as SkyRL's OPD example and Tinker).

Where it differs from the references
------------------------------------
* SkyRL (skyrl_train ppo_utils): a group of one there gets mean 0, std 1, so
  A = r / (1 + eps); here A = 0. Its ``importance_sampling`` loss does not
  clamp the log-ratio; here it is clamped to +-20 like ``ppo``. Its
  clip_ratio counts -surr2 > -surr1, which equals our count except at A = 0.
  Its reductions pre-scale advantages by mini-batch totals and then sum; here
  ``aggregate`` takes those totals as arguments, which gives the same sum.
  TIS sequence mode, outlier masks and dual-clip are not implemented.
* verl (core_algos): same singleton rule as SkyRL. ``seq-mean-token-sum-norm``
  divides by the padded length loss_mask.shape[-1] (or a configured factor);
  here max_len defaults to the padded T but the caller should pass the
  configured generation limit so micro-batches padded differently agree.
  ``seq-mean-token-sum`` is not offered.
* TRL (grpo_trainer): eps = 1e-4 and ``num_generations >= 2`` enforced;
  no log-ratio clamp; k3 KL is unclamped and added to the per-token loss
  before aggregation (callers here add the aggregated KL, which is the same
  for every reduction because they are linear). Loss types map as
  grpo -> seq_mean_token_mean, bnpo/dapo -> token_mean,
  dr_grpo -> seq_mean_token_sum_norm with max_len = max_completion_length.
"""

import math

import torch

from trainer import names

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: large enough never to bind on sane runs, finite in fp32


def group_advantages(rewards, group_size, *, norm_by_std=True, eps=1e-6):
    """Group-relative advantages for rewards (B*G,) laid out group-contiguous -> (B*G,)."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (B*G,), got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"group_size={group_size} does not divide {rewards.numel()} rewards")
    # At least fp32 so integer or bf16 rewards do not round the normalised values.
    grouped = rewards.detach().to(torch.promote_types(rewards.dtype, torch.float32)).view(-1, group_size)  # (B, G)
    if group_size == 1:
        return torch.zeros_like(grouped).view(-1)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if norm_by_std:
        centred = centred / (grouped.std(dim=1, keepdim=True, unbiased=True) + eps)
    return centred.view(-1)


def _over_row_chunks(logits, chunk_size, per_row_fn, *extra):
    """Apply per_row_fn to (N, V) fp32 row-chunks of (B, T, V) logits -> (B, T).

    Only one fp32 chunk is alive at a time when no graph is recorded (old, ref
    and teacher log-probs); under autograd the fp32 upcast of a low-precision
    chunk is kept for backward, still never a second full (B, T, V) tensor.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be (B, T, V), got shape {tuple(logits.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    batch, length, vocab = logits.shape
    rows = logits.reshape(-1, vocab)  # (B*T, V)
    flat_extra = [e.reshape(-1) for e in extra]  # each (B*T,)
    pieces = [
        per_row_fn(rows[i : i + chunk_size].float(), *(e[i : i + chunk_size] for e in flat_extra))
        for i in range(0, rows.shape[0], chunk_size)
    ]
    if not pieces:
        return logits.new_zeros((batch, length), dtype=torch.float32)
    return torch.cat(pieces).view(batch, length)


def token_logprobs(logits, targets, *, chunk_size=1024):
    """log softmax(logits)[targets] -> (B, T) fp32, as logit - logsumexp per chunk.

    Gathering one logit and subtracting logsumexp avoids the (B, T, V) output
    that log_softmax would allocate and save for backward.
    """
    if targets.shape != logits.shape[:2]:
        raise ValueError(f"targets shape {tuple(targets.shape)} != logits (B, T) {tuple(logits.shape[:2])}")

    def rows_logprob(rows, row_targets):  # (N, V), (N,) -> (N,)
        picked = rows.gather(-1, row_targets.long().unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(rows, dim=-1)

    return _over_row_chunks(logits, chunk_size, rows_logprob, targets)


def entropy_from_logits(logits, *, chunk_size=1024):
    """Entropy of softmax(logits) per position -> (B, T) fp32; logits must be finite."""

    def rows_entropy(rows):  # (N, V) -> (N,)
        probs = torch.softmax(rows, dim=-1)
        return torch.logsumexp(rows, dim=-1) - (probs * rows).sum(dim=-1)

    return _over_row_chunks(logits, chunk_size, rows_entropy)


def _per_token(advantages, like):
    """Broadcast (B,) sequence advantages to (B, T); pass (B, T) through."""
    if advantages.shape == like.shape:
        return advantages
    if advantages.dim() == 1 and advantages.shape[0] == like.shape[0]:
        return advantages.unsqueeze(-1)  # (B, 1)
    raise ValueError(f"advantages shape {tuple(advantages.shape)} is neither (B,) nor (B, T) = {tuple(like.shape)}")


def policy_loss(
    logprobs,
    old_logprobs,
    advantages,
    *,
    eps_clip_low,
    eps_clip_high,
    loss_type="ppo",
    rollout_logprobs=None,
    tis_cap=None,
):
    """Per-token policy-gradient loss (B, T) and per-token detached stats.

    Stats are (B, T) so the caller can average them under its mask:
    ``ratio``, ``clip_frac`` (1 where the clipped branch is active; its masked
    mean is the clip fraction), ``clip_frac_low``, ``clip_frac_high`` and,
    with TIS, ``tis_weight``. Gradient flows through ``logprobs`` only.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {tuple(LOSS_TYPES)}, got {loss_type!r}")
    if not (0.0 <= eps_clip_low < 1.0 and eps_clip_high >= 0.0):
        raise ValueError(f"need 0 <= eps_clip_low < 1 and eps_clip_high >= 0, got {eps_clip_low}, {eps_clip_high}")
    if old_logprobs.shape != logprobs.shape:
        raise ValueError(f"old_logprobs shape {tuple(old_logprobs.shape)} != logprobs {tuple(logprobs.shape)}")
    advantages = _per_token(advantages.detach(), logprobs)  # (B, T) or (B, 1)
    log_ratio = (logprobs - old_logprobs.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)  # (B, T)
    loss, low, high = LOSS_TYPES[loss_type](ratio, advantages, eps_clip_low, eps_clip_high)
    stats = {
        "ratio": ratio.detach(),
        "clip_frac": (low | high).to(ratio.dtype),
        "clip_frac_low": low.to(ratio.dtype),
        "clip_frac_high": high.to(ratio.dtype),
    }
    if tis_cap is not None:
        if rollout_logprobs is None:
            raise ValueError("tis_cap is set but rollout_logprobs is None")
        if tis_cap <= 0:
            raise ValueError(f"tis_cap must be > 0, got {tis_cap}")
        # pi_old / mu corrects for the rollout engine sampling from a slightly different policy.
        tis_log = (old_logprobs - rollout_logprobs).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        weight = torch.exp(tis_log).clamp(max=tis_cap)  # (B, T)
        loss = loss * weight
        stats["tis_weight"] = weight
    return loss, stats


def ppo(ratio, advantages, eps_clip_low, eps_clip_high):
    """-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A) -> (loss, clipped below, clipped above), each (B, T)."""
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_clip_low, 1.0 + eps_clip_high) * advantages
    low = (ratio < 1.0 - eps_clip_low) & (advantages < 0)
    high = (ratio > 1.0 + eps_clip_high) & (advantages > 0)
    return -torch.min(unclipped, clipped), low, high


def importance_sampling(ratio, advantages, eps_clip_low, eps_clip_high):
    """-rho A, never clipped -> (loss, clipped below, clipped above), each (B, T)."""
    never = torch.zeros_like(ratio, dtype=torch.bool)
    return -(ratio * advantages), never, never


#: ``policy_loss_type`` -> the per-token loss of the ratio and the advantages.
LOSS_TYPES = {"ppo": ppo, "importance_sampling": importance_sampling}
names.POLICY_LOSS_TYPES.check(LOSS_TYPES, registry_name="trainer.losses.LOSS_TYPES")


def kl_penalty(logprobs, ref_logprobs, *, estimator="k3"):
    """Per-token KL(pi || pi_ref) estimate on sampled tokens -> (B, T).

    k3 (Schulman's low-variance estimator) clamps as SkyRL and verl do:
    d = clamp(ref - logp, -20, 20), then clamp(e^d - d - 1, -10, 10).
    """
    diff = logprobs - ref_logprobs.detach()  # (B, T)
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"estimator must be one of {tuple(KL_ESTIMATORS)}, got {estimator!r}")
    return KL_ESTIMATORS[estimator](diff)


def k1(diff):
    """The log-ratio itself: unbiased, high variance."""
    return diff


def k2(diff):
    """Half the squared log-ratio: biased, low variance."""
    return 0.5 * diff.square()


def k3(diff):
    """Schulman's pi_ref/pi - log(pi_ref/pi) - 1: unbiased, low variance, never negative."""
    d = (-diff).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)


#: ``kl_estimator_type`` -> the per-token KL estimate of the log-ratio log pi - log pi_ref.
KL_ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3}
names.KL_ESTIMATORS.check(KL_ESTIMATORS, registry_name="trainer.losses.KL_ESTIMATORS")


def _masked(x, mask):
    """x * mask with an exact 0 where mask is 0, even where x is NaN or inf.

    Multiplying alone would carry a non-finite value at a masked position
    into the sum (0 * NaN = NaN); ``where`` also routes no gradient there.
    """
    return torch.where(mask != 0, x * mask, 0.0)


def masked_mean(x, mask, dim=None):
    """Mean of x over positions where mask is 1; 0 where nothing is selected."""
    mask = mask.to(x.dtype)
    if dim is None:
        return _masked(x, mask).sum() / mask.sum().clamp(min=1.0)
    return _masked(x, mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def aggregate(per_token, mask, reduction, *, num_sequences=None, num_tokens=None, max_len=None):
    """Reduce a (B, T) per-token loss to a scalar.

    token_mean:              sum(L m) / num_tokens          (default: mask.sum())
    seq_mean_token_mean:     sum_i mean_t(L_i) / num_sequences   (default: B)
    seq_mean_token_sum_norm: sum(L m) / (num_sequences * max_len) (default: B, T)

    For gradient accumulation pass the whole mini-batch's num_tokens,
    num_sequences and max_len to every micro-batch call: each reduction is then
    a sum of per-token or per-sequence terms over fixed denominators, so the
    micro-batch losses sum to the loss of the mini-batch computed at once.
    The defaults normalise by this call's own batch (a per-micro-batch mean).
    A row with no response tokens adds 0 but still counts as a sequence.
    """
    if per_token.shape != mask.shape or per_token.dim() != 2:
        raise ValueError(f"per_token {tuple(per_token.shape)} and mask {tuple(mask.shape)} must both be (B, T)")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {tuple(REDUCTIONS)}, got {reduction!r}")
    sequences = per_token.shape[0] if num_sequences is None else num_sequences
    return REDUCTIONS[reduction](per_token, mask.to(per_token.dtype), sequences=sequences, num_tokens=num_tokens,
                                 max_len=max_len)


def token_mean(per_token, mask, *, sequences, num_tokens, max_len):
    """sum(L m) / num_tokens (default: mask.sum())."""
    tokens = mask.sum().clamp(min=1.0) if num_tokens is None else max(num_tokens, 1)
    return _masked(per_token, mask).sum() / tokens


def seq_mean_token_mean(per_token, mask, *, sequences, num_tokens, max_len):
    """sum_i mean_t(L_i) / sequences."""
    per_sequence = masked_mean(per_token, mask, dim=-1)  # (B,)
    return per_sequence.sum() / max(sequences, 1)


def seq_mean_token_sum_norm(per_token, mask, *, sequences, num_tokens, max_len):
    """sum(L m) / (sequences * max_len) (default max_len: the padded T)."""
    length = per_token.shape[1] if max_len is None else max_len
    return _masked(per_token, mask).sum() / (max(sequences, 1) * max(length, 1))


#: ``loss_reduction`` -> (B, T) per-token loss and mask to a scalar (see :func:`aggregate`).
REDUCTIONS = {"token_mean": token_mean, "seq_mean_token_mean": seq_mean_token_mean,
              "seq_mean_token_sum_norm": seq_mean_token_sum_norm}
names.LOSS_REDUCTIONS.check(REDUCTIONS, registry_name="trainer.losses.REDUCTIONS")


def pass_at_k(n, c, k):
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def distillation_advantages(student_logprobs, teacher_logprobs, *, coef=1.0):
    """Per-token advantage (B, T) = -coef (log pi_student - log pi_teacher) on sampled tokens.

    A single-sample reverse-KL estimate: tokens the teacher finds likelier than
    the student are pushed up. Detached, since it plays the role of a reward.
    """
    if student_logprobs.shape != teacher_logprobs.shape:
        raise ValueError(
            f"student {tuple(student_logprobs.shape)} and teacher {tuple(teacher_logprobs.shape)} shapes differ"
        )
    return (-coef * (student_logprobs - teacher_logprobs)).detach()
