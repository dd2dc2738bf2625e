"""sweepkit: grid files of named cells for GRPO / distillation training runs."""

from sweepkit.grid.cell import Cell, Mark, Target
from sweepkit.grid.declare import axis, base, cell, command, mark, param, product
from sweepkit.hookspec import hookimpl

__all__ = [
    "Cell",
    "Mark",
    "Target",
    "axis",
    "base",
    "cell",
    "command",
    "hookimpl",
    "mark",
    "param",
    "product",
]
