"""Rollout engines: the one place that turns prompt token ids into sampled completions.

The loop sees only :class:`RolloutEngine`. An engine takes prompts as token-id
lists and returns a :class:`Generation`: device tensors of the sampled ids, their
mask and (when it can) the log-probabilities it sampled them with, so the loop
never re-packs completions row by row and a faster engine replaces another
without touching the loss code.

Engines are registered by name in :data:`ENGINES` (name -> module), which is
``trainer.names.BACKENDS``: the names and modules the config validates against. A
module holds one engine class, exported as ``ENGINE``, with its own constructor from
the config and its own report of the knobs that do nothing under it; :func:`engine_class`
checks, when it imports one, that it does. A backend's module is imported only when it
is selected: ``vllm`` is never imported unless ``backend="vllm"``. Adding an engine is
one module and one line in ``trainer.names``.
"""

from __future__ import annotations

import abc
import importlib
import importlib.util
from typing import Optional

import attrs
import torch

from trainer import names

#: Backend name -> the module that defines it (its ``ENGINE`` attribute is the class); ``auto`` is
#: no engine but a choice between them (``trainer.setup.resolve_backend``).
ENGINES = {name: names.BACKENDS.module(name) for name in names.BACKENDS.implemented_names()}
# A name without its module fails here, not when a run first selects it (nothing is imported).
if missing := [module for module in ENGINES.values() if importlib.util.find_spec(module) is None]:
    raise names.RegistryMismatch(f"trainer.names names backends in {', '.join(missing)}, which do not exist")


class BackendUnavailable(RuntimeError):
    """The selected rollout backend cannot run here (e.g. its package is not installed)."""


@attrs.frozen(kw_only=True, eq=False)
class Generation:
    """Sampled completions as padded device tensors, rows group-contiguous.

    ``response_ids[i, :length_i]`` are row i's sampled tokens, ending with the stop
    token when ``stopped[i]`` (it is trained on, so the policy learns to stop);
    positions past the end hold the pad id and have mask 0. ``logprobs`` are the
    engine's own log-probabilities of those tokens under the distribution it
    sampled from (temperature, top-k and top-p applied), 0 off the mask, or None
    when the engine does not report them.
    """

    response_ids: torch.Tensor  # (B, R) long
    response_mask: torch.Tensor  # (B, R) float, 1 on sampled tokens
    stopped: torch.Tensor  # (B,) bool: ended on a stop token (else ran to the length limit)
    logprobs: Optional[torch.Tensor] = None  # (B, R) float32

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def token_lists(self) -> list[list[int]]:
        """Each row's tokens as a list (one device-to-host copy for the whole batch)."""
        ids = self.response_ids.tolist()
        lengths = self.response_mask.sum(dim=1).long().tolist()
        return [row[:length] for row, length in zip(ids, lengths)]

    @classmethod
    def cut_at_stop(cls, ids: torch.Tensor, stop_ids: torch.Tensor, *, pad_id: int, logprobs=None) -> "Generation":
        """Sampled (B, R) ids (and log-probs) -> each row up to and including its first stop
        token, pad and mask 0 after it, trimmed to the longest row."""
        is_stop = torch.isin(ids, stop_ids).long()
        before = is_stop.cumsum(dim=1) - is_stop  # stop tokens strictly before each position
        mask = (before == 0).float()
        longest = max(1, int(mask.sum(dim=1).max().item()))
        return cls(response_ids=ids.masked_fill(mask == 0, pad_id)[:, :longest], response_mask=mask[:, :longest],
                   stopped=(is_stop.bool() & (before == 0)).any(dim=1),
                   logprobs=(logprobs * mask)[:, :longest] if logprobs is not None else None)

    @classmethod
    def from_rows(cls, rows, *, stopped, pad_id: int, device, logprobs=None) -> "Generation":
        """Build from per-row token lists (engines that produce lists, e.g. vLLM)."""
        longest = max([1, *(len(r) for r in rows)])
        ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), longest))
        values = torch.zeros((len(rows), longest)) if logprobs is not None else None
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1.0
            if values is not None:
                values[i, : len(row)] = torch.tensor(logprobs[i], dtype=torch.float32)
        return cls(response_ids=ids.to(device), response_mask=mask.to(device),
                   stopped=torch.tensor(stopped, dtype=torch.bool, device=device),
                   logprobs=values.to(device) if values is not None else None)

    @classmethod
    def concat(cls, parts: list["Generation"], *, pad_id: int) -> "Generation":
        """Rows of several generations in order, padded to the longest."""
        if len(parts) == 1:
            return parts[0]
        width = max(p.response_ids.shape[1] for p in parts)

        def widen(t, value):
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

        has_logprobs = all(p.logprobs is not None for p in parts)
        return cls(
            response_ids=torch.cat([widen(p.response_ids, pad_id) for p in parts]),
            response_mask=torch.cat([widen(p.response_mask, 0.0) for p in parts]),
            stopped=torch.cat([p.stopped for p in parts]),
            logprobs=torch.cat([widen(p.logprobs, 0.0) for p in parts]) if has_logprobs else None,
        )


