"""The GRPO training loop, top to bottom.

The variant
-----------
Outcome-reward GRPO with PPO-style clipped updates, as SkyRL's ``main_base``
runs it for GSM8K:

* each step samples ``train_batch_size`` prompts and ``n_samples_per_prompt``
  completions of each from the current policy (a group), scores each
  completion with the task's reward, and gives every token of a completion
  its group advantage A_i = (r_i - mean r) / (std r + 1e-6)
  (``grpo_norm_by_std=False``: Dr.GRPO's r_i - mean r; ``advantage_estimator
  = "no_op"`` passes the reward through as the advantage, the hook for
  distillation rewards);
* log-probs of the sampled tokens under the policy before any update (pi_old)
  and, with ``use_kl_loss``, under a frozen copy of the initial policy
  (pi_ref), are computed once per step without gradients;
* the step's samples are split into ``train_batch_size / policy_mini_batch_size``
  mini-batches (whole groups, one optimizer step each), each processed in
  micro-batches with gradient accumulation; every micro-batch loss is
  normalised by its whole mini-batch's totals, so the accumulated gradient is
  the mini-batch loss's gradient;
* loss per token: -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A), rho =
  pi/pi_old, times the TIS weight min(pi_old/mu, C) with ``use_tis``; plus
  ``kl_loss_coef`` * KL(pi || pi_ref) (k1/k2/k3) with ``use_kl_loss``; minus
  ``entropy_loss_coef`` * entropy with ``use_entropy_loss``; reduced by
  ``loss_reduction``; then grad-norm clip and AdamW with linear warm-up (the
  learning rate is constant after warm-up). An update whose gradient norm is
  not finite is skipped and counted (``policy/skipped_updates``).
* in the training forward, left-pad positions attend to themselves (see
  ``padded_attention``): a query row that sees no key gets NaN gradients from
  cuDNN attention even where its output is unused.

How it differs from the papers and SkyRL
----------------------------------------
* Log-probs and entropies are those of the sampling distribution: logits are
  divided by the rollout ``temperature`` before the softmax (as SkyRL and verl
  do); ``top_p`` truncation is not reflected in them.
* The first mini-batch of a step is exactly on-policy (rho = 1); later ones are
  off-policy by the earlier updates of the same step, which is what the clip
  is for.
* With the HF engine the rollout policy *is* the trained model, so the
  engine's log-probs mu equal pi_old up to batch-shape numerics; the engine
  does not report them and TIS uses pi_old as mu (weight 1). With vLLM, mu
  comes from the engine.
* One device: the policy is not sharded (no FSDP); multi-GPU knobs are
  reported as inert at start.
* ``policy/kl`` is the k3 estimate of KL(pi || pi_old) over the updates of
  the step (how far the step moved the policy); ``policy/ref_kl`` is the KL
  to the reference when ``use_kl_loss``.

Determinism: the prompt order comes from the resumable sampler; every
generation is seeded from (``seed``, step), and the RNG states are
checkpointed, so on CPU a resumed run repeats the uninterrupted one exactly.
"""

from __future__ import annotations

import copy
import gc
import hashlib
import json
import math
import random
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Optional

import attrs
import torch

from trainer import checkpoint
from trainer.config import ConfigError, TrainerConfig
from trainer.data import PromptSampler
from trainer.losses import (
    aggregate, entropy_from_logits, group_advantages, kl_penalty, masked_mean, pass_at_k,
    policy_loss, token_logprobs,
)
from trainer.metrics import MetricsLogger, ProgressBar, peak_memory_gb
from trainer.models import load_model_and_tokenizer
from trainer.rollout import make_engine
from trainer.stopping import StopRequest, Stopped
from trainer.tasks import load_task

EVAL_SEED_OFFSET = 1_000_003  # keeps eval samples apart from the training step's samples


