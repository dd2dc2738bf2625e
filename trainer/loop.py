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
-> advantages -> update -> sync (the engine reads the new weights). Everything
made before the first step (device, seeds, model, data, reference, teacher,
optimizer, the resumed checkpoint, engine, logger) is a :class:`trainer.setup.Run`.

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

import hashlib
import json
import signal
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import NoReturn

import attrs
import torch

from trainer import checkpoint, parallel, startup
from trainer.advantages import advantages_for
from trainer.batch import Batch
from trainer.config import TrainerConfig
from trainer.losses import pass_at_k
from trainer.metrics import ProgressBar, peak_memory_gb
from trainer.models import decode_texts
from trainer.rollout import SamplingParams
from trainer.setup import Run, set_up
from trainer.stopping import StopRequest, Stopped
from trainer.timing import Verdict
from trainer.packing import plan_packing
from trainer.update import update_policy

EVAL_SEED_OFFSET = 1_000_003  # keeps eval samples apart from the training step's samples


def train(cfg: TrainerConfig, *, ckpt_dir, metrics_path, stdout=None, stderr=None) -> dict:
    """Run (or resume) one training run, or this process's rank of one; returns the last train metrics."""
    with parallel.process_group(cfg) as group:
        return train_rank(cfg, group, ckpt_dir=ckpt_dir, metrics_path=metrics_path, stdout=stdout, stderr=stderr)


def train_rank(cfg: TrainerConfig, group: parallel.Group, *, ckpt_dir, metrics_path, stdout=None,
               stderr=None) -> dict:
    stderr = stderr or sys.stderr
    with startup.phase("build"):
        run = set_up(cfg, group, ckpt_dir=Path(ckpt_dir), metrics_path=metrics_path, stdout=stdout, stderr=stderr)
    engine, device, logger, n = run.engine, run.device, run.logger, cfg.n_samples_per_prompt
    on_policy = cfg.train_batch_size == cfg.policy_mini_batch_size  # one update per step

    def run_eval(at_step: int) -> None:
        logger.log("eval", at_step, evaluate(engine, run.task, run.encode, run.tokenizer, cfg,
                                             seed=cfg.seed + EVAL_SEED_OFFSET + at_step, group=group))

    step = first_step = run.start_step
    if step == 0 and cfg.eval_before_train:
        print(f"sweep-train: eval before the first step: {len(run.task.eval)} prompts x "
              f"{cfg.eval_n_samples_per_prompt} samples (eval_before_train=false skips it, eval_limit=N shortens it)",
              file=stderr, flush=True)
        run_eval(0)
    started = time.perf_counter()
    progress = progress_bar(cfg, stdout or sys.stdout, total=run.total_steps, done=step) if group.is_main else None
    last = {}
    saved_step = step if run.start_from is not None else None  # the step the latest checkpoint holds
    precise = timing_verdict(run) if step > 0 else None  # a resumed run may have measured enough already
    packing = None  # how the update cuts mini-batches: decided as the first update starts
    if precise is not None:
        end_by_rule(run, precise, step, stderr)

    with ExitStack() as closing:  # the logger and progress bar close however the loop ends
        closing.callback(logger.close)
        if progress is not None:
            closing.callback(progress.close)
        stop = closing.enter_context(StopRequest(stderr))
        while step < run.total_steps and precise is None:
            # Every stop decision is the ranks' common one: they must stop at the same step.
            if (signum := group.agree(stop.signum)) is not None:
                stop_now(run, signum, step, saved_step)
            step += 1
            times = {}
            step_started = time.perf_counter()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)

            # -- 1. generate: prompts (this rank's whole groups of each mini-batch) and rollouts ----
            step_examples = run.sampler.next_batch()
            all_prompts = run.encode([e.prompt for e in step_examples])
            examples = group.share(step_examples, cfg.policy_mini_batch_size)
            prompts = group.share(all_prompts, cfg.policy_mini_batch_size)
            params = SamplingParams(n=n, max_new_tokens=cfg.max_generate_length, temperature=cfg.temperature,
                                    top_p=cfg.top_p, top_k=cfg.top_k, seed=group.seed(cfg.seed * 1_000_000 + step))
            with timed(times, "timing/generate", device):
                generation = engine.generate(prompts, params)
            with timed(times, "timing/sync_weights", device):  # the engine's sleep and wake count as sync
                engine.sleep()
            batch = Batch.from_generation(prompts, generation, n=n, pad_id=run.tokenizer.pad_token_id, device=device)

            # -- 2. score: rewards, and pi_old / pi_ref where the update needs them ----------------
            texts = decode_texts(run.tokenizer, generation.token_lists())
            samples_examples = [e for e in examples for _ in range(n)]  # group-contiguous, as generated
            rewards = torch.tensor([run.task.reward(t, e) for t, e in zip(texts, samples_examples)])  # (B,)
            with timed(times, "timing/ref", device):
                old_logprobs = None if on_policy else run.old_policy.score(batch)
                batch = attrs.evolve(
                    batch, rewards=rewards.to(device), old_logprobs=old_logprobs,
                    ref_logprobs=run.ref_policy.score(batch) if run.ref_policy is not None else None,
                    rollout_logprobs=batch.engine_logprobs if engine.reports_logprobs else old_logprobs)

            distill = {}
            if run.teacher is not None:  # OPD: the teacher scores the student's own tokens
                with timed(times, "timing/teacher", device):
                    kl, distill = run.teacher.token_kl(batch, run.model)
                batch = attrs.evolve(batch, token_rewards=-kl)
                # Each rank's are means over its own tokens; their mean stands for the step's.
                distill = dict(zip(distill, (value / group.world for value in group.sum_floats([*distill.values()]))))

            # -- 3. advantages ------------------------------------------------------------------
            reward_signal = batch.token_rewards if batch.token_rewards is not None else batch.rewards
            batch = attrs.evolve(batch, advantages=advantages_for(reward_signal, n, cfg))

            # -- 4. update: mini-batches of whole groups, micro-batches accumulate --------------
            if packing is None:
                packing = plan_packing(cfg, run.model, run.optimizer, device)
                if group.is_main:
                    print(f"sweep-train: update micro-batches: {packing.describe()}", file=stderr, flush=True)
            with timed(times, "timing/policy_train", device):
                update_stats = update_policy(run.policy, run.optimizer, run.scheduler, batch, cfg,
                                             precision=run.precision, stderr=stderr, group=group, packing=packing)

            # -- 5. sync: the full policy gathers the new shards, the rollout engine reads it --------
            with timed(times, "timing/sync_weights", device):
                parallel.gather_weights(run.policy, run.model)
                engine.wake()
                engine.sync_weights(run.model)

            # -- metrics (of all ranks' rows), eval, checkpoint, stop rules ------------------------
            times["timing/step"] = time.perf_counter() - step_started
            last = step_metrics(run, batch, rewards, all_prompts, times, update_stats, distill)
            logger.log("train", step, last)
            if step == first_step + 1 and group.is_main:
                print(f"sweep-train: {startup.describe(times['timing/step'])}", file=stderr, flush=True)
            del batch, generation
            if run.timing is not None:
                run.timing.add(times["timing/step"])
            precise = timing_verdict(run)
            final = step == run.total_steps or precise is not None  # the eval and checkpoint of a last step
            if group.agree(stop.signum) is None and ((cfg.eval_interval and step % cfg.eval_interval == 0) or final):
                run_eval(step)
            if (cfg.ckpt_interval and step % cfg.ckpt_interval == 0) or final:
                run.save(step)
                saved_step = step
            if precise is not None:
                end_by_rule(run, precise, step, stderr)
            if progress is not None:
                progress.update(step, last)
            if (signum := group.agree(stop.signum)) is not None and not final:
                stop_now(run, signum, step, saved_step)
        # The signal handlers stay for the export: a signal during it is the same request.
        finish(run, stop, timing_reached=precise is not None, stderr=stderr)
    reward = f", last reward {last['reward/mean']:.3f}" if "reward/mean" in last else ""
    print(f"sweep-train: done: {step - first_step} steps in {time.perf_counter() - started:.1f} s{reward}; "
          f"metrics in {metrics_path}, checkpoints in {run.ckpt_dir}", file=stderr, flush=True)
    return last


