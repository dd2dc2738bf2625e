"""Selection: -k over ids and keywords, -m over marks, PATH::CELL with near names."""

import pytest

HEADER = '''
import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
'''
GRID = HEADER + '''
base = sk.base(train_batch_size=32, n=4, eager=True)
tbs = sk.axis("train_batch_size", [64, 128, sk.param(512, marks=sk.mark.slow)], id="tbs{train_batch_size}")
n = sk.axis("n", [8, 16], marks=sk.mark.slow)
cudagraph = sk.cell(eager=False)
combo_C = sk.cell(on=cudagraph, train_batch_size=128)
probe = sk.cell(n=64, marks=[sk.mark.slow, sk.mark.xfail(reason="OOM")])
'''


def ids(result) -> list[str]:
    return [line.split("::")[1].split()[0] for line in result.stdout.splitlines() if "::" in line]


def test_keyword_expression(sweeper):
    sweeper.grid("g", GRID)
    result = sweeper.run("list", "-k", "tbs and not 512")
    assert result.ret == 0, result
    assert ids(result) == ["tbs64", "tbs128"]
    assert "2 cells in 1 grid (7 deselected)" in result.stdout


def test_keyword_matches_axis_name_and_marks(sweeper):
    sweeper.grid("g", GRID)
    assert ids(sweeper.run("list", "-k", "n and not probe")) == ["n8", "n16"]
    assert ids(sweeper.run("list", "-k", "xfail")) == ["probe"]
    assert ids(sweeper.run("list", "-k", "COMBO")) == ["combo_C"]  # any case


def test_mark_expression(sweeper):
    sweeper.grid("g", GRID)
    assert ids(sweeper.run("list", "-m", "slow and not xfail")) == ["tbs512", "n8", "n16"]
    assert ids(sweeper.run("list", "-m", "not slow")) == ["base", "tbs64", "tbs128", "cudagraph",
                                                          "combo_C"]


def test_a_mark_no_cell_has_is_refused_with_the_known_marks(sweeper):
    sweeper.grid("g", GRID)
    for expression in ("slo", "not slo", "xfail or (slow and fast)"):
        result = sweeper.run("run", "-m", expression)
        assert result.ret == 4, result
        assert "Traceback" not in result.output, result
    result = sweeper.run("list", "-m", "not slo")
    assert "ERROR: -m 'not slo': no cell has the mark 'slo' (did you mean 'slow'?); " \
           "the marks of the collected cells: slow, xfail" in result.stderr, result
    assert "no cell has the mark 'fast'" in sweeper.run("list", "-m", "xfail or (slow and fast)").stderr
    assert not (sweeper.path / "runs").exists()


def test_node_ids(sweeper):
    sweeper.grid("g", GRID)
    result = sweeper.run("list", "grids/g.py::combo_C", "grids/g.py::base")
    assert ids(result) == ["base", "combo_C"]


def test_unknown_node_id_lists_near_names(sweeper):
    sweeper.grid("g", GRID)
    result = sweeper.run("list", "grids/g.py::tbs256", "grids/g.py::combo_c")
    assert result.ret == 4, result
    assert "grids/g.py::combo_c: no such cell in grids/g.py; near names: combo_C" in result.stderr
    assert "grids/g.py::tbs256: no such cell in grids/g.py; near names: tbs64, tbs512, tbs128" in result.stderr


@pytest.mark.parametrize("command", ["list", "run", "status", "report", "cancel"])
def test_every_command_refuses_an_unknown_cell_with_near_names(sweeper, command):
    sweeper.grid("g", GRID)
    result = sweeper.run(command, "grids/g.py::combo_c")
    assert result.ret == 4, result
    assert "grids/g.py::combo_c: no such cell in grids/g.py; near names: combo_C" in result.stderr
    assert not (sweeper.path / "runs").exists()


def test_status_shows_only_the_named_cells(sweeper):
    sweeper.grid("g", GRID)
    result = sweeper.run("status", "grids/g.py::combo_C", "grids/g.py::tbs64")
    assert result.ret == 0, result
    assert [line.split()[0] for line in result.stdout.splitlines() if "::" in line] == \
        ["grids/g.py::tbs64", "grids/g.py::combo_C"]


def test_bad_keyword_expression_points_at_the_column(sweeper):
    sweeper.grid("g", GRID)
    result = sweeper.run("run", "-k", "tbs and (512 or")
    assert result.ret == 4, result
    assert "-k 'tbs and (512 or': wrong expression at column 16: expected not OR left parenthesis " \
           "OR identifier; got end of input" in result.stderr
    assert not (sweeper.path / "runs").exists()


def test_nothing_selected(sweeper):
    sweeper.grid("g", GRID)
    result = sweeper.run("list", "-k", "nothing_matches_this")
    assert result.ret == 5
    assert "0 cells" in result.stdout


def test_failed_picks_the_cells_whose_last_run_failed(sweeper):
    sweeper.grid("g", '''
import sweepkit as sk
target = sk.command("{python}", "-c", "import json, sys; sys.exit(json.load(open(sys.argv[1]))['code'])",
                    "{config}")
base = sk.base(code=0)
broken = sk.cell(code=3)
fine = sk.cell(code=0, other=1)
''')
    first = sweeper.run("run", "--executor", "local")
    assert first.ret == 1, first
    result = sweeper.run("list", "--failed")
    assert result.ret == 0, result
    assert ids(result) == ["broken"]