def train(cfg: TrainerConfig, *, ckpt_dir, metrics_path, stdout=None, stderr=None) -> dict:
    """Run (or resume) one training run; returns the last train metrics."""
    stderr = stderr or sys.stderr
    ckpt_dir = Path(ckpt_dir)
    start_from = checkpoint.plan_start(ckpt_dir, cfg.resume_mode)  # refuses before anything loads
    for stale in checkpoint.remove_stale_writes(ckpt_dir):
        print(f"sweep-train: removed {stale.name}, left by an interrupted checkpoint write", file=stderr)
    if cfg.resume_mode == "latest" and start_from is None:
        print(f"sweep-train: resume_mode=latest but {ckpt_dir} holds no checkpoint; starting fresh",
              file=stderr)

    # -- setup: seeds, model, data, optimizer, engine --------------------------------------
    device = resolve_device(cfg)
    inert = inert_knobs(cfg, device)
    if inert:
        shown = ", ".join(f"{key}={entry['value']!r}" for key, entry in inert.items())
        print(f"sweep-train: no effect in this run (backend={cfg.backend}, device={device.type}): {shown}",
              file=stderr)
    dtype = torch.bfloat16 if cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda") \
        else torch.float32
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_model_and_tokenizer(cfg, device=device, dtype=dtype)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    task = load_task(cfg, tokenizer)
    sampler = PromptSampler(task.train, cfg.train_batch_size, seed=cfg.seed)
    total_steps = cfg.epochs * sampler.steps_per_epoch
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    reference = copy.deepcopy(model).eval().requires_grad_(False) if cfg.use_kl_loss else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.adam_betas,
                                  weight_decay=cfg.weight_decay, foreach=True)
    warmup = cfg.num_warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda update: min(1.0, (update + 1) / warmup) if warmup else 1.0)

    step = 0
    if start_from is not None:
        resumed = checkpoint.load(start_from, model=model, optimizer=optimizer, scheduler=scheduler,
                                  device=device)
        sampler.load_state_dict(resumed.sampler_state)
        step = resumed.step
        print(f"sweep-train: resuming from {start_from} (step {step})", file=stderr)
    if reference is not None:
        # A fresh run's reference is its own initial policy, never one left in the directory
        # by an earlier run that died before its first checkpoint.
        if start_from is None or not checkpoint.load_reference(ckpt_dir, reference, device):
            checkpoint.save_reference(ckpt_dir, reference)
    engine = make_engine(cfg, model=model, tokenizer=tokenizer, device=device)
    pad_id = tokenizer.pad_token_id

    def encode(prompt: str) -> list[int]:
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return ids[-cfg.max_prompt_length :]  # left-truncate: the question's end holds the ask

    logger = MetricsLogger(metrics_path, stdout=stdout, resume_step=step)
    info = run_info(cfg, device=device, dtype=dtype, total_steps=total_steps,
                    resumed_from=str(start_from) if start_from else None, inert=inert)
    logger.log("info", step, info)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    checkpoint.write_atomic(ckpt_dir / "run_info.json", json.dumps(info, indent=1) + "\n")

    def run_eval(at_step: int) -> None:
        metrics = evaluate(engine, task, encode, tokenizer, cfg, seed=cfg.seed + EVAL_SEED_OFFSET + at_step)
        logger.log("eval", at_step, metrics)

    if step == 0 and cfg.eval_before_train:
        run_eval(0)
    progress = progress_bar(cfg, stdout or sys.stdout, total=total_steps, done=step)
    last = {}

    saved_step = step if start_from is not None else None  # the step the latest checkpoint holds

    def save(at_step: int) -> None:
        nonlocal saved_step
        checkpoint.save(ckpt_dir, at_step, model=model, optimizer=optimizer, scheduler=scheduler,
                        sampler_state=sampler.state_dict(), config=attrs.asdict(cfg))
        saved_step = at_step

    def stop_now(signum: int) -> None:
        # Whenever the signal came (during a step, its eval or its checkpoint), the last
        # finished step is checkpointed before the run ends.
        if step > 0 and saved_step != step:
            save(step)
        raise Stopped(signum, step, checkpointed=saved_step is not None)

    with ExitStack() as closing:  # the logger and progress bar close however the loop ends
        closing.callback(logger.close)
        if progress is not None:
            closing.callback(progress.close)
        stop = closing.enter_context(StopRequest(stderr))
        while step < total_steps:
            if stop.signum is not None:
                stop_now(stop.signum)
            step += 1
            times = {}
            step_started = time.perf_counter()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)

            # -- 1. prompts and rollouts ------------------------------------------------------
            examples = sampler.next_batch()
            prompts = [encode(e.prompt) for e in examples]
            n = cfg.n_samples_per_prompt
            with timed(times, "timing/generate"):
                completions = engine.generate(prompts, n=n, max_new_tokens=cfg.max_generate_length,
                                              temperature=cfg.temperature, top_p=cfg.top_p,
                                              seed=cfg.seed * 1_000_000 + step)
            with timed(times, "timing/sync_weights"):  # the engine's sleep and wake count as weight sync
                engine.sleep()
            texts = tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
            samples_examples = [e for e in examples for _ in range(n)]  # group-contiguous, as generated
            rewards = torch.tensor([task.reward(t, e) for t, e in zip(texts, samples_examples)])  # (B,)
            batch = Rollout.build([p for p in prompts for _ in range(n)], completions, pad_id, device)

            # -- 2. advantages, old / reference log-probs -------------------------------------
            if cfg.advantage_estimator == "grpo":
                advantages = group_advantages(rewards, n, norm_by_std=cfg.grpo_norm_by_std)  # (B,)
            else:
                advantages = rewards.clone()
            batch.advantages = advantages.to(device)
            with timed(times, "timing/ref"):
                batch.old_logprobs, entropy = score(model, batch, cfg, with_entropy=True)  # (B, R) each
                if reference is not None:
                    batch.ref_logprobs, _ = score(reference, batch, cfg)
            batch.rollout_logprobs = batch.engine_logprobs if engine.reports_logprobs else batch.old_logprobs

            # -- 3. policy updates: mini-batches of whole groups, micro-batches accumulate ---
            with timed(times, "timing/policy_train"):
                update_stats = update_policy(model, optimizer, scheduler, batch, cfg, stderr=stderr)

            # -- 4. push the new weights to the rollout engine ------------------------------------
            with timed(times, "timing/sync_weights"):
                engine.wake()
                engine.sync_weights(model)

            # -- 5. metrics, eval, checkpoint ----------------------------------------------------
            times["timing/step"] = time.perf_counter() - step_started
            lengths = batch.response_mask.sum(dim=1).float()  # (B,)
            tokens = int(lengths.sum().item())
            last = {
                **times,
                "throughput/tokens_generated": tokens,
                "throughput/tokens_per_s": tokens / times["timing/step"],
                "reward/mean": rewards.mean().item(),
                "reward/std": rewards.std().item() if rewards.numel() > 1 else 0.0,
                "policy/entropy": masked_mean(entropy, batch.response_mask).item(),
                **update_stats,
                "response_length/mean": lengths.mean().item(),
                "response_length/max": int(lengths.max().item()),
                "response/stop_frac": sum(c.finish_reason == "stop" for c in completions) / len(completions),
                "memory/peak_gb": peak_memory_gb(device),
                "data/epoch": sampler.epoch,
                "data/prompt_fingerprint": fingerprint(prompts),
            }
            logger.log("train", step, last)
            del batch, entropy
            free_memory(device)
            if stop.signum is None and ((cfg.eval_interval and step % cfg.eval_interval == 0) or step == total_steps):
                run_eval(step)
            if (cfg.ckpt_interval and step % cfg.ckpt_interval == 0) or step == total_steps:
                save(step)
            if progress is not None:
                progress.update(step, last)
            if stop.signum is not None:
                stop_now(stop.signum)
    if cfg.export_final:
        checkpoint.export(ckpt_dir, model, tokenizer)
    return last


