"""What SkyRL's config accepts, read from the SkyRL installed where ``sweep`` runs.

Two layouts of SkyRL's config are in use; a cell's overrides must follow the one of the
package its command runs (:func:`sweepkit_plugins.skyrl.layout_of` picks it):

``fork``
    skyrl-train's ``skyrl_train`` package: the seeds' MarinSkyRL fork (pinned at 9bb6d5e,
    whose skyrl-train says version 0.3.0) and ``skyrl-train`` on PyPI (0.3.0 and 0.3.1
    checked). Its config is a Hydra yaml, ``skyrl_train/config/ppo_base_config.yaml`` with
    its defaults list, and no dataclasses: the schema here is that yaml as Hydra composes it
    for the entry point (``@hydra.main(config_name="ppo_base_config")``). The entry point
    takes ``++path=value``, Hydra's force-add: it sets a key the yaml has, and adds one it
    lacks, which SkyRL then reads only if its code asks for it.
``upstream``
    NovaSky-AI/SkyRL's ``skyrl`` package (``skyrl`` on PyPI, 0.3.0 checked), which replaced
    ``skyrl_train`` (NovaSky-AI/SkyRL#1249). The schema is the dataclass tree of
    ``skyrl.train.config.SkyRLTrainConfig``; the inference engine's settings moved under
    ``generator.inference_engine`` (``num_engines``, ``tensor_parallel_size``, ...). Its entry
    point (``skyrl.train.entrypoints.main_base``) parses its arguments with
    ``SkyRLTrainConfig.from_cli_overrides``: plain ``path=value`` (it refuses a ``+``
    prefix), and a key that is no field of its dataclass fails start-up.

Only the config code is imported (no Ray, vLLM or torch): for the fork ``hydra-core`` and
the package's yaml files, for upstream ``skyrl.train.config`` with ``omegaconf``,
``pyyaml``, ``loguru`` and ``skyrl-gym`` (README, SkyRL).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import types
import typing
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs

from sweepkit.errors import did_you_mean


@attrs.frozen(kw_only=True)
class Layout:
    """One layout of SkyRL's config.

    ``package``: the Python package the entry point lives in (a command naming it runs this
    layout); ``distribution``: its name on PyPI; ``engine_paths``: where the layout keeps
    the inference engine settings grids name flatly; ``prefix``: what comes before
    ``path=value`` on the command line.
    """

    name: str
    package: str
    distribution: str
    engine_paths: Mapping[str, str]
    prefix: str
    doc: str


#: The inference engine's settings grids name flatly: where the fork keeps each, and where
#: upstream moved it (``generator.inference_engine``, ``SkyRLTrainConfig``).
MOVED_ENGINE_PATHS = {
    "gpu_memory_utilization": ("generator.gpu_memory_utilization", "generator.inference_engine.gpu_memory_utilization"),
    "enforce_eager": ("generator.enforce_eager", "generator.inference_engine.enforce_eager"),
    "num_inference_engines": ("generator.num_inference_engines", "generator.inference_engine.num_engines"),
    "inference_tp": ("generator.inference_engine_tensor_parallel_size",
                     "generator.inference_engine.tensor_parallel_size"),
    "backend": ("generator.backend", "generator.inference_engine.backend"),
}
FORK = Layout(
    name="fork", package="skyrl_train", distribution="skyrl-train", prefix="++",
    engine_paths={name: fork for name, (fork, _) in MOVED_ENGINE_PATHS.items()},
    doc="skyrl_train (the seeds' MarinSkyRL fork, skyrl-train on PyPI): Hydra yaml, '++path=value'")
UPSTREAM = Layout(
    name="upstream", package="skyrl.train", distribution="skyrl", prefix="",
    engine_paths={name: upstream for name, (_, upstream) in MOVED_ENGINE_PATHS.items()},
    doc="skyrl.train (NovaSky-AI/SkyRL, skyrl on PyPI): SkyRLTrainConfig dataclasses, 'path=value'")
LAYOUTS = {layout.name: layout for layout in (FORK, UPSTREAM)}


class _Open:
    """A node below which any key is accepted: a dict-typed field, an empty yaml dict."""

    def __repr__(self) -> str:
        return "OPEN"


class _Leaf:
    def __repr__(self) -> str:
        return "LEAF"


OPEN, LEAF = _Open(), _Leaf()
Tree = Mapping[str, Any]  # a name's node: a Tree (a section), OPEN or LEAF


#: How close a missing key's name must be to one its section has to count as misspelt.
MISSPELT = 0.85


@attrs.frozen(kw_only=True)
class Problem:
    """Why a path is not in the config. ``added``: keys are missing (Hydra's ``++`` would add
    them), rather than the path going through a value; ``misspelt``: the first missing name
    is within :data:`MISSPELT` of a key its section has; ``text`` says which, ``hint`` is a
    did-you-mean (or '')."""

    added: bool
    misspelt: bool = False
    text: str
    hint: str = ""


@attrs.frozen(kw_only=True)
class Schema:
    """The config tree of one installed SkyRL; ``source`` says which (version and file)."""

    source: str
    tree: Tree

    def paths(self, *, values_only: bool = False) -> list[str]:
        """Every dotted path of the tree: sections and values, or only values (what an
        override sets)."""
        found = []

        def walk(node: Tree, prefix: str) -> None:
            for name, child in node.items():
                path = f"{prefix}{name}"
                if isinstance(child, Mapping):
                    found.extend([] if values_only else [path])
                    walk(child, path + ".")
                else:
                    found.append(path)

        walk(self.tree, "")
        return found

    def problem(self, path: str) -> Problem | None:
        """Why ``path`` is not in the config, or None when it is."""
        node: Any = self.tree
        walked: list[str] = []
        for part in path.split("."):
            if node is OPEN:
                return None
            if node is LEAF:
                return Problem(added=False, text=f"{'.'.join(walked)} is a value in {self.source}, "
                                                 f"it has no key {part!r}")
            if part not in node:
                missing = ".".join([*walked, part])
                return Problem(added=True, misspelt=bool(difflib.get_close_matches(part, list(node), n=1,
                                                                                   cutoff=MISSPELT)),
                               text=f"{path} is not in {self.source}", hint=self.suggestion(path, missing))
            node = node[part]
            walked.append(part)
        return None

    def suggestion(self, path: str, missing: str) -> str:
        """A did-you-mean for ``path``, whose first part not in the config is ``missing``:
        the values of the same top section named as the path ends (a key that moved), else
        those whose own name is close to the missing part's or the path's last name (a key
        renamed), else the closest paths."""
        section = path.split(".", 1)[0]
        values = [p for p in self.paths(values_only=True) if p.split(".", 1)[0] == section]
        names = {p: p.rsplit(".", 1)[-1] for p in values}
        last = path.rsplit(".", 1)[-1]
        found = [p for p in values if names[p] == last]
        for name in dict.fromkeys([missing.rsplit(".", 1)[-1], last]):
            close = difflib.get_close_matches(name, set(names.values()), n=3)
            found += [p for match in close for p in values if names[p] == match and p not in found]
        if found:
            return f" (did you mean {', '.join(map(repr, found[:3]))}?)"
        return did_you_mean(path, self.paths())


def _version(distribution: str, module) -> str:
    """``skyrl 0.3.0`` for the installed distribution ``module`` comes from, else where it
    was imported from (a checkout on ``PYTHONPATH``, an editable install)."""
    where = Path(module.__file__).resolve()
    try:
        installed = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        installed = None
    if installed is not None and where.is_relative_to(Path(str(installed.locate_file(""))).resolve()):
        return f"{distribution} {installed.version}"
    return f"{distribution} at {where.parent}"


# -- the fork: Hydra's composition of the package's yaml ----------------------------------------


def _yaml_tree(node: Any) -> Any:
    if isinstance(node, Mapping):
        # An empty dict (engine_init_kwargs: {}) is there to be filled, as a null
        # (rope_scaling: null) may be: Hydra's ++ puts keys below both.
        return {str(name): _yaml_tree(child) for name, child in node.items()} or OPEN
    return OPEN if node is None else LEAF


def fork_schema() -> Schema:
    """``skyrl_train``'s ``ppo_base_config`` as Hydra composes it for the entry point."""
    config = importlib.import_module("skyrl_train.config.utils")  # first: it says whether skyrl_train is there
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(config.CONFIG_DIR), version_base=None):
        composed = compose(config_name=config.DEFAULT_CONFIG_NAME)
    tree = _yaml_tree(OmegaConf.to_container(composed, resolve=False))
    return Schema(tree=tree,
                  source=f"the fork layout's config ({_version(FORK.distribution, config)}, "
                         f"skyrl_train/config/{config.DEFAULT_CONFIG_NAME})")


