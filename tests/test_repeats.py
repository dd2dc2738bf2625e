"""Repeats over seeds: ``seeds=`` on every declaration and a module-level ``seeds = N`` expand
a cell into ``<id>``, ``<id>-seed<s+1>``, ...; every cell gets the group of cells it repeats."""

from __future__ import annotations

import json

import pytest

from conftest import Sweeper
from test_collect import refused
from sweepkit_plugins import skyrl
from test_run import cpu_sweeper, script_grid  # noqa: F401 (cpu_sweeper is a fixture)

HEADER = '''import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
'''


def collected(sweeper: Sweeper) -> dict:
    """Cell id -> cell, through the real collection and plugins."""
    from sweepkit.cli import start_session
    from sweepkit.grid.collect import collect

    grids = str(sweeper.path / "grids")
    session = start_session(["list", "--rootdir", str(sweeper.path), grids])
    session.configure()
    return {cell.name: cell for cell in collect(session, [grids]).cells}


def seeds_of(cells: dict) -> dict[str, object]:
    """Cell id -> its ``seed`` (None where the config has no seed key), in grid order."""
    return {name: cell.config.get("seed") for name, cell in cells.items()}


def listed(result) -> list[str]:
    """The cell ids `sweep list -q` printed."""
    return [line.split("::")[1] for line in result.stdout.splitlines() if "::" in line]


def test_an_int_repeats_each_cell_from_its_own_seed(sweeper):
    sweeper.grid("g", HEADER + '''
seeds = 3
base = sk.base(lr=1.0, seed=10)
fast = sk.cell(lr=2.0, seed=100)
''')
    cells = collected(sweeper)
    assert seeds_of(cells) == {"base": 10, "base-seed11": 11, "base-seed12": 12,
                               "fast": 100, "fast-seed101": 101, "fast-seed102": 102}
    assert cells["fast-seed101"].config == {"lr": 2.0, "seed": 101}
    assert cells["fast-seed101"].diff == {"lr": (1.0, 2.0), "seed": (10, 101)}
    assert [cell.index for cell in cells.values()] == [0, 1, 2, 3, 4, 5]  # each repeat after its cell


def test_a_list_gives_exactly_those_seeds_and_the_first_may_change_the_cells_own(sweeper):
    sweeper.grid("g", HEADER + '''
base = sk.base(lr=1.0, seed=10)
same = sk.cell(lr=2.0, seeds=[10, 20, 30])
moved = sk.cell(lr=3.0, seeds=(7, 8))
''')
    cells = collected(sweeper)
    assert seeds_of(cells) == {"base": 10, "same": 10, "same-seed20": 20, "same-seed30": 30,
                               "moved": 7, "moved-seed8": 8}
    assert cells["moved"].diff == {"lr": (1.0, 3.0), "seed": (10, 7)}  # same id, its seed from the list
    assert cells["moved"].location_of("seed") == ("grids/g.py", 6)  # where seeds= set it


def test_module_level_seeds_and_the_precedence_of_a_cells_axis_and_params_own(sweeper):
    sweeper.grid("g", HEADER + '''
seeds = 2
base = sk.base(lr=1.0, n=1, m=1, seed=0)
alone = sk.cell(lr=2.0, seeds=1)
three = sk.cell(lr=3.0, seeds=3)
n = sk.axis("n", [2, sk.param(3, seeds=[5, 6, 7])], seeds=[0, 9])
m = sk.axis("m", [2])
both = sk.product(lr=[4.0], n=[4, 5], id="lr{lr}_n{n}", seeds=1)
''')
    assert seeds_of(collected(sweeper)) == {
        "base": 0, "base-seed1": 1,                                 # the module's seeds
        "alone": 0,                                                 # seeds=1: the cell alone
        "three": 0, "three-seed1": 1, "three-seed2": 2,             # the cell's own wins over the module's
        "n2": 0, "n2-seed9": 9,                                     # the axis's
        "n3": 5, "n3-seed6": 6, "n3-seed7": 7,                      # the param's wins over the axis's
        "m2": 0, "m2-seed1": 1,                                     # the module's again
        "lr4.0_n4": 0, "lr4.0_n5": 0,                               # the product's
    }


def test_base_seeds_repeat_base_alone_and_the_modules_every_cell_but_base(sweeper):
    sweeper.grid("g", HEADER + '''
base = sk.base(lr=1.0, seed=0, seeds=2)
other = sk.cell(lr=2.0)
mine = sk.cell(lr=3.0, seeds=[4])
''')
    assert seeds_of(collected(sweeper)) == {"base": 0, "base-seed1": 1, "other": 0, "mine": 4}
    sweeper.grid("g", HEADER + '''
seeds = 3
base = sk.base(lr=1.0, seed=0, seeds=2)
other = sk.cell(lr=2.0)
''')
    assert seeds_of(collected(sweeper)) == {"base": 0, "base-seed1": 1, "other": 0, "other-seed1": 1,
                                            "other-seed2": 2}


