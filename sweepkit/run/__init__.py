"""Cells to runs: plans, the runner, jobs, chains, cancel, failure classes, executors."""
