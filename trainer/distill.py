"""On-policy distillation (OPD): the student samples, a frozen teacher scores its tokens.

The per-token reward is minus a one-sample estimate of the reverse KL,
KL(student || teacher), at each response position t, both distributions taken at
the sampling temperature (log-softmax of logits / temperature):

* ``teacher_top_k = 0`` -- sampled-token reverse KL (k1, as SkyRL's and Tinker's OPD)::

      kl_t = log q(y_t) - log p(y_t)

  with q the student, p the teacher, y_t the student's sampled token. Its
  expectation under q is the exact KL(q || p) at that position.

* ``teacher_top_k = K`` -- the seed's top-k OPD, where the teacher serves only its
  top-K log-probs (vLLM ``prompt_logprobs=K``). The vocabulary is folded into K + 1
  categories: the teacher's top-K ids T_t and one tail bucket holding every other
  token. With q~ and p~ the two distributions over those categories
  (q~(tail) = 1 - sum_{i in T} q_i, likewise p~) and c(y) = y if y in T else tail::

      kl_t = log q~(c(y_t)) - log p~(c(y_t))

  a one-sample estimate of KL(q~ || p~), the exact reverse KL between the two
  (K+1)-category distributions: never negative in expectation and a lower bound
  of the full KL (folding categories cannot increase a divergence).

Why this top-k form and not the truncated sum sum_{i in T} q_i log(q_i / p_i):
verl's OPD (PR #5041) found top-k reverse KL of that truncated kind unstable, because
the student can shrink it by moving its mass off the top-k ids; here that mass
lands in the tail bucket and is charged there (the tail construction of verl
PR #7855, in the reverse direction). And why a sampled-token estimate rather than
the full sum over categories: the reward of token y_t then depends on y_t, so the
policy gradient (``advantage_estimator=no_op``, ``policy_loss_type=
importance_sampling``) carries it; a per-position quantity that does not depend on
the sampled token has zero expected policy gradient at that token.

The teacher is loaded once, frozen, in the compute dtype (bf16 on CUDA), scores in
its own micro-batches (``teacher_micro_batch_size``) and is never written to the
run's checkpoint directory: its files cannot make a run look resumable.
"""

from __future__ import annotations

import math

import attrs
import torch

from trainer.batch import Batch
from trainer.config import ConfigError
from trainer.forward import autocast_dtype, response_hidden, response_logits, split_head

TEACHER_SEED_OFFSET = 7_919  # the seed a built-in random teacher is initialised from, past the run's
TAIL_FLOOR = 1e-6  # the least mass a tail bucket is given (its log stays finite)


@torch.no_grad()
def position_logprobs(model, batch: Batch, temperature: float, *, micro_batch_size: int, precision,
                      top_k: int = 0, at_ids: torch.Tensor | None = None, chunk_tokens: int = 1024) -> dict:
    """Log-probs under ``model`` at each response position, without gradients.

    Returns ``sampled`` (B, R): the sampled token's; with ``top_k``, ``top_ids`` and
    ``top_logprobs`` (B, R, K): the model's own top-K; with ``at_ids`` (B, R, K), ``at``
    (B, R, K): the log-probs of those ids. Off the response mask every value is 0.
    Full-vocabulary logits exist for ``chunk_tokens`` positions at a time only.
    """
    was_training = model.training
    model.eval()
    size, width = batch.size, batch.response_ids.shape[1]
    device = batch.response_ids.device
    out = {"sampled": torch.zeros(size, width, device=device)}
    if top_k:
        out["top_ids"] = torch.zeros(size, width, top_k, dtype=torch.long, device=device)
        out["top_logprobs"] = torch.zeros(size, width, top_k, device=device)
    if at_ids is not None:
        out["at"] = torch.zeros(at_ids.shape, device=device)
    with precision.autocast():
        for start in range(0, size, micro_batch_size):
            rows = slice(start, start + micro_batch_size)
            micro = batch.rows(rows)
            keep = micro.response_mask.bool()
            response = micro.response_ids.shape[1]
            logits_of = _position_logits(model, micro, keep, temperature)  # chunk -> (C, V) fp32
            targets = micro.response_ids[keep]
            count = int(keep.sum())
            sampled = torch.empty(count, device=device)
            top_ids = torch.empty(count, top_k, dtype=torch.long, device=device) if top_k else None
            top_lp = torch.empty(count, top_k, device=device) if top_k else None
            ids = at_ids[rows][:, :response][keep] if at_ids is not None else None
            at = torch.empty(ids.shape, device=device) if ids is not None else None
            for lo in range(0, count, chunk_tokens):
                hi = min(lo + chunk_tokens, count)
                logits = logits_of(lo, hi)
                lse = torch.logsumexp(logits, dim=-1, keepdim=True)
                sampled[lo:hi] = (logits.gather(-1, targets[lo:hi, None]) - lse)[:, 0]
                if top_k:
                    values, indices = logits.topk(top_k, dim=-1)
                    top_ids[lo:hi], top_lp[lo:hi] = indices, values - lse
                if ids is not None:
                    at[lo:hi] = logits.gather(-1, ids[lo:hi]) - lse
                del logits
            target_rows = out["sampled"][rows][:, :response]
            target_rows[keep] = sampled
            if top_k:
                out["top_ids"][rows][:, :response][keep] = top_ids
                out["top_logprobs"][rows][:, :response][keep] = top_lp
            if ids is not None:
                out["at"][rows][:, :response][keep] = at
    model.train(was_training)
    return out


