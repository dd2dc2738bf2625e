"""Executors place prepared cells on machines; the interface is in ``base``."""

from sweepkit.executors.base import DONE, QUEUED, RUNNING, Executor, Handle
from sweepkit.executors.warm import WarmTarget
from sweepkit.job import CellJob

__all__ = ["DONE", "QUEUED", "RUNNING", "CellJob", "Executor", "Handle", "WarmTarget"]
