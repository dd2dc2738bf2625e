"""Mixed precision: fp32 master weights take every update, whatever the compute dtype."""

from __future__ import annotations

import json

import safetensors.torch
import torch

from trainer.config import TrainerConfig
from trainer.loop import train
from trainer.models import load_model_and_tokenizer
from trainer.precision import Precision

RUN = dict(model="tiny-random", dataset="synthetic", device="cpu", lr=1e-6, max_steps=2,
           train_batch_size=4, policy_mini_batch_size=4, n_samples_per_prompt=4, max_generate_length=6,
           eval_before_train=False, eval_limit=4, eval_n_samples_per_prompt=1, export_final=True,
           progress_bar=False, seed=5)


def run(tmp_path, name, **overrides):
    cfg = TrainerConfig(**RUN, **overrides)
    ckpt = tmp_path / name
    with open(tmp_path / f"{name}.log", "w") as quiet:
        train(cfg, ckpt_dir=ckpt, metrics_path=tmp_path / f"{name}.jsonl", stdout=quiet, stderr=quiet)
    return cfg, ckpt


def test_bf16_compute_at_lr_1e6_moves_the_weights_as_fp32_does(tmp_path):
    torch.set_num_threads(1)
    _, fp32_dir = run(tmp_path, "fp32", dtype="float32")
    cfg, bf16_dir = run(tmp_path, "bf16", dtype="bfloat16")
    initial, _ = load_model_and_tokenizer(cfg, device="cpu", dtype="float32")
    start = {k: v for k, v in initial.state_dict().items()}
    fp32 = safetensors.torch.load_file(fp32_dir / "global_step_2" / "model.safetensors")
    bf16 = safetensors.torch.load_file(bf16_dir / "global_step_2" / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in bf16.values())  # the checkpoint keeps the masters

    def changed(weights):
        moved = sum(int((weights[k] != start[k]).sum()) for k in weights if k in start)
        return moved / sum(start[k].numel() for k in weights if k in start)

    # Two AdamW steps of about 1e-6 each: below bf16's resolution for almost every weight, so
    # bf16 parameters would keep ~0% of them; fp32 masters keep them all.
    assert changed(fp32) > 0.95
    assert changed(bf16) > 0.95
    for key in fp32:
        step_fp32, step_bf16 = fp32[key] - start[key], bf16[key] - start[key]
        # Same direction and size up to the bf16 forward's noise in the gradients.
        cosine = torch.nn.functional.cosine_similarity(step_fp32.flatten(), step_bf16.flatten(), dim=0)
        assert cosine > 0.5, key
        assert 0.5 < step_bf16.norm() / step_fp32.norm() < 2.0, key
    info = json.loads((bf16_dir / "run_info.json").read_text())
    assert (info["dtype"], info["master_dtype"]) == ("bfloat16", "float32")


def test_the_export_is_written_in_the_compute_dtype(tmp_path):
    torch.set_num_threads(1)
    _, bf16_dir = run(tmp_path, "bf16", dtype="bfloat16")
    exported = safetensors.torch.load_file(bf16_dir / "export" / "model.safetensors")
    assert {t.dtype for t in exported.values()} == {torch.bfloat16}
    assert json.loads((bf16_dir / "export" / "config.json").read_text())["dtype"] == "bfloat16"
    master = safetensors.torch.load_file(bf16_dir / "global_step_2" / "model.safetensors")
    shared = exported.keys() & master.keys()  # tied embeddings are stored under one of their names
    assert shared
    for key in shared:
        assert torch.equal(exported[key], master[key].to(torch.bfloat16))


def test_bf16_parameters_would_lose_the_update():
    # The failure the masters prevent, shown directly: AdamW at lr 1e-6 on bf16 weights.
    torch.manual_seed(0)
    weight = torch.randn(512, 128) * 0.02
    for dtype, expected in ((torch.float32, 0.99), (torch.bfloat16, 0.2)):
        parameter = torch.nn.Parameter(weight.to(dtype).clone())
        optimizer = torch.optim.AdamW([parameter], lr=1e-6, weight_decay=0.0)
        for _ in range(10):
            parameter.grad = torch.randn_like(parameter)
            optimizer.step()
        moved = float((parameter.detach().float() != weight.to(dtype).float()).float().mean())
        assert (moved > expected) if dtype == torch.float32 else (moved < expected), (dtype, moved)


def test_autocast_is_on_only_for_a_lower_compute_dtype():
    cuda_like = Precision.for_run(TrainerConfig(dtype="auto"), torch.device("cuda"))
    assert cuda_like.compute == torch.bfloat16 and cuda_like.mixed
    cpu = Precision.for_run(TrainerConfig(dtype="auto"), torch.device("cpu"))
    assert cpu.compute == torch.float32 and not cpu.mixed
    with Precision.for_run(TrainerConfig(dtype="bfloat16"), torch.device("cpu")).autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
