"""The grid-file API: declarations, ids, tied keys, products, marks, on=, and locations."""

import json
import re
from pathlib import Path

import pytest

import sweepkit as sk
from sweepkit.grid.declare import GridError
from sweepkit.grid.ids import format_value, from_template, id_problem

REPO = Path(__file__).resolve().parents[1]

HEADER = '''
import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
'''


def listed(result) -> dict[str, str]:
    """node id -> rest of its line, from `sweep list` output."""
    out = {}
    for line in result.stdout.splitlines():
        if "::" in line:
            nodeid, _, rest = line.partition("  ")
            out[nodeid.split("::")[1]] = rest
    return out


def test_axis_ids_from_template_list_param_and_default(sweeper):
    sweeper.grid("g", HEADER + '''
base = sk.base(train_batch_size=32, policy_mini_batch_size=32, n=4, gmu=0.7, lr=1e-6)
tbs = sk.axis("train_batch_size, policy_mini_batch_size", [(64, 64), sk.param((512, 512), id="wide")],
              id="tbs{train_batch_size}")
gmu = sk.axis("gmu", [0.80, 0.85], ids=["gmu080", "gmu085"])
n = sk.axis("n", [8, 16])
lr = sk.axis("lr", [3e-7, 1e-5], id="lr{lr}")
''')
    result = sweeper.run("list")
    assert result.ret == 0, result
    cells = listed(result)
    assert list(cells) == ["base", "tbs64", "wide", "gmu080", "gmu085", "n8", "n16", "lr3e-7", "lr1e-5"]
    assert cells["tbs64"] == "train_batch_size=64 policy_mini_batch_size=64"
    assert cells["gmu085"] == "gmu=0.85"
    assert cells["base"].startswith("(base)")


def test_product_is_cartesian_only_when_asked(sweeper):
    sweeper.grid("g", HEADER + '''
base = sk.base(lr=1e-6, n=4)
lr_x_n = sk.product(lr=[1e-6, 1e-5], n=[8, 16], id="lr{lr}_n{n}")
''')
    result = sweeper.run("list")
    assert result.ret == 0, result
    # 1e-6 with n=4 would be the base; the product only holds the 4 named combinations.
    assert list(listed(result)) == ["base", "lr1e-6_n8", "lr1e-6_n16", "lr1e-5_n8", "lr1e-5_n16"]


def test_cell_on_another_cell_and_marks(sweeper):
    sweeper.grid("g", HEADER + '''
marks = [sk.mark.gsm8k]
base = sk.base(lr=1e-6, n=4, entropy=0.0)
combo_acc = sk.cell(lr=1e-5, n=8, marks=sk.mark.slow)
combo_acc_stab = sk.cell(on=combo_acc, entropy=0.01)
probe = sk.cell(n=64, marks=sk.mark.xfail(reason="OOM at n64"))
''')
    result = sweeper.run("list")
    assert result.ret == 0, result
    cells = listed(result)
    assert cells["combo_acc_stab"].startswith("lr=1e-5 n=8 entropy=1e-2  [gsm8k]")
    assert cells["combo_acc"].endswith("[gsm8k, slow]")
    assert cells["probe"].endswith("[gsm8k, xfail: OOM at n64]")


def test_declarations_record_file_and_line():
    here = __file__
    declared = sk.cell(lr=1.0); line = declared.location[1]  # noqa: E702 - same line on purpose
    assert declared.location == (here, line)
    assert sk.axis("lr", [1.0]).location[0] == here
    assert sk.param(1.0).location[0] == here


def test_marks_take_arguments():
    mark = sk.mark.xfail(reason="OOM")
    assert mark.name == "xfail" and mark.reason == "OOM"
    assert sk.mark.slow.name == "slow" and sk.mark.slow.args == ()


def test_tied_axis_needs_tuples_of_the_right_length():
    with pytest.raises(GridError, match="must be a tuple of 2 values"):
        sk.axis("a, b", [(1, 2), 3])


def test_ids_list_must_match_values():
    with pytest.raises(GridError, match="2 ids for 1 values"):
        sk.axis("a", [1], ids=["x", "y"])


@pytest.mark.parametrize(("value", "text"), [(1e-5, "1e-5"), (3e-4, "3e-4"), (0.85, "0.85"),
                                             (True, "true"), ((2, 2), "2-2"), (512, "512")])
def test_id_values_read_short(value, text):
    assert format_value(value) == text


def test_id_template_fills_keys():
    assert from_template("{num_inference_engines}xTP{inference_tp}",
                         {"num_inference_engines": 2, "inference_tp": 2}) == "2xTP2"


@pytest.mark.parametrize("bad", ["a/b", "..", "a..b", "x;rm", "a b", "$(x)", "`x`", "report", ""])
def test_unsafe_ids_are_refused(bad):
    assert id_problem(bad)


@pytest.mark.parametrize("good", ["base", "tbs128", "2xTP2", "lr1e-5", "gmu0.85", "a+b", "combo_C"])
def test_safe_ids_pass(good):
    assert id_problem(good) is None


def test_cell_config_hash_is_stable_and_sensitive():
    from sweepkit.grid.cell import Cell, Target

    target = Target(name="command", argv=("x", "{config}"))
    make = lambda **config: Cell(grid="g.py", grid_name="g", name="a", config=config,  # noqa: E731
                                 target=target, location=("g.py", 1), launch_keys={"gpus": 0})
    assert make(lr=1.0, gpus=1).config_hash() == make(gpus=1, lr=1.0).config_hash()
    assert make(lr=1.0).config_hash() != make(lr=2.0).config_hash()
    cell = make(lr=1.0, gpus=2)
    assert cell.target_config() == {"lr": 1.0}
    assert cell.launch() == {"gpus": 2}
    json.dumps(cell.to_json())


def test_the_documented_grid_examples_collect_as_written(sweeper):
    # The example grids of docs/grids.md, ARCHITECTURE and the README, verbatim; with the smoke
    # profile (no GPUs needed) every cell would run.
    from test_job import readme_block

    architecture = re.findall(r"```python\n(# grids/example.py\n.*?)```", (REPO / "docs" / "ARCHITECTURE.md").read_text(),
                              flags=re.S)
    assert len(architecture) == 1
    sweeper.write("grids/my_grid.py", readme_block("# grids/my_grid.py"))
    sweeper.write("grids/example.py", architecture[0])
    sweeper.write("grids/my_sweep.py", readme_block("# grids/my_sweep.py"))
    listed = sweeper.run("list", "grids/my_sweep.py")
    assert listed.ret == 0, listed  # base on 3 seeds (the trainer's 42, then 43, 44), 2 + 2 axis cells, 3 named
    assert "10 cells in 1 grid" in listed.stdout and "grids/my_sweep.py::base-seed44" in listed.stdout, listed
    for grid, cells in (("my_grid", 15), ("example", 16)):  # the second has tbs256 too
        listed = sweeper.run("list", f"grids/{grid}.py")
        assert listed.ret == 0, listed
        assert f"{cells} cells in 1 grid" in listed.stdout and f"grids/{grid}.py::lr1e-5_n8" in listed.stdout
        planned = sweeper.run("run", f"grids/{grid}.py", "--profile", "smoke", "--dry-run",
                              env={"CUDA_VISIBLE_DEVICES": ""})
        assert planned.ret == 0, planned
        assert f"would run {cells} fresh" in planned.stdout
