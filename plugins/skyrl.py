"""SkyRL's entry point as a target: the cell's settings reach it as overrides on its command line.

A cell targets SkyRL when its command runs a SkyRL entry point: the seeds' MarinSkyRL fork
(``target = sk.command("{python}", "-m", "skyrl_train.entrypoints.main_base")``, with
``--config-name`` and the like of its recipe after it when it needs them) or upstream
SkyRL (``"skyrl.train.entrypoints.main_base"``). SkyRL reads no config file of sweepkit's:
everything the cell sets is appended to its command line, through the ``sweep_cell_args``
hook, on every executor and cluster. What is appended, in order (:func:`hydra_overrides`):

1. the cell's diff against ``base`` (``base`` stands for the recipe yaml), flat grid names
   mapped to their path by :data:`SKYRL_PATHS` and the layout's ``engine_paths``, dotted
   keys taken as paths;
2. the cell's own checkpoint and export dirs when a checkpoint root is configured
   (:mod:`sweepkit_plugins.ckpt_guard`);
3. the resume mode, always explicit: ``latest`` for a resumed run (``--resume``, a chain
   link), else the cell's own mode, else ``null`` (an unset mode once let a launcher fall
   back to its destructive default);
4. the ``hydra_overrides`` launch key, verbatim.

The layout (:mod:`sweepkit_plugins.skyrl_schema`) decides the paths of the inference
engine's settings and the syntax: ``++path=value`` for the fork (Hydra's force-add),
``path=value`` for upstream, whose parser refuses a ``+``. It is the ``skyrl_layout`` launch
key's, or, with ``auto`` (the default), the layout of the package the command runs:
upstream has had no ``skyrl_train`` since NovaSky-AI/SkyRL#1249 and the fork has no
``skyrl.train``, so the entry point says what is installed where the cell runs. The job
script says which layout the cell got (``SWEEP_SKYRL_LAYOUT`` among its variables).

Validation, before anything is submitted:

- a bare top-level key, which Hydra resolves against the struct root and rejects with
  ``ConfigKeyError``, is refused, as is a ``hydra_overrides`` entry not in the layout's
  syntax (``++section.key=value``; upstream ``section.key=value``);
- where the driver can import the layout's config code (:func:`skyrl_schema.installed_schema`),
  every override's path is looked up in it. Not there is an error naming the grid's
  file:line and the key, with a did-you-mean, except in the fork layout for a dotted key or a
  ``hydra_overrides`` entry: Hydra's ``++`` adds a key the fork's yaml lacks and the fork's
  code reads some (``trainer.enable_db_registration``), so such a path gets a note, unless it
  is misspelt (:data:`skyrl_schema.MISSPELT`) or where the upstream layout keeps an engine
  setting. A path through a value is an error in both layouts. Where the config code cannot
  be imported, a note says the overrides were not checked, and nothing else changes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from sweepkit.hookspec import hookimpl
from sweepkit_plugins import ckpt_guard, skyrl_export, skyrl_schema
from sweepkit_plugins.skyrl_schema import FORK, LAYOUTS, UPSTREAM, Layout

ENTRY_POINT = "skyrl_train.entrypoints.main_base"
UPSTREAM_ENTRY_POINT = "skyrl.train.entrypoints.main_base"
LAYOUT_KEY = "skyrl_layout"
LAYOUT_ENV = "SWEEP_SKYRL_LAYOUT"
NOTED_KEY = "skyrl.noted"

#: The flat names grids use, and where SkyRL keeps them in both layouts; the inference
#: engine's settings are in each layout's ``engine_paths``. A dotted key is a path already.
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
    "eval_interval": "trainer.eval_interval",
    "resume_mode": "trainer.resume_mode",
    "reshard_after_forward": "trainer.policy.fsdp_config.reshard_after_forward",
    "advantage_estimator": "trainer.algorithm.advantage_estimator",
    "use_kl_loss": "trainer.algorithm.use_kl_loss",
    "kl_loss_coef": "trainer.algorithm.kl_loss_coef",
    "use_entropy_loss": "trainer.algorithm.use_entropy_loss",
    "entropy_loss_coef": "trainer.algorithm.entropy_loss_coef",
    "eps_clip_high": "trainer.algorithm.eps_clip_high",
    "colocate_all": "trainer.placement.colocate_all",
    "num_gpus": "trainer.placement.policy_num_gpus_per_node",  # the built-in trainer's policy GPUs
    "n_samples_per_prompt": "generator.n_samples_per_prompt",
    "eval_n_samples_per_prompt": "generator.eval_n_samples_per_prompt",
    "max_generate_length": "generator.sampling_params.max_generate_length",
    "temperature": "generator.sampling_params.temperature",
    "env_class": "environment.env_class",
    # The key sk.command's seed_key names: a grid's seeds= sets it on each repeat of a cell.
    "seed": "trainer.seed",
}
#: Flat names of the built-in trainer that SkyRL has no setting for, and why.
NO_SKYRL_SETTING = {
    "format_reward_coef": "the built-in trainer's format shaping; SkyRL's gsm8k env has no such setting "
                          "(it scores with compute_score's format_score=0.0, skyrl_gym/envs/gsm8k/env.py)",
}
_PATH = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)+$")
_USER_OVERRIDE = re.compile(r"^(?P<prefix>\+*)(?P<key>[^=\s]+)=(?P<value>.*)$", re.DOTALL)
_PLAIN = re.compile(r"^[\w./:@+-]+$")
_BEFORE_QUOTE = re.compile(r"(\\*)('|$)")


@attrs.frozen(kw_only=True)
class Override:
    """One override of a SkyRL cell: ``key`` is the cell key it comes from (where an error
    points), ``path`` where it goes in SkyRL's config, ``value`` in Hydra's grammar;
    ``written``: the path is the grid's own (a dotted key, a ``hydra_overrides`` entry), not
    one of sweepkit's flat names or settings."""

    key: str
    path: str
    value: str
    written: bool


