"""Executors place prepared cells on machines; the interface is in ``base``."""

from sweepkit.run.executors.base import DONE, QUEUED, RUNNING, Executor, Handle
from sweepkit.run.executors.warm import WarmTarget
from sweepkit.run.job import CellJob

__all__ = ["DONE", "QUEUED", "RUNNING", "CellJob", "Executor", "Handle", "WarmTarget"]
