"""``sweep export`` end to end: a real tiny trainer cell, its best checkpoint as a HF model dir."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import CHECKPOINTED_TINY_GRID, Sweeper

TINY = CHECKPOINTED_TINY_GRID
# A cell that completes without writing any checkpoint.
EMPTY = """
import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
base = sk.base(x=1)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Sweeper:
    """One real run of the tiny grid (3 steps, a checkpoint and an eval at each), and one cell
    without checkpoints; the tests export from it into dirs of their own."""
    sweeper = Sweeper.new(tmp_path_factory.mktemp("export"))
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    sweeper.grid("tiny", TINY)
    sweeper.grid("empty", EMPTY)
    result = sweeper.run("run")
    assert result.ret == 0, result
    return sweeper


def cell_dir(project: Sweeper) -> Path:
    return project.path / "runs" / "tiny" / "base"


def expected_best(directory: Path, metric: str = "eval/pass_at_k") -> tuple[int, float]:
    """The argmax of ``metric`` over the eval records at checkpointed steps, the earliest on a tie."""
    checkpointed = {int(path.name.removeprefix("global_step_")) for path in (directory / "ckpt").glob("global_step_*")}
    evals = {}
    for line in (directory / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "eval" and record["step"] in checkpointed and metric in record:
            evals[record["step"]] = record[metric]
    assert len(evals) == 3, evals
    best = max(sorted(evals), key=lambda step: evals[step])  # max keeps the first of equals
    return best, evals[best]


def greedy(model, ids: list[int], new_tokens: int = 6) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=new_tokens, do_sample=False)
    return out[0].tolist()


def trainer_model(step_dir: Path):
    """The trainer's own model of a checkpoint, built as the run built it."""
    import safetensors.torch
    import torch

    from trainer.config import TrainerConfig
    from trainer.models import load_model_and_tokenizer

    config = json.loads((step_dir / "trainer_state.json").read_text())["config"]
    model, tokenizer = load_model_and_tokenizer(TrainerConfig.from_dict(config), device="cpu", dtype=torch.float32)
    safetensors.torch.load_model(model, str(step_dir / "model.safetensors"))
    return model.eval(), tokenizer


