"""The end of a sweep: ``sweep export`` (a cell's chosen checkpoint as a Hugging Face model
dir) and ``sweep clean`` (free the checkpoints a finished sweep no longer needs)."""

from sweepkit.end.pick import Checkpoint, Choice, Metric, checkpoints, pick

__all__ = ["Checkpoint", "Choice", "Metric", "checkpoints", "pick"]
