"""Checkpoints that survive being killed mid-write, and never delete a run by accident.

Layout of ``<ckpt-dir>``::

    global_step_N/            one complete checkpoint (appears only by an atomic rename)
      model.safetensors       policy weights
      optimizer.pt            AdamW + lr-scheduler state
      rng.pt                  python, torch and cuda RNG states (of each rank, in a run of several)
      trainer_state.json      step, prompt-sampler position, the run's config, its number of ranks
    latest                    "global_step_N", rewritten atomically after each complete write
    reference.safetensors     the frozen initial policy, written once when a KL loss needs it
    .tmp-global_step_N/       a write in progress; a leftover one is a killed write and is removed
    export/                   save_pretrained policy + tokenizer at the end (export_final)

A checkpoint directory is written in full under a temporary name and renamed
into place, so ``global_step_N`` either exists complete or not at all; the
``latest`` marker moves only after that. A run killed during a write leaves a
``.tmp-*`` directory and the old marker, and resumes from the previous
checkpoint.

A run of several ranks (``trainer.parallel``) writes the same layout: every rank
takes part in :func:`save` (the sharded optimizer state and each rank's RNG states
are gathered) and rank 0 writes, from the full policy it keeps; the weights are
those a one-device run writes. It resumes on as many ranks as it was saved by
(``world_size`` in ``trainer_state.json``; 1 where absent): each rank's RNG states
and its share of the prompts belong to that count, and :func:`check_world_size`
names both counts when they differ.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Optional

import attrs
import safetensors.torch
import torch

from trainer.parallel import SINGLE, Group

STEP_DIR = re.compile(r"^global_step_(\d+)$")
TEMP_PREFIX = ".tmp-"
LATEST = "latest"
REFERENCE = "reference.safetensors"


class CheckpointError(RuntimeError):
    """The checkpoint directory does not allow what was asked (e.g. a fresh run over old steps)."""


@attrs.frozen(kw_only=True)
class Resumed:
    """What a loaded checkpoint hands back to the loop besides the restored objects."""

    step: int
    sampler_state: dict[str, Any]
    path: Path


def step_dirs(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """Complete ``global_step_N`` directories, oldest first."""
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return sorted(found)


def remove_stale_writes(ckpt_dir: Path) -> list[Path]:
    """Delete temp directories left by a write that was killed; returns what was removed."""
    stale = [p for p in ckpt_dir.glob(TEMP_PREFIX + "*")] if ckpt_dir.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    return stale


def find_latest(ckpt_dir: Path) -> Optional[Path]:
    """The checkpoint to resume from: the one ``latest`` names, else the newest complete one.

    The fallback covers a kill between the directory rename and the marker
    update; both are complete checkpoints, so the newer one wins.
    """
    complete = step_dirs(ckpt_dir)
    if not complete:
        return None
    newest = complete[-1][1]
    marker = ckpt_dir / LATEST
    if marker.is_file():
        named = ckpt_dir / marker.read_text().strip()
        if STEP_DIR.match(named.name) and named.is_dir() and _step_of(named) >= _step_of(newest):
            return named
    return newest


def plan_start(ckpt_dir: Path, resume_mode: Optional[str]) -> Optional[Path]:
    """Decide, before anything heavy loads, where the run starts: a checkpoint path or None (fresh).

    ``resume_mode=None`` refuses to start over existing ``global_step_*``
    directories instead of deleting them: clearing a checkpoint dir is the
    user's decision, never a default.
    """
    if resume_mode is None:
        existing = step_dirs(ckpt_dir)
        if existing:
            names = ", ".join(p.name for _, p in existing)
            raise CheckpointError(
                f"resume_mode=null (fresh run) but {ckpt_dir} already holds {names}; "
                f"pass resume_mode=latest to continue that run, or remove the directory yourself "
                f"for a clean re-run (nothing was deleted)")
        return None
    if resume_mode == "latest":
        return find_latest(ckpt_dir)
    raise CheckpointError(f"resume_mode: unknown value {resume_mode!r}")


def check_world_size(path: Path, world: int) -> None:
    """Raise :class:`CheckpointError` when the checkpoint at ``path`` was saved by another number of ranks."""
    state_file = path / "trainer_state.json"
    if not state_file.is_file():
        return  # an incomplete checkpoint: load() names what is missing
    saved = int(json.loads(state_file.read_text()).get("world_size", 1))
    if saved != world:
        raise CheckpointError(
            f"{path} was saved by a run of {saved} process(es) and this run has {world} "
            f"(num_gpus on CUDA, num_cpu_ranks on the CPU): a checkpoint resumes on the number of processes "
            f"that saved it, whose RNG states and prompt shares it holds; set it back to {saved}")


def save(ckpt_dir: Path, step: int, *, model, optimizer, scheduler, sampler_state: dict, config: dict,
         group: Group = SINGLE) -> Path:
    """Write ``global_step_<step>`` atomically and move the ``latest`` marker to it.

    With a ``group`` of several ranks every rank calls it, ``optimizer`` gathers
    the full state (``trainer.parallel.FullOptimizerState``) and ``model`` is the
    full policy; rank 0 writes, and all return once it has.
    """
    states = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    rng = group.gather_objects(_rng_state())
    final = ckpt_dir / f"global_step_{step}"
    if group.is_main:
        state = {"step": step, "sampler": sampler_state, "config": config, "world_size": group.world}
        _write(ckpt_dir, final, model=model, states=states, rng=rng[0] if len(rng) == 1 else {"per_rank": rng},
               state=state)
    group.barrier()
    return final


def _write(ckpt_dir: Path, final: Path, *, model, states: dict, rng: dict, state: dict) -> None:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    name = final.name
    temp = ckpt_dir / f"{TEMP_PREFIX}{name}"
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    # save_model handles tied embeddings, which save_file refuses as shared storage.
    safetensors.torch.save_model(model, str(temp / "model.safetensors"))
    torch.save(states, temp / "optimizer.pt")
    torch.save(rng, temp / "rng.pt")
    (temp / "trainer_state.json").write_text(json.dumps(state, indent=1))
    _fsync_tree(temp)
    if final.exists():
        # A rerun past a resumed step rewrites it; the old one is moved away before being removed,
        # so a kill in between leaves a stale temp dir, never a half-deleted checkpoint.
        doomed = ckpt_dir / f"{TEMP_PREFIX}old-{name}"
        os.replace(final, doomed)
        os.replace(temp, final)
        shutil.rmtree(doomed, ignore_errors=True)
    else:
        os.replace(temp, final)
    write_atomic(ckpt_dir / LATEST, name + "\n")


def load(path: Path, *, model, optimizer, scheduler, device, group: Group = SINGLE) -> Resumed:
    """Restore model, optimizer, scheduler and RNG states from ``path``; return step and sampler state.

    Every rank of a ``group`` loads: ``model`` is its full policy, ``optimizer`` takes
    the full state and keeps its shard, and the RNG states are the rank's own.
    """
    missing = [f for f in ("model.safetensors", "optimizer.pt", "rng.pt", "trainer_state.json")
               if not (path / f).is_file()]
    if missing:
        raise CheckpointError(f"{path}: incomplete checkpoint, missing {', '.join(missing)}")
    check_world_size(path, group.world)
    safetensors.torch.load_model(model, str(path / "model.safetensors"), device=str(device))
    states = torch.load(path / "optimizer.pt", map_location=device, weights_only=True)
    optimizer.load_state_dict(states["optimizer"])
    scheduler.load_state_dict(states["scheduler"])
    rng = torch.load(path / "rng.pt", weights_only=False)
    _set_rng_state(rng["per_rank"][group.rank] if "per_rank" in rng else rng)
    state = json.loads((path / "trainer_state.json").read_text())
    return Resumed(step=int(state["step"]), sampler_state=state["sampler"], path=path)


def save_reference(ckpt_dir: Path, model) -> Path:
    """Keep the initial policy, so a resumed KL loss compares against the same reference.

    Written at the start of a fresh run, replacing (atomically) a reference that an
    earlier run left behind without any checkpoint to resume."""
    target = ckpt_dir / REFERENCE
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    temp = ckpt_dir / f"{TEMP_PREFIX}{REFERENCE}"
    safetensors.torch.save_model(model, str(temp))
    os.replace(temp, target)
    return target


def load_reference(ckpt_dir: Path, model, device) -> bool:
    """Load the saved initial policy into ``model``; False when none was saved."""
    target = ckpt_dir / REFERENCE
    if not target.is_file():
        return False
    safetensors.torch.load_model(model, str(target), device=str(device))
    return True


@contextlib.contextmanager
def _quiet_saving():
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def export(ckpt_dir: Path, model, tokenizer, *, dtype: Optional[torch.dtype] = None) -> Path:
    """``save_pretrained`` the policy and tokenizer to ``<ckpt-dir>/export``, replacing an older export.

    ``dtype`` is the dtype the export is written in (the run's compute dtype: bf16 for a
    GPU run, as published checkpoints are), whatever the fp32 master weights are.
    """
    final = ckpt_dir / "export"
    temp = ckpt_dir / f"{TEMP_PREFIX}export"
    shutil.rmtree(temp, ignore_errors=True)
    write_pretrained(temp, model, tokenizer, dtype=dtype)
    if final.exists():
        doomed = ckpt_dir / f"{TEMP_PREFIX}old-export"
        os.replace(final, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    os.replace(temp, final)
    return final


def write_pretrained(directory: Path, model, tokenizer, *, dtype: Optional[torch.dtype] = None) -> None:
    """``save_pretrained`` the model (its ``config.json``, safetensors weights and
    ``generation_config.json``) and the tokenizer into ``directory``, the weights in ``dtype``
    (None: as they are); ``config.json`` then names that dtype. Shared by the end of a run
    (:func:`export`) and ``python -m trainer.export`` (a chosen step, after the run)."""
    master = next(model.parameters()).dtype
    with _quiet_saving():  # a shard progress bar per export is noise in a cell's stderr.log
        if dtype is None or dtype == master:
            model.save_pretrained(directory)
        else:
            state = {name: tensor.to(dtype) if tensor.is_floating_point() else tensor
                     for name, tensor in model.state_dict().items()}
            model.save_pretrained(directory, state_dict=state)
            config = Path(directory) / "config.json"  # save_pretrained records the masters' dtype
            written = json.loads(config.read_text())
            written["dtype"] = str(dtype).removeprefix("torch.")
            config.write_text(json.dumps(written, indent=2) + "\n")
    tokenizer.save_pretrained(directory)


def write_atomic(path: Path, text: str) -> None:
    temp = path.with_name(f"{TEMP_PREFIX}{path.name}")
    with open(temp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def _step_of(path: Path) -> int:
    return int(STEP_DIR.match(path.name).group(1))


def _fsync_tree(directory: Path) -> None:
    # Without this a power loss after the rename could leave a complete-looking dir of empty files.
    for path in directory.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())


def _rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