def command_layout(argv) -> Layout | None:
    """The layout of the SkyRL package a command runs (``-m skyrl.train...``, a script under
    ``skyrl/train/``; ``skyrl_train``), or None for a command that runs no SkyRL."""
    for part in argv:
        if "skyrl.train." in part or "skyrl/train/" in part:
            return UPSTREAM
        if "skyrl_train" in part:
            return FORK
    return None


def targets_skyrl(cell) -> bool:
    """True when the cell's command runs a SkyRL entry point (``skyrl_train...``, ``skyrl.train...``)."""
    return command_layout(cell.target.argv) is not None


def layout_of(cell) -> tuple[Layout, str]:
    """The layout of a SkyRL cell, and why: the ``skyrl_layout`` launch key, or with ``auto``
    the package its command runs (see the module docstring)."""
    chosen = cell.launch().get(LAYOUT_KEY) or "auto"
    if chosen != "auto":
        return LAYOUTS[chosen], f"{LAYOUT_KEY}={chosen!r}"
    layout = command_layout(cell.target.argv) or FORK
    return layout, f"its command runs {layout.package}"


def hydra_value(value: Any, layout: Layout = FORK) -> str:
    """A value in the layout's override grammar: null, true/false, numbers, strings, lists,
    dicts; Hydra's for the fork, and for upstream the YAML that ``OmegaConf.from_cli`` parses
    (a quoted string in JSON's double quotes, a dict's items ``key: value``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item, layout) for item in value) + "]"
    if isinstance(value, Mapping):
        colon = ":" if layout is FORK else ": "
        return "{" + ",".join(f"{key}{colon}{hydra_value(item, layout)}" for key, item in value.items()) + "}"
    text = str(value)
    if _PLAIN.match(text) and text not in ("null", "true", "false"):
        return text
    if layout is UPSTREAM:
        return json.dumps(text)
    # Hydra's quoted strings take a backslash as it is, except in a run before a quote or the
    # closing quote, which is halved: double those runs, then escape each quote.
    return "'" + _BEFORE_QUOTE.sub(lambda run: run[1] * 2 + ("\\'" if run[2] else ""), text) + "'"


def hydra_path(key: str, layout: Layout = FORK) -> str | None:
    """Where a cell key lives in SkyRL's config of ``layout``, or None for a bare key Hydra
    would reject."""
    if _PATH.match(key):
        return key
    return layout.engine_paths.get(key) or SKYRL_PATHS.get(key)


def _diff_keys(cell) -> list[str]:
    # The resume mode is appended on its own (always explicit), so the diff never repeats it.
    return [key for key in cell.diff if key not in cell.launch_keys and key not in ckpt_guard.RESUME_KEYS]


def _user_override(text: str, layout: Layout):
    """The match of a ``hydra_overrides`` entry in the layout's syntax, or None."""
    match = _USER_OVERRIDE.match(text)
    if match and match["prefix"] == layout.prefix and _PATH.match(match["key"]):
        return match
    return None


