"""The built-in trainer as a sweepkit target: its command, its schema, its smoke profile.

This is the one module that knows both sides: it imports sweepkit's hook marker
and ``trainer.config`` (attrs and the standard library only, never torch).

The ``smoke`` profile makes a whole grid run on a laptop CPU in minutes while
every cell stays distinct:

* ``model="tiny-random"``, ``device="cpu"``, ``backend="hf"``, ``gpus=0``;
* ``dataset``: a local path (a file or directory holding GSM8K or MATH rows) is kept;
  a hub name such as ``"gsm8k"`` becomes ``$SWEEPKIT_GSM8K`` when that names an
  existing path, and ``"math"`` becomes ``$SWEEPKIT_MATH`` likewise (never GSM8K),
  else the built-in ``"synthetic"`` task, so smoke runs offline;
* ``max_steps=2``, generations of at most 16 tokens, prompts of at most 128, and no
  ``timing_target`` (two steps settle no sec/step);
* ``train_batch_size`` and ``policy_mini_batch_size`` divided by one common factor
  (:data:`BATCH_DIVISOR`) with their ratio kept, so ``tbs64`` … ``tbs512`` stay
  distinct and ``train_batch_size % policy_mini_batch_size == 0`` still holds;
* a small eval (:data:`SMOKE_EVAL_LIMIT` prompts, 2 samples each), no final export;
* an OPD cell's ``teacher_model`` becomes ``tiny-random`` too (built from the teacher's
  own seed, so it differs from the student).

The ``gpu`` profile runs a grid's cells on one GPU of a machine that has the trainer's
dependencies but no hub access (a benchmark machine, a cluster's GPU node):

* a hub model becomes a random-init model of the Qwen2.5-0.5B shape (a whole grid
  then runs in minutes on one GPU, and its relative numbers are what it is for);
  a local model path is kept; an OPD cell's hub teacher becomes the larger
  :data:`GPU_TEACHER_SHAPE` (random too, so its scoring costs what a bigger teacher's does);
* ``device="cuda"``, the static in-process engine (``backend="static"``; vLLM cells
  become static cells, their ``enforce_eager`` kept, so the CUDA-graph cell stays a
  lever), ``num_gpus=1`` and ``gpus=1``;
* batches divided by :data:`GPU_BATCH_DIVISOR` (one GPU's share of a 4-GPU node's
  batch, ratios kept), the dataset as the smoke profile maps it, no eval before
  training, a small final eval, no export;
* measure until sure: a cell runs until the interval of its steady-state sec/step is
  within :data:`GPU_TIMING_TARGET` of the mean (``timing_target``: ±5 %, on at least
  :data:`GPU_TIMING_MIN_STEPS` steps after its warm-up), for at most :data:`GPU_MAX_STEPS`
  steps: a steady cell ends in a few steps, a noisy one takes the steps its number needs
  (a cell that ends early logs a ``kind="stop"`` metrics record saying why);
* ``compile_update=False``: compiling the update's body costs about a minute per row
  width it meets, most of a cell of a few dozen steps (a real run of hundreds keeps it);
  ``share_prompts=False`` with it: the shared-prompt forward compiles flex attention's
  kernels (about 11 s of a cold first step on an H100), and it has been measured inside
  the compiled body only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sweepkit import hookimpl
from sweepkit_plugins.cluster_offline import warn
from sweepkit.run.executors.warm import WarmTarget
from sweepkit.errors import UsageError
from sweepkit.state.records import CKPT_DIR, cell_dir
from trainer.config import ConfigError, TrainerConfig, check_type, schema
from trainer.data import MATH_NAMES
from trainer.shapes import RANDOM_PREFIX, TINY_MODEL

TRAINER_ARGV = ("{python}", "-m", "trainer", "{config}", "--ckpt-dir", "{ckpt_dir}",
                "--metrics", "{metrics}")
# What `python -m trainer` imports on its way to the first step (torch and transformers are
# most of a smoke cell's time), for a warm worker to import once per local sweep run; and
# the variables those imports read (thread pools, the HF hub and cache settings; not
# CUDA_VISIBLE_DEVICES: torch reads it when a child first uses CUDA, never at import).
TRAINER_PRELOAD = ("torch", "transformers", "trainer.cli", "trainer.checkpoint", "trainer.rollout",
                   "trainer.data", "trainer.models", "trainer.loop", "trainer.stopping",
                   "transformers.tokenization_utils_tokenizers", "transformers.convert_slow_tokenizer")
TRAINER_PRELOAD_ENV = ("OMP_*", "MKL_*", "OPENBLAS_*", "GOMP_*", "KMP_*", "TORCH*", "PYTORCH_*",
                       "HF_*", "TRANSFORMERS_*", "TOKENIZERS_*")
GSM8K_ENV = "SWEEPKIT_GSM8K"
MATH_ENV = "SWEEPKIT_MATH"
BATCH_DIVISOR = 16
SMOKE_STEPS = 2
SMOKE_GENERATE = 16
SMOKE_PROMPT = 128
SMOKE_EVAL_LIMIT = 8
SMOKE_EVAL_SAMPLES = 2
GPU_BATCH_DIVISOR = 4
# ±5 %: on a one-GPU benchmark machine a step's host-bound part varies by 8-25 % from step to
# step (H200, benchmarks/RESULTS.md), so ±2 % took more than 30 steps in every cell measured
# there; ±5 % still tells apart the levers worth a cell (the CUDA-graph cells: -57 to -81 %).
GPU_TIMING_TARGET = 0.05
GPU_TIMING_MIN_STEPS = 5
GPU_MAX_STEPS = 30
GPU_EVAL_LIMIT = 32
GPU_DEFAULT_SHAPE = "random:qwen2.5-0.5b"
GPU_TEACHER_SHAPE = "random:qwen2.5-1.5b"  # same tokenizer as the student's shape
COMPILE_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
COMPILE_CACHE_DIR = ".torch-compile-cache"  # in the runs dir (dot names are no grid's)
# What the trainer writes in its checkpoint dir that is no checkpoint to resume from: written
# before its first step (so a run stopped before it left nothing to resume), or the final
# export; and the prefix of its half-written files, cleaned up when it next starts.
# What a dry run and every run of a cell with backend="vllm" says: that engine is an explicit
# choice nothing here has measured.
VLLM_UNRUN = ("backend='vllm' runs an engine no tested machine has run (vllm is not installed where "
              "sweepkit's tests and benchmarks run: its code is tested only up to the vllm calls); "
              "backend='auto' (the static engine for the models it knows) is the measured one, "
              "benchmarks/RESULTS.md")
LATEST_POINTER = "latest"  # trainer.checkpoint.LATEST: its text names the latest global_step_N
NOT_CHECKPOINTS = frozenset({"run_info.json", "reference.safetensors", "export"})
# What makes a checkpoint dir one of the trainer's, which trainer.export can convert.
EXPORT_NEEDS = ("trainer_state.json", "model.safetensors")
WRITING_PREFIX = ".tmp-"


@hookimpl
def sweep_register_targets(register):
    register("trainer", WarmTarget(name="trainer", argv=TRAINER_ARGV, schema=schema(),
                                   preload=TRAINER_PRELOAD, preload_env=TRAINER_PRELOAD_ENV))


@hookimpl
def sweep_register_profiles(register):
    register("smoke", smoke, "shrink every trainer cell to run on a CPU in minutes (tiny model, "
                             "2 steps, short generations, batches / 16)")
    register("gpu", gpu, f"run every trainer cell on one GPU offline (random-init model of the cell's "
                         f"shape, static engine, batches / {GPU_BATCH_DIVISOR}) until its sec/step is "
                         f"known to +-{GPU_TIMING_TARGET:.0%} (at most {GPU_MAX_STEPS} steps)")


def smoke_dataset(dataset: str) -> str:
    """Keep a local path; a hub name becomes $SWEEPKIT_GSM8K ('math': $SWEEPKIT_MATH) if that
    exists, else 'synthetic'."""
    if dataset == "synthetic" or Path(dataset).exists():
        return dataset
    local = os.environ.get(MATH_ENV if dataset in MATH_NAMES else GSM8K_ENV)
    if local and Path(local).exists():
        return local
    return "synthetic"


def _scaled_batches(config: dict, defaults: dict, divisor: int = BATCH_DIVISOR) -> dict:
    train = config.get("train_batch_size", defaults["train_batch_size"]["default"])
    mini = config.get("policy_mini_batch_size", defaults["policy_mini_batch_size"]["default"])
    ratio = max(train // mini, 1) if mini else 1
    small_mini = max(mini // divisor, 1)
    return {"train_batch_size": small_mini * ratio, "policy_mini_batch_size": small_mini}


def gpu_model(model: str, hub_shape: str = GPU_DEFAULT_SHAPE) -> str:
    """A local path or a model built locally is kept; a hub name becomes ``hub_shape``, random."""
    if model.startswith(RANDOM_PREFIX) or model == TINY_MODEL or Path(model).exists():
        return model
    return hub_shape


def gpu(config: dict, target_name: str) -> dict:
    """The gpu profile's changes for one trainer cell (see the module docstring)."""
    if target_name != "trainer":
        return {}
    fields = schema()
    changes = {
        "model": gpu_model(config.get("model", fields["model"]["default"])),
        "dataset": smoke_dataset(config.get("dataset", fields["dataset"]["default"])),
        "device": "cuda",
        "backend": "static",
        "num_gpus": 1,
        "gpus": 1,
        "max_steps": GPU_MAX_STEPS,
        "timing_target": GPU_TIMING_TARGET,
        "timing_min_steps": GPU_TIMING_MIN_STEPS,
        "eval_before_train": False,
        "eval_limit": min(config.get("eval_limit") or GPU_EVAL_LIMIT, GPU_EVAL_LIMIT),
        "export_final": False,
        "compile_update": False,
        "share_prompts": False,
        **_scaled_batches(config, fields, GPU_BATCH_DIVISOR),
    }
    if config.get("teacher_model"):  # OPD: a larger random teacher
        changes["teacher_model"] = gpu_model(config["teacher_model"], GPU_TEACHER_SHAPE)
    return {k: v for k, v in changes.items() if config.get(k, fields.get(k, {}).get("default")) != v}


