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
  distillation rewards; see ``trainer.advantages``);
* log-probs of the sampled tokens under the policy before any update (pi_old)
  are needed only when a step makes several updates (``train_batch_size /
  policy_mini_batch_size > 1``): then they come from one no-grad forward; a
  step of one update is exactly on-policy and uses the update forward's own
  log-probs, detached (rho = 1). With ``use_kl_loss`` the frozen initial
  policy (pi_ref) scores the samples once per step;
* the step's samples are split into mini-batches of whole groups (one
  optimizer step each), each processed in micro-batches with gradient
  accumulation (``trainer.update``);
* loss per token: -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A), times the TIS
  weight min(pi_old/mu, C) with ``use_tis`` (mu: the rollout engine's own
  log-probs); plus ``kl_loss_coef`` * KL(pi || pi_ref) (k1/k2/k3) with
  ``use_kl_loss``; minus ``entropy_loss_coef`` * entropy with
  ``use_entropy_loss``; reduced by ``loss_reduction``; then grad-norm clip and
  AdamW with linear warm-up (constant after). An update whose gradient norm is
  not finite is skipped and counted (``policy/skipped_updates``).

The step is five named stages over one :class:`trainer.batch.Batch`:
generate (the rollout engine) -> score (rewards; pi_old and pi_ref when needed)
-> advantages -> update -> sync (the engine reads the new weights).

Precision: fp32 master weights and optimizer state; bf16 compute under autocast
on CUDA (``trainer.precision`` says why). The rollout engine keeps its own bf16
copy, refreshed in place by the sync stage.

A timing run (``timing_target``) ends itself once its steady-state sec/step is known
that precisely (``trainer.timing``): that step is its last, evaluated and checkpointed.

How it differs from the papers and SkyRL
----------------------------------------
* Log-probs and entropies are those of the sampling distribution: logits are
  divided by the rollout ``temperature`` before the softmax (as SkyRL and verl
  do); ``top_p``/``top_k`` truncation is reflected in the engine's log-probs
  (mu) but not in the trainer's.
* Later mini-batches of a step are off-policy by the earlier updates of the
  same step, which is what the clip is for.
* Several GPUs of one node (``num_gpus``; ``num_cpu_ranks`` on the CPU) run
  as one process each (``trainer.parallel``): the policy sharded with FSDP2,
  every rank sampling its share of the step's groups with its own engine from
  its own gathered copy of the weights, the losses normalised so that the
  ranks' mean gradient is the one-device gradient (``trainer.update``);
  metrics are reduced over the ranks, and rank 0 writes them and the
  checkpoints. One process is exactly the one-device run.
* ``policy/kl`` is the k3 estimate of KL(pi || pi_old) over the updates of
  the step (how far the step moved the policy); ``policy/ref_kl`` is the KL
  to the reference when ``use_kl_loss``; ``policy/entropy`` is measured in the
  update's forward passes.

Determinism: the prompt order comes from the resumable sampler; every
generation is seeded from (``seed``, step, rank), and the RNG states are
checkpointed, so on CPU a resumed run repeats the uninterrupted one exactly.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import signal
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import attrs
import torch

from trainer import checkpoint, parallel
from trainer.advantages import advantages_for
from trainer.batch import Batch
from trainer.config import ConfigError, TrainerConfig
from trainer.data import PromptSampler
from trainer.distill import Teacher
from trainer.forward import PolicyScorer, compile_body
from trainer.losses import pass_at_k
from trainer.metrics import MetricsLogger, ProgressBar, SilentLogger, peak_memory_gb
from trainer.models import decode_texts, encode_prompts, load_model_and_tokenizer
from trainer.precision import MASTER_DTYPE, Precision
from trainer.rollout import SamplingParams, engine_class, make_engine
from trainer.stopping import StopRequest, Stopped
from trainer.tasks import load_task
from trainer.timing import TimingRule, Verdict
from trainer.update import update_policy

EVAL_SEED_OFFSET = 1_000_003  # keeps eval samples apart from the training step's samples