def form_errors(cell, layout: Layout) -> list[str]:
    """Bare keys, keys SkyRL has no setting for, and ``hydra_overrides`` entries that are not
    in the layout's syntax."""
    errors = []
    for key in _diff_keys(cell):
        if key in NO_SKYRL_SETTING:
            errors.append(f"{key}: SkyRL has no setting for it: {NO_SKYRL_SETTING[key]}; leave it to the "
                          "built-in trainer's cells")
        elif hydra_path(key, layout) is None:
            fails = ("Hydra resolves it against the struct root and fails with ConfigKeyError" if layout is FORK
                     else "SkyRLTrainConfig has no such field at its root, and the entry point fails at start-up")
            errors.append(f"{key!r} is a bare top-level key: {fails}; name its full path, e.g. "
                          f"'trainer.{key}' (known flat names: "
                          f"{', '.join(sorted({*SKYRL_PATHS, *layout.engine_paths}))})")
    for override in cell.launch().get("hydra_overrides") or ():
        if _user_override(str(override), layout) is not None:
            continue
        if layout is UPSTREAM:
            errors.append(f"hydra_overrides: {override!r} is not an override upstream SkyRL takes; write "
                          "'section.key=value' with the full dotted path and no '+' "
                          "(SkyRLTrainConfig.from_cli_overrides refuses a '+' prefix)")
        else:
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


def overrides_of(cell, *, resume: bool = False) -> list[Override]:
    """The overrides of a SkyRL cell in the order they are appended (see the module
    docstring); empty for a cell that does not target SkyRL."""
    if not targets_skyrl(cell):
        return []
    layout, _ = layout_of(cell)
    out = [Override(key=key, path=hydra_path(key, layout), value=hydra_value(cell.config[key], layout),
                    written=bool(_PATH.match(key)))
           for key in _diff_keys(cell) if key in cell.config and hydra_path(key, layout)]
    ckpt_dir = ckpt_guard.ckpt_dir_of(cell, os.environ)
    if ckpt_dir is not None:
        out.append(Override(key="trainer.ckpt_path", path="trainer.ckpt_path",
                            value=hydra_value(str(ckpt_dir), layout), written=False))
        out.append(Override(key="trainer.export_path", path="trainer.export_path",
                            value=hydra_value(str(ckpt_guard.export_dir(cell, os.environ)), layout),
                            written=False))
    out.append(Override(key="resume_mode", path="trainer.resume_mode",
                        value=hydra_value(resume_mode(cell, resume=resume), layout), written=False))
    for text in cell.launch().get("hydra_overrides") or ():
        match = _user_override(str(text), layout)
        if match is not None:
            out.append(Override(key="hydra_overrides", path=match["key"], value=match["value"], written=True))
    return out


def hydra_overrides(cell, *, resume: bool = False) -> list[str]:
    """The arguments of a SkyRL cell, appended after its entry point: its overrides in the
    layout's syntax, the ``hydra_overrides`` entries verbatim."""
    if not targets_skyrl(cell):
        return []
    layout, _ = layout_of(cell)
    rendered = [f"{layout.prefix}{override.path}={override.value}"
                for override in overrides_of(cell, resume=resume) if override.key != "hydra_overrides"]
    return rendered + [str(text) for text in cell.launch().get("hydra_overrides") or ()]


# -- the check against SkyRL's own config ------------------------------------------------------