def smoke(config: dict, target_name: str) -> dict:
    """The smoke profile's changes for one trainer cell (see the module docstring)."""
    if target_name != "trainer":
        return {}
    fields = schema()
    dataset = smoke_dataset(config.get("dataset", fields["dataset"]["default"]))
    changes = {
        "model": "tiny-random",
        "dataset": dataset,
        "device": "cpu",
        "backend": "hf",
        "gpus": 0,
        "max_steps": SMOKE_STEPS,
        "max_generate_length": min(config.get("max_generate_length", SMOKE_GENERATE), SMOKE_GENERATE),
        "max_prompt_length": min(config.get("max_prompt_length", SMOKE_PROMPT), SMOKE_PROMPT),
        "eval_limit": min(config.get("eval_limit") or SMOKE_EVAL_LIMIT, SMOKE_EVAL_LIMIT),
        "eval_n_samples_per_prompt": min(config.get("eval_n_samples_per_prompt", SMOKE_EVAL_SAMPLES),
                                         SMOKE_EVAL_SAMPLES),
        "export_final": False,
        **_scaled_batches(config, fields),
    }
    if config.get("num_gpus"):
        changes["num_gpus"] = 0
    if config.get("teacher_model"):
        # OPD: a tiny random teacher; the trainer builds it from its own seed, so the
        # student has a real KL to close.
        changes["teacher_model"] = "tiny-random"
    if config.get("ckpt_interval", 0) > SMOKE_STEPS:
        changes["ckpt_interval"] = SMOKE_STEPS
    if config.get("timing_target") is not None:
        # Two steps settle no sec/step; the run is a smoke test of the cell, not a measurement.
        changes["timing_target"] = None
    if dataset == "synthetic":
        # Enough prompts for every step of the largest smoke batch, and no more.
        changes["synthetic_size"] = max(64, changes["train_batch_size"] * SMOKE_STEPS)
    return {k: v for k, v in changes.items()
            if k not in config and k not in fields or config.get(k, fields.get(k, {}).get("default")) != v}


