"""``sweep export`` of a SkyRL cell's checkpoint: copy a Hugging Face export SkyRL wrote, or refuse.

SkyRL's FSDP checkpoint (``global_step_N/policy/`` of sharded ``model_state`` /
``optimizer_state`` files, one per rank, NovaSky-AI/SkyRL ``docs/checkpointing-logging``)
can only be gathered into one model by SkyRL's own code, under ``torchrun`` at the world
size it was saved with; ``sweep export`` runs no such job. What it can export is a model
SkyRL already wrote in Hugging Face format, a directory holding ``config.json`` and
``*.safetensors``, looked for in this order (:func:`hf_candidates`):

1. ``global_step_N/policy/huggingface/`` (where SkyRL's FSDP strategy saves the policy's HF
   config and tokenizer, and its weights where the run saved them);
2. ``global_step_N/policy/`` itself, when it holds such a model;
3. ``<export dir>/global_step_N/policy/`` (``hf_save_interval``'s exports; the export dir is
   the checkpoint guard's, ``export_path`` or ``<ckpt dir>/export``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sweepkit.errors import UsageError
from sweepkit_plugins import ckpt_guard


def is_hf_model(directory: Path) -> bool:
    """A directory holding ``config.json`` and at least one ``*.safetensors``."""
    directory = Path(directory)
    return (directory / "config.json").is_file() and any(directory.glob("*.safetensors"))


def hf_candidates(cell, step_dir: Path) -> list[Path]:
    """Where an HF-format export of ``step_dir`` may be, in the order they are tried."""
    step_dir = Path(step_dir)
    found = [step_dir / "policy" / "huggingface", step_dir / "policy"]
    exports = ckpt_guard.export_dir(cell, os.environ)
    if exports is not None:
        found.append(exports / step_dir.name / "policy")
    return found


def export_skyrl_step(cell, step_dir: Path, to: Path) -> list[Path]:
    """Copy the first HF-format export of ``step_dir`` to ``to`` (absent or empty), whole or
    not at all; UsageError naming where it looked when there is none."""
    candidates = hf_candidates(cell, step_dir)
    source = next((candidate for candidate in candidates if is_hf_model(candidate)), None)
    if source is None:
        raise UsageError(
            f"{cell.nodeid}: {step_dir} holds no Hugging Face-format model (config.json and *.safetensors; "
            f"looked in {', '.join(map(str, candidates))}); its FSDP shards need SkyRL's own conversion, run under "
            "torchrun at the world size they were saved with, which sweep export does not run; nothing was written")
    to = Path(to)
    temp = to.with_name(f".tmp-{to.name}")
    shutil.rmtree(temp, ignore_errors=True)
    try:
        shutil.copytree(source, temp, symlinks=False)
        if to.exists():
            to.rmdir()  # empty: sweep export checked
        os.replace(temp, to)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return sorted(path for path in to.rglob("*") if path.is_file())
