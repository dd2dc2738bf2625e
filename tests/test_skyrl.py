"""The SkyRL target: Hydra overrides from a cell's diff, appended to the command on every
executor (stand-in ``skyrl_train`` and ``skyrl.train`` entry points record the argv they got),
fresh and resumed, in the syntax of the cell's layout, and listed in the job scripts of a
cluster's dry run with the layout the cell got. The check against SkyRL's own config is in
test_skyrl_schema.py."""

from __future__ import annotations

import json
import shlex
import textwrap

import pytest

from conftest import Sweeper
from sweepkit_plugins import skyrl
from test_cluster_scripts import dry_run, ok
from test_jupiter import RULES_GRID, collected_cells
from test_slurm_executor import DEADLINE_S, cluster, on_cluster  # noqa: F401 (cluster: a fixture)

# Stands in for SkyRL's entry point: records its arguments, leaves a checkpoint and fails on
# a fresh run (so the next run can --resume), succeeds on a resumed one. Either layout: the
# fork's arguments start with '++', upstream's do not.
STAND_IN = '''
import json, os, sys
with open(os.path.join(os.environ["SWEEP_CELL_DIR"], "argv.jsonl"), "a") as seen:
    seen.write(json.dumps(sys.argv[1:]) + "\\n")
args = [arg.lstrip("+") for arg in sys.argv]
ckpt = next((arg.split("=", 1)[1] for arg in args if arg.startswith("trainer.ckpt_path=")),
            os.environ["SWEEP_CKPT_DIR"])
if "trainer.resume_mode=latest" not in args:
    os.makedirs(os.path.join(ckpt, "global_step_1"))
    sys.exit("stand-in: stopped after step 1")
'''

GRID = '''
import sweepkit as sk
target = sk.command("{python}", "-m", "skyrl_train.entrypoints.main_base")
base = sk.base(model="Qwen/Qwen2.5-1.5B-Instruct", lr=1e-6)
tuned = sk.cell(lr=3e-6, **{"generator.sampling_params.temperature": 1.0},
                hydra_overrides=["++trainer.enable_db_registration=false"])
'''
UPSTREAM_GRID = (GRID.replace("skyrl_train.entrypoints", "skyrl.train.entrypoints")
                 .replace("++trainer.enable_db_registration=false", "trainer.logger=console"))

TUNED = ["++trainer.policy.optimizer_config.lr=3e-06", "++generator.sampling_params.temperature=1.0"]
USER = ["++trainer.enable_db_registration=false"]
NOT_CHECKED = ("the overrides of SkyRL cells of the {layout} layout were not checked against SkyRL's config: it "
               "cannot be imported here (No module named '{module}'); install its config code where sweep runs "
               "to check them (README, SkyRL)")


def stand_in_project(sweeper: Sweeper) -> None:
    # The project dir is on the cells' PYTHONPATH (see conftest), so `-m` finds the packages;
    # the driver finds them too, before an installed SkyRL: packages without config code.
    for path in ("skyrl_train/__init__.py", "skyrl_train/entrypoints/__init__.py", "skyrl/__init__.py",
                 "skyrl/train/__init__.py", "skyrl/train/entrypoints/__init__.py"):
        sweeper.write(path, "")
    for package in ("skyrl_train", "skyrl/train"):
        sweeper.write(f"{package}/entrypoints/main_base.py", textwrap.dedent(STAND_IN))
    sweeper.grid("agentic", GRID)
    sweeper.env.update({"CUDA_VISIBLE_DEVICES": "", "CHECKPOINTS_DIR": "", "SWEEP_CLUSTER": ""})