@hookimpl
def sweep_validate_cell(cell, session):
    """The trainer's own value rules (ranges, choices, batch divisibility), for well-typed keys.

    Unknown keys and wrong types are the core's to report; checking only the rest
    here keeps each mistake reported once.
    """
    if cell.target.name != "trainer":
        return []
    fields = schema()
    values = {}
    for key, value in cell.target_config().items():
        if key in fields:
            try:
                values[key] = check_type(key, value, fields[key]["type"])
            except ConfigError:
                continue
    try:
        cfg = TrainerConfig.from_dict(values, source="trainer")
    except ConfigError as exc:
        return [line.removeprefix("trainer: ") for line in str(exc).splitlines()]
    if cfg.backend == "vllm":
        warn(session, cell, "backend", VLLM_UNRUN)
    return gpu_count_errors(cfg, cell.launch().get("gpus"))


@hookimpl
def sweep_cell_env(cell, session):
    """A trainer cell's ``torch.compile`` cache (inductor's compiled graphs and Triton
    kernels) in the runs dir, shared by the project's cells and by each cell's chain
    links: a resumed link, or another cell of the same shape, loads what an earlier
    process compiled (``compile_update`` compiles for about a minute per shape) instead
    of compiling it again in its own ``/tmp``. A cache dir set in the environment is kept.
    """
    if cell.target.name != "trainer" or os.environ.get(COMPILE_CACHE_ENV):
        return {}
    return {COMPILE_CACHE_ENV: str(session.runs_dir / COMPILE_CACHE_DIR)}


