"""Seconds per step and peak memory of TRL's ``GRPOTrainer`` on the shape of bench_trainer.py.

The same model, tokenizer, prompts and reward as the trainer's benchmark, built by the
trainer's own modules: ``trainer.models.load_model_and_tokenizer`` (``--model
random:qwen2.5-0.5b`` is a random-init Qwen2.5-0.5B shape with the byte-level tokenizer
padded to its 151,936-token vocabulary, no download; ``tiny-random`` the 2-layer model),
``trainer.tasks.load_task`` (GSM8K train questions with the trainer's prompt text, or the
synthetic task) and ``trainer.rewards.gsm8k_reward``. TRL is not a dependency of this
project: install ``trl`` (tested with 1.16) to run this. The H200 run::

    python benchmarks/bench_trl.py --model random:qwen2.5-0.5b \\
        --dataset /path/to/gsm8k --prompts 32 --samples 4 \\
        --prompt-length 256 --generate-length 512 --steps 4

``bench_trainer.py --compare trl`` runs this in its own process after the trainer's run
and prints both.

How the trainer's shape maps onto GRPOConfig
--------------------------------------------
One step is one generation of ``prompts * samples`` completions and one optimizer update,
as in the trainer (``policy_mini_batch_size == train_batch_size``):

* ``num_generations = samples``; ``generation_batch_size = prompts * samples`` (128 in
  the H200 run);
* ``per_device_train_batch_size = --micro-batch`` (8 completions per forward/backward,
  the trainer's ``micro_train_batch_size_per_gpu``) and ``gradient_accumulation_steps =
  prompts * samples / micro-batch`` (16 there), so ``steps_per_generation`` (derived by
  GRPOConfig) equals ``gradient_accumulation_steps``: TRL generates once per optimizer
  step and, being exactly on-policy, skips the old-log-prob forward, as the trainer does
  for a step of one update;
* ``num_iterations = 1``, ``beta = 0`` (no reference model, as ``use_kl_loss=False``),
  ``loss_type = "dapo"`` (token mean over the whole accumulated batch, the trainer's
  ``token_mean``), clip ``epsilon`` / ``epsilon_high`` and lr, betas, weight decay,
  grad-norm clip, temperature, top-p, top-k and seed from the trainer's defaults, lr
  constant, fused AdamW on CUDA (``adamw_torch_fused``, TRL's default and the trainer's
  choice there), no gradient checkpointing (TRL turns it on by default, the trainer does
  not), ``mask_truncated_completions = False``;
* ``max_completion_length = --generate-length``, HF ``generate`` (no vLLM; the trainer's
  own engine is whatever its ``backend`` picks), no stop string: a random model rarely
  samples eos, so completions run the full length;
* TRL 1.16 has no prompt-length cap, so each prompt is left-truncated to
  ``--prompt-length`` tokens here, as the trainer does before generating;
* fp32 master weights with bf16 autocast on CUDA (``bf16=True`` over an fp32 model:
  TRL's default, which loads models in fp32, and the trainer's ``trainer.precision``),
  plain fp32 on CPU; no eval, no saving, ``report_to="none"``, a log every step.

Each step is timed from ``on_step_begin`` to ``on_step_end`` of a ``TrainerCallback``
(after a CUDA synchronize), which covers generation, reward, the forward/backward passes
and the optimizer step; the policy's ``generate`` is timed on its own too (the trainer's
``timing/generate``). The first ``--warmup`` steps are left out. Everything TRL prints
goes to stderr, so that ``--json`` prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.config import ConfigError, TrainerConfig  # noqa: E402
from trainer.data import DataError  # noqa: E402

TESTED_TRL = "1.16.0"
INSTALL_HINT = (f"install it with 'pip install trl=={TESTED_TRL}', or offline with 'python3 -m pip install "
                "--no-index --no-deps --target /tmp/site .whl/*.whl' and PYTHONPATH=/tmp/site")
TRL_MISSING = 3  # exit status when TRL cannot be imported


class TrlMissing(RuntimeError):
    """TRL (or a package it needs) cannot be imported."""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-random", help="as the trainer's model key")
    parser.add_argument("--dataset", default="synthetic", help="'synthetic' or a GSM8K directory/file")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--samples", type=int, default=4, help="completions per prompt (num_generations)")
    parser.add_argument("--prompt-length", type=int, default=256, help="prompt tokens, left-truncated")
    parser.add_argument("--generate-length", type=int, default=64, help="max_completion_length")
    parser.add_argument("--steps", type=int, default=3, help="steps to run, warm-up included")
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the summary")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--micro-batch", type=int, default=8,
                        help="completions per forward/backward (per_device_train_batch_size)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--check", action="store_true",
                        help="only check that TRL's GRPOTrainer imports; print its version")
    return parser.parse_args(argv)


def import_trl():
    """The ``trl`` module, ``GRPOConfig`` and ``GRPOTrainer``; raises TrlMissing saying how to install."""
    try:
        import trl
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        raise TrlMissing(f"TRL is not importable ({type(exc).__name__}: {exc}); {INSTALL_HINT}") from None
    except RuntimeError as exc:  # trl's lazy module wraps a failing dependency import in a RuntimeError
        raise TrlMissing(f"TRL's GRPOTrainer does not import ({exc}); {INSTALL_HINT}") from None
    return trl, GRPOConfig, GRPOTrainer


def trainer_config(args) -> TrainerConfig:
    """The trainer's config for this shape: the source of the model, the prompts and the defaults."""
    return TrainerConfig.from_dict({
        "model": args.model, "dataset": args.dataset, "device": args.device,
        "train_batch_size": args.prompts, "policy_mini_batch_size": args.prompts,
        "n_samples_per_prompt": args.samples, "max_prompt_length": args.prompt_length,
        "max_generate_length": args.generate_length, "micro_train_batch_size_per_gpu": args.micro_batch,
        "max_steps": args.steps,
    }, source="bench_trl.py")


