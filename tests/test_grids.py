"""The project's grids: cell counts and names, cross-grid base, smoke profile, no torch import."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.config import schema

REPO = Path(__file__).resolve().parents[1]


def collect_in_process(*args: str, profile: str | None = None) -> dict[str, dict]:
    """nodeid -> cell JSON, collected in a fresh interpreter that also reports its imports."""
    script = f"""
import json, sys
from sweepkit.cli import start_session
session = start_session(["list", *{list(args)!r}] + ({["--profile", profile] if profile else []!r}))
session.configure()
o = session.options
cells = session.select(o.paths, profile=o.profile)
session.validate(cells, check_runs_dir=False)
print(json.dumps({{"cells": {{c.nodeid: c.to_json() for c in cells}},
                  "torch": "torch" in sys.modules,
                  "plugins": [name for name, _ in session.pm.list_name_plugin()]}}))
"""
    env = {k: v for k, v in os.environ.items() if k != "SWEEPKIT_GSM8K"}
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def grids():
    return collect_in_process()


@pytest.fixture(scope="module")
def smoke():
    return collect_in_process(profile="smoke")


def names(cells: dict, grid: str) -> list[str]:
    return [c["name"] for c in cells.values() if c["grid"] == f"grids/{grid}.py"]


def test_collecting_every_grid_with_the_trainer_plugin_imports_no_torch(grids):
    assert "trainer" in grids["plugins"]
    assert grids["torch"] is False


def test_throughput_grid_has_the_18_cells(grids):
    cells = names(grids["cells"], "gsm8k_throughput")
    assert len(cells) == 18
    assert {"base", "tbs64", "tbs128", "tbs256", "tbs512", "n8", "n16", "gmu080", "gmu085",
            "cudagraph", "2xTP2", "1xTP4", "reshard", "disaggregated", "combo_C"} <= set(cells)
    base = grids["cells"]["grids/gsm8k_throughput.py::base"]["config"]
    assert base["model"] == "Qwen/Qwen2.5-1.5B-Instruct" and base["gpus"] == 4
    assert (base["train_batch_size"], base["n_samples_per_prompt"], base["num_inference_engines"],
            base["inference_tp"], base["lr"]) == (32, 4, 4, 1, 1e-6)
    combo_c = grids["cells"]["grids/gsm8k_throughput.py::combo_C"]["diff"]
    assert combo_c["enforce_eager"] == [True, False] and combo_c["train_batch_size"] == [32, 128]


def test_accuracy_grid_starts_from_combo_c(grids):
    cells = grids["cells"]
    accuracy = names(cells, "gsm8k_accuracy")
    assert 18 <= len(accuracy) <= 22
    assert {"combo_acc", "combo_acc_stab", "gen1024", "clip_high", "entbonus", "lr1e-5"} <= set(accuracy)
    combo_c = cells["grids/gsm8k_throughput.py::combo_C"]["config"]
    base = cells["grids/gsm8k_accuracy.py::base"]["config"]
    assert {k: v for k, v in base.items() if k in combo_c and k not in ("lr", "time_limit")} == \
        {k: v for k, v in combo_c.items() if k not in ("lr", "time_limit")}
    stab = cells["grids/gsm8k_accuracy.py::combo_acc_stab"]["diff"]
    assert stab == {"lr": [1e-6, 1e-5], "n_samples_per_prompt": [4, 8],
                    "max_generate_length": [512, 1024], "use_entropy_loss": [False, True]}


def test_ceiling_probes_are_expected_failures(grids):
    cells = grids["cells"]
    for name in names(cells, "gsm8k_ceilings"):
        marks = [m["name"] for m in cells[f"grids/gsm8k_ceilings.py::{name}"]["marks"]]
        assert ("xfail" in marks) == (name != "base")


def test_synthetic_grid_is_a_small_cpu_lr_sweep(grids):
    cells = {n: grids["cells"][f"grids/learn_synthetic.py::{n}"] for n in names(grids["cells"], "learn_synthetic")}
    assert 3 <= len(cells) <= 5
    assert len({c["config"]["lr"] for c in cells.values()}) == len(cells)
    for cell in cells.values():
        assert cell["launch"]["gpus"] == 0 and cell["target_config"]["device"] == "cpu"
        assert "gpus" not in cell["target_config"]  # launch keys stay out of config.json


def test_smoke_profile_keeps_cells_distinct_and_small(smoke):
    cells = smoke["cells"]
    assert smoke["torch"] is False
    for nodeid, cell in cells.items():
        config = cell["config"]
        assert cell["profile"] == "smoke"
        assert config["model"] == "tiny-random" and config["device"] == "cpu" and config["gpus"] == 0
        assert config["dataset"] == "synthetic" and config["backend"] == "hf"
        assert config["max_steps"] <= 3 and config["max_generate_length"] <= 32
        assert config["train_batch_size"] % config["policy_mini_batch_size"] == 0, nodeid
    widths = [cells[f"grids/gsm8k_throughput.py::{n}"]["config"]["train_batch_size"]
              for n in ("base", "tbs64", "tbs128", "tbs256", "tbs512")]
    assert widths == sorted(set(widths))  # still five distinct, ordered widths
    tbs128 = cells["grids/gsm8k_throughput.py::tbs128"]
    assert tbs128["profile_changes"]["model"] == ["Qwen/Qwen2.5-1.5B-Instruct", "tiny-random"]
    assert tbs128["profile_changes"]["train_batch_size"] == [128, 8]
    # Two probes differ only in the model, which smoke replaces: they stay two cells.
    dense, moe = (cells[f"grids/gsm8k_ceilings.py::{n}"] for n in ("dense32b", "moe30b"))
    assert dense["config"] == moe["config"] and dense["name"] != moe["name"]


def test_gpu_profile_puts_every_throughput_cell_on_one_gpu_with_its_levers_kept():
    collected = collect_in_process("grids/gsm8k_throughput.py", profile="gpu")
    assert collected["torch"] is False
    cells = collected["cells"]
    assert len(cells) == 18
    for nodeid, cell in cells.items():
        config = cell["config"]
        assert config["model"] == "random:qwen2.5-0.5b" and config["backend"] == "static", nodeid
        assert (config["device"], config["num_gpus"], config["gpus"]) == ("cuda", 1, 1), nodeid
        # Measure until sure: each cell stops once its sec/step is known to +-2 %, 30 steps at most
        # (the profile leaves out a value that is the trainer's default).
        min_steps = config.get("timing_min_steps", schema()["timing_min_steps"]["default"])
        assert (config["timing_target"], min_steps, config["max_steps"]) == (0.05, 5, 30), nodeid
        assert config["eval_before_train"] is False
        assert config["compile_update"] is False, nodeid  # a few steps: no minute of compilation
        assert config["share_prompts"] is False, nodeid  # nor flex attention's, outside the compiled body
    base, cudagraph = (cells[f"grids/gsm8k_throughput.py::{n}"]["config"] for n in ("base", "cudagraph"))
    assert (base["enforce_eager"], cudagraph["enforce_eager"]) == (True, False)  # the CUDA-graph lever stays
    widths = [cells[f"grids/gsm8k_throughput.py::{n}"]["config"]["train_batch_size"]
              for n in ("base", "tbs64", "tbs128", "tbs256", "tbs512")]
    assert widths == [8, 16, 32, 64, 128]  # one GPU's share of a 4-GPU node's batch


def test_gpu_profile_keeps_a_local_model_path(tmp_path):
    from sweepkit_plugins.trainer import gpu

    assert "model" not in gpu({"model": str(tmp_path)}, "trainer")
    assert gpu({"model": "Qwen/Qwen2.5-1.5B-Instruct"}, "trainer")["model"] == "random:qwen2.5-0.5b"
    assert gpu({"lr": 1.0}, "command") == {}


def test_gpu_profile_gives_an_opd_cell_a_larger_random_teacher_of_the_same_tokenizer(tmp_path):
    from sweepkit_plugins.trainer import gpu

    changes = gpu({"model": "Qwen/Qwen3-1.7B", "teacher_model": "Qwen/Qwen3-32B"}, "trainer")
    assert (changes["model"], changes["teacher_model"]) == ("random:qwen2.5-0.5b", "random:qwen2.5-1.5b")
    assert "teacher_model" not in gpu({"teacher_model": str(tmp_path)}, "trainer")  # a local teacher stays


def test_smoke_keeps_a_local_gsm8k_path(tmp_path):
    from sweepkit_plugins.trainer import smoke

    data = tmp_path / "gsm8k"
    data.mkdir()
    assert smoke({"dataset": str(data), "model": "Qwen/Qwen2.5-1.5B-Instruct"}, "trainer")["model"] == \
        "tiny-random"
    assert "dataset" not in smoke({"dataset": str(data)}, "trainer")
    assert smoke({"dataset": "gsm8k"}, "trainer")["dataset"] == "synthetic"
    assert smoke({"lr": 1.0}, "command") == {}


def test_readme_main_job_runs_the_smoke_grid_and_reports(sweeper):
    """`sweep run grids/gsm8k_throughput.py --profile smoke && sweep report` in a copy of the
    project's grids (three of the 18 cells, to stay quick), with the real trainer."""
    for grid in sorted((REPO / "grids").glob("*.py")):
        sweeper.write(f"grids/{grid.name}", grid.read_text())
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    sweeper.env.pop("SWEEPKIT_GSM8K", None)
    run = sweeper.run("run", "grids/gsm8k_throughput.py", "--profile", "smoke",
                      "-k", "base or tbs128 or combo_C or gmu080 or reshard")
    assert run.ret == 0, run
    assert "5 passed" in run.stdout
    report = sweeper.run("report", "--format", "json")
    assert report.ret == 0, report
    tables = json.loads(report.stdout.splitlines()[0])["tables"]
    rows = {row["cell"]: row for row in tables["throughput"]}
    assert set(rows) == {"base", "tbs128", "gmu080", "reshard", "combo_C"}
    assert all(row["status"] == "passed" and row["steps"] == 2 for row in rows.values())
    assert rows["base"]["delta_vs_base_pct"] == 0.0 and rows["tbs128"]["delta_vs_base_pct"] is not None
    assert (sweeper.path / "runs" / "gsm8k_throughput" / "report" / "accuracy.parquet").is_file()
    # Two smoke steps settle nothing, and a knob the CPU run cannot use is inert: no finding,
    # said on the terminal's table at its narrowest, and nothing for suggest to propose.
    verdicts = {name: row["verdict"] for name, row in rows.items()}
    assert (verdicts["base"], verdicts["gmu080"], verdicts["reshard"]) == (None, "inert", "inert")
    # One timed step when the first was the warm-up, two when the machine's load hid it: no finding either way.
    assert verdicts["tbs128"] in ("too few steps", "within noise") and verdicts["combo_C"] in ("too few steps",
                                                                                                "within noise")
    screen = sweeper.run("report", "--table", "throughput", env={"COLUMNS": "60"})
    lines = {line.split()[0]: line for line in screen.stdout.splitlines() if line.split()}
    assert "inert" in lines["gmu080"].split() and "inert" in lines["reshard"].split(), screen.stdout
    assert "too few steps" in lines["tbs128"] or "within noise" in lines["tbs128"]
    suggestion = sweeper.run("suggest", "grids/gsm8k_throughput.py", "--by", "sec_per_step")
    assert suggestion.ret == 0, suggestion
    assert "#   gmu: inert here, base kept" in suggestion.stdout
    assert "#   reshard: inert here, base kept" in suggestion.stdout
    assert "sk.cell(" not in suggestion.stdout and "no axis beats base beyond the noise" in suggestion.stdout

    # The README's rerun of one cell by its id, as written there: only that cell runs again.
    rerun = readme_command("sweep run grids/gsm8k_throughput.py::tbs128")
    again = sweeper.run(*rerun[1:])
    assert again.ret == 0, again
    assert "1 passed" in again.stdout
    attempts = {cell: len(json.loads((sweeper.path / "runs/gsm8k_throughput" / cell / "state.json")
                                     .read_text())["attempts"]) for cell in rows}
    assert attempts == {"base": 1, "tbs128": 2, "gmu080": 1, "reshard": 1, "combo_C": 1}
    report = sweeper.run("report", "--format", "json")
    assert report.ret == 0, report
    tables = json.loads(report.stdout.splitlines()[0])["tables"]
    for table in tables.values():
        assert {row["cell"]: (row["status"], row["steps"]) for row in table} == \
            {cell: ("passed", 2) for cell in ("base", "tbs128", "gmu080", "reshard", "combo_C")}