def test_the_trainers_repeats_count_up_from_its_schema_default_seed(sweeper):
    sweeper.grid("t", '''import sweepkit as sk
base = sk.base(lr=1e-6, seeds=3)
''')
    cells = collected(sweeper)
    assert list(cells) == ["base", "base-seed43", "base-seed44"]  # trainer/config.py: seed = 42
    assert "seed" not in cells["base"].config  # its own seed: the config stays as written
    assert cells["base-seed43"].config["seed"] == 43 and cells["base-seed43"].target.seed_key == "seed"


def test_adding_seeds_keeps_every_existing_id_and_config_hash(sweeper):
    cells = '''{seeds}
base = sk.base(lr=1.0, n=4, seed=1)
n = sk.axis("n", [8, 16])
fast = sk.cell(lr=2.0)
'''
    sweeper.grid("plain", HEADER + cells.format(seeds=""))
    sweeper.grid("repeated", HEADER + cells.format(seeds="seeds = 3"))
    from sweepkit.cli import start_session
    from sweepkit.grid.collect import collect

    session = start_session(["list", "--rootdir", str(sweeper.path)])
    session.configure()
    found = collect(session, [str(sweeper.path / "grids")]).cells
    plain = {c.name: c for c in found if c.grid_name == "plain"}
    repeated = {c.name: c for c in found if c.grid_name == "repeated"}
    assert list(plain) == ["base", "n8", "n16", "fast"]
    assert [name for name in repeated if "-seed" not in name] == list(plain)
    assert len(repeated) == 12
    for name, cell in plain.items():
        assert repeated[name].config_hash() == cell.config_hash(), name
        assert repeated[name].config == cell.config
    assert repeated["n8-seed2"].config_hash() != plain["n8"].config_hash()


def test_groups_join_repeats_however_declared_and_only_those(sweeper):
    sweeper.grid("g", HEADER + '''
base = sk.base(lr=1.0, seed=0)
by_axis = sk.axis("seed", [1, 2], id="s{seed}")
fast = sk.cell(lr=2.0, seeds=2)
fast_again = sk.cell(lr=2.0, seed=7)
other = sk.cell(lr=3.0, seed=5)
''')
    cells = collected(sweeper)
    assert {name: cell.group for name, cell in cells.items()} == {
        "base": "base", "s1": "base", "s2": "base",                 # an explicit seed axis
        "fast": "fast", "fast-seed1": "fast", "fast_again": "fast",  # seeds= and a cell that differs in seed only
        "other": "other",                                            # differs in lr: its own group
    }
    record = cells["fast-seed1"].to_json()
    assert record["group"] == "fast" and record["target"]["seed_key"] == "seed"
    assert json.loads(json.dumps(record))["group"] == "fast"


def test_a_target_with_another_seed_key_repeats_and_groups_over_that_key(sweeper):
    sweeper.grid("g", '''import sweepkit as sk
target = sk.command("{python}", "-c", "pass", seed_key="rng")
base = sk.base(lr=1.0, rng=3, seed=0, seeds=2)
''')
    cells = collected(sweeper)
    assert {name: (cell.config["rng"], cell.config["seed"], cell.group) for name, cell in cells.items()} == \
        {"base": (3, 0, "base"), "base-seed4": (4, 0, "base")}
    assert cells["base"].to_json()["target"]["seed_key"] == "rng"


def test_a_skyrl_cells_seed_reaches_skyrl_as_trainer_seed(sweeper):
    sweeper.grid("g", f'''import sweepkit as sk
target = sk.command("{{python}}", "-m", "{skyrl.ENTRY_POINT}")
base = sk.base(lr=1e-6, seed=42, seeds=2)
''')
    repeat = collected(sweeper)["base-seed43"]
    assert skyrl.form_errors(repeat, skyrl.layout_of(repeat)[0]) == []
    assert "++trainer.seed=43" in skyrl.hydra_overrides(repeat)