def left_truncated(prompts: list[str], tokenizer, limit: int) -> list[str]:
    """Each prompt as the text of its last ``limit`` tokens, as the trainer feeds ``generate``."""
    encoded = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    kept = []
    for text, ids in zip(prompts, encoded):
        if len(ids) > limit:
            text = tokenizer.decode(ids[-limit:])
            # A byte-level cut inside a multi-byte character decodes to U+FFFD, which re-encodes longer.
            while len(tokenizer(text, add_special_tokens=False)["input_ids"]) > limit:
                text = text[1:]
        kept.append(text)
    return kept


def gsm8k_correct(completions: list[str], answer: list[str], **_trl_extras) -> list[float]:
    """TRL reward function: the trainer's strict GSM8K reward of each completion.

    TRL passes the dataset's other columns by name (``answer``) and extras of its own
    (``prompts``, ``completion_ids``, ``trainer_state``, ...), which this reward ignores.
    """
    from trainer.rewards import gsm8k_reward

    return [gsm8k_reward(completion, gold) for completion, gold in zip(completions, answer)]


def step_timer(device):
    """A TrainerCallback recording each optimizer step's seconds, generate seconds and peak memory,
    and the step logs."""
    import torch
    from transformers import TrainerCallback

    from trainer.metrics import peak_memory_gb

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.steps: list[dict] = []
            self.logs: list[dict] = []
            self._started = None
            self._generating = 0.0

        def time_generate(self, model) -> None:
            """Count the seconds in ``model.generate`` (TRL calls it on the policy itself on one GPU)."""
            generate = model.generate

            def timed_generate(*args, **kwargs):
                synchronize()
                started = time.perf_counter()
                try:
                    return generate(*args, **kwargs)
                finally:
                    synchronize()
                    self._generating += time.perf_counter() - started

            model.generate = timed_generate

        def on_step_begin(self, args, state, control, **kwargs):
            synchronize()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            self._generating = 0.0
            self._started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            synchronize()
            self.steps.append({"seconds": time.perf_counter() - self._started,
                               "generate_seconds": self._generating,
                               "peak_memory_gb": peak_memory_gb(device)})

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:  # a step's log, not the end-of-run summary
                self.logs.append(dict(logs))

    return StepTimer()


def micro_batch(cfg: TrainerConfig) -> int:
    """Completions per forward/backward: the trainer's micro-batch, or the whole step when smaller."""
    return min(cfg.micro_train_batch_size_per_gpu, cfg.train_batch_size * cfg.n_samples_per_prompt)


def grpo_config(GRPOConfig, cfg: TrainerConfig, *, on_cuda: bool, output_dir: str):
    """The GRPOConfig of one generation and one optimizer update per step (see the module docstring)."""
    completions = cfg.train_batch_size * cfg.n_samples_per_prompt
    micro = micro_batch(cfg)
    if completions % micro:
        raise ConfigError(f"--micro-batch: {micro} does not divide the {completions} completions of a step")
    config = GRPOConfig(
        output_dir=output_dir,
        max_steps=cfg.max_steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=completions // micro,
        generation_batch_size=completions,
        num_generations=cfg.n_samples_per_prompt,
        num_iterations=1,
        max_completion_length=cfg.max_generate_length,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=max(cfg.top_k, 0),  # the trainer's -1 and TRL's 0 both mean off
        use_vllm=False,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        epsilon=cfg.eps_clip_low,
        epsilon_high=cfg.eps_clip_high,
        mask_truncated_completions=False,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.adam_betas[0],
        adam_beta2=cfg.adam_betas[1],
        max_grad_norm=cfg.max_grad_norm,
        optim="adamw_torch_fused" if on_cuda else "adamw_torch",
        gradient_checkpointing=False,
        bf16=on_cuda,
        use_cpu=not on_cuda,
        seed=cfg.seed,
        eval_strategy="no",
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )
    # One generation per optimizer step, or the step would not be the trainer's step.
    assert config.steps_per_generation == config.gradient_accumulation_steps, config.steps_per_generation
    return config