@hookimpl
def sweep_cell_checkpoints(cell, directory, session):
    """In a cell dir's own ``ckpt/``: every entry but the trainer's :data:`NOT_CHECKPOINTS` and
    half-written files. Whatever the cell's target: a command target may run the trainer
    through a script of its own, and sweepkit's ``{ckpt_dir}`` is where it writes them; a
    checkpoint dir a plugin keeps elsewhere is that plugin's to answer for."""
    own = cell_dir(session.runs_dir, cell) / CKPT_DIR
    if Path(directory) != own:
        return None
    if not own.is_dir():
        return []
    return sorted(entry for entry in own.iterdir()
                  if entry.name not in NOT_CHECKPOINTS and not entry.name.startswith(WRITING_PREFIX))


@hookimpl
def sweep_checkpoint_pointer(cell, entry, session):
    """The trainer's ``latest`` in a cell dir's own ``ckpt/``: it names ``global_step_N``."""
    own = cell_dir(session.runs_dir, cell) / CKPT_DIR
    if Path(entry).name != LATEST_POINTER or Path(entry).parent.resolve() != own.resolve():
        return None
    return "global_step_{}"


@hookimpl
def sweep_export_checkpoint(cell, step_dir, to, session):
    """A checkpoint the trainer wrote (``trainer_state.json`` and ``model.safetensors`` in it),
    whatever the cell's target, converted by ``python -m trainer.export`` in a process of its
    own (sweepkit never imports torch), in the run's compute dtype (which ``trainer.export``
    reads from the ``run_info.json`` beside the checkpoints)."""
    step_dir = Path(step_dir)
    if not all((step_dir / name).is_file() for name in EXPORT_NEEDS):
        return None
    argv = [sys.executable, "-m", "trainer.export", str(step_dir), "--to", str(to)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-20:]
        raise UsageError(f"{cell.nodeid}: python -m trainer.export {step_dir} failed (exit {done.returncode}); "
                         "nothing was written for it", *said)
    return sorted(path for path in Path(to).rglob("*") if path.is_file())


@hookimpl
def sweep_cell_gpus(cell, session):
    """A trainer cell with no ``gpus`` key gets its ``num_gpus`` when that is more than one
    and the run is not on the CPU: the trainer starts one process per GPU and would
    otherwise find none (and train on the CPU). One GPU stays opt-in (``gpus=1``), so a
    plain cell still runs on a machine without GPUs."""
    if cell.target.name != "trainer":
        return None
    config, fields = cell.target_config(), schema()
    num_gpus = config.get("num_gpus", fields["num_gpus"]["default"])
    if config.get("device", fields["device"]["default"]) == "cpu" or not isinstance(num_gpus, int) or num_gpus <= 1:
        return None
    return num_gpus


def gpu_count_errors(cfg: TrainerConfig, gpus) -> list[str]:
    """A cell that hands its job fewer GPUs (``gpus``) than the trainer starts processes on
    (``num_gpus``, one per GPU; a cluster's request follows ``num_gpus`` itself)."""
    if not isinstance(gpus, int) or isinstance(gpus, bool):
        return []  # a mistyped launch key is the core's to report
    if cfg.device != "cpu" and gpus and cfg.num_gpus > gpus:
        return [f"num_gpus={cfg.num_gpus} but gpus={gpus}: the trainer starts one process per GPU of num_gpus "
                f"and needs that many; set gpus={cfg.num_gpus}"]
    return []
