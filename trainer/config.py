"""The trainer's configuration: one frozen attrs class, flat keys named as in SkyRL.

This module imports attrs and the standard library only (and :mod:`trainer.names`, which
does the same), so that sweepkit's trainer plugin can validate grid files against
:func:`schema` without torch. The keys that pick a named part (``backend``,
``decode_attention``, ``advantage_estimator``, ``policy_loss_type``, ``loss_reduction``,
``kl_estimator_type``) take their choices and help text from :mod:`trainer.names`.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Union

import attrs

from trainer import names
from trainer.names import Names

RESUME_MODES = (None, "latest")


class ConfigError(ValueError):
    """A config key is unknown or has a bad value; the message names the key."""


def _positive(instance, attribute, value):
    if value is None:
        return
    if value <= 0:
        raise ConfigError(f"{attribute.name}: must be > 0, got {value!r}")


def _non_negative(instance, attribute, value):
    if value < 0:
        raise ConfigError(f"{attribute.name}: must be >= 0, got {value!r}")


def _at_least(lowest):
    def check(instance, attribute, value):
        if value < lowest:
            raise ConfigError(f"{attribute.name}: must be >= {lowest}, got {value!r}")

    return check


def _below_one(instance, attribute, value):
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"{attribute.name}: must be in [0, 1), got {value!r}")


def _open_fraction(instance, attribute, value):
    if value is None:
        return
    if not 0.0 < value < 1.0:
        raise ConfigError(f"{attribute.name}: must be in (0, 1), got {value!r}")


def _fraction(instance, attribute, value):
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"{attribute.name}: must be in (0, 1], got {value!r}")


def _choice(choices):
    def check(instance, attribute, value):
        if value not in choices:
            shown = ", ".join(repr(c) for c in choices)
            raise ConfigError(f"{attribute.name}: must be one of {shown}, got {value!r}")

    return check


def _named(choices: Names, default: str):
    """A key that picks one of ``choices``: its validator and help text come from :mod:`trainer.names`."""
    return attrs.field(default=default, validator=_choice(choices.choices()), metadata=_doc(choices.help()))


def _doc(text: str, *, path: bool = False) -> dict:
    """Field metadata: its help text, and whether its value may be a filesystem path (a
    sweep takes such a value, when relative, from the project root, not the cell dir)."""
    return {"doc": text, "path": path}


@attrs.frozen(kw_only=True)
class TrainerConfig:
    """Every knob of one training run. Keys are SkyRL's where SkyRL has one."""

    # -- model and data ------------------------------------------------------
    model: str = attrs.field(default="tiny-random", metadata=_doc(
        "HF model path or hub name, or 'tiny-random' (built locally, no download).", path=True))
    dataset: str = attrs.field(default="synthetic", metadata=_doc(
        "'synthetic' (built-in learnable task), 'gsm8k' (hub, needs network), or a "
        "directory / .jsonl / .parquet path holding GSM8K question/answer rows or MATH "
        "problem/solution (or answer) rows; the rows' fields choose the task.", path=True))
    train_split: str = attrs.field(default="train", metadata=_doc("split used for training"))
    eval_split: str = attrs.field(default="test", metadata=_doc("held-out split for eval"))
    eval_limit: Optional[int] = attrs.field(default=None, validator=_positive, metadata=_doc(
        "evaluate on the first N held-out prompts only (None: all)"))
    synthetic_size: int = attrs.field(default=512, validator=_positive, metadata=_doc(
        "number of generated prompts per split for dataset='synthetic'"))
    format_reward_coef: float = attrs.field(default=0.0, validator=_non_negative, metadata=_doc(
        "reward shaping: credit for a well-formed '#### <number>' answer that is wrong"))

    # -- batch shape ------------------------------------------------------------
    train_batch_size: int = attrs.field(default=32, validator=_positive, metadata=_doc(
        "prompts per step"))
    policy_mini_batch_size: int = attrs.field(default=32, validator=_positive, metadata=_doc(
        "prompts per optimizer step; train_batch_size / policy_mini_batch_size updates a step"))
    micro_train_batch_size_per_gpu: Optional[int] = attrs.field(default=None, validator=_positive, metadata=_doc(
        "sequences per forward/backward (gradient accumulation unit); null (default): micro-batches "
        "packed by tokens within the memory budget (trainer/packing.py)"))
    micro_train_tokens_per_gpu: Optional[int] = attrs.field(default=None, validator=_positive, metadata=_doc(
        "padded tokens per packed micro-batch; null: from train_memory_gb on a GPU (at most 32768), "
        "4096 on the CPU; no effect when micro_train_batch_size_per_gpu is set"))
    train_memory_gb: Optional[float] = attrs.field(default=None, validator=_positive, metadata=_doc(
        "device memory the update's packed micro-batches may fill, in GB; null: 90% of the card, at most "
        "56 (an A100-64GB's worth)"))
    micro_forward_batch_size_per_gpu: int = attrs.field(default=16, validator=_positive, metadata=_doc(
        "sequences per no-grad forward (old / reference logprobs)"))
    n_samples_per_prompt: int = attrs.field(default=4, validator=_positive, metadata=_doc(
        "completions sampled per prompt (the GRPO group size)"))
    max_prompt_length: int = attrs.field(default=512, validator=_positive, metadata=_doc(
        "prompt tokens; longer prompts are left-truncated"))
    max_generate_length: int = attrs.field(default=512, validator=_positive, metadata=_doc(
        "new tokens per completion"))

    # -- optimisation -------------------------------------------------------------
    lr: float = attrs.field(default=1e-6, validator=_positive, metadata=_doc("AdamW learning rate"))
    weight_decay: float = attrs.field(default=0.0, validator=_non_negative, metadata=_doc(
        "AdamW weight decay"))
    adam_betas: tuple[float, float] = attrs.field(default=(0.9, 0.999), converter=tuple, metadata=_doc(
        "AdamW betas"))
    num_warmup_steps: int = attrs.field(default=0, validator=_non_negative, metadata=_doc(
        "linear lr warm-up, in optimizer steps"))
    max_grad_norm: float = attrs.field(default=1.0, validator=_positive, metadata=_doc(
        "gradient-norm clip"))
    epochs: int = attrs.field(default=1, validator=_positive, metadata=_doc("passes over the train split"))
    max_steps: Optional[int] = attrs.field(default=None, validator=_positive, metadata=_doc(
        "stop after this many steps (None: run all epochs)"))

    # -- measure until sure: a timing run stops itself (trainer.timing) -----------------------
    timing_target: Optional[float] = attrs.field(default=None, validator=_open_fraction, metadata=_doc(
        "measure until sure: end the run, complete (its final eval and checkpoint, a kind='stop' "
        "metrics record saying why), once the timing_level interval of its steady-state sec/step "
        "(the steps after the warm-up their times show; a resumed run counts its earlier steps) is "
        "within this fraction of the mean: 0.02 stops at +-2 %; max_steps stays the cap (None: off)"))
    timing_level: float = attrs.field(default=0.95, validator=_open_fraction, metadata=_doc(
        "confidence level of timing_target's sec/step interval"))
    timing_min_steps: int = attrs.field(default=5, validator=_at_least(2), metadata=_doc(
        "timed steps (after warm-up) the sec/step must rest on before timing_target may end the "
        "run: a few alike steps can give a narrow interval by chance"))

    # -- algorithm -------------------------------------------------------------------
    advantage_estimator: str = _named(names.ADVANTAGE_ESTIMATORS, "grpo")
    grpo_norm_by_std: bool = attrs.field(default=True, metadata=_doc(
        "divide group advantages by the group std (False: Dr.GRPO)"))
    policy_loss_type: str = _named(names.POLICY_LOSS_TYPES, "ppo")
    loss_reduction: str = _named(names.LOSS_REDUCTIONS, "token_mean")
    eps_clip_low: float = attrs.field(default=0.2, validator=_below_one, metadata=_doc(
        "PPO clip below 1"))
    eps_clip_high: float = attrs.field(default=0.2, validator=_non_negative, metadata=_doc(
        "PPO clip above 1 (0.28: DAPO clip-higher)"))
    use_kl_loss: bool = attrs.field(default=False, metadata=_doc(
        "add a KL loss against the frozen reference policy"))
    kl_loss_coef: float = attrs.field(default=0.001, validator=_non_negative, metadata=_doc(
        "weight of the KL loss"))
    kl_estimator_type: str = _named(names.KL_ESTIMATORS, "k3")
    use_entropy_loss: bool = attrs.field(default=False, metadata=_doc("add an entropy bonus"))
    entropy_loss_coef: float = attrs.field(default=0.01, validator=_non_negative, metadata=_doc(
        "weight of the entropy bonus"))
    use_tis: bool = attrs.field(default=False, metadata=_doc(
        "truncated importance sampling for rollout-vs-trainer logprob mismatch"))
    tis_imp_ratio_cap: float = attrs.field(default=2.0, validator=_positive, metadata=_doc(
        "cap C of the TIS weight min(pi_old / mu_rollout, C)"))

    # -- on-policy distillation (trainer.distill) ------------------------------------------
    teacher_model: Optional[str] = attrs.field(default=None, metadata=_doc(
        "OPD: the frozen teacher (HF path, hub name, 'tiny-random', or another run's export/); "
        "None: no teacher", path=True))
    teacher_top_k: int = attrs.field(default=0, validator=_non_negative, metadata=_doc(
        "OPD: 0 scores the sampled token's reverse KL (k1); K > 0 the KL over the teacher's "
        "top-K ids plus a tail bucket (the seed's TOPK)"))
    teacher_micro_batch_size: int = attrs.field(default=16, validator=_positive, metadata=_doc(
        "OPD: sequences per teacher scoring forward"))
    use_kl_in_reward: bool = attrs.field(default=False, metadata=_doc(
        "OPD: the per-token reward is -KL(student || teacher) (needs teacher_model)"))

    # -- sampling ----------------------------------------------------------------------
    temperature: float = attrs.field(default=1.0, validator=_positive, metadata=_doc("rollout temperature"))
    top_p: float = attrs.field(default=1.0, validator=_fraction, metadata=_doc("rollout nucleus sampling"))
    top_k: int = attrs.field(default=-1, validator=_at_least(-1), metadata=_doc(
        "rollout top-k sampling (-1 or 0: off)"))
    eval_temperature: float = attrs.field(default=0.6, validator=_positive, metadata=_doc(
        "sampling temperature for pass@k eval"))
    eval_n_samples_per_prompt: int = attrs.field(default=4, validator=_positive, metadata=_doc(
        "k of the pass@k eval"))

    # -- rollout engine and placement -------------------------------------------------
    backend: str = _named(names.BACKENDS, "auto")
    device: str = attrs.field(default="auto", validator=_choice(("auto", "cpu", "cuda")), metadata=_doc(
        "'auto' takes cuda when available"))
    dtype: str = attrs.field(default="auto", validator=_choice(("auto", "float32", "bfloat16")),
                             metadata=_doc("compute dtype ('auto': bfloat16 on cuda, float32 on cpu); "
                                           "master weights and optimizer state are always float32"))
    gpu_memory_utilization: float = attrs.field(default=0.7, validator=_fraction, metadata=_doc(
        "share of GPU memory the rollout engine may fill (its weights and KV cache), counting what "
        "is in use when it starts"))
    enforce_eager: bool = attrs.field(default=True, metadata=_doc(
        "False lets the engine capture its decode steps in CUDA graphs"))
    compile_decode: bool = attrs.field(default=True, metadata=_doc(
        "torch.compile the static engine's decode step inside its CUDA graphs (fuses its small "
        "kernels; costs seconds of compilation per batch-size bucket on a run's first steps)"))
    decode_attention: str = _named(names.DECODE_ATTENTIONS, "auto")
    decode_pdl: bool = attrs.field(default=True, metadata=_doc(
        "on CUDA devices of compute capability 9 and later, launch the static engine's Triton decode "
        "kernels with programmatic dependent launch (each starts while the one before it drains); "
        "false launches them plainly"))
    colocate_all: bool = attrs.field(default=True, metadata=_doc(
        "policy and rollout engines share the GPUs (engines sleep during training)"))
    num_inference_engines: int = attrs.field(default=1, validator=_positive, metadata=_doc(
        "rollout engine replicas"))
    inference_tp: int = attrs.field(default=1, validator=_positive, metadata=_doc(
        "tensor-parallel size of each rollout engine"))
    reshard_after_forward: bool = attrs.field(default=True, metadata=_doc(
        "FSDP2 reshard_after_forward of the sharded policy (runs of more than one process)"))
    num_gpus: int = attrs.field(default=1, validator=_non_negative, metadata=_doc(
        "GPUs of one node the policy trains on: one process per GPU, the policy sharded with "
        "FSDP2, one rollout engine per process (0 means CPU)"))
    num_cpu_ranks: int = attrs.field(default=1, validator=_positive, metadata=_doc(
        "processes a CPU run trains on (gloo, the policy sharded with FSDP2): num_gpus's "
        "counterpart without GPUs, for testing the multi-process path"))
    gradient_checkpointing: bool = attrs.field(default=False, metadata=_doc(
        "recompute activations in backward to save memory"))
    fused_logprobs: bool = attrs.field(default=True, metadata=_doc(
        "on CUDA, compute the lm_head's log-prob and entropy chunks with torch.compile'd fused "
        "expressions (a few seconds of compilation on the first step)"))

    compile_update: bool = attrs.field(default=True, metadata=_doc(
        "on CUDA, torch.compile the policy's decoder layers (one graph they share) for the "
        "update's forward and backward; row widths are padded to multiples of 128 so that a "
        "run compiles a few shapes only (each costs its compilation once, on the first step "
        "that meets it)"))
    share_prompts: bool = attrs.field(default=True, metadata=_doc(
        "run each group's prompt once in the update's and the scorers' forwards, its samples "
        "attending to that one copy through a mask (flex attention on CUDA, a dense mask on the "
        "CPU): a quarter fewer tokens at n=4, 256-token prompts and 512-token responses; false: "
        "each sample's row runs its own copy of the prompt (trainer/shared_prompt.py); one GPU or "
        "the CPU, without gradient_checkpointing"))

    # -- schedule, checkpoints, logging ------------------------------------------------
    eval_interval: int = attrs.field(default=0, validator=_non_negative, metadata=_doc(
        "evaluate every N steps (0: only before the first and after the last step)"))
    eval_before_train: bool = attrs.field(default=True, metadata=_doc("evaluate at step 0"))
    ckpt_interval: int = attrs.field(default=0, validator=_non_negative, metadata=_doc(
        "checkpoint every N steps (0: only at the end)"))
    resume_mode: Optional[str] = attrs.field(default=None, validator=_choice(RESUME_MODES), metadata=_doc(
        "None: fresh, refuses existing global_step_*; 'latest': resume exactly"))
    export_final: bool = attrs.field(default=True, metadata=_doc(
        "save_pretrained the final policy under <ckpt_dir>/export"))
    seed: int = attrs.field(default=42, metadata=_doc("seed of data order, sampling and init"))
    progress_bar: bool = attrs.field(default=True, metadata=_doc(
        "show a progress bar when stdout is a terminal"))

    def __attrs_post_init__(self):
        if self.train_batch_size % self.policy_mini_batch_size:
            raise ConfigError(
                f"train_batch_size: {self.train_batch_size} is not a multiple of "
                f"policy_mini_batch_size={self.policy_mini_batch_size}")
        if (self.teacher_model is None) == self.use_kl_in_reward:
            raise ConfigError(
                "use_kl_in_reward: on-policy distillation needs both teacher_model and use_kl_in_reward=true "
                f"(got teacher_model={self.teacher_model!r}, use_kl_in_reward={self.use_kl_in_reward}); "
                "the KL in the reward is the one to the teacher")
        if self.teacher_model is not None and self.advantage_estimator != "no_op":
            raise ConfigError(
                f"advantage_estimator: OPD's per-token -KL rewards are the advantages: set "
                f"advantage_estimator='no_op' (got {self.advantage_estimator!r})")
        if self.advantage_estimator == "grpo" and self.n_samples_per_prompt < 2:
            # A group of one has no baseline: its GRPO advantage is 0 and nothing is learned.
            raise ConfigError(
                f"n_samples_per_prompt: GRPO needs at least 2 samples per prompt, got "
                f"{self.n_samples_per_prompt}")
        if self.timing_target is not None and self.max_steps is not None and self.timing_min_steps > self.max_steps:
            raise ConfigError(
                f"timing_min_steps: {self.timing_min_steps} is above max_steps={self.max_steps}: the run would "
                f"end before the rule could stop it")

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> "TrainerConfig":
        """Build from a plain mapping; every unknown key and bad value is reported at once."""
        fields = schema()
        errors = []
        values = {}
        for key, value in data.items():
            if key not in fields:
                errors.append(f"{source}: unknown key {key!r}{did_you_mean(key, fields)}")
                continue
            try:
                values[key] = check_type(key, value, fields[key]["type"])
            except ConfigError as exc:
                errors.append(f"{source}: {exc}")
        if errors:
            raise ConfigError("\n".join(errors))
        try:
            return cls(**values)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    @classmethod
    def from_json(cls, path: str | Path, overrides: list[str] = ()) -> "TrainerConfig":
        """Read a JSON config file, then apply ``key=value`` overrides (values parsed as JSON)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a JSON object of config keys")
        for item in overrides:
            key, sep, text = item.partition("=")
            if not sep:
                raise ConfigError(f"override {item!r}: expected key=value")
            data[key.strip()] = parse_value(text)
        return cls.from_dict(data, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def parse_value(text: str) -> Any:
    """A command-line value: JSON when it parses (1e-6, true, null, [1,2]), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def did_you_mean(key: str, known) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _type_name(tp) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "list[" + ", ".join(_type_name(a) for a in typing.get_args(tp)) + "]"
    return getattr(tp, "__name__", str(tp))