def _position_logits(model, batch: Batch, keep: torch.Tensor, temperature: float):
    """A function (lo, hi) -> fp32 logits / temperature of kept positions lo..hi."""
    parts = split_head(model)
    if parts is None:
        logits = response_logits(model, batch, temperature)[keep].float()
        return lambda lo, hi: logits[lo:hi]
    body, head = parts
    predicting = response_hidden(body, batch)  # (N, H)
    dtype = autocast_dtype(predicting) or predicting.dtype
    weight = head.weight.to(dtype)

    def logits_of(lo: int, hi: int) -> torch.Tensor:
        logits = (predicting[lo:hi].to(dtype) @ weight.T).float()
        return logits / temperature if temperature != 1.0 else logits

    return logits_of


def sampled_kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """k1: log q(y) - log p(y), elementwise over (B, R) sampled-token log-probs."""
    return student - teacher


def top_k_tail_kl(student_sampled, teacher_sampled, sampled_ids, top_ids, student_at_top, teacher_top):
    """The (K+1)-category one-sample reverse KL (see the module docstring), (B, R).

    ``student_sampled`` / ``teacher_sampled`` (B, R): each model's log-prob of the sampled
    token; ``top_ids`` (B, R, K): the teacher's top-K ids; ``student_at_top`` /
    ``teacher_top`` (B, R, K): each model's log-probs of those ids.
    """
    in_top = (top_ids == sampled_ids[..., None]).any(dim=-1)  # (B, R)
    student_tail = _log_tail(student_at_top)
    teacher_tail = _log_tail(teacher_top)
    student_category = torch.where(in_top, student_sampled, student_tail)
    teacher_category = torch.where(in_top, teacher_sampled, teacher_tail)
    return student_category - teacher_category


def _log_tail(top_logprobs: torch.Tensor) -> torch.Tensor:
    """log(1 - sum_i exp(lp_i)) over the last dim, floored at TAIL_FLOOR."""
    mass = top_logprobs.double().exp().sum(dim=-1).clamp(max=1.0 - TAIL_FLOOR)
    return torch.log1p(-mass).to(top_logprobs.dtype)


class Teacher:
    """The frozen teacher of an OPD run: ``token_kl(batch, student)`` is the stage the step calls."""

    def __init__(self, cfg, *, student_tokenizer, device, precision):
        from trainer.models import load_model_and_tokenizer

        self.cfg = cfg
        self.precision = precision
        # A built-in random teacher gets its own seed: the student's would make it the student.
        teacher_cfg = attrs.evolve(cfg, model=cfg.teacher_model, seed=cfg.seed + TEACHER_SEED_OFFSET)
        self.model, tokenizer = load_model_and_tokenizer(teacher_cfg, device=device, dtype=precision.compute)
        self.model.eval().requires_grad_(False)
        if tokenizer.get_vocab() != student_tokenizer.get_vocab():
            raise ConfigError(
                f"teacher_model: the teacher {cfg.teacher_model!r} has a different tokenizer from the student "
                f"{cfg.model!r} ({len(tokenizer)} vs {len(student_tokenizer)} tokens); OPD scores the student's "
                f"own token ids, so both must share one vocabulary")

    def token_kl(self, batch: Batch, student) -> tuple[torch.Tensor, dict]:
        """(B, R) per-token KL estimates (0 off the mask) and the step's teacher metrics."""
        cfg = self.cfg
        # a top-k as wide as the vocabulary is the whole distribution (the tail is empty)
        top_k = min(cfg.teacher_top_k, self.model.get_output_embeddings().weight.shape[0])
        teacher = position_logprobs(self.model, batch, cfg.temperature, top_k=top_k,
                                    micro_batch_size=cfg.teacher_micro_batch_size, precision=self.precision)
        if top_k:
            mine = position_logprobs(student, batch, cfg.temperature, at_ids=teacher["top_ids"],
                                     micro_batch_size=cfg.micro_forward_batch_size_per_gpu,
                                     precision=self.precision)
            kl = top_k_tail_kl(mine["sampled"], teacher["sampled"], batch.response_ids, teacher["top_ids"],
                               mine["at"], teacher["top_logprobs"])
        else:
            student_logprobs = batch.engine_logprobs
            if student_logprobs is None:
                student_logprobs = position_logprobs(student, batch, cfg.temperature,
                                                     micro_batch_size=cfg.micro_forward_batch_size_per_gpu,
                                                     precision=self.precision)["sampled"]
            kl = sampled_kl(student_logprobs, teacher["sampled"])
        mask = batch.response_mask
        tokens = mask.sum().clamp(min=1)
        kl = kl * mask
        metrics = {
            "distill/token_kl_mean": float(kl.sum() / tokens),
            "teacher/chosen_logprob_mean": float((teacher["sampled"] * mask).sum() / tokens),
        }
        if not math.isfinite(metrics["distill/token_kl_mean"]):
            raise FloatingPointError("distill: the per-token KL is not finite")
        return kl, metrics
