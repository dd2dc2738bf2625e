"""Collection through `sweep list`: bad grid files refused with file:line, cross-grid bases, paths."""

import json
import shutil

import pytest

HEADER = '''
import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
'''


def refused(result, *fragments):
    """The command failed as bad input, said why, and ran nothing."""
    assert result.ret == 4, result
    for fragment in fragments:
        assert fragment in result.stderr, result
    assert "Traceback" not in result.output, result


def test_syntax_error_names_file_and_line(sweeper):
    sweeper.grid("g", HEADER + "base = sk.base(lr=1e-6\nx = 1\n")
    result = sweeper.run("list")
    refused(result, "grids/g.py:3: syntax error")
    assert "^" in result.stderr


def test_exception_in_a_grid_names_its_line(sweeper):
    sweeper.grid("g", HEADER + "base = sk.base(lr=1e-6)\nx = undefined_name\n")
    refused(sweeper.run("list"), "grids/g.py:4: NameError: name 'undefined_name' is not defined")


def test_a_grid_needs_a_base(sweeper):
    sweeper.grid("g", HEADER + "a = sk.cell(lr=1.0)\n")
    refused(sweeper.run("list"), "grids/g.py:3: no base cell; declare one with base = sk.base(...)")


@pytest.mark.parametrize("text", ["", "\n# nothing here yet\n"])
def test_an_empty_grid_names_its_first_line(sweeper, text):
    sweeper.grid("g", text)
    refused(sweeper.run("list"), "grids/g.py:1: the grid file declares nothing; declare its base "
                                 "cell: base = sk.base(key=value, ...)")


def test_a_binary_grid_file_is_refused_without_a_line_of_none(sweeper):
    sweeper.write("grids/nul.py", "x = 1\n")
    (sweeper.path / "grids/nul.py").write_bytes(b"x = 1\n\x00\x01\x02\n")
    (sweeper.path / "grids/latin.py").write_bytes(b"import sweepkit as sk\n\xc4\xff\xfe = 1\n")
    result = sweeper.run("list")
    refused(result, "grids/nul.py:2: not a Python source file: it holds a NUL byte",
            "grids/latin.py:2: not a Python source file: byte 0xc4 is not utf-8 text",
            "2 errors found in 2 grid files")
    assert "None" not in result.stderr, result


@pytest.mark.parametrize("stop, shown", [("sys.exit(0)", "SystemExit(0)"), ("sys.exit(3)", "SystemExit(3)"),
                                         ("sys.exit()", "SystemExit(None)"), ("exit('bye')", "SystemExit('bye')")])
def test_a_grid_file_that_does_not_run_to_its_end_is_a_collection_error(sweeper, stop, shown):
    sweeper.grid("a", HEADER + "base = sk.base(lr=1e-6)\n")
    sweeper.grid("b", HEADER + f"import sys\nbase = sk.base(lr=1e-6)\n{stop}\nlate = sk.cell(lr=1.0)\n")
    sweeper.grid("c", HEADER + "base = sk.base(lr=1e-6)\nn = sk.axis('n', [8])\n")
    result = sweeper.run("run", "grids/")
    refused(result, f"grids/b.py:5: {shown} stopped the file before its end; a grid file must run "
                    "to its end to be collected", "grids/c.py:4: axis over 'n'", "2 errors found in 2 grid files")
    assert not (sweeper.path / "runs").exists()
    assert sweeper.run("list", "grids/a.py").ret == 0


def test_collection_errors_come_with_the_key_errors_of_the_cells_in_one_round(sweeper):
    sweeper.grid("g", '''import sweepkit as sk
base = sk.base(lr=1e-6, n_samples_per_prompt=4, lrr=3.0)
n = sk.axis("n_sample_per_prompt", [8, 16])
slow = sk.cell(lr="fast")
''')
    result = sweeper.run("run")
    refused(result, "grids/g.py:3: axis over 'n_sample_per_prompt': no such key for target 'trainer' "
                    "(did you mean 'n_samples_per_prompt'?)",
            "grids/g.py:2: base, slow (2 cells): lrr: unknown key for target 'trainer' (did you mean 'lr'?)",
            "grids/g.py:4: slow: lr: expected float, got 'fast' (str)",
            "3 errors found; nothing was run")