def test_keyword_selects_every_repeat_and_a_node_id_only_one(sweeper):
    sweeper.grid("g", HEADER + '''
base = sk.base(train_batch_size=32, seed=0)
width = sk.axis("train_batch_size", [64, sk.param(128, marks=sk.mark.slow)], id="tbs{train_batch_size}", seeds=3)
''')
    cells = collected(sweeper)
    assert {"tbs128", "width", "tbs128-seed1"} <= cells["tbs128-seed1"].keywords
    assert [m.name for m in cells["tbs128-seed2"].marks] == ["slow"]
    assert cells["tbs128-seed2"].location == cells["tbs128"].location == ("grids/g.py", 5)
    assert listed(sweeper.run("list", "-q", "-k", "tbs128")) == ["tbs128", "tbs128-seed1", "tbs128-seed2"]
    # the axis's name is a keyword of its repeats too, not only a part of their ids
    assert listed(sweeper.run("list", "-q", "-k", "width")) == \
        ["tbs64", "tbs64-seed1", "tbs64-seed2", "tbs128", "tbs128-seed1", "tbs128-seed2"]
    assert listed(sweeper.run("list", "-q", "-m", "slow")) == ["tbs128", "tbs128-seed1", "tbs128-seed2"]
    assert listed(sweeper.run("list", "-q", "grids/g.py::tbs128")) == ["tbs128"]
    assert listed(sweeper.run("list", "-q", "grids/g.py::tbs128-seed2")) == ["tbs128-seed2"]


def test_sweep_list_shows_each_repeat_with_its_seed_after_the_cells_own_change(sweeper):
    sweeper.grid("g", HEADER + '''
marks = [sk.mark.fast]
base = sk.base(lr=1.0, seed=0)
big = sk.cell(lr=2.0, seeds=2)
''')
    result = sweeper.run("list")
    assert result.ret == 0, result
    assert result.stdout.splitlines() == ["grids/g.py::base  (base)  [fast]",
                                          "grids/g.py::big  lr=2.0  [fast]",
                                          "grids/g.py::big-seed1  lr=2.0 seed=1  [fast]",
                                          "3 cells in 1 grid"]


@pytest.mark.parametrize(("line", "message"), [
    ("a = sk.cell(lr=2.0, seeds=0)", "seeds: must be at least 1, got 0"),
    ("a = sk.cell(lr=2.0, seeds=-2)", "seeds: must be at least 1, got -2"),
    ("a = sk.cell(lr=2.0, seeds=2.0)", "seeds: expected a number of seeds (an int of at least 1) or a list of "
                                       "distinct int seeds, got 2.0 (float)"),
    ("a = sk.cell(lr=2.0, seeds=True)", "seeds: expected a number of seeds (an int of at least 1) or a list of "
                                        "distinct int seeds, got True (bool)"),
    ("a = sk.cell(lr=2.0, seeds='3')", "seeds: expected a number of seeds (an int of at least 1) or a list of "
                                       "distinct int seeds, got '3' (str)"),
    ("a = sk.cell(lr=2.0, seeds=[])", "seeds: an empty list; give at least one seed"),
    ("a = sk.cell(lr=2.0, seeds=[1, 2, 1])", "seeds: 1 repeated in [1, 2, 1]; each seed must appear once"),
    ("a = sk.cell(lr=2.0, seeds=[1, 'x'])", "seeds: 'x' (str) in [1, 'x'] is not an int seed"),
    ("a = sk.axis('lr', [2.0], seeds=0)", "seeds: must be at least 1, got 0"),
    ("a = sk.product(lr=[2.0], seeds=0)", "seeds: must be at least 1, got 0"),
    ("a = sk.axis('lr', [sk.param(2.0, seeds=0)])", "seeds: must be at least 1, got 0"),
])
def test_a_bad_seeds_value_is_refused_at_its_line(sweeper, line, message):
    sweeper.grid("g", HEADER + "base = sk.base(lr=1.0, seed=0)\n" + line + "\n")
    refused(sweeper.run("list"), f"grids/g.py:4: {message}")


def test_bad_seeds_on_the_base_and_at_module_level_are_refused_at_their_lines(sweeper):
    sweeper.grid("a", HEADER + "base = sk.base(lr=1.0, seed=0, seeds=0)\n")
    sweeper.grid("b", HEADER + "marks = []\nseeds = 'all'\nbase = sk.base(lr=1.0, seed=0)\n")
    refused(sweeper.run("list"),
            "grids/a.py:3: seeds: must be at least 1, got 0",
            "grids/b.py:4: seeds: expected a number of seeds (an int of at least 1) or a list of distinct int "
            "seeds, got 'all' (str)",
            "2 errors found in 2 grid files")


def test_every_seeds_mistake_of_a_file_is_reported_together(sweeper):
    sweeper.grid("g", HEADER + '''seeds = 'x'
base = sk.base(lr=1.0, seed=0)
a = sk.cell(lr=2.0, seeds=0)
b = sk.cell(lr=3.0, seeds=[])
c = sk.cell(lr=4.0, seeds=[2, 2])
d = sk.cell(lr="fast")
''')
    refused(sweeper.run("list"),
            "grids/g.py:3: seeds: expected a number of seeds", "grids/g.py:5: seeds: must be at least 1",
            "grids/g.py:6: seeds: an empty list", "grids/g.py:7: seeds: 2 repeated",
            "grids/g.py:8: d: lr: expected float like the base's 1.0, got 'fast' (str)",  # in the same round
            "5 errors found")