def check_type(key: str, value: Any, tp) -> Any:
    """Return ``value`` if it fits the annotation ``tp`` (ints widen to floats), else raise."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        for option in typing.get_args(tp):
            try:
                return check_type(key, value, option)
            except ConfigError:
                continue
    elif tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin is tuple:
        args = typing.get_args(tp)
        if isinstance(value, (list, tuple)) and len(value) == len(args):
            return tuple(check_type(key, v, a) for v, a in zip(value, args))
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def schema() -> Mapping[str, Mapping[str, Any]]:
    """Every key of :class:`TrainerConfig`: ``{name: {"type", "type_name", "default", "doc", "path"}}``;
    ``path`` is True for the keys whose value may be a filesystem path (``model``, ``dataset``).

    Published for sweepkit's validation of grid files; needs neither torch nor transformers.
    Built once per process (``typing.get_type_hints`` evaluates every annotation, and
    validation asks once per cell) and shared, so it is read-only: copy it to change it.
    """
    return _schema()


@functools.cache
def _schema() -> Mapping[str, Mapping[str, Any]]:
    hints = typing.get_type_hints(TrainerConfig)
    out = {}
    for field in attrs.fields(TrainerConfig):
        out[field.name] = types.MappingProxyType({
            "type": hints[field.name],
            "type_name": _type_name(hints[field.name]),
            "default": field.default,
            "doc": field.metadata.get("doc", ""),
            "path": field.metadata.get("path", False),
        })
    return types.MappingProxyType(out)
