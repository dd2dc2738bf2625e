"""A preload that fails at import: the warm worker refuses, and cells start cold."""

raise RuntimeError("warm_broken: fails at import on purpose")