def test_marks_need_names_that_select_and_xfail_needs_a_reason(sweeper):
    sweeper.grid("g", HEADER + '''marks = [getattr(sk.mark, "not a mark; rm -rf")]
base = sk.base(lr=1e-6)
probe = sk.cell(lr=1.0, marks=sk.mark.xfail)
strict = sk.cell(lr=2.0, marks=[sk.mark.xfail(strict=True)])
empty = sk.cell(lr=3.0, marks=sk.mark.xfail(reason=""))
lr = sk.axis("lr", [4.0, sk.param(5.0, marks=sk.Mark(name="or"))])
fine = sk.cell(lr=6.0, marks=[sk.mark.xfail(reason="OOM"), sk.mark.slow_2])
''')
    result = sweeper.run("list")
    need = "xfail needs a reason: sk.mark.xfail(reason=\"...\"), shown next to XFAIL"
    refused(result, "grids/g.py:3: mark 'not a mark; rm -rf': a mark name must be a Python identifier "
                    "other than and, or, not, so that -m can select it",
            f"grids/g.py:5: {need}", f"grids/g.py:6: {need}", f"grids/g.py:7: {need}",
            "grids/g.py:8: mark 'or': a mark name must be", "5 errors found")
    assert "grids/g.py:9" not in result.stderr, result


def test_axis_over_a_key_the_base_lacks(sweeper):
    sweeper.grid("g", HEADER + "base = sk.base(lr=1e-6)\n\nn = sk.axis('n_samples', [8, 16])\n")
    refused(sweeper.run("list"), "grids/g.py:5: axis over 'n_samples': the base has no such key")


def test_two_cells_with_one_id(sweeper):
    sweeper.grid("g", HEADER + '''base = sk.base(lr=1e-6)
lr = sk.axis("lr", [1e-5, 2e-5], id="fast")
''')
    refused(sweeper.run("list"), "grids/g.py:4: cell id 'fast' is already used", "ids must be unique")


def test_a_cell_named_like_an_axis_cell(sweeper):
    sweeper.grid("g", HEADER + '''base = sk.base(n=4)
n = sk.axis("n", [8])
n8 = sk.cell(n=9)
''')
    refused(sweeper.run("list"), "grids/g.py:5: cell id 'n8' is already used by the cell at grids/g.py:4")


def test_two_cells_with_the_same_config(sweeper):
    sweeper.grid("g", HEADER + '''base = sk.base(lr=1e-6)
a = sk.cell(lr=1e-5)
b = sk.cell(lr=1e-5)
''')
    refused(sweeper.run("list"), "grids/g.py:5: cell 'b' has the same config as cell 'a' (grids/g.py:4)")


def test_a_cell_equal_to_the_base(sweeper):
    sweeper.grid("g", HEADER + "base = sk.base(lr=1e-6)\nlr = sk.axis('lr', [1e-6, 1e-5])\n")
    refused(sweeper.run("list"), "same config as cell 'base'")


@pytest.mark.parametrize("bad", ["../x", "a/b", "x;rm -rf", "$(id)", "a b", "report"])
def test_unsafe_cell_ids(sweeper, bad):
    sweeper.grid("g", HEADER + f"base = sk.base(lr=1e-6)\nlr = sk.axis('lr', [sk.param(1e-5, id={bad!r})])\n")
    result = sweeper.run("list")
    refused(result, f"grids/g.py:4: cell id {bad!r} is")


def test_every_mistake_of_every_grid_file_is_reported_together(sweeper):
    sweeper.grid("a", HEADER + '''base = sk.base(lr=1e-6, n=4)
gen = sk.axis("gen", [256, 512])
lr = sk.axis("lr", [1e-5, 2e-5], id="fast")
n = sk.axis("n", [sk.param(8, id="a/b"), 16])
same = sk.cell(lr=1e-3)
again = sk.cell(lr=1e-3)
stab = sk.cell(on="stable", n=2)
''')
    sweeper.grid("b", HEADER + "base = sk.base(lr=1e-6\n")
    sweeper.grid("c", 'import sweepkit as sk\ntarget = "trainr"\nbase = sk.base(lr=1.0)\nother = sk.base(lr=2.0)\n')
    sweeper.grid("d", HEADER + "base = sk.base(lr=1e-6)\n")
    result = sweeper.run("run")
    messages = [
        "grids/a.py:4: axis over 'gen': the base has no such key",
        "grids/a.py:5: cell id 'fast' is already used by the cell at grids/a.py:5",
        "grids/a.py:6: cell id 'a/b' is not allowed",
        "grids/a.py:8: cell 'again' has the same config as cell 'same' (grids/a.py:7)",
        "grids/a.py:9: on='stable': no cell of that name in this grid",
        "grids/b.py:3: syntax error",
        "grids/c.py:2: target 'trainr': not a registered target",
        "grids/c.py:4: a second sk.base ('other'); a grid has one base",
    ]
    refused(result, *messages, "8 errors found in 3 grid files; nothing was run")
    positions = [result.stderr.index(message) for message in messages]
    assert positions == sorted(positions), result
    assert not (sweeper.path / "runs").exists()


