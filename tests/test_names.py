"""trainer.names: one list of the names a config chooses among, which the config and the registries share."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainer import names
from trainer.config import ConfigError, TrainerConfig, schema
from trainer.names import Name, Names, RegistryMismatch

REPO = Path(__file__).resolve().parents[1]


def registries() -> dict[str, dict]:
    """Each group of names' implementing registry, by config key."""
    from trainer import advantages, losses, rollout
    from trainer.rollout import attention

    return {
        "backend": rollout.ENGINES,
        "decode_attention": attention.DECODE_ATTENTION,
        "advantage_estimator": advantages.ESTIMATORS,
        "policy_loss_type": losses.LOSS_TYPES,
        "loss_reduction": losses.REDUCTIONS,
        "kl_estimator_type": losses.KL_ESTIMATORS,
    }


def test_every_registry_implements_exactly_its_names():
    found = registries()
    assert found.keys() == names.ALL.keys()  # a new group of names needs its registry here
    for key, registry in found.items():
        assert set(registry) == set(names.ALL[key].implemented_names()), key
    for key in ("decode_attention", "advantage_estimator", "policy_loss_type", "loss_reduction",
                "kl_estimator_type"):
        for name, implementation in found[key].items():
            assert implementation.__module__ == names.ALL[key].module(name), (key, name)


def test_every_backend_names_a_module_that_exports_its_engine():
    from trainer.rollout import BackendUnavailable, RolloutEngine, engine_class

    for name in names.BACKENDS.implemented_names():
        module = names.BACKENDS.module(name)
        assert importlib.util.find_spec(module) is not None, name
        try:
            engine = engine_class(name)
        except BackendUnavailable:  # vllm without the vllm package: the module exists, it cannot run here
            assert name == "vllm"
            continue
        assert issubclass(engine, RolloutEngine) and engine.__module__ == module, name


def test_every_name_is_documented_and_its_module_exists():
    for group in names.ALL.values():
        assert len(set(group.choices())) == len(group.choices()), group.key
        for entry in group.entries():
            assert entry.doc and "\n" not in entry.doc, (group.key, entry.name)
            assert importlib.util.find_spec(entry.module) is not None, (group.key, entry.name, entry.module)


def test_a_registry_that_disagrees_with_its_names_is_refused():
    group = Names(key="color", what="a color", implemented=(Name("red", "warm", __name__),
                                                            Name("blue", "cold", __name__)))

    def red(): ...

    def blue(): ...

    group.check({"red": red, "blue": blue}, registry_name="COLORS")  # agrees: no error
    with pytest.raises(RegistryMismatch, match=r"COLORS: registers 'green', which trainer.names does not name"):
        group.check({"red": red, "blue": blue, "green": red}, registry_name="COLORS")
    with pytest.raises(RegistryMismatch, match=r"COLORS: implements no 'blue', which trainer.names names for color"):
        group.check({"red": red}, registry_name="COLORS")
    with pytest.raises(RegistryMismatch, match=rf"implements 'red' in json, where trainer.names says {__name__}"):
        group.check({"red": json.loads, "blue": blue}, registry_name="COLORS")


# Each registry checks itself when its module is imported: one name more in trainer.names than
# it implements fails the import.
AT_IMPORT = textwrap.dedent("""
    import importlib, sys
    import attrs
    from trainer import names
    from trainer.names import Name

    for attribute, module, extra in [
            ("ADVANTAGE_ESTIMATORS", "trainer.advantages", "trainer.advantages"),
            ("POLICY_LOSS_TYPES", "trainer.losses", "trainer.losses"),
            ("LOSS_REDUCTIONS", "trainer.losses", "trainer.losses"),
            ("KL_ESTIMATORS", "trainer.losses", "trainer.losses"),
            ("DECODE_ATTENTIONS", "trainer.rollout.attention", "trainer.rollout.attention"),
            ("BACKENDS", "trainer.rollout", "trainer.rollout.sglang")]:
        group = getattr(names, attribute)
        setattr(names, attribute, attrs.evolve(group, implemented=(*group.implemented, Name("extra", "-", extra))))
        sys.modules.pop(module, None)
        try:
            importlib.import_module(module)
            print(attribute, "imported")
        except names.RegistryMismatch as error:
            print(attribute, "refused:", error)
        setattr(names, attribute, group)
        sys.modules.pop(module, None)
        importlib.import_module(module)
""")


def test_each_registry_refuses_at_import_a_name_it_does_not_implement():
    out = subprocess.run([sys.executable, "-c", AT_IMPORT], env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 6 and all(" refused: " in line for line in lines), out.stdout
    assert "trainer.advantages.ESTIMATORS: implements no 'extra'" in lines[0]
    assert "trainer.rollout.sglang, which do not exist" in lines[-1]


@pytest.mark.parametrize("key", sorted(names.ALL))
def test_the_config_takes_its_choices_and_help_from_the_names(key):
    group = names.ALL[key]
    field = schema()[key]
    assert field["doc"] == group.help()
    assert field["default"] in group.choices()
    for name in group.choices():
        assert getattr(TrainerConfig.from_dict({key: name}), key) == name
    with pytest.raises(ConfigError) as refused:
        TrainerConfig.from_dict({key: "nope"})
    assert f"{key}: must be one of {', '.join(map(repr, group.choices()))}, got 'nope'" in str(refused.value)


def run_without_torch(code: str) -> subprocess.CompletedProcess:
    blocked = "import sys; sys.modules['torch'] = None  # any import of torch now fails\n"
    return subprocess.run([sys.executable, "-c", blocked + textwrap.dedent(code)],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)


def test_config_and_names_import_without_torch():
    out = run_without_torch("""
        import trainer.config as c, trainer.names
        c.schema(); c.TrainerConfig.from_dict({'backend': 'hf', 'decode_attention': 'sdpa'})
        print(sorted(m for m in sys.modules if m.startswith('trainer')))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['trainer', 'trainer.config', 'trainer.names']"


def test_a_name_added_to_the_names_is_a_config_choice_with_its_help():
    out = run_without_torch("""
        import attrs
        from trainer import names
        group = names.KL_ESTIMATORS
        names.KL_ESTIMATORS = attrs.evolve(group, implemented=(*group.implemented, names.Name("k4", "a fourth", "x")))
        del sys.modules["trainer.config"]  # the package imported it: make it again from the names as they are now
        from trainer.config import TrainerConfig, schema
        print(TrainerConfig.from_dict({"kl_estimator_type": "k4"}).kl_estimator_type)
        print(schema()["kl_estimator_type"]["doc"])
    """)
    assert out.returncode == 0, out.stderr
    chosen, doc = out.stdout.splitlines()
    assert chosen == "k4"
    assert doc.startswith("KL estimator: 'k1' (") and doc.endswith(" or 'k4' (a fourth)")
