"""Rollout engines: the one place that turns prompt token ids into sampled completions.

The loop sees only :class:`RolloutEngine`. An engine takes prompts as token-id
lists and returns completions as token-id lists (plus, when it can, the
log-probabilities it sampled them with), so a faster engine replaces
``transformers.generate`` without touching the loss code. Each backend lives in
its own module and is imported only when selected: ``vllm`` is never imported
unless ``backend="vllm"``.
"""

from __future__ import annotations

import abc
from typing import Optional

import attrs


class BackendUnavailable(RuntimeError):
    """The selected rollout backend cannot run here (e.g. its package is not installed)."""


@attrs.frozen(kw_only=True)
class Completion:
    """One sampled completion of one prompt.

    ``token_ids`` ends with the stop token when ``finish_reason == "stop"``
    (it is trained on, so the policy learns to stop); ``logprobs`` are the
    engine's own log-probabilities of those tokens under the distribution it
    sampled from, or None when the engine does not report them.
    """

    token_ids: tuple[int, ...] = attrs.field(converter=tuple)
    logprobs: Optional[tuple[float, ...]] = attrs.field(default=None)
    finish_reason: str = attrs.field(validator=attrs.validators.in_(("stop", "length")))


class RolloutEngine(abc.ABC):
    """Samples completions for the policy; owns no optimizer and never computes a loss."""

    #: True when :meth:`generate` fills ``Completion.logprobs`` (used by TIS).
    reports_logprobs: bool = False

    @abc.abstractmethod
    def generate(
        self,
        prompts: list[list[int]],
        *,
        n: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
    ) -> list[Completion]:
        """``n`` completions per prompt, group-contiguous: prompt i owns ``[i*n, (i+1)*n)``.

        The same ``seed`` with the same weights gives the same completions
        (as far as the device's kernels are deterministic).
        """

    @abc.abstractmethod
    def sync_weights(self, model) -> None:
        """Make the engine sample from ``model``'s current weights (after each update)."""

    def sleep(self) -> None:
        """Release device memory while the policy trains (colocated engines)."""

    def wake(self) -> None:
        """Take device memory back before the next :meth:`sync_weights` / :meth:`generate`."""


def require_backend(backend: str) -> None:
    """Raise :class:`BackendUnavailable` now, before any model is loaded, if ``backend`` cannot run."""
    if backend == "vllm":
        import trainer.rollout.vllm  # noqa: F401  (its import guard raises the clear error)


def make_engine(cfg, *, model, tokenizer, device) -> RolloutEngine:
    """The engine ``cfg.backend`` names, sampling from ``model``."""
    if cfg.backend == "hf":
        from trainer.rollout.hf import HFEngine

        return HFEngine(model, tokenizer, device=device)
    if cfg.backend == "vllm":
        from trainer.rollout.vllm import VLLMEngine

        return VLLMEngine.from_config(cfg, model=model, tokenizer=tokenizer)
    raise ValueError(f"backend: unknown rollout backend {cfg.backend!r}")


__all__ = ["BackendUnavailable", "Completion", "RolloutEngine", "make_engine", "require_backend"]