def _other_layouts_path(path: str, layout: Layout) -> str:
    """``: that is where the upstream layout keeps ...`` when ``path`` is where the other
    layout keeps an inference engine setting, else ''."""
    for other in LAYOUTS.values():
        for name, there in other.engine_paths.items():
            if other is not layout and there == path:
                return (f": that is where the {other.name} layout keeps {name}, which the {layout.name} "
                        f"layout names {layout.engine_paths[name]}")
    return ""


def _consequence(layout: Layout, problem: skyrl_schema.Problem) -> str:
    if layout is UPSTREAM:
        return "whose entry point fails at start-up on a key that is no field of its config"
    if problem.added:
        return "where Hydra's ++ adds the key and SkyRL never reads it"
    return "where Hydra fails at start-up"


def schema_problems(cell, schema: skyrl_schema.Schema) -> tuple[list[str], list[str]]:
    """``(errors, notes)`` of the cell's overrides looked up in ``schema``; a note for a
    path of the grid's that Hydra's ``++`` adds in the fork layout, unless it is misspelt
    or the other layout's (see the module docstring)."""
    layout, why = layout_of(cell)
    errors, notes = [], []
    for override in overrides_of(cell):
        problem = schema.problem(override.path)
        if problem is None:
            continue
        moved = _other_layouts_path(override.path, layout)
        if layout is FORK and override.written and problem.added and not problem.misspelt and not moved:
            file, line = cell.location_of(override.key)
            notes.append(f"{file}:{line}: {problem.text}: Hydra's ++ adds it, and SkyRL uses it only if its code "
                         "reads it (the fork's reads a few keys its yaml lacks, trainer.enable_db_registration "
                         "among them)")
            continue
        errors.append(f"{override.key}: {problem.text}{moved or problem.hint}; the cell runs the {layout.name} "
                      f"layout ({why}), {_consequence(layout, problem)}")
    return errors, notes


def _note_once(session, text: str) -> None:
    noted = session.stash.setdefault(NOTED_KEY, set())
    if text not in noted:
        noted.add(text)
        session.err_console.print(f"note: {text}", markup=False, highlight=False)


def skyrl_errors(cell, session) -> list[str]:
    """Every error of a SkyRL cell's overrides: their form, then, where the layout's config
    code imports here, their paths in SkyRL's config (the notes are printed once)."""
    if not targets_skyrl(cell):
        return []
    layout, _ = layout_of(cell)
    errors = form_errors(cell, layout)
    schema = skyrl_schema.installed_schema(layout.name)
    if isinstance(schema, str):
        _note_once(session, f"the overrides of SkyRL cells of the {layout.name} layout were not checked against "
                            f"SkyRL's config: it cannot be imported here ({schema}); install its config code "
                            "where sweep runs to check them (README, SkyRL)")
        return errors
    found, notes = schema_problems(cell, schema)
    for note in notes:
        _note_once(session, note)
    return errors + found


@hookimpl
def sweep_register_keys(register):
    register("hydra_overrides", list[str], [],
             "extra overrides of a SkyRL cell, appended last as written: '++path=value' in the fork "
             "layout, 'path=value' upstream")
    register(LAYOUT_KEY, Literal["auto", "fork", "upstream"], "auto",
             "layout of a SkyRL cell's config: " + "; ".join(f"{layout.name}: {layout.doc}" for layout in
                                                           LAYOUTS.values())
             + "; auto: the layout of the package the cell's command runs")


@hookimpl
def sweep_validate_cell(cell, session):
    return skyrl_errors(cell, session)


@hookimpl
def sweep_cell_env(cell, session):
    return {LAYOUT_ENV: layout_of(cell)[0].name} if targets_skyrl(cell) else {}


@hookimpl
def sweep_cell_args(cell, resume, session):
    return hydra_overrides(cell, resume=resume)


@hookimpl
def sweep_export_checkpoint(cell, step_dir, to, session):
    """A SkyRL cell's checkpoint: a copy of the HF-format model SkyRL wrote for it, or a
    UsageError for FSDP shards (:mod:`sweepkit_plugins.skyrl_export`)."""
    if not targets_skyrl(cell):
        return None
    return skyrl_export.export_skyrl_step(cell, step_dir, to)