@attrs.frozen(kw_only=True)
class SamplingParams:
    """How to sample: ``temperature`` 0 means greedy; ``top_k`` <= 0 and ``top_p`` 1 mean off."""

    n: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 0


class RolloutEngine(abc.ABC):
    """Samples completions for the policy; owns no optimizer and never computes a loss."""

    #: True when :meth:`generate` fills ``Generation.logprobs`` (used by TIS and on-policy updates).
    reports_logprobs: bool = False

    @classmethod
    @abc.abstractmethod
    def from_config(cls, cfg, *, model, tokenizer, device, max_rows: int) -> "RolloutEngine":
        """The engine for a run: ``max_rows`` is the most sequences one call will ask for."""

    @classmethod
    def inert_knobs(cls, cfg) -> dict[str, str]:
        """Config keys that have no effect with this engine, each with the reason."""
        return {}

    @classmethod
    def check_available(cls) -> None:
        """Raise :class:`BackendUnavailable` if this engine cannot run here."""

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> Generation:
        """``params.n`` completions per prompt, group-contiguous: prompt i owns rows ``[i*n, (i+1)*n)``.

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


def engine_class(backend: str) -> type[RolloutEngine]:
    """The engine class registered as ``backend``; imports only its module."""
    if backend not in ENGINES:
        known = ", ".join(repr(name) for name in ENGINES)
        raise ValueError(f"backend: unknown rollout backend {backend!r}; known: {known}")
    engine = getattr(importlib.import_module(ENGINES[backend]), "ENGINE", None)
    if not (isinstance(engine, type) and issubclass(engine, RolloutEngine)):
        raise names.RegistryMismatch(f"trainer.names names backend {backend!r} in {ENGINES[backend]}, which "
                                     f"exports no RolloutEngine as ENGINE")
    return engine


def require_backend(backend: str) -> None:
    """Raise :class:`BackendUnavailable` now, before any model is loaded, if ``backend`` cannot run."""
    if backend != "auto":
        engine_class(backend).check_available()


def make_engine(cfg, *, model, tokenizer, device, max_rows: int, backend: Optional[str] = None) -> RolloutEngine:
    """The engine ``backend`` (default: ``cfg.backend``) names, sampling from ``model``."""
    return engine_class(backend or cfg.backend).from_config(
        cfg, model=model, tokenizer=tokenizer, device=torch.device(device), max_rows=max_rows)


def stop_token_ids(model, tokenizer) -> list[int]:
    """The model's configured end-of-turn ids (Qwen lists two), else the tokenizer's eos."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if configured is None:
        configured = tokenizer.eos_token_id
    if configured is None:
        raise ValueError("neither the model's generation_config nor the tokenizer defines an eos token")
    return list(configured) if isinstance(configured, (list, tuple)) else [configured]


def pad_token_id(tokenizer, stop_ids: list[int]) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]


__all__ = [
    "ENGINES", "BackendUnavailable", "Generation", "RolloutEngine", "SamplingParams", "engine_class",
    "make_engine", "pad_token_id", "require_backend", "stop_token_ids",
]