def test_a_grid_based_on_a_bad_grid_shows_both(sweeper):
    sweeper.grid("first", HEADER + "base = sk.base(lr=1e-6)\nn = sk.axis('n', [8])\n")
    sweeper.grid("second", HEADER + 'base = sk.base(from_cell="first.py::base", gen=1024)\n')
    result = sweeper.run("list", "grids/second.py")
    refused(result, "grids/first.py:4: axis over 'n': the base has no such key",
            "grids/second.py:3: from_cell='first.py::base': first.py cannot be collected (above)",
            "2 errors found in 2 grid files")
    # Named too, the bad grid's own errors are shown once.
    result = sweeper.run("list", "grids/first.py", "grids/second.py")
    assert result.stderr.count("axis over 'n'") == 1, result


def test_base_from_a_cell_of_another_grid(sweeper):
    sweeper.grid("first", HEADER + '''base = sk.base(lr=1e-6, n=4, gen=512)
combo_C = sk.cell(n=8)
''')
    sweeper.grid("second", HEADER + '''base = sk.base(from_cell="first.py::combo_C", gen=1024)
lr = sk.axis("lr", [1e-5])
''')
    result = sweeper.run("list", "grids/second.py")
    assert result.ret == 0, result
    assert "grids/second.py::lr1e-5  lr=1e-5\n" in result.stdout
    assert "grids/first.py" not in result.stdout  # collected for the base, not listed
    assert "2 cells in 1 grid\n" in result.stdout  # nor counted as deselected

    result = sweeper.run("run", "--dry-run", "grids/second.py::base")
    assert result.ret == 0, result


def test_base_from_a_missing_cell_lists_near_names(sweeper):
    sweeper.grid("first", HEADER + "base = sk.base(lr=1e-6)\ncombo_C = sk.cell(lr=1.0)\n")
    sweeper.grid("second", HEADER + 'base = sk.base(from_cell="first.py::combo_c")\n')
    refused(sweeper.run("list", "grids/second.py"),
            "grids/second.py:3: from_cell='first.py::combo_c': first.py has no cell 'combo_c' "
            "(did you mean 'combo_C'?)")


def test_bases_in_a_cycle(sweeper):
    sweeper.grid("a", HEADER + 'base = sk.base(from_cell="b.py::base")\n')
    sweeper.grid("b", HEADER + 'base = sk.base(from_cell="a.py::base")\n')
    refused(sweeper.run("list", "grids/a.py"), "cycle")


def test_default_path_collects_grids_dir_without_private_files(sweeper):
    sweeper.grid("g", HEADER + "base = sk.base(lr=1e-6)\n")
    sweeper.grid("_helpers", "raise RuntimeError('must not be collected')\n")
    sweeper.write("grids/sweepconf.py", "")
    sweeper.write("grids/sub/h.py", HEADER + "base = sk.base(lr=1e-6)\n")
    result = sweeper.run("list")
    assert result.ret == 0, result
    assert result.stdout.splitlines()[0] == "grids/g.py::base  (base)"
    assert "1 cell in 1 grid" in result.stdout

    result = sweeper.run("list", "grids/sub")
    assert "grids/sub/h.py::base" in result.stdout


def test_two_grids_with_one_name_would_share_a_runs_dir(sweeper):
    sweeper.grid("g", HEADER + "base = sk.base(lr=1e-6)\n")
    sweeper.write("other/g.py", HEADER + "base = sk.base(lr=1e-6)\n")
    refused(sweeper.run("list", "grids/g.py", "other/g.py"), "runs/g/")


def test_missing_path(sweeper):
    sweeper.grid("g", HEADER + "base = sk.base(lr=1e-6)\n")
    refused(sweeper.run("list", "grids/nope.py"), "grids/nope.py: no such file or directory")


