"""Plugins shipped with sweepkit (package ``sweepkit_plugins``): the built-in trainer, clusters."""
