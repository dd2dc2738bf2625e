"""SkyRL cells' overrides against SkyRL's own config, read from the installed packages (no
copy of their schema here): ``skyrl-train`` for the fork layout (its Hydra yaml), ``skyrl``
for upstream (its ``SkyRLTrainConfig`` dataclasses). ``.ci/run`` installs both (README,
SkyRL); where one is missing its tests skip, saying so.

The GSM8K grids run as SkyRL cells here (their ``target`` replaced by a SkyRL entry point);
every override they render must pass sweepkit's check and SkyRL's own parser: Hydra's
composition of the fork's yaml with each override made strict (no ``++``, so a key the yaml
lacks fails), and upstream's strict dataclass builder over each section.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conftest import Sweeper
from sweepkit_plugins import skyrl, skyrl_schema
from sweepkit_plugins.skyrl_schema import FORK, UPSTREAM
from test_jupiter import collected_cells

GRIDS = Path(__file__).parent.parent / "grids"
ENTRY_POINTS = {FORK.name: skyrl.ENTRY_POINT, UPSTREAM.name: skyrl.UPSTREAM_ENTRY_POINT}
# SkyRL has no format-reward setting for gsm8k: the accuracy grid's shaped cells stay the trainer's.
NO_SKYRL_CELLS = {"shaped0.1", "shaped0.2"}


def installed(layout: str) -> skyrl_schema.Schema:
    schema = skyrl_schema.installed_schema(layout)
    if isinstance(schema, str):
        pytest.skip(f"SkyRL's {layout} config is not importable here ({schema}); .ci/run installs it")
    return schema


@pytest.fixture(params=[FORK.name, UPSTREAM.name])
def layout(request) -> str:
    installed(request.param)
    return request.param


def collected(sweeper: Sweeper):
    """The session and the collected cells of every grid, by node id (cell names repeat
    across grids)."""
    return collected_cells(sweeper, key=lambda cell: cell.nodeid)


def gsm8k_grids_as_skyrl(sweeper: Sweeper, layout: str) -> None:
    """The shipped GSM8K grids, each line where it was, with a SkyRL command as their target."""
    target = f'target = sk.command("{{python}}", "-m", "{ENTRY_POINTS[layout]}")'
    throughput = (GRIDS / "gsm8k_throughput.py").read_text()
    assert 'target = "trainer"\n' in throughput
    sweeper.grid("gsm8k_throughput", throughput.replace('target = "trainer"', target))
    sweeper.grid("gsm8k_accuracy", (GRIDS / "gsm8k_accuracy.py").read_text() + target + "\n")


def test_the_flat_names_of_each_layout_resolve_in_it_and_five_do_not_in_the_other():
    fork, upstream = installed(FORK.name), installed(UPSTREAM.name)
    fork_paths = {**skyrl.SKYRL_PATHS, **FORK.engine_paths}
    upstream_paths = {**skyrl.SKYRL_PATHS, **UPSTREAM.engine_paths}
    assert [name for name, path in fork_paths.items() if fork.problem(path)] == []
    assert [name for name, path in upstream_paths.items() if upstream.problem(path)] == []
    # The inference engine's five settings moved under generator.inference_engine upstream.
    assert {name for name, path in fork_paths.items() if upstream.problem(path)} == set(FORK.engine_paths)
    assert {name for name, path in upstream_paths.items() if fork.problem(path)} == set(UPSTREAM.engine_paths)
    assert fork.problem("trainer.ckpt_path") is None and upstream.problem("trainer.export_path") is None


def test_every_override_of_the_gsm8k_grids_resolves(sweeper, monkeypatch, layout):
    gsm8k_grids_as_skyrl(sweeper, layout)
    monkeypatch.setenv("CHECKPOINTS_DIR", str(sweeper.path / "ckpts"))  # so the ckpt paths are rendered too
    session, cells = collected(sweeper)
    assert {Path(nodeid.split("::")[0]).name for nodeid in cells} == {"gsm8k_throughput.py", "gsm8k_accuracy.py"}
    rendered, refused = {}, {}
    for name, cell in cells.items():
        assert skyrl.layout_of(cell)[0].name == layout
        errors = skyrl.skyrl_errors(cell, session)
        if errors:
            refused[name] = errors
        else:
            rendered[name] = skyrl.hydra_overrides(cell)
    assert {nodeid.split("::")[1] for nodeid in refused} == NO_SKYRL_CELLS, refused
    assert all(error.startswith("format_reward_coef: SkyRL has no setting for it") for errors in refused.values()
               for error in errors)
    paths = {arg.lstrip("+").split("=", 1)[0] for args in rendered.values() for arg in args}
    engine = set(skyrl_schema.LAYOUTS[layout].engine_paths.values())
    assert engine - {skyrl_schema.LAYOUTS[layout].engine_paths["backend"]} <= paths, paths  # the grid sweeps them
    assert len(paths) >= 20, paths
    accepted_by_skyrl(layout, [args for args in rendered.values()])


def accepted_by_skyrl(layout: str, commands: list[list[str]]) -> None:
    """Every command line, parsed by SkyRL's own code for ``layout``; raises where it refuses."""
    if layout == FORK.name:
        from hydra import compose, initialize_config_dir

        from skyrl_train.config import utils

        with initialize_config_dir(config_dir=str(utils.CONFIG_DIR), version_base=None):
            for args in commands:
                assert all(arg.startswith("++") for arg in args), args
                # Without '++' an override may only set a key the yaml has.
                compose(config_name=utils.DEFAULT_CONFIG_NAME, overrides=[arg[2:] for arg in args])
        return
    from omegaconf import OmegaConf

    from skyrl.train.config import config

    sections = {field.name: field.type for field in dataclasses.fields(config.SkyRLTrainConfig)}
    for args in commands:
        assert not any(arg.startswith("+") for arg in args), args
        # from_cli_overrides parses so, then builds every section with a strict key check; the
        # whole SkyRLTrainConfig is left out: its __post_init__ imports the inference servers.
        for section, values in OmegaConf.to_container(OmegaConf.from_cli(args)).items():
            config.build_nested_dataclass(sections[section], values)