def finish(run: Run, stop: StopRequest, *, timing_reached: bool, stderr) -> None:
    """The end of a run whose last step (max_steps', or the one timing_target ended it at) has run
    and is checkpointed: a stop asked for during it or since (``stop``, up to the end of the
    export) has nothing left to stop (the step's eval was skipped if the stop came first), and
    the run ends complete, exported."""
    if run.timing is not None and not timing_reached and run.group.is_main:
        print(f"sweep-train: timing_target not reached by the last step: {run.timing.verdict().reason}",
              file=stderr, flush=True)
    if run.cfg.export_final and run.group.is_main:
        checkpoint.export(run.ckpt_dir, run.model, run.tokenizer, dtype=run.precision.compute)
    if stop.signum is not None:
        print(f"sweep-train: {signal.Signals(stop.signum).name} after the last step: the run is complete",
              file=stderr, flush=True)


def step_metrics(run: Run, batch: Batch, rewards: torch.Tensor, all_prompts: list[list[int]], times: dict,
                 update_stats: dict, distill: dict) -> dict:
    """The step's ``train`` record, over all ranks' rows: its timings and throughput, rewards, the
    update's (and OPD's teacher's) stats, response lengths, peak memory and place in the data."""
    group = run.group
    rewards = group.gather_rows(rewards)  # (B,) over all ranks from here on
    lengths = group.gather_rows(batch.response_mask.sum(dim=1).float())  # (B,)
    stopped = group.gather_rows(batch.stopped.float())
    tokens = int(lengths.sum().item())
    metrics = {
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
        "memory/peak_gb": group.max_floats([peak_memory_gb(run.device)])[0],
        "data/epoch": run.sampler.epoch,
        "data/prompt_fingerprint": fingerprint(all_prompts),
    }
    if batch.engine_logprobs is not None:
        # How far the engine's sampling distribution is from the policy it stands for.
        engine_sum, engine_tokens = group.sum_floats(
            [float((batch.engine_logprobs * batch.response_mask).sum()), float(batch.response_mask.sum())])
        metrics["rollout/engine_logprob_mean"] = engine_sum / max(engine_tokens, 1.0)
    return metrics


def timing_verdict(run: Run) -> Verdict | None:
    """The timing rule's verdict when it ends the run now, else None. Rank 0's step times are the
    ones logged, so its verdict is every rank's: they must stop at the same step, or the
    collectives would hang."""
    if run.timing is None:
        return None
    verdict = run.group.gather_objects(run.timing.verdict() if run.group.is_main else None)[0]
    return verdict if verdict.stop else None


def end_by_rule(run: Run, verdict: Verdict, step: int, stderr) -> None:
    run.logger.log("stop", step, verdict.record())
    print(f"sweep-train: {verdict.reason}; the run is complete at step {step}", file=stderr, flush=True)


def stop_now(run: Run, signum: int, step: int, saved_step: int | None) -> NoReturn:
    """End the run on a stop signal. Whenever it came (during a step, its eval or its
    checkpoint), the last finished step is checkpointed first."""
    if step > 0 and saved_step != step:
        run.save(step)
        saved_step = step
    raise Stopped(signum, step, checkpointed=saved_step is not None)


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
