"""Checkpoints: exact round trips, atomic writes, the latest marker, and never deleting a run."""

from __future__ import annotations

import random

import pytest
import torch

from trainer import checkpoint
from trainer.checkpoint import CheckpointError
from trainer.config import TrainerConfig
from trainer.models import load_model_and_tokenizer


def make_training(seed: int):
    model, tokenizer = load_model_and_tokenizer(TrainerConfig(seed=seed), device="cpu", dtype="float32")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: min(1.0, (update + 1) / 5))
    return model, tokenizer, optimizer, scheduler


def train_a_little(model, optimizer, scheduler, updates=2):
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    for _ in range(updates):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def save(ckpt_dir, step, model, optimizer, scheduler):
    return checkpoint.save(ckpt_dir, step, model=model, optimizer=optimizer, scheduler=scheduler,
                           sampler_state={"epoch": 1, "index": 8}, config={"lr": 0.01})


def test_round_trip_restores_weights_optimizer_schedule_and_rng(tmp_path):
    model, _, optimizer, scheduler = make_training(seed=1)
    train_a_little(model, optimizer, scheduler)
    random.seed(5)
    torch.manual_seed(5)
    path = save(tmp_path, 2, model, optimizer, scheduler)
    expected_random, expected_torch = random.random(), torch.rand(3)

    restored, _, restored_optimizer, restored_scheduler = make_training(seed=2)  # different init
    resumed = checkpoint.load(path, model=restored, optimizer=restored_optimizer,
                              scheduler=restored_scheduler, device="cpu")
    assert resumed.step == 2 and resumed.sampler_state == {"epoch": 1, "index": 8}
    assert random.random() == expected_random and torch.equal(torch.rand(3), expected_torch)
    for (name, a), b in zip(model.state_dict().items(), restored.state_dict().values()):
        assert torch.equal(a, b), name
    assert restored_scheduler.get_last_lr() == scheduler.get_last_lr()
    # Continuing both gives the same weights: Adam moments and step counts came back too.
    train_a_little(model, optimizer, scheduler)
    train_a_little(restored, restored_optimizer, restored_scheduler)
    for a, b in zip(model.parameters(), restored.parameters()):
        assert torch.equal(a, b)


def test_latest_marker_and_fallback(tmp_path):
    model, _, optimizer, scheduler = make_training(seed=1)
    save(tmp_path, 2, model, optimizer, scheduler)
    save(tmp_path, 4, model, optimizer, scheduler)
    assert (tmp_path / "latest").read_text().strip() == "global_step_4"
    assert checkpoint.find_latest(tmp_path).name == "global_step_4"
    # Killed between the rename and the marker update: the newer complete directory wins.
    (tmp_path / "latest").write_text("global_step_2\n")
    assert checkpoint.find_latest(tmp_path).name == "global_step_4"
    (tmp_path / "latest").unlink()
    assert checkpoint.find_latest(tmp_path).name == "global_step_4"
    assert checkpoint.find_latest(tmp_path / "nothing-here") is None


def test_half_written_checkpoint_is_ignored_and_cleaned(tmp_path):
    model, _, optimizer, scheduler = make_training(seed=1)
    save(tmp_path, 2, model, optimizer, scheduler)
    partial = tmp_path / ".tmp-global_step_4"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"\0" * 10)
    assert checkpoint.plan_start(tmp_path, "latest").name == "global_step_2"
    assert checkpoint.remove_stale_writes(tmp_path) == [partial]
    assert not partial.exists() and (tmp_path / "global_step_2").is_dir()


def test_incomplete_directory_is_refused_by_name(tmp_path):
    model, _, optimizer, scheduler = make_training(seed=1)
    path = save(tmp_path, 2, model, optimizer, scheduler)
    (path / "rng.pt").unlink()
    with pytest.raises(CheckpointError, match="missing rng.pt"):
        checkpoint.load(path, model=model, optimizer=optimizer, scheduler=scheduler, device="cpu")


def test_fresh_run_over_checkpoints_is_refused_and_nothing_deleted(tmp_path):
    (tmp_path / "global_step_7").mkdir()
    with pytest.raises(CheckpointError, match="global_step_7.*nothing was deleted"):
        checkpoint.plan_start(tmp_path, None)
    assert (tmp_path / "global_step_7").is_dir()
    assert checkpoint.plan_start(tmp_path / "empty", None) is None


def test_rewriting_a_step_replaces_it_whole(tmp_path):
    model, _, optimizer, scheduler = make_training(seed=1)
    save(tmp_path, 2, model, optimizer, scheduler)
    train_a_little(model, optimizer, scheduler)
    path = save(tmp_path, 2, model, optimizer, scheduler)
    fresh, _, fresh_optimizer, fresh_scheduler = make_training(seed=2)
    checkpoint.load(path, model=fresh, optimizer=fresh_optimizer, scheduler=fresh_scheduler, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))
    assert not list(tmp_path.glob(".tmp-*"))


def test_reference_round_trips_and_a_new_one_replaces_the_old(tmp_path):
    model, _, optimizer, scheduler = make_training(seed=1)
    checkpoint.save_reference(tmp_path, model)
    train_a_little(model, optimizer, scheduler)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    checkpoint.save_reference(tmp_path, model)  # a fresh run's own initial policy replaces a leftover
    reference, *_ = make_training(seed=2)
    assert checkpoint.load_reference(tmp_path, reference, "cpu")
    assert all(torch.equal(trained[k], v) for k, v in reference.state_dict().items())
    assert not list(tmp_path.glob(".tmp-*"))
    assert not checkpoint.load_reference(tmp_path / "none", reference, "cpu")


def test_export_is_loadable_with_from_pretrained(tmp_path):
    import transformers

    model, tokenizer, _, _ = make_training(seed=1)
    checkpoint.export(tmp_path, model, tokenizer)
    checkpoint.export(tmp_path, model, tokenizer)  # a second export replaces the first
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export")
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model.eval()(ids).logits, atol=1e-6)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "export").eos_token == tokenizer.eos_token
    assert not list(tmp_path.glob(".tmp-*"))