# -- upstream: the dataclass tree ------------------------------------------------------------------


def _field_node(annotation: Any, depth: int) -> Any:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _field_node(typing.get_args(annotation)[0], depth)
    if origin in (typing.Union, types.UnionType):
        nodes = [_field_node(arg, depth) for arg in typing.get_args(annotation) if arg is not type(None)]
        sections = [node for node in nodes if isinstance(node, Mapping)]
        if sections:
            return sections[0]
        return OPEN if any(node is OPEN for node in nodes) else LEAF
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return _dataclass_tree(annotation, depth + 1)
    # A dict field takes any key below it (engine_init_kwargs); so does an OmegaConf DictConfig.
    if annotation is Any or origin in (dict, Mapping) or annotation in (dict, Mapping) \
            or getattr(annotation, "__name__", "") == "DictConfig":
        return OPEN
    return LEAF


def _dataclass_tree(cls: type, depth: int = 0) -> Tree:
    if depth > 20:
        raise RecursionError(f"{cls.__name__}: config dataclasses nested more than 20 deep")
    hints = typing.get_type_hints(cls, include_extras=True)
    return {field.name: _field_node(hints.get(field.name, field.type), depth) for field in dataclasses.fields(cls)}


def upstream_schema() -> Schema:
    """The fields of ``skyrl.train.config.SkyRLTrainConfig``, nested dataclasses as sections."""
    config = importlib.import_module("skyrl.train.config")
    return Schema(tree=_dataclass_tree(config.SkyRLTrainConfig),
                  source=f"upstream SkyRL's config ({_version(UPSTREAM.distribution, config)}, SkyRLTrainConfig)")


@functools.cache
def installed_schema(layout: str) -> Schema | str:
    """The schema of ``layout`` from the SkyRL installed here, or why it cannot be read (a
    sentence: the package, or what its config code imports, is missing)."""
    load = fork_schema if layout == FORK.name else upstream_schema
    try:
        return load()
    except ImportError as exc:  # ModuleNotFoundError included
        return f"{exc}"
    except Exception as exc:  # an installed SkyRL whose config does not load: say so, don't guess
        return f"its config did not load ({type(exc).__name__}: {exc})"