@attrs.define
class Rollout:
    """One step's samples as padded tensors, rows group-contiguous.

    Prompts are left-padded and responses right-padded, so every row's
    response starts at the same column and ``logits_to_keep`` can skip the
    prompt positions' logits.
    """

    prompt_ids: torch.Tensor  # (B, P) long
    prompt_mask: torch.Tensor  # (B, P)
    response_ids: torch.Tensor  # (B, R) long
    response_mask: torch.Tensor  # (B, R) float, 1 on sampled tokens
    engine_logprobs: Optional[torch.Tensor] = None  # (B, R), from engines that report them
    advantages: Optional[torch.Tensor] = None  # (B,) or (B, R)
    old_logprobs: Optional[torch.Tensor] = None  # (B, R)
    ref_logprobs: Optional[torch.Tensor] = None
    rollout_logprobs: Optional[torch.Tensor] = None

    @classmethod
    def build(cls, prompts, completions, pad_id, device) -> "Rollout":
        from trainer.rollout.hf import left_pad  # the same padding the HF engine decodes with

        prompt_ids, prompt_mask = left_pad(prompts, pad_id, device)
        longest = max(1, max(len(c.token_ids) for c in completions))
        response_ids = torch.full((len(completions), longest), pad_id, dtype=torch.long)
        response_mask = torch.zeros((len(completions), longest))
        engine_logprobs = torch.zeros((len(completions), longest)) if completions[0].logprobs else None
        for i, c in enumerate(completions):
            response_ids[i, : len(c.token_ids)] = torch.tensor(c.token_ids, dtype=torch.long)
            response_mask[i, : len(c.token_ids)] = 1.0
            if engine_logprobs is not None:
                engine_logprobs[i, : len(c.token_ids)] = torch.tensor(c.logprobs)
        return cls(prompt_ids, prompt_mask, response_ids.to(device), response_mask.to(device),
                   engine_logprobs.to(device) if engine_logprobs is not None else None)

    def rows(self, index: slice) -> "Rollout":
        """A slice of rows, trimmed to its own longest prompt and response."""
        prompt_mask = self.prompt_mask[index]
        response_mask = self.response_mask[index]
        prompt_from = int((prompt_mask.sum(dim=0) == 0).sum().item())  # all-padding left columns
        response_to = max(1, int(response_mask.sum(dim=1).max().item()))

        def cut(t):
            if t is None:
                return None
            t = t[index]
            return t[:, :response_to] if t.dim() == 2 else t

        return Rollout(
            self.prompt_ids[index][:, prompt_from:], prompt_mask[:, prompt_from:],
            cut(self.response_ids), cut(self.response_mask), cut(self.engine_logprobs),
            cut(self.advantages), cut(self.old_logprobs), cut(self.ref_logprobs), cut(self.rollout_logprobs),
        )