def readme_command(start: str) -> list[str]:
    """The README's command line that starts with ``start``, without its comment."""
    lines = [line for line in (REPO / "README.md").read_text().splitlines() if line.startswith(start)]
    assert len(lines) == 1, f"README has {len(lines)} lines starting with {start!r}"
    return shlex.split(lines[0], comments=True)


def test_trainer_cells_share_one_compile_cache_in_the_runs_dir(sweeper):
    sweeper.grid("train", """
        import sweepkit as sk
        base = sk.base(model="tiny-random", dataset="synthetic", device="cpu", backend="hf")
        lr3 = sk.cell(lr=1e-3)
    """)
    sweeper.grid("plain", """
        import sweepkit as sk
        target = sk.command("{python}", "-c", "pass")
        base = sk.base(lr=1.0)
    """)
    cache = sweeper.path / "runs" / ".torch-compile-cache"
    plan = sweeper.run("run", "--dry-run")
    assert plan.ret == 0, plan
    blocks = {block.split()[0]: block for block in plan.stdout.split("FRESH")[1:]}
    assert set(blocks) == {"grids/train.py::base", "grids/train.py::lr3", "grids/plain.py::base"}
    for cell in ("grids/train.py::base", "grids/train.py::lr3"):
        assert f"env:  TORCHINDUCTOR_CACHE_DIR={cache}\n" in blocks[cell]
    assert "TORCHINDUCTOR_CACHE_DIR" not in blocks["grids/plain.py::base"]
    # The user's own cache dir is theirs: the plugin leaves it to the environment.
    own = sweeper.run("run", "--dry-run", env={"TORCHINDUCTOR_CACHE_DIR": "/scratch/me/inductor"})
    assert own.ret == 0 and "TORCHINDUCTOR_CACHE_DIR" not in own.stdout, own
    # The cache's dot-named dir is no grid's: status lists the grids only.
    cache.mkdir(parents=True)
    status = sweeper.run("status")
    assert status.ret == 0 and "torch-compile-cache" not in status.output, status