def test_a_target_without_a_seed_key_cannot_repeat(sweeper):
    sweeper.grid("g", '''import sweepkit as sk
target = sk.command("{python}", "-c", "pass", seed_key=None)
base = sk.base(lr=1.0)
one = sk.cell(lr=2.0, seeds=1)
two = sk.cell(lr=3.0, seeds=2)
''')
    refused(sweeper.run("list"), "grids/g.py:5: seeds=2: target 'command' has no seed key (its seed_key is None), "
                                 "so its cells cannot repeat over seeds")
    assert "grids/g.py:4" not in sweeper.run("list").stderr  # seeds=1 is the cell alone


def test_counting_up_needs_a_seed_to_start_from(sweeper):
    sweeper.grid("g", HEADER + '''
base = sk.base(lr=1.0)
a = sk.cell(lr=2.0, seeds=3)
b = sk.cell(lr=3.0, seed="x", seeds=3)
listed = sk.cell(lr=4.0, seeds=[3, 4])
''')
    result = sweeper.run("list")
    refused(result, "grids/g.py:5: seeds=3 counts up from the cell's own 'seed', which neither the cell sets nor "
                    "target 'command' gives a default for; set seed=... in sk.base, or list the seeds",
            "grids/g.py:6: seeds=3 counts up from the cell's own 'seed', which is 'x' (str), not an int",
            "2 errors found")
    assert "grids/g.py:7" not in result.stderr  # a list needs no seed to start from


def test_seeds_that_collide_with_another_cell_name_both_cells(sweeper):
    sweeper.grid("g", HEADER + '''
base = sk.base(lr=1.0, seed=1)
a = sk.cell(lr=2.0, seeds=[1, 2])
two = sk.cell(lr=2.0, seed=2)
late = sk.cell(lr=5.0, seed=9)
early = sk.cell(lr=5.0, seeds=[8, 9])
moved = sk.cell(lr=1.0, seed=5, seeds=[1, 3])
''')
    refused(sweeper.run("list"),
            "grids/g.py:6: cell 'two' has the same config as cell 'a-seed2' (grids/g.py:5; a repeat of 'a': "
            "seed=2 from seeds=[1, 2] at grids/g.py:5); a duplicate cell would run the same thing twice; give seeds= "
            "values that no other cell of the grid has",
            "grids/g.py:8: cell 'early-seed9' (a repeat of 'early': seed=9 from seeds=[8, 9] at grids/g.py:8) has "
            "the same config as cell 'late' (grids/g.py:7); a duplicate cell",
            "grids/g.py:9: cell 'moved' (seed=1 from seeds=[1, 3] at grids/g.py:9) has the same config as cell "
            "'base' (grids/g.py:4); a duplicate cell",
            "3 errors found")


def test_a_repeat_id_that_is_taken_is_a_collision(sweeper):
    sweeper.grid("g", HEADER + '''
base = sk.base(lr=1.0, seed=0)
a = sk.cell(lr=2.0, seeds=2)
a_seed = sk.axis("lr", [3.0], ids=["a-seed1"])
''')
    refused(sweeper.run("list"), "grids/g.py:6: cell id 'a-seed1' is already used by the cell at grids/g.py:5")


def test_a_module_level_axis_named_seeds_is_an_axis(sweeper):
    sweeper.grid("g", HEADER + '''
base = sk.base(lr=1.0, seed=0)
seeds = sk.axis("seed", [1, 2], id="seed{seed}")
''')
    cells = collected(sweeper)
    assert {name: cell.group for name, cell in cells.items()} == {"base": "base", "seed1": "base", "seed2": "base"}


def test_each_repeat_runs_with_its_own_seed_and_records_its_group(cpu_sweeper):
    script_grid(cpu_sweeper, "g", "seeds = 2\nquick = sk.cell(steps=2)", seed=7)
    result = cpu_sweeper.run("run")
    assert result.ret == 0, result
    assert "4 passed" in result.stdout
    runs = cpu_sweeper.path / "runs" / "g"
    seen = {}
    for cell in ("base", "base-seed8", "quick", "quick-seed8"):
        config = json.loads((runs / cell / "config.json").read_text())
        record = json.loads((runs / cell / "cell.json").read_text())
        assert record["nodeid"] == f"grids/g.py::{cell}"
        seen[cell] = (config["seed"], config["steps"], record["group"], record["target"]["seed_key"])
    assert seen == {"base": (7, 3, "base", "seed"), "base-seed8": (8, 3, "base", "seed"),
                    "quick": (7, 2, "quick", "seed"), "quick-seed8": (8, 2, "quick", "seed")}
    assert json.loads((runs / "quick-seed8" / "state.json").read_text())["state"] == "completed"
