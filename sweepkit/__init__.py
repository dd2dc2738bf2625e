"""sweepkit: grid files of named cells for GRPO / distillation training runs."""

from sweepkit.cell import Cell, Mark, Target
from sweepkit.hookspec import hookimpl

__all__ = ["Cell", "Mark", "Target", "hookimpl"]
