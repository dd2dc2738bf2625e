"""What fails on a cluster whose compute nodes have no internet, found before submitting.

Leonardo's jobs run offline (``HF_HUB_OFFLINE=1``): a model or data set named by its hub
name must be pre-staged on the login node, and sweepkit cannot see inside the cell's venv.
:func:`offline_problems` is what its rules call.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Values of the trainer's path keys that are built locally, never downloaded
#: (``trainer/models.py``, ``trainer/data.py``).
LOCAL_NAMES = ("tiny-random", "synthetic")
LOCAL_PREFIXES = ("random:",)
WARNED_KEY = "clusters.warned"


def hub_names(cell) -> list[tuple[str, str]]:
    """``(key, value)`` of the cell's path keys (the target's schema marks them) whose value
    is a hub name: not a path (collection made every existing relative one absolute), not
    one of the names the trainer builds locally."""
    schema = cell.target.schema or {}
    found = []
    for key, spec in schema.items():
        value = cell.config.get(key)
        if not spec.get("path") or not isinstance(value, str) or not value:
            continue
        if os.path.isabs(value) or value.startswith((".", "~", "$")) or value in LOCAL_NAMES \
                or value.startswith(LOCAL_PREFIXES):
            continue
        found.append((key, value))
    return found


def in_hub_cache(cache: str, value: str) -> bool:
    """Whether ``huggingface_hub``'s cache dir ``cache`` holds a snapshot of repo ``value``
    (``models--org--name`` or ``datasets--org--name``, as ``hf download`` leaves it)."""
    name = value.replace("/", "--")
    return any(any((Path(cache) / f"{kind}--{name}" / "snapshots").glob("*"))
               for kind in ("models", "datasets") if (Path(cache) / f"{kind}--{name}" / "snapshots").is_dir())


def warn(session, cell, key: str, message: str) -> None:
    """Print a warning once per message (the message names the key and value, so every
    cell with that value shares it), with where the first such cell set the key."""
    warned = session.stash.setdefault(WARNED_KEY, set())
    if message in warned:
        return
    warned.add(message)
    file, line = cell.location_of(key)
    session.err_console.print(f"warning: {file}:{line}: {cell.name}: {message}", markup=False, highlight=False)


def submits(session) -> bool:
    """Whether this command submits (``sweep run`` without ``--dry-run``): what a job would
    only find out on a compute node is an error then, and a warning in a preview."""
    options = session.options
    return getattr(options, "command", None) == "run" and not getattr(options, "dry_run", False)


def offline_problems(cell, session, *, hub_cache: str, venv: str | None, cluster: str) -> list[str]:
    """What fails on a cluster whose jobs run offline (``HF_HUB_OFFLINE=1``, no internet).

    - A hub name (``model="Qwen/Qwen2.5-1.5B-Instruct"``, ``dataset="gsm8k"``) with no
      snapshot in the pre-staged cache ``hub_cache``: the job would fail at its first line,
      after its wait in the queue. An error when submitting; in a dry run (or ``list``),
      which is often typed where the cache is not, a warning.
    - ``backend="vllm"``: a warning, always. sweepkit cannot see into the cell's venv; the
      trainer's vLLM engine needs vllm installed there.
    """
    errors = []
    for key, value in hub_names(cell):
        if in_hub_cache(hub_cache, value):
            continue
        message = (f"{key}: {value!r} is a hub name, and {cluster}'s jobs run offline (HF_HUB_OFFLINE=1, "
                   f"no internet on compute nodes) with no snapshot of it in the hub cache {hub_cache}; "
                   f"pre-stage it on the login node (HF_HUB_CACHE={hub_cache} hf download {value}"
                   + (" --repo-type dataset" if key == "dataset" else "")
                   + f") or set {key} to a local path")
        if submits(session):
            errors.append(message)
        else:
            warn(session, cell, key, message + " (an error when submitting)")
    if cell.config.get("backend") == "vllm":
        warn(session, cell, "backend",
             f"backend: 'vllm' needs vllm installed in the cell's venv ({venv or 'none set: $SWEEP_VENV'}); "
             "sweepkit cannot check inside the container, and the trainer's vLLM engine has not been run on any "
             "tested machine; a venv without vllm fails at the first rollout (for the seeds' Leonardo venv: "
             "uv sync --extra vllm); backend='static' runs the trainer's own engine")
    return errors
