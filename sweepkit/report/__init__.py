"""Runs to decisions: the tables, their intervals and verdicts, renderers, compare, suggest, status."""