def response_logits(model, batch: Rollout, temperature: float) -> torch.Tensor:
    """Logits that predict each response token: (b, R, V), of the sampling distribution."""
    input_ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)  # (b, P+R)
    attention = torch.cat([batch.prompt_mask, batch.response_mask.long()], dim=1)
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)  # left padding shifts positions
    response_len = batch.response_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=padded_attention(model, attention),
                   position_ids=positions, logits_to_keep=response_len + 1, use_cache=False).logits[:, :-1]
    return logits / temperature if temperature != 1.0 else logits  # (b, R, V)


def padded_attention(model, attention: torch.Tensor) -> torch.Tensor:
    """The attention mask for a left-padded (b, L) batch in which no query row is empty.

    With the plain 2-D mask a left-pad position sees no key at all (every key
    before it is padding). Its output is never used and its upstream gradient
    is zero, but cuDNN's SDPA backward (torch's pick on an H200 in bf16) still
    returns NaN dQ for such rows, and 0 * NaN poisons q_proj and everything
    below it. Here every pad query attends to its own key, which no real
    token can see, so real tokens' outputs are unchanged.

    Only SDPA and eager attention take a dense 4-D mask; other kernels (the
    flash-attention family) unpad instead and get the 2-D mask, as do models
    with sliding-window layers, whose windows a hand-built mask would drop.
    """
    config = model.config
    implementation = getattr(config, "_attn_implementation", None)
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if (implementation not in ("sdpa", "eager") or layer_types != {"full_attention"}
            or getattr(config, "sliding_window", None) is not None):
        return attention
    valid = attention.bool()  # (b, L)
    length = valid.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=valid.device).tril()
    own_key = torch.eye(length, dtype=torch.bool, device=valid.device)
    allowed = (causal & valid[:, None, :]) | (own_key & ~valid[:, :, None])  # (b, L query, L key)
    if implementation == "sdpa":
        return allowed[:, None]  # (b, 1, L, L), True = attend
    return torch.zeros(allowed.shape, dtype=model.dtype, device=valid.device).masked_fill_(
        ~allowed, torch.finfo(model.dtype).min)[:, None]  # eager adds the mask to the scores


