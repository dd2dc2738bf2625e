"""``sweep-train`` / ``python -m trainer``: config errors, overrides, GSM8K end to end, inert knobs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainer.cli import EXIT_CONFIG, main

REPO = Path(__file__).resolve().parents[1]
GSM8K = Path("/work/shared/data/gsm8k")
TINY_GSM8K = {
    "model": "tiny-random", "dataset": str(GSM8K), "train_batch_size": 2, "policy_mini_batch_size": 2,
    "n_samples_per_prompt": 2, "max_prompt_length": 48, "max_generate_length": 12, "max_steps": 2,
    "eval_limit": 2, "eval_n_samples_per_prompt": 2, "lr": 1e-4, "export_final": False,
}


def write_config(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def run_in_process(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def test_unknown_key_exits_2_naming_it_without_importing_torch(tmp_path):
    config = write_config(tmp_path, {"lr": 1e-5, "learning_rate": 0.1})
    code = ("import sys; from trainer.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(config), "--ckpt-dir", str(tmp_path / "c")],
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    assert out.stdout.split() == [str(EXIT_CONFIG), "False"]
    assert "unknown key 'learning_rate'" in out.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("override, key", [
    ("lr=-1", "lr"),
    ("use_kl_loss=maybe", "use_kl_loss"),
    ("eps_clip_hgih=0.28", "eps_clip_hgih"),
    ("backend=sglang", "backend"),
])
def test_bad_override_exits_2_naming_the_key(tmp_path, capsys, override, key):
    code, err = run_in_process(capsys, write_config(tmp_path, {}), override, "--ckpt-dir", tmp_path / "c")
    assert code == EXIT_CONFIG
    assert key in err


def test_help_lists_every_config_key_with_its_default(capsys):
    from trainer.config import schema

    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    for key, field in schema().items():
        assert f"  {key} ({field['type_name']}, default {field['default']!r}): " in shown


def test_missing_config_file_exits_2(tmp_path, capsys):
    code, err = run_in_process(capsys, tmp_path / "nope.json", "--ckpt-dir", tmp_path / "c")
    assert code == EXIT_CONFIG and "nope.json" in err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_backend_without_vllm_exits_2(tmp_path, capsys):
    code, err = run_in_process(capsys, write_config(tmp_path, {}), "backend=vllm", "--ckpt-dir", tmp_path / "c")
    assert code == EXIT_CONFIG and "vllm package" in err


@pytest.mark.skipif(not (GSM8K / "train.jsonl").is_file(), reason="GSM8K data not staged at /work/shared/data")
def test_gsm8k_end_to_end_with_overrides_and_inert_knobs(tmp_path):
    config = write_config(tmp_path, TINY_GSM8K)
    result = subprocess.run(
        [sys.executable, "-m", "trainer", str(config), "gpu_memory_utilization=0.9", "max_steps=1",
         "--ckpt-dir", str(tmp_path / "ckpt")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    # --metrics left out: the file lands in the working directory (the cell dir).
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in records] == [("info", 0), ("eval", 0), ("train", 1), ("eval", 1)]
    info = records[0]
    assert info["config"]["max_steps"] == 1 and info["config"]["gpu_memory_utilization"] == 0.9
    assert info["inert_knobs"]["gpu_memory_utilization"] == {
        "value": 0.9, "default": 0.7, "changed": True,
        "reason": "on the CPU the KV cache is sized for the run's largest batch"}
    assert info["inert_knobs"]["enforce_eager"]["changed"] is False
    assert json.loads((tmp_path / "ckpt" / "run_info.json").read_text())["inert_knobs"] == info["inert_knobs"]
    inert_lines = [line for line in result.stderr.splitlines() if "no effect in this run" in line]
    assert len(inert_lines) == 1 and "gpu_memory_utilization=0.9" in inert_lines[0]
    train = records[2]
    assert train["throughput/tokens_generated"] > 0 and 0 <= train["reward/mean"] <= 1
    assert (tmp_path / "ckpt" / "global_step_1" / "model.safetensors").is_file()
    # what it is doing, as it does it: the run, the eval that precedes the first step, the end
    said = [line for line in result.stderr.splitlines() if line.startswith("sweep-train: ")]
    assert said[1].startswith("sweep-train: tiny-random on cpu (float32 compute, static engine): 1 steps of")
    assert said[2].startswith("sweep-train: eval before the first step: ") and "eval_before_train=false" in said[2]
    assert said[-1].startswith("sweep-train: done: 1 steps in ") and "metrics in metrics.jsonl" in said[-1]
    assert "Writing model shards" not in result.stderr  # the export's progress bar


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_cuda_device_without_cuda_exits_2_naming_the_key(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = subprocess.run(
        ["sweep-train", str(write_config(tmp_path, {"device": "cuda"})), "--ckpt-dir", str(tmp_path / "ckpt"),
         "--metrics", str(tmp_path / "m.jsonl")],
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=300)
    assert result.returncode == EXIT_CONFIG, result.stderr
    assert "device: 'cuda' but torch sees no CUDA device" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_trainer_never_imports_sweepkit():
    # The trainer is a separate program (config in, metrics and checkpoints out).
    code = textwrap.dedent("""
        import pkgutil, sys, trainer
        from trainer.rollout import BackendUnavailable
        for module in pkgutil.walk_packages(trainer.__path__, "trainer."):
            if module.name != "trainer.__main__":
                try:
                    __import__(module.name)
                except BackendUnavailable:  # trainer.rollout.vllm without vllm installed
                    pass
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("sweepkit", "sweepkit_plugins")))
        print(len([m for m in sys.modules if m.startswith("trainer.")]))
    """)
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    imported, trainer_modules = out.stdout.split("\n")[:2]
    assert imported == "[]"
    assert int(trainer_modules) >= 12  # the walk imported the trainer's modules


def test_batch_larger_than_the_split_exits_2(tmp_path):
    config = write_config(tmp_path, {"synthetic_size": 4, "train_batch_size": 8, "policy_mini_batch_size": 8})
    result = subprocess.run(
        [sys.executable, "-m", "trainer", str(config), "--ckpt-dir", str(tmp_path / "ckpt"),
         "--metrics", str(tmp_path / "m.jsonl")],
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert result.returncode == EXIT_CONFIG
    assert "train_batch_size" in result.stderr


def test_a_trainer_killed_by_a_fatal_signal_leaves_its_python_stack(tmp_path):
    """A rank that segfaults inside a collective library must not die with its exit status
    alone: the trainer's stderr gets every thread's Python stack (faulthandler)."""
    config = write_config(tmp_path, {"model": "tiny-random", "dataset": "synthetic", "max_steps": 100000,
                                     "export_final": False, "eval_before_train": False})
    process = subprocess.Popen([sys.executable, "-m", "trainer", str(config), "--ckpt-dir", str(tmp_path / "ckpt"),
                                "--metrics", str(tmp_path / "metrics.jsonl")], cwd=tmp_path,
                               env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and '"kind": "train"' in metrics.read_text()):
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "no train step within 120 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGSEGV)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in stderr, stderr[-2000:]
    assert re.search(r'File ".*trainer[/\\]\w+\.py", line \d+', stderr), stderr[-2000:]