def run(args) -> dict:
    """Build everything, train ``--steps`` steps, return the summary."""
    trl, GRPOConfig, GRPOTrainer = import_trl()
    import datasets
    import torch

    from trainer.models import load_model_and_tokenizer
    from trainer.precision import MASTER_DTYPE
    from trainer.tasks import load_task

    cfg = trainer_config(args)
    on_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if on_cuda else "cpu")
    compute_dtype = torch.bfloat16 if on_cuda else torch.float32  # TRL autocasts with bf16=True
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_model_and_tokenizer(cfg, device=device, dtype=MASTER_DTYPE)
    task = load_task(cfg, tokenizer)
    prompts = left_truncated([e.prompt for e in task.train], tokenizer, cfg.max_prompt_length)
    dataset = datasets.Dataset.from_dict({"prompt": prompts, "answer": [e.answer for e in task.train]})
    timer = step_timer(device)
    timer.time_generate(model)
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as scratch:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=gsm8k_correct,
            args=grpo_config(GRPOConfig, cfg, on_cuda=on_cuda, output_dir=scratch),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[timer],
        )
        trainer.train()
    kept_steps = timer.steps[args.warmup:] or timer.steps
    kept_logs = timer.logs[args.warmup:] or timer.logs
    completions = cfg.train_batch_size * cfg.n_samples_per_prompt
    seconds = [s["seconds"] for s in kept_steps]
    lengths = [log["completions/mean_length"] for log in kept_logs]
    return {
        "model": cfg.model, "device": str(model.device), "dtype": str(compute_dtype).removeprefix("torch."),
        "master_dtype": str(model.dtype).removeprefix("torch."),
        "prompts": cfg.train_batch_size, "samples": cfg.n_samples_per_prompt,
        "steps_measured": len(kept_steps),
        "sec_per_step": statistics.fmean(seconds),
        "each_step": [round(t, 3) for t in seconds],
        "first_step_s": timer.steps[0]["seconds"] if timer.steps else None,
        "generate_sec_per_step": statistics.fmean(s["generate_seconds"] for s in kept_steps),
        "tokens_per_s": sum(lengths) * completions / sum(seconds) if len(lengths) == len(seconds) else None,
        "response_length_mean": _mean_or_none(lengths),
        "reward_mean": _mean_or_none([log.get("reward") for log in kept_logs]),
        # TRL's own step_time (its training_step calls, without the optimizer step): a cross-check.
        "trl_logged_step_time": _mean_or_none([log.get("step_time") for log in kept_logs]),
        "peak_memory_gb": max(s["peak_memory_gb"] for s in kept_steps),
        "trl_version": trl.__version__,
        "micro_batch": micro_batch(cfg),
        "gradient_accumulation_steps": completions // micro_batch(cfg),
    }


def _mean_or_none(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.check:
            trl, _, _ = import_trl()
            print(f"trl {trl.__version__}")
            return 0
        with contextlib.redirect_stdout(sys.stderr):  # TRL and transformers print; stdout is the summary's
            summary = run(args)
    except TrlMissing as exc:
        print(f"bench_trl: {exc}", file=sys.stderr)
        return TRL_MISSING
    except (ConfigError, DataError) as exc:
        print(f"bench_trl: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"TRL {summary['trl_version']} GRPOTrainer: {summary['model']} on {summary['device']} "
          f"({summary['dtype']}), {summary['prompts']} prompts x {summary['samples']} samples, "
          f"prompt <= {args.prompt_length}, {args.generate_length} new tokens, "
          f"{summary['steps_measured']} steps measured")
    print(f"  sec/step            {summary['sec_per_step']:.3f}")
    print(f"  generate            {summary['generate_sec_per_step']:.3f} s "
          f"({summary['generate_sec_per_step'] / summary['sec_per_step']:.0%})")
    if summary["tokens_per_s"] is not None:
        print(f"  tokens/s (step)     {summary['tokens_per_s']:.1f}")
    if summary["response_length_mean"] is not None:
        print(f"  response length     {summary['response_length_mean']:.1f}")
    print(f"  peak memory         {summary['peak_memory_gb']:.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