@torch.no_grad()
def score(model, batch: Rollout, cfg, *, with_entropy=False):
    """Log-probs (and entropies) of the sampled tokens, (B, R) each, in forward micro-batches."""
    was_training = model.training
    model.eval()
    logprobs = torch.zeros_like(batch.response_mask)
    entropy = torch.zeros_like(batch.response_mask) if with_entropy else None
    size = cfg.micro_forward_batch_size_per_gpu
    for start in range(0, batch.response_ids.shape[0], size):
        micro = batch.rows(slice(start, start + size))
        width = micro.response_ids.shape[1]
        logits = response_logits(model, micro, cfg.temperature)
        logprobs[start : start + size, :width] = token_logprobs(logits, micro.response_ids)
        if with_entropy:
            entropy[start : start + size, :width] = entropy_from_logits(logits)
        del logits
    model.train(was_training)
    return logprobs * batch.response_mask, entropy


def update_policy(model, optimizer, scheduler, batch: Rollout, cfg, *, stderr=None) -> dict:
    """One optimizer step per mini-batch; returns the step's policy metrics.

    A mini-batch whose gradient norm is not finite leaves the weights, the
    optimizer state and the schedule untouched; it is counted in
    ``policy/skipped_updates`` and reported on ``stderr``.
    """
    model.train()
    samples = batch.response_ids.shape[0]
    mini_size = cfg.policy_mini_batch_size * cfg.n_samples_per_prompt
    micro_size = cfg.micro_train_batch_size_per_gpu
    # Sums stay on the device until the end: a .item() per micro-batch would stall the GPU queue.
    sums = {"loss": 0.0, "grad_norm": 0.0, "clip_frac": 0.0, "kl": 0.0, "ref_kl": 0.0, "tis_weight": 0.0}
    tokens_seen = 0.0
    mini_batches = skipped = 0
    for mini_start in range(0, samples, mini_size):
        mini = batch.rows(slice(mini_start, mini_start + mini_size))
        totals = dict(num_sequences=mini.response_ids.shape[0], num_tokens=float(mini.response_mask.sum()),
                      max_len=cfg.max_generate_length)
        mini_loss = 0.0
        for micro_start in range(0, mini.response_ids.shape[0], micro_size):
            micro = mini.rows(slice(micro_start, micro_start + micro_size))
            mask = micro.response_mask  # (b, R)
            logits = response_logits(model, micro, cfg.temperature)  # (b, R, V)
            logprobs = token_logprobs(logits, micro.response_ids)  # (b, R)
            per_token, stats = policy_loss(
                logprobs, micro.old_logprobs, micro.advantages,
                eps_clip_low=cfg.eps_clip_low, eps_clip_high=cfg.eps_clip_high, loss_type=cfg.policy_loss_type,
                rollout_logprobs=micro.rollout_logprobs if cfg.use_tis else None,
                tis_cap=cfg.tis_imp_ratio_cap if cfg.use_tis else None)
            loss = aggregate(per_token, mask, cfg.loss_reduction, **totals)
            if cfg.use_kl_loss:
                ref_kl = kl_penalty(logprobs, micro.ref_logprobs, estimator=cfg.kl_estimator_type)  # (b, R)
                loss = loss + cfg.kl_loss_coef * aggregate(ref_kl, mask, cfg.loss_reduction, **totals)
                sums["ref_kl"] += (ref_kl.detach() * mask).sum()
            if cfg.use_entropy_loss:
                entropy = entropy_from_logits(logits)  # (b, R), with grad
                loss = loss - cfg.entropy_loss_coef * aggregate(entropy, mask, cfg.loss_reduction, **totals)
            loss.backward()
            mini_loss += loss.detach()
            drift = kl_penalty(logprobs.detach(), micro.old_logprobs, estimator="k3")
            tokens_seen += mask.sum()
            sums["kl"] += (drift * mask).sum()
            sums["clip_frac"] += (stats["clip_frac"] * mask).sum()
            if "tis_weight" in stats:
                sums["tis_weight"] += (stats["tis_weight"] * mask).sum()
            del logits, logprobs, per_token, loss
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        lr = optimizer.param_groups[0]["lr"]  # the rate this update uses (the scheduler then moves on)
        # One sync per optimizer step: a non-finite gradient would turn every weight to NaN
        # (AdamW's moments keep it forever), so that update is dropped and counted instead.
        if torch.isfinite(grad_norm):
            optimizer.step()
            scheduler.step()
            sums["grad_norm"] += grad_norm.detach()
        else:
            skipped += 1
            print(f"sweep-train: skipped the update of mini-batch {mini_batches + 1}: the gradient norm is "
                  f"{float(grad_norm)}", file=stderr or sys.stderr)
        optimizer.zero_grad(set_to_none=True)
        sums["loss"] += mini_loss
        mini_batches += 1
    sums = {key: float(total) for key, total in sums.items()}  # one device sync for the whole step
    per_token = max(float(tokens_seen), 1.0)
    applied = mini_batches - skipped
    metrics = {
        "policy/loss": sums["loss"] / mini_batches,
        "policy/grad_norm": sums["grad_norm"] / applied if applied else math.nan,  # of the applied updates
        "policy/lr": lr,
        "policy/clip_frac": sums["clip_frac"] / per_token,
        "policy/kl": sums["kl"] / per_token,
        "policy/optimizer_steps": applied,
        "policy/skipped_updates": skipped,
    }
    if cfg.use_kl_loss:
        metrics["policy/ref_kl"] = sums["ref_kl"] / per_token
    if cfg.use_tis:
        metrics["policy/tis_weight"] = sums["tis_weight"] / per_token
    return metrics


