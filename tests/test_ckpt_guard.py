"""The guarded checkpoint wipe, on real directories, and through a real ``sweep run``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sweepkit.state.checkpoints import DeletionRefused
from sweepkit_plugins.ckpt_guard import MISSING, CheckpointGuardError, delete_checkpoint_entries, guarded_wipe


def wipe(ckpt_dir: Path, root: Path, resume_mode, **options) -> list[Path]:
    """The guarded wipe as a fresh cell's job finishes it: checked and announced when the
    cell is prepared, then deleted as its job starts it."""
    found = guarded_wipe(ckpt_dir, root, resume_mode, **options)
    return [] if found is None else delete_checkpoint_entries(found)


def make_steps(directory: Path, *steps: int) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    made = []
    for step in steps:
        step_dir = directory / f"global_step_{step}"
        (step_dir / "policy").mkdir(parents=True)
        (step_dir / "policy" / "model.pt").write_text("weights")
        made.append(step_dir)
    return made


@pytest.fixture
def root(tmp_path) -> Path:
    path = tmp_path / "ckpts"
    path.mkdir()
    return path


def test_fresh_run_deletes_exactly_its_steps_after_listing_them(root):
    cell = root / "grid" / "cell"
    steps = make_steps(cell, 100, 20, 3)
    (cell / "latest_ckpt_global_step.txt").write_text("100")
    (cell / "export").mkdir()
    (cell / "notes.txt").write_text("keep")
    said = []

    def announce(line):
        said.append((line, sorted(p.name for p in cell.iterdir())))

    deleted = wipe(cell, root, None, announce=announce)
    assert [p.name for p in deleted] == ["global_step_3", "global_step_20", "global_step_100",
                                         "latest_ckpt_global_step.txt"]
    line, present_when_announced = said[0]
    assert "global_step_3, global_step_20, global_step_100" in line
    assert all(step.name in present_when_announced for step in steps)  # listed before deleting
    assert sorted(p.name for p in cell.iterdir()) == ["export", "notes.txt"]


def test_null_string_is_fresh_too(root):
    cell = root / "cell"
    make_steps(cell, 1)
    assert [p.name for p in wipe(cell, root, "null", announce=lambda line: None)] == ["global_step_1"]


@pytest.mark.parametrize("mode", ["latest", "from_path"])
def test_resume_deletes_nothing(root, mode):
    cell = root / "cell"
    steps = make_steps(cell, 50)
    assert wipe(cell, root, mode, announce=pytest.fail) == []
    assert all(step.is_dir() for step in steps)


def test_missing_resume_mode_is_an_error_before_any_deletion(root):
    cell = root / "cell"
    steps = make_steps(cell, 50)
    with pytest.raises(CheckpointGuardError, match="resume mode is unset"):
        wipe(cell, root, MISSING, announce=pytest.fail)
    assert steps[0].is_dir()


def test_unknown_resume_mode_is_an_error_before_any_deletion(root):
    cell = root / "cell"
    steps = make_steps(cell, 50)
    with pytest.raises(CheckpointGuardError, match="'lastest' is not a resume mode"):
        wipe(cell, root, "lastest", announce=pytest.fail)
    assert steps[0].is_dir()


def test_symlink_out_of_the_root_is_refused(root, tmp_path):
    elsewhere = tmp_path / "precious"
    steps = make_steps(elsewhere, 7)
    (root / "grid").mkdir()
    (root / "grid" / "cell").symlink_to(elsewhere)
    with pytest.raises(CheckpointGuardError, match="not inside the checkpoint root"):
        wipe(root / "grid" / "cell", root, None, announce=pytest.fail)
    assert steps[0].is_dir()


def test_the_root_itself_is_refused(root):
    steps = make_steps(root, 1)
    with pytest.raises(CheckpointGuardError, match="not inside"):
        wipe(root, root, None, announce=pytest.fail)
    assert steps[0].is_dir()


def test_a_step_that_is_a_symlink_is_unlinked_not_followed(root, tmp_path):
    cell = root / "cell"
    cell.mkdir()
    outside = make_steps(tmp_path / "other", 9)[0]
    (cell / "global_step_9").symlink_to(outside)
    wipe(cell, root, None, announce=lambda line: None)
    assert not (cell / "global_step_9").exists() and (outside / "policy" / "model.pt").is_file()


def test_a_symlink_that_appears_after_the_check_stops_the_deletion(root, tmp_path):
    # The driver checks and resolves the dir when it prepares the cell; the job deletes
    # when it starts the cell, maybe much later, and only in that same directory.
    cell = root / "grid" / "cell"
    make_steps(cell, 4)
    checked = guarded_wipe(cell, root, None, announce=lambda line: None)
    assert checked == cell.resolve()
    elsewhere = make_steps(tmp_path / "elsewhere", 4)[0].parent
    shutil.rmtree(cell)
    cell.symlink_to(elsewhere)
    with pytest.raises(DeletionRefused, match="now resolves to"):
        delete_checkpoint_entries(checked)
    assert (elsewhere / "global_step_4" / "policy" / "model.pt").is_file()


def test_opt_out_keeps_everything(root):
    cell = root / "cell"
    steps = make_steps(cell, 5)
    said = []
    assert wipe(cell, root, None, clean=False, announce=said.append) == []
    assert steps[0].is_dir() and "switched off" in said[0]


# -- through sweep ------------------------------------------------------------------------------

GRID = '''
import sweepkit as sk
target = sk.command("{python}", "-c", "import os; print('CKPT_DIR=' + os.environ['CKPT_DIR'])")
base = sk.base(lr=1.0, resume_mode=None)
resumed = sk.cell(resume_mode="latest")
'''


def test_a_plain_run_never_wipes_checkpoints_it_finds(sweeper):
    sweeper.grid("g", GRID)
    root = sweeper.path / "ckpts"
    steps = make_steps(root / "g" / "base", 10, 20) + make_steps(root / "g" / "resumed", 30)
    result = sweeper.run("run", "--executor", "debug", env={"CHECKPOINTS_DIR": str(root)})
    assert result.ret != 0 and "nothing was run" in result.output, result
    for cell in ("base", "resumed"):
        assert f"{cell}: was pending and has checkpoints in {root / 'g' / cell}; pass --resume" in result.output
    assert "deleting" not in result.output
    assert all(step.is_dir() for step in steps)


def test_rerun_wipes_every_cell_it_starts_over_whatever_its_resume_mode(sweeper):
    # --rerun is the explicit fresh start: a resume_mode='latest' cell must not go on from
    # the steps it promised to delete.
    sweeper.grid("g", GRID)
    root = sweeper.path / "ckpts"
    fresh_steps = make_steps(root / "g" / "base", 10, 20)
    resumed_steps = make_steps(root / "g" / "resumed", 30)
    result = sweeper.run("run", "--executor", "debug", "--rerun", env={"CHECKPOINTS_DIR": str(root)})
    assert result.ret == 0, result
    assert "deleting 2 checkpoint entries" in result.output and "global_step_10, global_step_20" in result.output
    assert "deleting 1 checkpoint entries" in result.output and "global_step_30" in result.output
    assert not any(step.exists() for step in fresh_steps + resumed_steps)
    log = (sweeper.path / "runs" / "g" / "base" / "stdout.log").read_text()
    assert f"CKPT_DIR={root / 'g' / 'base'}" in log


def test_what_is_not_a_step_is_no_checkpoint_and_is_never_deleted(sweeper):
    # An export (or a log) under the checkpoint dir neither stops a plain run nor goes with --rerun.
    sweeper.grid("g", GRID)
    root = sweeper.path / "ckpts"
    export = root / "g" / "base" / "export" / "hf.bin"
    export.parent.mkdir(parents=True)
    export.write_bytes(b"weights")
    plain = sweeper.run("run", "--executor", "debug", "grids/g.py::base", env={"CHECKPOINTS_DIR": str(root)})
    assert plain.ret == 0, plain
    rerun = sweeper.run("run", "--executor", "debug", "--rerun", "grids/g.py::base",
                        env={"CHECKPOINTS_DIR": str(root)})
    assert rerun.ret == 0, rerun
    assert export.read_bytes() == b"weights" and "deleting" not in rerun.output


def test_rerun_opt_out_by_env(sweeper):
    sweeper.grid("g", GRID)
    root = sweeper.path / "ckpts"
    steps = make_steps(root / "g" / "base", 10)
    result = sweeper.run("run", "--executor", "debug", "--rerun", "grids/g.py::base",
                         env={"CHECKPOINTS_DIR": str(root), "CLEAN_CKPT": "0"})
    assert result.ret == 0, result
    assert "switched off" in result.output
    assert steps[0].is_dir()


def base_cell_in_session(sweeper, monkeypatch):
    """A configured ``sweep run`` session over GRID, its ``base`` cell and the checkpoint root."""
    from sweepkit.cli import start_session
    from sweepkit.grid.collect import collect

    sweeper.grid("g", GRID)
    root = sweeper.path / "ckpts"
    monkeypatch.setenv("CHECKPOINTS_DIR", str(root))
    session = start_session(["run", "--executor", "debug", "--rootdir", str(sweeper.path),
                             str(sweeper.path / "grids")])
    session.configure()
    (cell,) = [cell for cell in collect(session, [str(sweeper.path / "grids")]).cells if cell.name == "base"]
    return session, cell, root


def test_a_fresh_plan_without_rerun_keeps_checkpoints_that_appeared_since(sweeper, monkeypatch, capsys):
    # The plan found none, then another process wrote some before the cell started: a
    # plain run never asked to lose them.
    from sweepkit_plugins import ckpt_guard

    session, cell, root = base_cell_in_session(sweeper, monkeypatch)
    steps = make_steps(root / "g" / "base", 7)
    ckpt_guard.sweep_prepare_cell_dir(cell=cell, cell_dir=sweeper.path / "runs" / "g" / "base", fresh=True,
                                      rerun=False, session=session)
    assert steps[0].is_dir()
    assert "keeping 1 checkpoint entries" in capsys.readouterr().out


def test_preparing_a_rerun_deletes_nothing_yet(sweeper, monkeypatch, capsys):
    # The wipe is announced and handed to the cell's job, which deletes as it starts the
    # cell: a sweep stopped before it gets to the cell leaves its steps.
    from sweepkit_plugins import ckpt_guard

    session, cell, root = base_cell_in_session(sweeper, monkeypatch)
    steps = make_steps(root / "g" / "base", 7)
    handed = ckpt_guard.sweep_prepare_cell_dir(cell=cell, cell_dir=sweeper.path / "runs" / "g" / "base",
                                               fresh=True, rerun=True, session=session)
    assert handed == [(root / "g" / "base").resolve()] and steps[0].is_dir()
    assert "deleting 1 checkpoint entries" in capsys.readouterr().out


def test_a_relative_root_is_the_directory_sweep_runs_in_for_the_cell_too(sweeper):
    # Read against the cell dir, where the cell's process runs, it would name another place.
    sweeper.grid("g", GRID)
    result = sweeper.run("run", "--executor", "debug", "grids/g.py::base", env={"CHECKPOINTS_DIR": "rel_ckpts"})
    assert result.ret == 0, result
    log = (sweeper.path / "runs" / "g" / "base" / "stdout.log").read_text()
    assert f"CKPT_DIR={sweeper.path / 'rel_ckpts' / 'g' / 'base'}" in log


def test_validation_refuses_unset_and_unknown_modes_before_anything_runs(sweeper, tmp_path):
    sweeper.grid("g", '''
        import sweepkit as sk
        target = sk.command("{python}", "-c", "pass")
        base = sk.base(lr=1.0)
        typo = sk.cell(resume_mode="lastest")
    ''')
    root = sweeper.path / "ckpts"
    steps = make_steps(root / "g" / "base", 10) + make_steps(root / "g" / "typo", 10)
    result = sweeper.run("run", "--executor", "debug", env={"CHECKPOINTS_DIR": str(root)})
    assert result.ret != 0
    assert "base: resume mode is unset" in result.output
    assert "typo: resume_mode='lastest' is not a resume mode" in result.output
    assert all(step.is_dir() for step in steps)
    assert not (sweeper.path / "runs").exists() or not any((sweeper.path / "runs").rglob("stdout.log"))


def test_validation_refuses_a_cell_dir_symlinked_out_of_the_root(sweeper, tmp_path):
    sweeper.grid("g", GRID)
    root = sweeper.path / "ckpts"
    (root / "g").mkdir(parents=True)
    elsewhere = make_steps(tmp_path / "elsewhere", 3)[0].parent
    (root / "g" / "base").symlink_to(elsewhere)
    result = sweeper.run("run", "--executor", "debug", env={"CHECKPOINTS_DIR": str(root)})
    assert result.ret != 0
    assert "is not inside the checkpoint root" in result.output
    assert (elsewhere / "global_step_3").is_dir()
