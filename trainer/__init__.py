"""A small, real GRPO trainer: a JSON config in, metrics lines and checkpoints out.

It never imports sweepkit; sweepkit reads what it writes.
"""

from trainer.config import ConfigError, TrainerConfig, schema

__all__ = ["ConfigError", "TrainerConfig", "schema"]