def evaluate(engine, task, encode, tokenizer, cfg, *, seed: int) -> dict:
    """pass@1 and pass@k (unbiased, k = n = eval_n_samples_per_prompt) on the held-out split."""
    k = cfg.eval_n_samples_per_prompt
    examples = list(task.eval)
    completions = engine.generate([encode(e.prompt) for e in examples], n=k,
                                  max_new_tokens=cfg.max_generate_length,
                                  temperature=cfg.eval_temperature, top_p=1.0, seed=seed)
    texts = tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
    correct = [task.is_correct(t, e) for t, e in zip(texts, (e for e in examples for _ in range(k)))]
    rewards = [task.reward(t, e) for t, e in zip(texts, (e for e in examples for _ in range(k)))]
    per_prompt = [sum(correct[i * k : (i + 1) * k]) for i in range(len(examples))]
    return {
        "eval/pass_at_1": sum(pass_at_k(k, c, 1) for c in per_prompt) / len(examples),
        "eval/pass_at_k": sum(pass_at_k(k, c, k) for c in per_prompt) / len(examples),
        "eval/k": k,
        "eval/reward_mean": sum(rewards) / len(rewards),
        "eval/prompts": len(examples),
    }


def run_info(cfg, *, device, dtype, total_steps, resumed_from, inert) -> dict:
    return {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "backend": cfg.backend,
        "total_steps": total_steps,
        "resumed_from": resumed_from,
        "inert_knobs": inert,
        "config": attrs.asdict(cfg),  # TrainerConfig.to_dict passes an argument attrs 26 lacks
    }