def test_unknown_target_name(sweeper):
    sweeper.grid("g", 'import sweepkit as sk\n\ntarget = "trainr"\nbase = sk.base(lr=1e-6)\n')
    refused(sweeper.run("list"), "grids/g.py:3: target 'trainr': not a registered target (registered: trainer)")


def test_profile_may_make_cells_alike_without_an_error(sweeper):
    sweeper.grid("g", '''
import sweepkit as sk
base = sk.base(model="Qwen/Qwen2.5-1.5B-Instruct", dataset="gsm8k", gpus=4)
bigger = sk.cell(model="Qwen/Qwen2.5-7B-Instruct")
''')
    result = sweeper.run("list", "--profile", "smoke")
    assert result.ret == 0, result
    assert "grids/g.py::base" in result.stdout and "grids/g.py::bigger" in result.stdout
    assert "smoke: model=tiny-random dataset=synthetic" in result.stdout


PATHS_TARGET = '''
import sweepkit as sk
READ = ("import json, pathlib; c = json.load(open('config.json')); "
        "pathlib.Path('seen.txt').write_text(open(c['data'] + '/rows.txt').read())")
PATH_KEY = {"type": str, "type_name": "str", "default": None, "doc": "", "path": True}
SCHEMA = {"data": PATH_KEY, "model": PATH_KEY, "name": {**PATH_KEY, "path": False}}
target = sk.command("{python}", "-c", READ, schema=SCHEMA)
'''


def test_relative_paths_of_path_keys_are_taken_from_the_project_root(sweeper, tmp_path):
    (tmp_path / "shared/data").mkdir(parents=True)
    (tmp_path / "shared/data/rows.txt").write_text("from shared\n")
    sweeper.write("local/data/rows.txt", "from the project\n")
    sweeper.grid("g", PATHS_TARGET + '''
base = sk.base(data="../shared/data", model="Qwen/Qwen2.5-1.5B-Instruct", name="./kept")
here = sk.cell(data="local/data", model="local/data")
dot = sk.cell(data="./local/data")
''')
    result = sweeper.run("run")
    assert result.ret == 0, result
    cells = sweeper.path / "runs/g"
    config = json.loads((cells / "base/config.json").read_text())
    assert config == {"data": str(tmp_path / "shared/data"), "model": "Qwen/Qwen2.5-1.5B-Instruct", "name": "./kept"}
    assert (cells / "base/seen.txt").read_text() == "from shared\n"
    here = json.loads((cells / "here/config.json").read_text())
    assert here["data"] == here["model"] == str(sweeper.path / "local/data")
    assert (cells / "dot/seen.txt").read_text() == "from the project\n"
    assert "grids/g.py::here  data=local/data model=local/data" in sweeper.run("list").stdout

    # The config hash holds the paths as written: the project moved elsewhere has the same cells.
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copytree(sweeper.path, moved / "project")
    shutil.copytree(tmp_path / "shared", moved / "shared")
    again = sweeper.run("--rootdir", str(moved / "project"), "--runs-dir", str(moved / "project/runs"),
                        "run", str(moved / "project/grids"))
    assert again.ret == 0, again
    assert again.stdout.count("SKIPPED") == 3, again


def test_a_relative_path_that_is_not_there_is_refused(sweeper):
    sweeper.grid("g", PATHS_TARGET + '''
base = sk.base(data="../shared/data/gsm8k", model="Qwen/Qwen2.5-1.5B-Instruct")
other = sk.cell(data="./data/none")
hub = sk.cell(data="org/dataset-on-the-hub")
''')
    result = sweeper.run("run")
    root = sweeper.path
    refused(result, f"grids/g.py:8: base: data: '../shared/data/gsm8k' is not there: a relative path in a "
                    f"cell is taken from the project root {root}, so it names {root.parent}/shared/data/gsm8k",
            "grids/g.py:9: other: data: './data/none' is not there",
            "2 errors found; nothing was run")


def test_the_trainer_target_says_which_keys_are_paths(sweeper):
    from trainer.config import schema

    assert [key for key, spec in schema().items() if spec.get("path")] == ["model", "dataset", "teacher_model"]
    sweeper.grid("g", '''import sweepkit as sk
base = sk.base(model="Qwen/Qwen2.5-1.5B-Instruct", dataset="../shared/data/gsm8k")
''')
    refused(sweeper.run("list"), "grids/g.py:2: base: dataset: '../shared/data/gsm8k' is not there")
