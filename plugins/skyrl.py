"""SkyRL's entry point as a target: the cell's settings reach it as Hydra overrides.

A cell targets SkyRL when its command runs a ``skyrl_train`` entry point
(``target = sk.command("{python}", "-m", "skyrl_train.entrypoints.main_base")``, with
``--config-name`` and the like of its recipe after it when it needs them).
SkyRL reads no config file of sweepkit's: everything the cell sets is appended to its
command line as ``++path=value`` (Hydra's add-or-override, last one wins), through the
``sweep_cell_args`` hook, on every executor and cluster. What is appended, in order
(:func:`hydra_overrides`):

1. the cell's diff against ``base`` (``base`` stands for the recipe yaml), flat grid names
   mapped to their Hydra path by :data:`SKYRL_PATHS`, dotted keys taken as paths;
2. the cell's own checkpoint and export dirs when a checkpoint root is configured
   (:mod:`sweepkit_plugins.ckpt_guard`);
3. the resume mode, always explicit: ``latest`` for a resumed run (``--resume``, a chain
   link), else the cell's own mode, else ``null`` (an unset mode once let a launcher fall
   back to its destructive default);
4. the ``hydra_overrides`` launch key, verbatim.

A bare top-level key, which Hydra resolves against the struct root and rejects with
``ConfigKeyError``, is refused at validation, as is a ``hydra_overrides`` entry that is not
``++section.key=value``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from sweepkit.hookspec import hookimpl
from sweepkit_plugins import ckpt_guard

ENTRY_POINT = "skyrl_train.entrypoints.main_base"

#: The flat names grids use, and where SkyRL keeps them. A dotted key is a path already.
SKYRL_PATHS = {
    "model": "trainer.policy.model.path",
    "lr": "trainer.policy.optimizer_config.lr",
    "epochs": "trainer.epochs",
    "strategy": "trainer.strategy",
    "train_batch_size": "trainer.train_batch_size",
    "policy_mini_batch_size": "trainer.policy_mini_batch_size",
    "micro_train_batch_size_per_gpu": "trainer.micro_train_batch_size_per_gpu",
    "micro_forward_batch_size_per_gpu": "trainer.micro_forward_batch_size_per_gpu",
    "max_prompt_length": "trainer.max_prompt_length",
    "ckpt_interval": "trainer.ckpt_interval",
    "resume_mode": "trainer.resume_mode",
    "advantage_estimator": "trainer.algorithm.advantage_estimator",
    "use_kl_loss": "trainer.algorithm.use_kl_loss",
    "kl_loss_coef": "trainer.algorithm.kl_loss_coef",
    "eps_clip_high": "trainer.algorithm.eps_clip_high",
    "colocate_all": "trainer.placement.colocate_all",
    "n_samples_per_prompt": "generator.n_samples_per_prompt",
    "gpu_memory_utilization": "generator.gpu_memory_utilization",
    "enforce_eager": "generator.enforce_eager",
    "num_inference_engines": "generator.num_inference_engines",
    "inference_tp": "generator.inference_engine_tensor_parallel_size",
    "backend": "generator.backend",
    "max_generate_length": "generator.sampling_params.max_generate_length",
    "temperature": "generator.sampling_params.temperature",
    "env_class": "environment.env_class",
}
_PATH = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)+$")
_USER_OVERRIDE = re.compile(r"^\+\+(?P<key>[^=\s]+)=(?P<value>.*)$", re.DOTALL)
_PLAIN = re.compile(r"^[\w./:@+-]+$")


def targets_skyrl(cell) -> bool:
    """True when the cell's command runs a SkyRL entry point (``skyrl_train.entrypoints...``)."""
    return any("skyrl_train" in part for part in cell.target.argv)


def hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar: null, true/false, numbers, quoted strings, lists."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    text = str(value)
    if _PLAIN.match(text) and text not in ("null", "true", "false"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def hydra_path(key: str) -> str | None:
    """Where a cell key lives in SkyRL's config, or None for a bare key Hydra would reject."""
    if _PATH.match(key):
        return key
    return SKYRL_PATHS.get(key)


def _diff_keys(cell) -> list[str]:
    # The resume mode is appended on its own (always explicit), so the diff never repeats it.
    return [key for key in cell.diff if key not in cell.launch_keys and key not in ckpt_guard.RESUME_KEYS]


def hydra_override_errors(cell) -> list[str]:
    if not targets_skyrl(cell):
        return []
    errors = []
    for key in _diff_keys(cell):
        if hydra_path(key) is None:
            errors.append(f"{key!r} is a bare top-level key: Hydra resolves it against the struct "
                          f"root and fails with ConfigKeyError; name its full path, e.g. "
                          f"'trainer.{key}' (known flat names: {', '.join(sorted(SKYRL_PATHS))})")
    for override in cell.launch().get("hydra_overrides") or ():
        match = _USER_OVERRIDE.match(str(override))
        if not match or not _PATH.match(match["key"]):
            errors.append(f"hydra_overrides: {override!r} is not a struct-safe override; write "
                          "'++section.key=value' with the full dotted path "
                          "(e.g. '++trainer.enable_db_registration=false')")
    return errors


def resume_mode(cell, *, resume: bool):
    """The mode SkyRL gets: ``latest`` for a resumed run, else the cell's own, else None."""
    if resume:
        return "latest"
    mode = ckpt_guard.resume_mode_of(cell)
    return None if mode is ckpt_guard.MISSING else mode


def hydra_overrides(cell, *, resume: bool = False) -> list[str]:
    """The Hydra arguments of a SkyRL cell, appended after its entry point (see the module
    docstring for their order); empty for a cell that does not target SkyRL."""
    if not targets_skyrl(cell):
        return []
    out = [f"++{hydra_path(key)}={hydra_value(cell.config[key])}"
           for key in _diff_keys(cell) if key in cell.config and hydra_path(key)]
    ckpt_dir = ckpt_guard.ckpt_dir_of(cell, os.environ)
    if ckpt_dir is not None:
        out.append(f"++trainer.ckpt_path={hydra_value(str(ckpt_dir))}")
        out.append(f"++trainer.export_path={hydra_value(str(ckpt_guard.export_dir(cell, os.environ)))}")
    out.append(f"++trainer.resume_mode={hydra_value(resume_mode(cell, resume=resume))}")
    out += [str(override) for override in cell.launch().get("hydra_overrides") or ()]
    return out


@hookimpl
def sweep_register_keys(register):
    register("hydra_overrides", list[str], [],
             "extra '++path=value' Hydra overrides of a SkyRL cell, appended last")


@hookimpl
def sweep_validate_cell(cell, session):
    return hydra_override_errors(cell)


@hookimpl
def sweep_cell_args(cell, resume, session):
    return hydra_overrides(cell, resume=resume)
