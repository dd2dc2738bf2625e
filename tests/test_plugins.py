"""Plugins: sweepconf.py next to the grids, -p modules, entry points, misspelt hooks, `sweep plugins`."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

GRID = '''
import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
base = sk.base(lr=1e-3)
hot = sk.cell(lr=0.5)
'''

SWEEPCONF = '''
import sweepkit as sk

@sk.hookimpl
def sweep_addoption(parser):
    parser.addoption("--max-lr", type=float, default=1.0, commands=("list", "run"))

@sk.hookimpl
def sweep_validate_cell(cell, session):
    lr, limit = cell.config.get("lr", 0), session.options.max_lr
    return [f"lr: {lr} is above --max-lr {limit}"] if lr > limit else []
'''

LAUNCH_PLUGIN = '''
import sweepkit as sk

@sk.hookimpl
def sweep_register_keys(register):
    register("nodes", int, 1, "SLURM nodes")
'''


def test_sweepconf_next_to_the_grids_is_loaded(sweeper):
    sweeper.grid("g", GRID)
    sweeper.write("grids/sweepconf.py", SWEEPCONF)
    assert sweeper.run("list").ret == 0
    result = sweeper.run("list", "--max-lr", "0.1")
    assert result.ret == 4, result
    assert "grids/g.py:4: hot: lr: 0.5 is above --max-lr 0.1" in result.stderr


def test_sweepconf_of_a_directory_applies_only_there(sweeper):
    sweeper.grid("g", GRID)
    sweeper.write("other/sweepconf.py", SWEEPCONF.replace("{limit}", "{limit} (other)")
                  .replace('"--max-lr", type=float, default=1.0', '"--max-lr", type=float, default=0.1'))
    sweeper.write("other/h.py", GRID)
    assert sweeper.run("list", "grids").ret == 0
    result = sweeper.run("list", "other")
    assert result.ret == 4 and "(other)" in result.stderr, result


def test_dash_p_loads_a_module(sweeper):
    grid = 'import sweepkit as sk\nbase = sk.base(lr=1e-6)\nbig = sk.cell(nodes={!r})\n'
    sweeper.grid("g", grid.format(2))
    sweeper.write("launchplug.py", LAUNCH_PLUGIN)
    without = sweeper.run("list")
    assert without.ret == 4
    assert "grids/g.py:3: big: nodes: unknown key for target 'trainer'" in without.stderr
    assert sweeper.run("-p", "launchplug", "list").ret == 0
    sweeper.grid("g", grid.format("two"))
    result = sweeper.run("list", "-p", "launchplug")
    assert result.ret == 4
    assert "grids/g.py:3: big: nodes: expected int, got 'two' (str)" in result.stderr


def test_dash_p_finds_a_module_of_the_project_without_pythonpath(sweeper):
    # The installed `sweep` script has no current directory on its path, unlike
    # `python -m sweepkit`; the project's own plugin module must still be found.
    sweeper.grid("g", 'import sweepkit as sk\nbase = sk.base(lr=1e-6)\nbig = sk.cell(nodes=2)\n')
    sweeper.write("launchplug.py", LAUNCH_PLUGIN)
    script = Path(sys.executable).parent / "sweep"
    if not script.is_file():
        pytest.skip("the sweep script is not installed next to this python")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    listed = subprocess.run([str(script), "-p", "launchplug", "list"], cwd=sweeper.path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "grids/g.py::big  nodes=2" in listed.stdout


def test_dash_p_of_a_missing_module(sweeper):
    sweeper.grid("g", GRID)
    result = sweeper.run("-p", "no_such_plugin_module", "list")
    assert result.ret == 4
    assert "-p no_such_plugin_module: cannot import plugin module" in result.stderr


def test_misspelt_hook_fails_at_start_up(sweeper):
    sweeper.grid("g", GRID)
    sweeper.write("typo.py", '''
import sweepkit as sk

@sk.hookimpl
def sweep_validate_cel(cell, session):
    return []
''')
    result = sweeper.run("-p", "typo", "list")
    assert result.ret == 4, result
    assert "sweep_validate_cel" in result.stderr and "no such hook" in result.stderr
    assert "grids/g.py::base" not in result.stdout


def test_blocking_the_trainer_plugin(sweeper):
    sweeper.grid("g", 'import sweepkit as sk\nbase = sk.base(lr=1e-6)\n')
    assert sweeper.run("list").ret == 0
    result = sweeper.run("-p", "no:trainer", "list")
    assert result.ret == 4
    assert "target 'trainer': not a registered target" in result.stderr


def test_plugins_command_lists_plugins_and_their_hooks(sweeper):
    sweeper.grid("g", GRID)
    sweeper.write("grids/sweepconf.py", SWEEPCONF)
    sweeper.write("launchplug.py", LAUNCH_PLUGIN)
    result = sweeper.run("-p", "launchplug", "plugins")
    assert result.ret == 0, result
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines()
            if line.startswith("│") and line.split("│")[1].strip()}
    assert "default" in rows["sweepkit.grid.collect"] and "sweep_collect_file" in rows["sweepkit.grid.collect"]
    assert "entry point (sweepkit)" in rows["trainer"]
    assert "sweep_register_targets" in rows["trainer"]
    assert "-p" in rows["launchplug"] and "sweep_register_keys" in rows["launchplug"]
    assert "sweepconf" in rows["sweepconf:grids/sweepconf.py"]
    assert "sweep_addoption" in rows["sweepconf:grids/sweepconf.py"]
    assert "profiles: smoke" in result.stdout
    launch_keys = next(line for line in result.stdout.splitlines() if line.startswith("launch keys:"))
    # The core's keys and the -p plugin's "nodes"; installed plugins may add more.
    assert set(launch_keys.removeprefix("launch keys: ").split(", ")) >= {
        "gpus", "time_limit", "max_restarts", "env", "cpus", "mem_gb", "partition", "account", "qos",
        "nodes"}


def hook_names() -> set[str]:
    from sweepkit import hookspec

    return {name for name in dir(hookspec) if name.startswith("sweep_")}


def table_rows(output: str) -> list[list[str]]:
    """The cells of each line of the `sweep plugins` table."""
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in output.splitlines() if line.startswith("│")]


def test_plugins_piped_keeps_each_plugin_on_one_line_whatever_the_width(sweeper):
    sweeper.grid("g", GRID)
    sweeper.write("launchplug.py", LAUNCH_PLUGIN)
    known = hook_names()
    for columns in ("60", "100"):
        result = sweeper.run("-p", "launchplug", "plugins", env={"COLUMNS": columns})
        assert result.ret == 0, result
        rows = table_rows(result.stdout)
        assert all(plugin for plugin, _, _ in rows), result.stdout  # no continuation lines
        for plugin, _, hooks in rows:
            assert set(hooks.split(", ")) <= known, (plugin, hooks)
        assert "sweep_job_concurrency_cap" in dict((p, h) for p, _, h in rows)["clusters"]


def test_plugins_on_a_narrow_terminal_wraps_between_hook_names_only(tmp_path, monkeypatch):
    from rich.console import Console

    from sweepkit import commands
    from sweepkit.cli import start_session

    monkeypatch.chdir(tmp_path)
    session = start_session(["plugins"])
    known = hook_names()
    for width in (40, 90, 120):
        out = io.StringIO()
        session.console = Console(file=out, force_terminal=True, width=width, color_system=None, soft_wrap=True)
        assert commands.cmd_plugins(session) == 0
        rows = table_rows(out.getvalue())
        words = [word for _, _, hooks in rows for word in hooks.replace(",", " ").split()]
        assert words and set(words) <= known, (width, [w for w in words if w not in known])
        if width >= 90:  # wide enough for the longest name: the table fits the terminal
            assert max(len(line) for line in out.getvalue().splitlines() if line[:1] in "┏┃┡│└") <= width