def train(cfg: TrainerConfig, *, ckpt_dir, metrics_path, stdout=None, stderr=None) -> dict:
    """Run (or resume) one training run, or this process's rank of one; returns the last train metrics."""
    with parallel.process_group(cfg) as group:
        return train_rank(cfg, group, ckpt_dir=ckpt_dir, metrics_path=metrics_path, stdout=stdout, stderr=stderr)


def train_rank(cfg: TrainerConfig, group: parallel.Group, *, ckpt_dir, metrics_path, stdout=None,
               stderr=None) -> dict:
    stderr = stderr or sys.stderr
    ckpt_dir = Path(ckpt_dir)
    start_from = checkpoint.plan_start(ckpt_dir, cfg.resume_mode)  # refuses before anything loads
    if start_from is not None:
        checkpoint.check_world_size(start_from, group.world)
    if group.is_main:
        for stale in checkpoint.remove_stale_writes(ckpt_dir):
            print(f"sweep-train: removed {stale.name}, left by an interrupted checkpoint write", file=stderr)
    if cfg.resume_mode == "latest" and start_from is None:
        print(f"sweep-train: resume_mode=latest but {ckpt_dir} holds no checkpoint; starting fresh",
              file=stderr)

    # -- setup: seeds, model, data, optimizer, engine --------------------------------------
    device = resolve_device(cfg)
    precision = Precision.for_run(cfg, device)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_model_and_tokenizer(cfg, device=device, dtype=MASTER_DTYPE)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    backend = resolve_backend(cfg, model)
    inert = inert_knobs(cfg, device, backend=backend, world=group.world)
    if inert:
        shown = ", ".join(f"{key}={entry['value']!r}" for key, entry in inert.items())
        print(f"sweep-train: no effect in this run (backend={backend}, device={device.type}): {shown}",
              file=stderr)
    task = load_task(cfg, tokenizer)
    sampler = PromptSampler(task.train, cfg.train_batch_size, seed=cfg.seed)
    total_steps = cfg.epochs * sampler.steps_per_epoch
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    ranks = f" x {group.world} processes" if group.distributed else ""
    print(f"sweep-train: {cfg.model} on {device}{ranks} ({str(precision.compute).removeprefix('torch.')} compute, "
          f"{backend} engine): {total_steps} steps of {cfg.train_batch_size} prompts x "
          f"{cfg.n_samples_per_prompt} samples, up to {cfg.max_generate_length} new tokens", file=stderr, flush=True)
    # The reference never trains: it is kept in the compute dtype.
    reference = copy.deepcopy(model).to(precision.compute).eval().requires_grad_(False) if cfg.use_kl_loss \
        else None
    teacher = Teacher(cfg, student_tokenizer=tokenizer, device=device, precision=precision) \
        if cfg.teacher_model is not None else None
    # What trains: the model itself, or (several ranks) a sharded copy; ``model`` stays the full
    # policy the engine samples from, the scorers read and checkpoints are written from.
    policy = parallel.shard(copy.deepcopy(model), cfg, group) if group.distributed else model
    if device.type == "cuda" and not group.distributed:
        policy.fused_logprobs = cfg.fused_logprobs  # read by trainer.forward.response_logprobs
        if cfg.compile_update:
            compile_body(policy)
    optimizer = precision.optimizer(policy.parameters(), cfg)
    warmup = cfg.num_warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda update: min(1.0, (update + 1) / warmup) if warmup else 1.0)

    full_optimizer = parallel.FullOptimizerState(policy, optimizer) if group.distributed else optimizer

    step = 0
    if start_from is not None:
        resumed = checkpoint.load(start_from, model=model, optimizer=full_optimizer, scheduler=scheduler,
                                  device=device, group=group)
        parallel.load_shards(model, policy)
        sampler.load_state_dict(resumed.sampler_state)
        step = resumed.step
        steps = group.gather_objects(step)
        if len(set(steps)) > 1:
            raise checkpoint.CheckpointError(f"the ranks resumed at different steps {steps}: {ckpt_dir} changed "
                                             f"while they loaded it")
        on_ranks = f" on all {group.world} ranks" if group.distributed else ""
        print(f"sweep-train: resuming from {start_from} (step {step}{on_ranks})", file=stderr)
    if reference is not None:
        # A fresh run's reference is its own initial policy, never one left in the directory
        # by an earlier run that died before its first checkpoint.
        if (start_from is None or not checkpoint.load_reference(ckpt_dir, reference, device)) and group.is_main:
            checkpoint.save_reference(ckpt_dir, reference)
    n = cfg.n_samples_per_prompt
    eval_prompts = min(len(task.eval), cfg.eval_limit or len(task.eval))
    eval_rows = -(-eval_prompts // group.world) * cfg.eval_n_samples_per_prompt  # this rank's share, rounded up
    engine = make_engine(cfg, model=model, tokenizer=tokenizer, device=device, backend=backend,
                         max_rows=max(cfg.train_batch_size // group.world * n, eval_rows))
    pad_id = tokenizer.pad_token_id
    on_policy = cfg.train_batch_size == cfg.policy_mini_batch_size  # one update per step
    old_policy = PolicyScorer(model, temperature=cfg.temperature, micro_batch_size=cfg.micro_forward_batch_size_per_gpu,
                              precision=precision)
    ref_policy = PolicyScorer(reference, temperature=cfg.temperature,
                              micro_batch_size=cfg.micro_forward_batch_size_per_gpu, precision=precision) \
        if reference is not None else None

    def encode(prompts: list[str]) -> list[list[int]]:
        return encode_prompts(tokenizer, prompts, cfg.max_prompt_length)

    logger = MetricsLogger(metrics_path, stdout=stdout, resume_step=step) if group.is_main else SilentLogger()
    info = run_info(cfg, device=device, precision=precision, backend=backend, total_steps=total_steps,
                    resumed_from=str(start_from) if start_from else None, inert=inert, world=group.world)
    logger.log("info", step, info)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    if group.is_main:
        checkpoint.write_atomic(ckpt_dir / "run_info.json", json.dumps(info, indent=1) + "\n")

    def run_eval(at_step: int) -> None:
        metrics = evaluate(engine, task, encode, tokenizer, cfg, seed=cfg.seed + EVAL_SEED_OFFSET + at_step,
                           group=group)
        logger.log("eval", at_step, metrics)

    if step == 0 and cfg.eval_before_train:
        print(f"sweep-train: eval before the first step: {len(task.eval)} prompts x {cfg.eval_n_samples_per_prompt} "
              f"samples (eval_before_train=false skips it, eval_limit=N shortens it)", file=stderr, flush=True)
        run_eval(0)
    started = time.perf_counter()
    first_step = step
    progress = progress_bar(cfg, stdout or sys.stdout, total=total_steps, done=step) if group.is_main else None
    last = {}

    saved_step = step if start_from is not None else None  # the step the latest checkpoint holds

    def save(at_step: int) -> None:
        nonlocal saved_step
        checkpoint.save(ckpt_dir, at_step, model=model, optimizer=full_optimizer, scheduler=scheduler,
                        sampler_state=sampler.state_dict(), config=attrs.asdict(cfg), group=group)
        saved_step = at_step

    def stop_now(signum: int) -> None:
        # Whenever the signal came (during a step, its eval or its checkpoint), the last
        # finished step is checkpointed before the run ends.
        if step > 0 and saved_step != step:
            save(step)
        raise Stopped(signum, step, checkpointed=saved_step is not None)

    # Measure until sure (timing_target): rank 0's step times are the ones logged, so its
    # verdict is every rank's; they must stop at the same step, or the collectives would hang.
    timing = TimingRule.for_run(cfg, logger.history) if cfg.timing_target is not None else None

    def timing_stop() -> Verdict | None:
        """The verdict that ends the run now (at ``step``), or None."""
        if timing is None:
            return None
        verdict = group.gather_objects(timing.verdict() if group.is_main else None)[0]
        return verdict if verdict.stop else None

    def end_by_rule(verdict: Verdict) -> None:
        logger.log("stop", step, verdict.record())
        print(f"sweep-train: {verdict.reason}; the run is complete at step {step}", file=stderr, flush=True)

    # A resumed run may have measured enough already: it is complete as it stands.
    precise = timing_stop() if step > 0 else None
    if precise is not None:
        end_by_rule(precise)

    with ExitStack() as closing:  # the logger and progress bar close however the loop ends
        closing.callback(logger.close)
        if progress is not None:
            closing.callback(progress.close)
        stop = closing.enter_context(StopRequest(stderr))
        while step < total_steps and precise is None:
            # Every stop decision is the ranks' common one: they must stop at the same step.
            if (signum := group.agree(stop.signum)) is not None:
                stop_now(signum)
            step += 1
            times = {}
            step_started = time.perf_counter()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)

            # -- 1. generate: prompts (this rank's whole groups of each mini-batch) and rollouts ----
            step_examples = sampler.next_batch()
            all_prompts = encode([e.prompt for e in step_examples])
            examples = group.share(step_examples, cfg.policy_mini_batch_size)
            prompts = group.share(all_prompts, cfg.policy_mini_batch_size)
            params = SamplingParams(n=n, max_new_tokens=cfg.max_generate_length, temperature=cfg.temperature,
                                    top_p=cfg.top_p, top_k=cfg.top_k, seed=group.seed(cfg.seed * 1_000_000 + step))
            with timed(times, "timing/generate", device):
                generation = engine.generate(prompts, params)
            with timed(times, "timing/sync_weights", device):  # the engine's sleep and wake count as sync
                engine.sleep()
            batch = Batch.from_generation(prompts, generation, n=n, pad_id=pad_id, device=device)

            # -- 2. score: rewards, and pi_old / pi_ref where the update needs them ----------------
            texts = decode_texts(tokenizer, generation.token_lists())
            samples_examples = [e for e in examples for _ in range(n)]  # group-contiguous, as generated
            rewards = torch.tensor([task.reward(t, e) for t, e in zip(texts, samples_examples)])  # (B,)
            with timed(times, "timing/ref", device):
                old_logprobs = None if on_policy else old_policy.score(batch)
                batch = attrs.evolve(
                    batch, rewards=rewards.to(device), old_logprobs=old_logprobs,
                    ref_logprobs=ref_policy.score(batch) if ref_policy is not None else None,
                    rollout_logprobs=batch.engine_logprobs if engine.reports_logprobs else old_logprobs)

            distill = {}
            if teacher is not None:  # OPD: the teacher scores the student's own tokens
                with timed(times, "timing/teacher", device):
                    kl, distill = teacher.token_kl(batch, model)
                batch = attrs.evolve(batch, token_rewards=-kl)
                # Each rank's are means over its own tokens; their mean stands for the step's.
                distill = dict(zip(distill, (value / group.world for value in group.sum_floats([*distill.values()]))))

            # -- 3. advantages ------------------------------------------------------------------
            reward_signal = batch.token_rewards if batch.token_rewards is not None else batch.rewards
            batch = attrs.evolve(batch, advantages=advantages_for(reward_signal, n, cfg))

            # -- 4. update: mini-batches of whole groups, micro-batches accumulate --------------
            with timed(times, "timing/policy_train", device):
                update_stats = update_policy(policy, optimizer, scheduler, batch, cfg, precision=precision,
                                             stderr=stderr, group=group)

            # -- 5. sync: the full policy gathers the new shards, the rollout engine reads it --------
            with timed(times, "timing/sync_weights", device):
                parallel.gather_weights(policy, model)
                engine.wake()
                engine.sync_weights(model)

            # -- metrics (of all ranks' rows), eval, checkpoint ----------------------------------
            times["timing/step"] = time.perf_counter() - step_started
            rewards = group.gather_rows(rewards)  # (B,) over all ranks from here on
            lengths = group.gather_rows(batch.response_mask.sum(dim=1).float())  # (B,)
            stopped = group.gather_rows(batch.stopped.float())
            tokens = int(lengths.sum().item())
            last = {
                **times,
                "throughput/tokens_generated": tokens,
                "throughput/tokens_per_s": tokens / times["timing/step"],
                "reward/mean": rewards.mean().item(),
                "reward/std": rewards.std().item() if rewards.numel() > 1 else 0.0,
                **update_stats,
                **distill,
                "response_length/mean": lengths.mean().item(),
                "response_length/max": int(lengths.max().item()),
                "response/stop_frac": stopped.mean().item(),
                "memory/peak_gb": group.max_floats([peak_memory_gb(device)])[0],
                "data/epoch": sampler.epoch,
                "data/prompt_fingerprint": fingerprint(all_prompts),
            }
            if batch.engine_logprobs is not None:
                # How far the engine's sampling distribution is from the policy it stands for.
                engine_sum, engine_tokens = group.sum_floats(
                    [float((batch.engine_logprobs * batch.response_mask).sum()), float(batch.response_mask.sum())])
                last["rollout/engine_logprob_mean"] = engine_sum / max(engine_tokens, 1.0)
            logger.log("train", step, last)
            del batch, generation
            if timing is not None:
                timing.add(times["timing/step"])
            precise = timing_stop()
            final = step == total_steps or precise is not None  # the eval and checkpoint of a last step
            if group.agree(stop.signum) is None and ((cfg.eval_interval and step % cfg.eval_interval == 0) or final):
                run_eval(step)
            if (cfg.ckpt_interval and step % cfg.ckpt_interval == 0) or final:
                save(step)
            if precise is not None:
                end_by_rule(precise)
            if progress is not None:
                progress.update(step, last)
            if (signum := group.agree(stop.signum)) is not None and not final:
                stop_now(signum)
        # The last step (max_steps', or the one timing_target ended the run at) has run and is
        # checkpointed: a stop asked for during it or since has nothing left to stop (the step's
        # eval was skipped if the stop came first), and the run ends complete, exported. The
        # handlers stay for the export: a signal during it is the same request.
        if timing is not None and precise is None and group.is_main:
            print(f"sweep-train: timing_target not reached by the last step: {timing.verdict().reason}",
                  file=stderr, flush=True)
        if cfg.export_final and group.is_main:
            checkpoint.export(ckpt_dir, model, tokenizer, dtype=precision.compute)
        if stop.signum is not None:
            print(f"sweep-train: {signal.Signals(stop.signum).name} after the last step: the run is complete",
                  file=stderr, flush=True)
    reward = f", last reward {last['reward/mean']:.3f}" if "reward/mean" in last else ""
    print(f"sweep-train: done: {step - first_step} steps in {time.perf_counter() - started:.1f} s{reward}; "
          f"metrics in {metrics_path}, checkpoints in {ckpt_dir}", file=stderr, flush=True)
    return last


def resolve_backend(cfg, model) -> str:
    """``backend='auto'``: the static engine where it knows the model's layout, else HF generate."""
    if cfg.backend != "auto":
        return cfg.backend
    return "static" if engine_class("static").supports(model) else "hf"


def evaluate(engine, task, encode, tokenizer, cfg, *, seed: int, group: parallel.Group = parallel.SINGLE) -> dict:
    """pass@1 and pass@k (unbiased, k = n = eval_n_samples_per_prompt) on the held-out split;
    each rank samples every world-th prompt, and the sums are the ranks' together."""
    k = cfg.eval_n_samples_per_prompt
    examples = list(task.eval)[group.rank :: group.world]
    generation = engine.generate(encode([e.prompt for e in examples]), SamplingParams(
        n=k, max_new_tokens=cfg.max_generate_length, temperature=cfg.eval_temperature, seed=group.seed(seed)))
    texts = decode_texts(tokenizer, generation.token_lists())
    correct = [task.is_correct(t, e) for t, e in zip(texts, (e for e in examples for _ in range(k)))]
    rewards = [task.reward(t, e) for t, e in zip(texts, (e for e in examples for _ in range(k)))]
    per_prompt = [sum(correct[i * k : (i + 1) * k]) for i in range(len(examples))]
    pass_1, pass_k, reward_sum, samples, prompts = group.sum_floats([
        sum(pass_at_k(k, c, 1) for c in per_prompt), sum(pass_at_k(k, c, k) for c in per_prompt),
        sum(rewards), len(rewards), len(examples)])
    return {
        "eval/pass_at_1": pass_1 / prompts,
        "eval/pass_at_k": pass_k / prompts,
        "eval/k": k,
        "eval/reward_mean": reward_sum / samples,
        "eval/prompts": int(prompts),
    }


def run_info(cfg, *, device, precision, backend, total_steps, resumed_from, inert, world: int = 1) -> dict:
    return {
        "device": str(device),
        "world_size": world,  # processes (ranks) the policy trains on
        "dtype": str(precision.compute).removeprefix("torch."),  # the compute dtype
        "master_dtype": str(MASTER_DTYPE).removeprefix("torch."),
        "backend": backend,
        "total_steps": total_steps,
        "resumed_from": resumed_from,
        "inert_knobs": inert,
        "config": attrs.asdict(cfg),  # TrainerConfig.to_dict passes an argument attrs 26 lacks
    }


def inert_knobs(cfg, device: torch.device, *, backend: str | None = None, world: int = 1) -> dict:
    """Every knob that has no effect in this run of ``world`` processes, with its value, default and why.

    All of them are listed, changed or not (``changed`` marks those set away
    from the default), so a grid axis over an inert knob shows up at once. The
    rollout engine reports its own (``RolloutEngine.inert_knobs``).
    """
    backend = backend or (cfg.backend if cfg.backend != "auto" else "static")
    reasons = dict(engine_class(backend).inert_knobs(attrs.evolve(cfg, device=device.type)))
    if world == 1:
        reasons["reshard_after_forward"] = "the policy trains in one process, unsharded"
    else:
        # The layout is the processes': each rank samples its share with an engine of its own.
        for key in ("num_inference_engines", "inference_tp", "colocate_all"):
            if key in reasons:
                reasons[key] = f"one rollout engine per training process ({world}), each TP1 and colocated with it"
    if device.type == "cpu":
        if cfg.num_gpus != 0:
            reasons["num_gpus"] = "training on the CPU (num_cpu_ranks sets its processes)"
    else:
        reasons["num_cpu_ranks"] = "training on CUDA (num_gpus sets its processes)"
        if cfg.num_gpus == 0:
            reasons["num_gpus"] = "device='cuda' trains on one GPU (num_gpus=0 means the CPU under device='auto')"
    if device.type != "cuda":
        reasons["fused_logprobs"] = "the fused log-prob expressions are compiled only on CUDA"
        reasons["compile_update"] = "the policy's body is compiled only on CUDA"
    elif world > 1:
        reasons["fused_logprobs"] = "the sharded policy's forward computes its log-probs unfused"
        reasons["compile_update"] = "the sharded policy's body runs uncompiled"
    if not cfg.use_kl_loss:
        reasons |= dict.fromkeys(("kl_loss_coef", "kl_estimator_type"), "use_kl_loss is false")
    if not cfg.use_entropy_loss:
        reasons["entropy_loss_coef"] = "use_entropy_loss is false"
    if not cfg.use_tis:
        reasons["tis_imp_ratio_cap"] = "use_tis is false"
    if cfg.train_batch_size == cfg.policy_mini_batch_size and not cfg.use_kl_loss and not cfg.teacher_top_k:
        reasons["micro_forward_batch_size_per_gpu"] = (
            "one update per step is exactly on-policy: no separate no-grad forward runs")
    if cfg.teacher_model is None:
        reasons |= dict.fromkeys(("teacher_top_k", "teacher_micro_batch_size"), "no teacher_model (not OPD)")
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
    if parallel.uses_cuda(cfg):
        return torch.device("cuda", torch.cuda.current_device())  # a rank's own: trainer.parallel sets it
    return torch.device("cpu")


def fingerprint(prompts: list[list[int]]) -> str:
    """A short hash of the step's prompt batch: equal across runs iff the data order is."""
    return hashlib.sha1(json.dumps(prompts).encode()).hexdigest()[:16]


@contextmanager
def timed(times: dict, key: str, device=None):
    """Add the wall time of the block to ``times[key]``; on CUDA, of its device work too."""
    started = time.perf_counter()
    try:
        yield
    finally:
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        times[key] = times.get(key, 0.0) + time.perf_counter() - started


def progress_bar(cfg, stdout, *, total: int, done: int):
    """A rich progress bar when asked and stdout is a terminal; None otherwise."""
    if not (cfg.progress_bar and hasattr(stdout, "isatty") and stdout.isatty()):
        return None
    try:
        return ProgressBar(total=total, done=done)
    except ImportError:  # rich is optional on the GPU machines
        return None