def inert_knobs(cfg, device: torch.device) -> dict:
    """Every knob that has no effect in this run, with its value, default and why.

    All of them are listed, changed or not (``changed`` marks those set away
    from the default), so a grid axis over an inert knob shows up at once.
    """
    reasons = {}
    if cfg.backend == "hf":
        for key in ("gpu_memory_utilization", "enforce_eager", "num_inference_engines", "inference_tp",
                    "colocate_all"):
            reasons[key] = "the HF engine generates with the policy model itself"
    else:
        for key in ("num_inference_engines", "colocate_all"):
            reasons[key] = "this trainer runs one vLLM engine, colocated with the policy"
    reasons["reshard_after_forward"] = "the policy trains on one device, unsharded"
    if device.type == "cpu" and cfg.num_gpus != 0:
        reasons["num_gpus"] = "training on the CPU"
    elif cfg.num_gpus != 1:
        reasons["num_gpus"] = "the policy trains on one device"
    if not cfg.use_kl_loss:
        reasons |= dict.fromkeys(("kl_loss_coef", "kl_estimator_type"), "use_kl_loss is false")
    if not cfg.use_entropy_loss:
        reasons["entropy_loss_coef"] = "use_entropy_loss is false"
    if cfg.backend == "hf":
        # pi_old and the sampling distribution are the same model's: every TIS weight is 1.
        reasons |= dict.fromkeys(("use_tis", "tis_imp_ratio_cap"),
                                 "the HF engine samples with the policy itself (rollout and trainer log-probs agree)")
    elif not cfg.use_tis:
        reasons["tis_imp_ratio_cap"] = "use_tis is false"
    if cfg.dataset == "synthetic":
        reasons |= dict.fromkeys(("train_split", "eval_split"), "the synthetic task makes its own splits")
    else:
        reasons["synthetic_size"] = f"dataset is {cfg.dataset!r}, not 'synthetic'"
    if cfg.advantage_estimator != "grpo":
        reasons["grpo_norm_by_std"] = f"advantage_estimator is {cfg.advantage_estimator!r}"
    if cfg.policy_loss_type != "ppo":
        reasons |= dict.fromkeys(("eps_clip_low", "eps_clip_high"), f"policy_loss_type is {cfg.policy_loss_type!r}")
    defaults = TrainerConfig()
    return {
        key: {"value": getattr(cfg, key), "default": getattr(defaults, key),
              "changed": getattr(cfg, key) != getattr(defaults, key), "reason": reason}
        for key, reason in reasons.items()
    }


def resolve_device(cfg) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' but torch sees no CUDA device (use 'auto' or 'cpu')")
    if cfg.device == "cuda" or (cfg.device == "auto" and cfg.num_gpus > 0 and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def fingerprint(prompts: list[list[int]]) -> str:
    """A short hash of the step's prompt batch: equal across runs iff the data order is."""
    return hashlib.sha1(json.dumps(prompts).encode()).hexdigest()[:16]


@contextmanager
def timed(times: dict, key: str):
    started = time.perf_counter()
    try:
        yield
    finally:
        times[key] = times.get(key, 0.0) + time.perf_counter() - started


def free_memory(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def progress_bar(cfg, stdout, *, total: int, done: int):
    """A rich progress bar when asked and stdout is a terminal; None otherwise."""
    if not (cfg.progress_bar and hasattr(stdout, "isatty") and stdout.isatty()):
        return None
    try:
        return ProgressBar(total=total, done=done)
    except ImportError:  # rich is optional on the GPU machines
        return None