def test_export_writes_the_best_checkpoint_as_a_model_that_generates_as_the_trainer_did(project):
    import transformers

    from trainer.tasks import SYNTHETIC_WORDS

    result = project.run("export", "grids/tiny.py", "--to", "out")
    assert result.ret == 0, result
    target = project.path / "out" / "tiny" / "base"
    assert "EXPORTED grids/tiny.py::base" in result.stdout and "huggingface-cli upload" in result.stdout
    best, value = expected_best(cell_dir(project))
    manifest = json.loads((target / "manifest.json").read_text())
    assert (manifest["step"], manifest["metric"], manifest["metric_value"]) == (best, "eval/pass_at_k", value)
    assert manifest["grid_file"] == "grids/tiny.py" and manifest["nodeid"] == "grids/tiny.py::base"
    state = json.loads((cell_dir(project) / "state.json").read_text())
    assert manifest["config_hash"] == state["config_hash"] and manifest["git_commit"] is None
    listed = {entry["path"]: entry for entry in manifest["files"]}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= set(listed)
    for name, entry in listed.items():
        data = (target / name).read_bytes()
        assert (entry["bytes"], entry["sha256"]) == (len(data), hashlib.sha256(data).hexdigest()), name
    assert sorted(listed) == sorted(p.name for p in target.iterdir() if p.name != "manifest.json")
    generation = json.loads((target / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 1 and generation["pad_token_id"] == 0 and generation["temperature"] == 1.0

    exported = transformers.AutoModelForCausalLM.from_pretrained(target).eval()
    auto_tokenizer = transformers.AutoTokenizer.from_pretrained(target)
    assert (auto_tokenizer.eos_token_id, auto_tokenizer.pad_token_id) == (1, 0)
    # transformers 5 gives a qwen2 model's dir its Qwen2Tokenizer, which rebuilds a byte-level
    # BPE and loses the synthetic task's word vocabulary: the saved tokenizer is read as the
    # trainer reads an export of its own (trainer.models._tokenizer_class).
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(target)
    own_model, own_tokenizer = trainer_model(cell_dir(project) / "ckpt" / f"global_step_{best}")
    for prompt in (" ".join(SYNTHETIC_WORDS[:3]), " ".join(SYNTHETIC_WORDS[3:6]), SYNTHETIC_WORDS[-1]):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert ids == own_tokenizer(prompt, add_special_tokens=False)["input_ids"] and ids
        assert greedy(exported, ids) == greedy(own_model, ids), prompt


def test_export_of_the_last_checkpoint_and_of_a_step(project):
    last = project.run("export", "grids/tiny.py::base", "--last", "--to", "last")
    assert last.ret == 0, last
    manifest = json.loads((project.path / "last/tiny/base/manifest.json").read_text())
    assert (manifest["step"], manifest["metric"], manifest["metric_value"]) == (3, "last", None)
    by = project.run("export", "grids/tiny.py", "--by", "pass_at_1", "--to", "by")
    assert by.ret == 0, by
    manifest = json.loads((project.path / "by/tiny/base/manifest.json").read_text())
    assert (manifest["step"], manifest["metric"]) == (expected_best(cell_dir(project), "eval/pass_at_1")[0],
                                                      "eval/pass_at_1")


@pytest.mark.parametrize("args, says", [
    (("grids/empty.py",), "grids/empty.py::base: no checkpoint"),
    (("grids/tiny.py", "--by", "eval/nope"), "never logged it; they logged: eval/k, eval/pass_at_1, eval/pass_at_k"),
    (("grids/tiny.py", "--step", "7"), "--step 7: no checkpoint at that step; checkpointed steps: 1, 2, 3"),
    (("grids/tiny.py", "grids/empty.py", "--step", "2"), "grids/empty.py::base: no checkpoint"),
])
def test_bad_input_writes_nothing(project, args, says):
    result = project.run("export", *args, "--to", "bad")
    assert result.ret == 4, result
    assert says in result.stderr and "nothing was written" in result.stderr, result
    assert not (project.path / "bad").exists()


def test_a_target_that_is_not_empty_is_refused_untouched(project):
    target = project.path / "full" / "tiny" / "base"
    target.mkdir(parents=True)
    (target / "mine.txt").write_text("keep me")
    result = project.run("export", "grids/tiny.py", "--to", "full")
    assert result.ret == 4, result
    assert "full/tiny/base exists and is not empty" in result.stderr
    assert [path.name for path in target.iterdir()] == ["mine.txt"]


def test_a_runs_dir_that_does_not_exist_is_named(project):
    result = project.run("--runs-dir", "nowhere", "export", "grids/tiny.py", "--to", "none")
    assert result.ret == 4, result
    assert "runs dir nowhere: no such directory" in result.stderr
    assert not (project.path / "none").exists() and not (project.path / "nowhere").exists()


def test_a_running_cell_is_refused(project):
    from sweepkit.state.files import LOCK_FILE, flock

    with flock(cell_dir(project) / LOCK_FILE):
        result = project.run("export", "grids/tiny.py", "--to", "running")
    assert result.ret == 1, result
    assert "REFUSED  grids/tiny.py::base: is running now" in result.stderr
    assert not (project.path / "running").exists()


def test_a_skyrl_cell_exports_the_hf_model_skyrl_wrote_and_refuses_fsdp_shards(sweeper):
    # A SkyRL cell (its entry point is not installed here: it fails at once) whose checkpoint
    # dir then holds step 2 with SkyRL's HF-format policy and step 4 with FSDP shards only.
    sweeper.env.update(CUDA_VISIBLE_DEVICES="", CHECKPOINTS_DIR=str(sweeper.path / "ckpts"))
    sweeper.grid("s", """
        import sweepkit as sk
        target = sk.command("{python}", "-m", "skyrl_train.entrypoints.main_base")
        base = sk.base(lr=1e-6, resume_mode=None)
    """)
    assert sweeper.run("run").ret == 1
    steps = sweeper.path / "ckpts" / "s" / "base"
    hf = steps / "global_step_2" / "policy" / "huggingface"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text('{"model_type": "qwen2"}')
    (hf / "model.safetensors").write_bytes(b"weights")
    (steps / "global_step_4" / "policy").mkdir(parents=True)
    (steps / "global_step_4" / "policy" / "model_state.pt").write_bytes(b"shard")
    exported = sweeper.run("export", "--step", "2", "--to", "out")
    assert exported.ret == 0, exported
    target = sweeper.path / "out" / "s" / "base"
    assert (target / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((target / "manifest.json").read_text())["step"] == 2
    refused = sweeper.run("export", "--last", "--to", "shards")
    assert refused.ret == 4, refused
    assert "FSDP shards need SkyRL's own conversion" in refused.stderr and "torchrun" in refused.stderr
    assert not (sweeper.path / "shards" / "s" / "base").exists()


def test_leonardo_exports_under_work_never_scratch():
    from sweepkit.errors import UsageError
    from sweepkit_plugins.leonardo import export_dir

    environ = {"WORK": "/leonardo_work/acct/me", "CINECA_SCRATCH": "/leonardo_scratch/large/me"}
    assert export_dir(environ) == Path("/leonardo_work/acct/me/sweepkit-exports")
    with pytest.raises(UsageError, match=r"WORK is not set"):
        export_dir({"CINECA_SCRATCH": "/leonardo_scratch/large/me"})
