"""Collection through `sweep list`: bad grid files refused with file:line, cross-grid bases, paths."""

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
    refused(sweeper.run("list"), "grids/g.py: no base cell")


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
