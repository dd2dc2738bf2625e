"""Advantage estimators, by name: ``advantage_estimator`` picks one from :data:`ESTIMATORS`.

Each takes the step's rewards (B,) or per-token rewards (B, R), the group size and the
config, and returns advantages of the same shape. A new estimator is one function and
one entry here, and its name in ``trainer.names.ADVANTAGE_ESTIMATORS`` (where the config
finds it without torch); the two are checked against each other at import.
"""

from __future__ import annotations

from typing import Callable

import torch

from trainer import names
from trainer.losses import group_advantages


def grpo(rewards: torch.Tensor, group_size: int, cfg) -> torch.Tensor:
    """(r - mean r) / (std r + 1e-6) within each group; Dr.GRPO's r - mean r without the std."""
    return group_advantages(rewards, group_size, norm_by_std=cfg.grpo_norm_by_std)


def no_op(rewards: torch.Tensor, group_size: int, cfg) -> torch.Tensor:
    """The reward itself (per sequence or per token): for rewards that are advantages already,
    such as on-policy distillation's -KL per token."""
    return rewards.clone()


ESTIMATORS: dict[str, Callable[[torch.Tensor, int, object], torch.Tensor]] = {"grpo": grpo, "no_op": no_op}
names.ADVANTAGE_ESTIMATORS.check(ESTIMATORS, registry_name="trainer.advantages.ESTIMATORS")


def advantages_for(rewards: torch.Tensor, group_size: int, cfg) -> torch.Tensor:
    return ESTIMATORS[cfg.advantage_estimator](rewards, group_size, cfg)
