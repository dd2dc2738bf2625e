"""The names a config chooses among, each with what it means and the module that implements it.

One home for the names of the trainer's pluggable parts: rollout engines (``backend``),
the static engine's decode attentions (``decode_attention``), advantage estimators,
policy loss types, loss reductions and KL estimators. :mod:`trainer.config` takes its
choices and their help text from here; each implementing registry checks itself against
its names when its module is imported (:meth:`Names.check`), so an implementation without
a name, or a name without an implementation, fails at once. Adding one is one line here
and one entry in its registry.

Imports attrs and the standard library only, as :mod:`trainer.config` does (sweepkit
validates configs without torch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import attrs


class RegistryMismatch(RuntimeError):
    """A registry and its names disagree: an implementation without a name, or a name without one."""


@attrs.frozen
class Name:
    """One choice: its name, what it is (one line, for help), and the module that implements it."""

    name: str
    doc: str
    module: str


@attrs.frozen(kw_only=True)
class Names:
    """The names one config key chooses among, in the order its help lists them.

    ``auto``, when there is one, is a name that picks one of the others at run time
    (its ``module`` is where it does): it is a choice, but no registry implements it.
    """

    key: str  # the config key
    what: str  # what the key picks, the head of its help text
    implemented: tuple[Name, ...] = attrs.field(converter=tuple)
    auto: Optional[Name] = None

    def choices(self) -> tuple[str, ...]:
        """Every value the config key accepts."""
        return tuple(entry.name for entry in self.entries())

    def entries(self) -> tuple[Name, ...]:
        return ((self.auto,) if self.auto is not None else ()) + self.implemented

    def implemented_names(self) -> tuple[str, ...]:
        """The names a registry must implement: every choice but ``auto``."""
        return tuple(entry.name for entry in self.implemented)

    def module(self, name: str) -> str:
        """The module that implements ``name``."""
        for entry in self.entries():
            if entry.name == name:
                return entry.module
        raise KeyError(f"{self.key}: no such name {name!r}; known: {', '.join(map(repr, self.choices()))}")

    def help(self) -> str:
        """The config key's help text: what it picks, then each name with its one-line doc."""
        shown = [f"'{entry.name}' ({entry.doc})" for entry in self.entries()]
        listed = ", ".join(shown[:-1]) + f" or {shown[-1]}" if len(shown) > 1 else shown[0]
        return f"{self.what}: {listed}"

    def check(self, registry: Mapping[str, Any], *, registry_name: str) -> None:
        """Raise :class:`RegistryMismatch` unless ``registry`` (name -> implementation) has exactly
        the implemented names, each implementation defined in the module its name states."""
        problems = []
        unnamed = [name for name in registry if name not in self.implemented_names()]
        if unnamed:
            problems.append(f"registers {', '.join(map(repr, unnamed))}, which trainer.names does not name "
                            f"(names of {self.key}: {', '.join(map(repr, self.implemented_names()))})")
        missing = [name for name in self.implemented_names() if name not in registry]
        if missing:
            problems.append(f"implements no {', '.join(map(repr, missing))}, which trainer.names names "
                            f"for {self.key}")
        for name, implementation in registry.items():
            defined_in = getattr(implementation, "__module__", None)
            if name in self.implemented_names() and defined_in != self.module(name):
                problems.append(f"implements {name!r} in {defined_in}, where trainer.names says "
                                f"{self.module(name)}")
        if problems:
            raise RegistryMismatch(f"{registry_name}: " + "; ".join(problems))


BACKENDS = Names(
    key="backend",
    what="rollout engine",
    auto=Name("auto", "static where it supports the model, else hf", "trainer.setup"),
    implemented=(
        Name("static", "in-process, static KV cache, CUDA graphs", "trainer.rollout.static"),
        Name("hf", "transformers generate", "trainer.rollout.hf"),
        Name("vllm", "vLLM, colocated with the policy; needs the vllm package", "trainer.rollout.vllm"),
    ),
)

DECODE_ATTENTIONS = Names(
    key="decode_attention",
    what="the static engine's decode attention",
    auto=Name("auto", "fused on CUDA where Triton is installed, else sdpa", "trainer.rollout.attention"),
    implemented=(
        Name("sdpa", "PyTorch's attention over every column, masked", "trainer.rollout.attention"),
        Name("split-kv", "a Triton flash-decoding kernel that reads only the cache columns in use",
             "trainer.rollout.attention"),
        Name("fused", "split-kv with the layer's RoPE and cache write in its split kernel",
             "trainer.rollout.attention"),
    ),
)

ADVANTAGE_ESTIMATORS = Names(
    key="advantage_estimator",
    what="advantage estimator",
    implemented=(
        Name("grpo", "the group baseline: r less its group's mean, over the group's std unless "
             "grpo_norm_by_std=false", "trainer.advantages"),
        Name("no_op", "the reward itself, per sequence or per token: for rewards that are advantages, OPD's -KL",
             "trainer.advantages"),
    ),
)

POLICY_LOSS_TYPES = Names(
    key="policy_loss_type",
    what="policy loss",
    implemented=(
        Name("ppo", "clipped ratio", "trainer.losses"),
        Name("importance_sampling", "unclipped ratio", "trainer.losses"),
    ),
)

LOSS_REDUCTIONS = Names(
    key="loss_reduction",
    what="how per-token losses become one number",
    implemented=(
        Name("token_mean", "sum over tokens / tokens", "trainer.losses"),
        Name("seq_mean_token_mean", "mean over sequences of each one's token mean", "trainer.losses"),
        Name("seq_mean_token_sum_norm", "sum over tokens / sequences / max_generate_length, Dr.GRPO's",
             "trainer.losses"),
    ),
)

KL_ESTIMATORS = Names(
    key="kl_estimator_type",
    what="KL estimator",
    implemented=(
        Name("k1", "the log-ratio log pi - log pi_ref", "trainer.losses"),
        Name("k2", "half the squared log-ratio", "trainer.losses"),
        Name("k3", "Schulman's low-variance estimator, clamped as SkyRL and verl do", "trainer.losses"),
    ),
)

#: Every group of names, by its config key.
ALL = {names.key: names for names in (BACKENDS, DECODE_ATTENTIONS, ADVANTAGE_ESTIMATORS, POLICY_LOSS_TYPES,
                                      LOSS_REDUCTIONS, KL_ESTIMATORS)}