def test_skyrl_itself_refuses_what_the_check_refuses(layout):
    # The other layout's engine paths: SkyRL's own parser fails on them as the check does.
    other = UPSTREAM if layout == FORK.name else FORK
    schema = installed(layout)
    prefix = skyrl_schema.LAYOUTS[layout].prefix
    for path in other.engine_paths.values():
        assert schema.problem(path) is not None
        with pytest.raises(Exception, match="(not in struct|Invalid fields|Could not override)"):
            accepted_by_skyrl(layout, [[f"{prefix}{path}=1"]])


MISPLACED = '''
import sweepkit as sk
target = sk.command("{{python}}", "-m", "{entry_point}")
base = sk.base(model="Qwen/Qwen2.5-1.5B-Instruct", resume_mode=None)
moved = sk.cell(**{{"{moved}": 2}})
typo = sk.cell(**{{"{typo}": 0.85}})
deep = sk.cell(**{{"trainer.epochs.count": 2}})
extra = sk.cell(**{{"trainer.enable_db_registration": False}})
'''


@pytest.mark.parametrize("layout_name, moved, typo", [
    ("upstream", "generator.num_inference_engines", "generator.inference_engine.gpu_memory_utilisation"),
    ("fork", "generator.inference_engine.num_engines", "generator.gpu_memory_utilisation"),
])
def test_a_bad_path_is_refused_at_its_line_with_a_did_you_mean(sweeper, layout_name, moved, typo):
    schema = installed(layout_name)
    layout = skyrl_schema.LAYOUTS[layout_name]
    sweeper.grid("bad", MISPLACED.format(entry_point=ENTRY_POINTS[layout_name], moved=moved, typo=typo))
    result = sweeper.run("run", "--dry-run", "--executor", "debug", "--cluster", "none")
    assert result.ret != 0 and "nothing was run" in result.output, result
    lines = result.output.splitlines()
    why = f"; the cell runs the {layout_name} layout (its command runs {layout.package}), "

    def refused(where: str, text: str) -> bool:
        return any(f"grids/bad.py:{where}: {text}{why}" in line for line in lines)

    other = "upstream" if layout is FORK else "fork"
    assert refused(f"4: moved: {moved}", f"{moved} is not in {schema.source}: that is where the {other} layout "
                                         f"keeps num_inference_engines, which the {layout_name} layout names "
                                         f"{layout.engine_paths['num_inference_engines']}"), result
    fixed = typo.replace("utilisation", "utilization")
    assert refused(f"5: typo: {typo}", f"{typo} is not in {schema.source} (did you mean {fixed!r}?)"), result
    assert refused("6: deep: trainer.epochs.count", f"trainer.epochs is a value in {schema.source}, "
                                                    "it has no key 'count'"), result
    extra = f"trainer.enable_db_registration is not in {schema.source}"
    if layout is FORK:
        # The fork's Hydra adds a key its yaml lacks, and its code reads some: a note, not an error.
        assert f"note: grids/bad.py:7: {extra}: Hydra's ++ adds it" in result.output, result
        assert not any("extra: " in line for line in lines) and "3 errors found" in result.output, result
    else:
        hint = schema.problem("trainer.enable_db_registration").hint
        assert refused("7: extra: trainer.enable_db_registration", extra + hint), result
        assert "4 errors found" in result.output, result


VALUES = [None, True, 3e-06, 4, "Qwen/Qwen2.5-1.5B-Instruct", "a b", "null", "it's", 'say "hi" \\ now',
          "ends in \\", "x\\'y", ["x", 1], {"k": 1, "j": ["a", 2]}]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_values_reach_skyrl_as_written(value):
    # Each layout's own parser reads the value back: Hydra's override grammar for the fork,
    # OmegaConf.from_cli (which from_cli_overrides calls) upstream.
    overrides_parser = pytest.importorskip("hydra.core.override_parser.overrides_parser")
    omegaconf = pytest.importorskip("omegaconf")
    fork = overrides_parser.OverridesParser.create().parse_override(f"++x.v={skyrl.hydra_value(value)}")
    assert fork.value() == value
    upstream = omegaconf.OmegaConf.from_cli([f"x.v={skyrl.hydra_value(value, UPSTREAM)}"])
    assert omegaconf.OmegaConf.to_container(upstream)["x"]["v"] == value