def seen_argv(sweeper: Sweeper, cell: str) -> list[list[str]]:
    lines = (sweeper.path / "runs" / "agentic" / cell / "argv.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("executor", ["local", "debug"])
def test_the_entry_point_gets_the_overrides_fresh_then_resumed(sweeper, executor):
    stand_in_project(sweeper)
    fresh = sweeper.run("run", "grids/agentic.py::tuned", "--executor", executor)
    assert fresh.ret != 0 and "stand-in: stopped after step 1" in fresh.output, fresh
    resumed = sweeper.run("run", "grids/agentic.py::tuned", "--executor", executor, "--resume")
    assert resumed.ret == 0, resumed
    # An unset resume mode still reaches SkyRL explicitly: null fresh, latest on --resume.
    assert seen_argv(sweeper, "tuned") == [TUNED + ["++trainer.resume_mode=null"] + USER,
                                           TUNED + ["++trainer.resume_mode=latest"] + USER]
    # The stand-in package has no config code: the run goes on, and says what was not checked.
    assert (f"note: {NOT_CHECKED.format(layout='fork', module='skyrl_train.config')}" in fresh.output.splitlines()
            and "error" not in fresh.output), fresh


def test_an_upstream_command_gets_plain_overrides_fresh_then_resumed(sweeper):
    # Upstream's entry point parses 'path=value' with SkyRLTrainConfig.from_cli_overrides,
    # which refuses a '+' prefix; the engine settings are under generator.inference_engine.
    stand_in_project(sweeper)
    sweeper.grid("agentic", UPSTREAM_GRID + "engines = sk.cell(num_inference_engines=2, inference_tp=2)\n")
    for cell in ("tuned", "engines"):
        fresh = sweeper.run("run", f"grids/agentic.py::{cell}", "--executor", "local")
        assert fresh.ret != 0 and "stand-in: stopped after step 1" in fresh.output, fresh
        assert f"note: {NOT_CHECKED.format(layout='upstream', module='skyrl.train.config')}" in fresh.output, fresh
        assert sweeper.run("run", f"grids/agentic.py::{cell}", "--executor", "local", "--resume").ret == 0
    plain = [arg.removeprefix("++") for arg in TUNED]
    assert seen_argv(sweeper, "tuned") == [plain + ["trainer.resume_mode=null", "trainer.logger=console"],
                                           plain + ["trainer.resume_mode=latest", "trainer.logger=console"]]
    engines = ["generator.inference_engine.num_engines=2", "generator.inference_engine.tensor_parallel_size=2"]
    assert seen_argv(sweeper, "engines") == [engines + ["trainer.resume_mode=null"],
                                             engines + ["trainer.resume_mode=latest"]]


@pytest.mark.parametrize("entry_point, layout, expected", [
    ("skyrl_train.entrypoints.main_base", "auto", ["++generator.num_inference_engines=2",
                                                   "++generator.inference_engine_tensor_parallel_size=2"]),
    ("skyrl.train.entrypoints.main_base", "auto", ["generator.inference_engine.num_engines=2",
                                                   "generator.inference_engine.tensor_parallel_size=2"]),
    # The launch key wins: a fork that took upstream's layout keeps its package name.
    ("skyrl_train.entrypoints.main_base", "upstream", ["generator.inference_engine.num_engines=2",
                                                       "generator.inference_engine.tensor_parallel_size=2"]),
    ("skyrl.train.entrypoints.main_base", "fork", ["++generator.num_inference_engines=2",
                                                   "++generator.inference_engine_tensor_parallel_size=2"]),
])
def test_the_layout_follows_the_entry_point_unless_the_launch_key_names_one(sweeper, entry_point, layout, expected):
    sweeper.grid("layouts", f'''
import sweepkit as sk
target = sk.command("{{python}}", "-m", "{entry_point}")
base = sk.base(num_inference_engines=4, inference_tp=1, resume_mode=None, skyrl_layout="{layout}")
engines = sk.cell(num_inference_engines=2, inference_tp=2)
''')
    _, cells = collected_cells(sweeper)
    chosen, _ = skyrl.layout_of(cells["engines"])
    assert skyrl.hydra_overrides(cells["engines"])[:2] == expected
    assert skyrl.sweep_cell_env(cell=cells["engines"], session=None) == {"SWEEP_SKYRL_LAYOUT": chosen.name}
    assert chosen.name == (layout if layout != "auto" else "upstream" if "skyrl.train" in entry_point else "fork")


def test_upstream_overrides_are_refused_with_a_plus(sweeper):
    sweeper.grid("up", UPSTREAM_GRID.replace("lr=1e-6)", "lr=1e-6, resume_mode=None)")
                 + 'forced = sk.cell(hydra_overrides=["++trainer.logger=console"])\n')
    result = sweeper.run("run", "--dry-run", "--executor", "debug", "--cluster", "none")
    assert result.ret != 0 and "nothing was run" in result.output, result
    assert ("grids/up.py:6: forced: hydra_overrides: '++trainer.logger=console' is not an override upstream "
            "SkyRL takes; write 'section.key=value'") in result.output, result


def test_the_job_script_says_which_layout_the_cell_got(sweeper):
    sweeper.grid("agentic", GRID.replace("lr=1e-6)", "lr=1e-6, resume_mode=None, num_gpus=4)"))
    sweeper.grid("upstream", UPSTREAM_GRID.replace("lr=1e-6)", "lr=1e-6, resume_mode=None, num_gpus=4)"))
    for grid, layout in (("agentic", "fork"), ("upstream", "upstream")):
        rendered = ok(dry_run(sweeper, "jupiter", f"grids/{grid}.py::tuned"))
        assert f"#   env:     SWEEP_SKYRL_LAYOUT={layout}" in rendered.text(f"{grid}_tuned.sbatch").splitlines()


def test_resume_from_checkpoints_under_the_checkpoint_root(sweeper):
    # The cell's checkpoints live in <root>/<grid>/<cell>, not in its cell dir: a rerun
    # must find them there, refuse to start over silently, and resume them on --resume.
    stand_in_project(sweeper)
    sweeper.grid("agentic", GRID.replace("lr=1e-6)", "lr=1e-6, resume_mode=None)"))
    root = sweeper.path / "ckpts"
    ckpt = root / "agentic" / "tuned"
    run = ["run", "grids/agentic.py::tuned", "--executor", "debug"]
    fresh = sweeper.run(*run, env={"CHECKPOINTS_DIR": str(root)})
    assert fresh.ret != 0 and (ckpt / "global_step_1").is_dir(), fresh
    plain = sweeper.run(*run, env={"CHECKPOINTS_DIR": str(root)})
    assert plain.ret != 0 and f"has checkpoints in {ckpt}; pass --resume" in plain.output, plain
    resumed = sweeper.run(*run, "--resume", env={"CHECKPOINTS_DIR": str(root)})
    assert resumed.ret == 0 and "deleting" not in resumed.output, resumed
    assert (ckpt / "global_step_1").is_dir()
    first, last = seen_argv(sweeper, "tuned")
    assert f"++trainer.ckpt_path={ckpt}" in first and "++trainer.resume_mode=null" in first
    assert f"++trainer.ckpt_path={ckpt}" in last and "++trainer.resume_mode=latest" in last


def test_a_cell_equal_to_base_gets_only_its_resume_mode(sweeper):
    stand_in_project(sweeper)
    sweeper.run("run", "grids/agentic.py::base", "--executor", "local")
    assert seen_argv(sweeper, "base") == [["++trainer.resume_mode=null"]]


def test_the_dry_run_lists_the_overrides_on_jupiter(sweeper):
    sweeper.grid("agentic", GRID.replace("lr=1e-6)", "lr=1e-6, resume_mode=None, num_gpus=4)"))
    rendered = ok(dry_run(sweeper, "jupiter", "grids/agentic.py::tuned"))
    root = sweeper.path.parent
    ckpt = root / "e/scratch/jureap59/user/checkpoints/agentic/tuned"
    expected = TUNED + [f"++trainer.ckpt_path={ckpt}", f"++trainer.export_path={ckpt / 'export'}",
                        "++trainer.resume_mode=null"] + USER
    argv = rendered.argv("tuned")
    assert argv[1:3] == ["-m", skyrl.ENTRY_POINT] and argv[3:] == expected
    # The job script lists the same command line, pasteable as it is.
    lines = rendered.text("agentic_tuned.sbatch").splitlines()
    (command,) = [line for line in lines if line.startswith("#   command: ")]
    assert shlex.split(command.removeprefix("#   command: ")) == argv
    assert "# cell grids/agentic.py::tuned" in lines


def test_an_override_with_a_line_break_is_refused_before_any_script(sweeper):
    sweeper.grid("agentic", GRID.replace("lr=1e-6)", "lr=1e-6, resume_mode=None, num_gpus=4)")
                 + 'multiline = sk.cell(hydra_overrides=["++trainer.run_name=a\\nrm -rf ~"])\n')
    rendered = dry_run(sweeper, "jupiter", "grids/agentic.py::multiline")
    assert rendered.result.ret != 0 and not rendered.scripts, rendered.result
    assert "multiline: cannot make its SLURM job: command argument " in rendered.result.output
    assert "has a line break" in rendered.result.output


def test_a_chain_link_lists_the_resumed_command(sweeper):
    sweeper.grid("agentic", GRID.replace("lr=1e-6)", "lr=1e-6, resume_mode=None, num_gpus=4, "
                                                     "time_limit='11:59:00', max_restarts=1)"))
    rendered = ok(dry_run(sweeper, "jupiter", "grids/agentic.py::tuned"))

    def listed(name: str) -> tuple[list[str], list[str]]:
        lines = rendered.text(name).splitlines()
        (command,) = [line for line in lines if line.startswith("#   command: ")]
        return shlex.split(command.removeprefix("#   command: ")), [line for line in lines if "SWEEP_RESUME" in line]

    head, head_env = listed("agentic_tuned.sbatch")
    link, link_env = listed("agentic_tuned.link1.sbatch")
    assert "++trainer.resume_mode=null" in head and "++trainer.resume_mode=latest" not in head
    assert link == [arg.replace("resume_mode=null", "resume_mode=latest") for arg in head]
    assert head_env == ["#   env:     SWEEP_RESUME=0"] and link_env == ["#   env:     SWEEP_RESUME=1"]


def test_hydra_overrides_come_from_the_diff(sweeper, monkeypatch):
    sweeper.grid("rules", RULES_GRID)
    monkeypatch.setenv("CHECKPOINTS_DIR", str(sweeper.path / "ckpts"))
    session, cells = collected_cells(sweeper)
    assert skyrl.hydra_overrides(cells["dotted"]) == [
        "++trainer.enable_db_registration=false",
        "++generator.sampling_params.temperature=1.0",
        f"++trainer.ckpt_path={sweeper.path / 'ckpts' / 'rules' / 'dotted'}",
        f"++trainer.export_path={sweeper.path / 'ckpts' / 'rules' / 'dotted' / 'export'}",
        "++trainer.resume_mode=null",
        "++generator.engine_init_kwargs.max_model_len=65536",
    ]
    # Launch keys (num_nodes, fsdp_size, ...) never become overrides; a chain link resumes.
    base = skyrl.hydra_overrides(cells["base"], resume=True)
    assert base[-1] == "++trainer.resume_mode=latest" and len(base) == 3


def test_an_explicit_resume_mode_is_kept_on_a_fresh_run(sweeper):
    sweeper.grid("rules", RULES_GRID + 'continue_run = sk.cell(resume_mode="latest")\n')
    _, cells = collected_cells(sweeper)
    overrides = skyrl.hydra_overrides(cells["continue_run"])
    assert [arg for arg in overrides if "resume_mode" in arg] == ["++trainer.resume_mode=latest"]


@pytest.mark.parametrize("value, text", [
    (None, "null"), (True, "true"), (3e-5, "3e-05"), ("a b", "'a b'"), (["x", 1], "[x,1]"),
    ("it's", "'it\\'s'"), ("null", "'null'"),
])
def test_hydra_values(value, text):
    assert skyrl.hydra_value(value) == text


@on_cluster
def test_a_chain_link_on_slurm_runs_the_resumed_command(sweeper):
    stand_in_project(sweeper)
    sweeper.grid("agentic", GRID.replace("lr=1e-6)", "lr=1e-6, cpus=1, mem_gb=0.25, time_limit='00:05:00', "
                                                     "max_restarts=1)"))
    result = sweeper.run("run", "grids/agentic.py::tuned", "--executor", "slurm", timeout=DEADLINE_S)
    assert result.ret == 0, result
    # The head stopped after a checkpoint; its link resumed it from there.
    assert seen_argv(sweeper, "tuned") == [TUNED + ["++trainer.resume_mode=null"] + USER,
                                           TUNED + ["++trainer.resume_mode=latest"] + USER]
    scripts = sorted((sweeper.path / "runs" / "agentic" / ".slurm").glob("*_submission.sh"))
    listed = [line for script in scripts for line in script.read_text().splitlines()
              if line.startswith("#   command: ")]
    assert [shlex.split(line.removeprefix("#   command: "))[3:] for line in listed] == seen_argv(sweeper, "tuned")


@pytest.mark.parametrize("layout", ["fork", "upstream"])
def test_the_gpu_budget_reads_either_layouts_engine_paths(layout):
    from sweepkit.grid.cell import Cell, Target
    from sweepkit_plugins import clusters
    from sweepkit_plugins.skyrl_schema import MOVED_ENGINE_PATHS

    index = 0 if layout == "fork" else 1
    config = {"num_gpus": 4, "trainer.placement.colocate_all": False,
              MOVED_ENGINE_PATHS["num_inference_engines"][index]: 2, MOVED_ENGINE_PATHS["inference_tp"][index]: 2}
    launch_keys = {name: default for name, _, default, _ in clusters.LAUNCH_KEYS}
    cell = Cell(grid="grids/g.py", grid_name="g", name="cell", location=("grids/g.py", 1), launch_keys=launch_keys,
                target=Target(name="skyrl", argv=("python", "-m", "skyrl_train.entrypoints.main_base")),
                config=config)
    assert clusters.gpu_budget(cell) == 4 + 2 * 2  # policy, then two engines of TP2 beside it
