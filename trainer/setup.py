"""A run's set-up: everything the training loop (``trainer.loop``) needs before its first step.

:func:`set_up` makes one rank's :class:`Run`, in this order (the order is the run's: the
initial weights, the reference's and the teacher's come from the seed in turn, and the
stderr lines appear in it):

1. where to start: a fresh run refuses a directory that holds checkpoints,
   ``resume_mode='latest'`` takes the latest (``trainer.checkpoint.plan_start``), before
   anything loads; writes an interrupted checkpoint left are removed;
2. the device, the precision (``trainer.precision``) and the seeds;
3. the model and tokenizer (fp32 master weights), the backend (``auto`` resolved), the knobs
   that do nothing in this run (``inert_knobs``), the task and its resumable prompt sampler;
4. the frozen reference (``use_kl_loss``) and the teacher (OPD);
5. the policy that trains: the model itself, or a sharded copy on several ranks; compiled on
   one GPU; its AdamW and linear warm-up schedule;
6. resume: the model, optimizer, schedule and sampler from the checkpoint; the reference
   saved, or loaded back;
7. the rollout engine and the scorers of pi_old and pi_ref;
8. the metrics logger and the run's ``info`` record (also ``run_info.json``), and the timing
   rule (``timing_target``), which continues from the steps the logger kept.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any, Optional, TextIO

import attrs
import torch

from trainer import checkpoint, parallel, shared_prompt, startup
from trainer.config import ConfigError, TrainerConfig
from trainer.data import PromptSampler
from trainer.distill import Teacher
from trainer.forward import PolicyScorer, compile_body
from trainer.metrics import MetricsLogger, SilentLogger
from trainer.models import encode_prompts, load_model_and_tokenizer
from trainer.precision import MASTER_DTYPE, Precision
from trainer.rollout import RolloutEngine, engine_class, make_engine
from trainer.tasks import Task, load_task
from trainer.timing import TimingRule


@attrs.frozen(kw_only=True, eq=False)
class Run:
    """What one rank's training loop works with, made by :func:`set_up`.

    Frozen: the loop changes these objects (the weights, the optimizer's state, the
    sampler's place), never which objects they are.
    """

    cfg: TrainerConfig
    group: parallel.Group
    ckpt_dir: Path
    device: torch.device
    precision: Precision
    backend: str  # the engine's name, ``auto`` resolved
    # The full policy: the engine samples from it, the scorers read it, checkpoints are written from it.
    model: torch.nn.Module
    tokenizer: Any
    task: Task
    sampler: PromptSampler
    total_steps: int
    teacher: Optional[Teacher]
    policy: torch.nn.Module  # what trains: ``model`` itself, or (several ranks) its sharded copy
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    full_optimizer: Any  # the optimizer as a checkpoint holds it (the ranks' shards gathered)
    start_from: Optional[Path]  # the checkpoint the run resumed from, or None
    start_step: int  # the step that checkpoint holds (0: a fresh run)
    engine: RolloutEngine
    old_policy: PolicyScorer  # pi_old, scored when a step makes several updates
    ref_policy: Optional[PolicyScorer]  # pi_ref, with use_kl_loss
    logger: MetricsLogger | SilentLogger
    timing: Optional[TimingRule]  # measure until sure: timing_target's rule, or None

    def encode(self, prompts: list[str]) -> list[list[int]]:
        return encode_prompts(self.tokenizer, prompts, self.cfg.max_prompt_length)

    def save(self, step: int) -> None:
        """Checkpoint the run as it stands after ``step`` (every rank takes part; rank 0 writes)."""
        checkpoint.save(self.ckpt_dir, step, model=self.model, optimizer=self.full_optimizer,
                        scheduler=self.scheduler, sampler_state=self.sampler.state_dict(),
                        config=attrs.asdict(self.cfg), group=self.group)


def set_up(cfg: TrainerConfig, group: parallel.Group, *, ckpt_dir: Path, metrics_path, stdout: Optional[TextIO],
           stderr: TextIO) -> Run:
    """This rank's :class:`Run` of ``cfg``: fresh, or resumed from ``ckpt_dir``'s latest checkpoint."""
    start_from = checkpoint.plan_start(ckpt_dir, cfg.resume_mode)  # refuses before anything loads
    if start_from is not None:
        checkpoint.check_world_size(start_from, group.world)
    if group.is_main:
        for stale in checkpoint.remove_stale_writes(ckpt_dir):
            print(f"sweep-train: removed {stale.name}, left by an interrupted checkpoint write", file=stderr)
    if cfg.resume_mode == "latest" and start_from is None:
        print(f"sweep-train: resume_mode=latest but {ckpt_dir} holds no checkpoint; starting fresh",
              file=stderr)

    device = resolve_device(cfg)
    if compiles(cfg, device, world=group.world):
        startup.warm_compile_workers()  # they come up while the model builds
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

    if not group.distributed:
        # Read by trainer.forward.response_logprobs; the copies below inherit it. Gradient
        # checkpointing's recompute runs in the backward, outside the shared forward's attention.
        model.share_prompts = cfg.share_prompts and shared_prompt.supports(model) and not cfg.gradient_checkpointing
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

    eval_prompts = min(len(task.eval), cfg.eval_limit or len(task.eval))
    eval_rows = -(-eval_prompts // group.world) * cfg.eval_n_samples_per_prompt  # this rank's share, rounded up
    engine = make_engine(cfg, model=model, tokenizer=tokenizer, device=device, backend=backend,
                         max_rows=max(cfg.train_batch_size // group.world * cfg.n_samples_per_prompt, eval_rows))
    old_policy = PolicyScorer(model, temperature=cfg.temperature, micro_batch_size=cfg.micro_forward_batch_size_per_gpu,
                              precision=precision)
    ref_policy = PolicyScorer(reference, temperature=cfg.temperature,
                              micro_batch_size=cfg.micro_forward_batch_size_per_gpu, precision=precision) \
        if reference is not None else None

    logger = MetricsLogger(metrics_path, stdout=stdout, resume_step=step) if group.is_main else SilentLogger()
    info = run_info(cfg, device=device, precision=precision, backend=backend, total_steps=total_steps,
                    resumed_from=str(start_from) if start_from else None, inert=inert, world=group.world)
    logger.log("info", step, info)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    if group.is_main:
        checkpoint.write_atomic(ckpt_dir / "run_info.json", json.dumps(info, indent=1) + "\n")
    # Measure until sure: rank 0's step times are the ones logged, and a resumed run's rule
    # counts the steps its earlier processes logged.
    timing = TimingRule.for_run(cfg, logger.history) if cfg.timing_target is not None else None

    return Run(cfg=cfg, group=group, ckpt_dir=ckpt_dir, device=device, precision=precision, backend=backend,
               model=model, tokenizer=tokenizer, task=task, sampler=sampler, total_steps=total_steps,
               teacher=teacher, policy=policy, optimizer=optimizer, scheduler=scheduler,
               full_optimizer=full_optimizer, start_from=start_from, start_step=step, engine=engine,
               old_policy=old_policy, ref_policy=ref_policy, logger=logger, timing=timing)


def resolve_device(cfg) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' but torch sees no CUDA device (use 'auto' or 'cpu')")
    if parallel.uses_cuda(cfg):
        return torch.device("cuda", torch.cuda.current_device())  # a rank's own: trainer.parallel sets it
    return torch.device("cpu")


def resolve_backend(cfg, model) -> str:
    """``backend='auto'``: the static engine where it knows the model's layout, else HF generate."""
    if cfg.backend != "auto":
        return cfg.backend
    return "static" if engine_class("static").supports(model) else "hf"


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


#: The knobs under which a run ``torch.compile``s something: the update's body, the fused
#: log-prob chunks, the decode step.
COMPILE_KNOBS = ("compile_update", "fused_logprobs", "compile_decode")


def compiles(cfg, device: torch.device, *, world: int = 1) -> bool:
    """Whether this run will ``torch.compile`` anything: a compile knob that is on and not inert
    (:func:`inert_knobs`, asked before the model exists: the backend as configured)."""
    inert = inert_knobs(cfg, device, world=world)
    return any(getattr(cfg, key) and key not in inert for key in COMPILE_KNOBS)


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
