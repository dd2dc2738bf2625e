"""The training loop end to end through ``python -m trainer``: it learns, resumes exactly, logs every metric.

Runs use one CPU thread: with two cores shared by other processes, torch's
default of two spinning threads makes tiny-model steps tens of times slower,
and a single thread also makes every reduction's order, hence every float,
repeatable between runs.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
import torch

from trainer.metrics import EVAL_KEYS, TRAIN_KEYS

REPO = Path(__file__).resolve().parents[1]

# GRPO on the synthetic task ("#### <first digit>"), sized to learn in about a minute on 2 cores.
LEARNING = {
    "model": "tiny-random", "dataset": "synthetic", "seed": 42,
    "train_batch_size": 16, "policy_mini_batch_size": 8, "n_samples_per_prompt": 8,
    "micro_train_batch_size_per_gpu": 64, "micro_forward_batch_size_per_gpu": 128,
    "max_generate_length": 8, "lr": 3e-3, "epochs": 5, "max_steps": 60,
    "eval_limit": 16, "eval_interval": 30, "ckpt_interval": 30, "export_final": True,
}
# Small and quick, for the resume runs.
RESUMABLE = {
    "model": "tiny-random", "dataset": "synthetic", "seed": 7,
    "train_batch_size": 4, "policy_mini_batch_size": 2, "n_samples_per_prompt": 4,
    "micro_train_batch_size_per_gpu": 3, "micro_forward_batch_size_per_gpu": 5,
    "max_generate_length": 6, "lr": 3e-3, "epochs": 100, "max_steps": 12, "ckpt_interval": 2,
    "eval_before_train": False, "export_final": False, "num_warmup_steps": 4,
    # Every optional loss term on, so resuming is checked with all of them.
    "use_kl_loss": True, "use_tis": True, "use_entropy_loss": True, "grpo_norm_by_std": False,
    "loss_reduction": "seq_mean_token_sum_norm",
}


def trainer_command(workdir: Path, config: dict, *overrides: str) -> list[str]:
    path = workdir / "config.json"
    path.write_text(json.dumps(config))
    return [sys.executable, "-m", "trainer", str(path), *overrides,
            "--ckpt-dir", str(workdir / "ckpt"), "--metrics", str(workdir / "metrics.jsonl")]


def trainer_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def run_trainer(workdir: Path, config: dict, *overrides: str) -> subprocess.CompletedProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(trainer_command(workdir, config, *overrides), cwd=workdir, env=trainer_env(),
                          capture_output=True, text=True, timeout=300)


def read_metrics(path: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == kind]


@pytest.fixture(scope="module")
def learning_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("learn")
    result = run_trainer(workdir, LEARNING)
    assert result.returncode == 0, result.stderr
    return workdir, result


def test_grpo_raises_reward_on_the_synthetic_task(learning_run):
    workdir, _ = learning_run
    rewards = [r["reward/mean"] for r in read_metrics(workdir / "metrics.jsonl", "train")]
    assert len(rewards) == LEARNING["max_steps"]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-10:]) / 10
    assert first <= 0.3, rewards
    assert last >= 0.8, rewards
    evals = read_metrics(workdir / "metrics.jsonl", "eval")
    assert evals[-1]["eval/pass_at_1"] > evals[0]["eval/pass_at_1"]


def test_every_metric_on_every_line(learning_run):
    workdir, result = learning_run
    train = read_metrics(workdir / "metrics.jsonl", "train")
    for record in train:
        missing = [k for k in TRAIN_KEYS if not isinstance(record.get(k), (int, float))]
        assert not missing, f"step {record['step']} lacks {missing}"
    assert [r["step"] for r in train] == list(range(1, LEARNING["max_steps"] + 1))
    evals = read_metrics(workdir / "metrics.jsonl", "eval")
    assert [r["step"] for r in evals] == [0, 30, 60]
    for record in evals:
        assert all(isinstance(record.get(k), (int, float)) for k in EVAL_KEYS), record
        assert record["eval/k"] == 4 and 0 <= record["eval/pass_at_1"] <= record["eval/pass_at_k"] <= 1


def test_stdout_mirrors_the_metrics_file(learning_run):
    workdir, result = learning_run
    mirrored = []
    for line in result.stdout.splitlines():
        if line.startswith("WANDB_MIRROR "):
            _, kind, step, payload = line.split(" ", 3)
            assert payload.startswith("metrics=")
            mirrored.append({"kind": kind.removeprefix("kind="), "step": int(step.removeprefix("step=")),
                             **json.loads(payload.removeprefix("metrics="))})
    from_file = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert mirrored == from_file
    assert from_file[0]["kind"] == "info"


def test_timing_split_adds_up(learning_run):
    workdir, _ = learning_run
    for record in read_metrics(workdir / "metrics.jsonl", "train"):
        parts = sum(record[k] for k in ("timing/generate", "timing/ref", "timing/policy_train",
                                         "timing/sync_weights"))
        assert 0 < parts <= record["timing/step"]
        assert record["throughput/tokens_generated"] > 0
        assert 1 <= record["response_length/mean"] <= record["response_length/max"] <= 8


def test_the_first_step_says_where_its_time_went(learning_run):
    workdir, result = learning_run
    lines = [line for line in result.stderr.splitlines() if line.startswith("sweep-train: first step ")]
    assert len(lines) == 1, result.stderr  # once, after the first step only
    first = read_metrics(workdir / "metrics.jsonl", "train")[0]["timing/step"]
    seconds = float(lines[0].removeprefix("sweep-train: first step ").split(" s;")[0])
    assert seconds == pytest.approx(first, abs=0.051)
    assert " build " in lines[0] and "compile " in lines[0]


def test_startup_phases_add_up_per_name():
    from trainer import startup

    before = startup.LEDGER["test phase"], startup.COUNTS["test phase"]
    for _ in range(2):
        with startup.phase("test phase"):
            time.sleep(0.01)
    assert startup.COUNTS["test phase"] - before[1] == 2
    assert startup.LEDGER["test phase"] - before[0] >= 0.02
    entry = startup.summary()["phases"]["test phase"]
    assert entry["count"] == before[1] + 2
    assert "test phase" in startup.describe(1.0)


def test_a_run_warms_the_compile_workers_only_where_it_compiles():
    from trainer.config import TrainerConfig
    from trainer.setup import compiles

    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # device objects: nothing touches CUDA
    assert compiles(TrainerConfig(), cuda)  # the update's body and the log-prob chunks
    assert not compiles(TrainerConfig(), cpu)
    uncompiled = TrainerConfig(enforce_eager=True, compile_update=False, fused_logprobs=False)
    assert not compiles(uncompiled, cuda)
    assert compiles(attrs.evolve(uncompiled, enforce_eager=False), cuda)  # the decode step
    assert not compiles(attrs.evolve(uncompiled, enforce_eager=False, compile_decode=False), cuda)
    assert compiles(attrs.evolve(uncompiled, fused_logprobs=True), cuda)
    assert not compiles(TrainerConfig(), cuda, world=2)  # the sharded policy runs uncompiled, decode eager


@pytest.mark.parametrize("compiles, events", [(True, ["warm", "build"]), (False, ["build"])])
def test_set_up_warms_the_compile_workers_before_the_model_builds(tmp_path, monkeypatch, compiles, events):
    """The pool itself is the next test's; here, that set_up starts it first, and only for a run
    that compiles (``trainer.setup.compiles`` is False on this CPU, so it is made to answer)."""
    import io

    import trainer.setup
    from trainer import startup
    from trainer.config import TrainerConfig
    from trainer.parallel import SINGLE

    seen, build = [], trainer.setup.load_model_and_tokenizer
    monkeypatch.setattr(trainer.setup, "compiles", lambda cfg, device, world: compiles)
    monkeypatch.setattr(startup, "warm_compile_workers", lambda: seen.append("warm"))
    monkeypatch.setattr(trainer.setup, "load_model_and_tokenizer",
                        lambda *args, **kwargs: seen.append("build") or build(*args, **kwargs))
    torch.set_num_threads(1)
    trainer.setup.set_up(TrainerConfig(max_steps=1), SINGLE, ckpt_dir=tmp_path / "ckpt",
                         metrics_path=tmp_path / "metrics.jsonl", stdout=None, stderr=io.StringIO())
    assert seen == events


@pytest.mark.parametrize("switch, pools", [("1", "1"), ("0", "0")])
def test_warming_the_compile_workers_starts_inductors_pool_unless_switched_off(switch, pools):
    code = ("from trainer import startup; startup.warm_compile_workers(); "
            "from torch._inductor.async_compile import AsyncCompile; "
            "print(AsyncCompile.process_pool.cache_info().currsize)")
    env = {**os.environ, "TORCH_WARM_POOL": switch, "TORCHINDUCTOR_COMPILE_THREADS": "2"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == pools, result.stdout


def test_final_checkpoint_and_export(learning_run):
    workdir, _ = learning_run
    ckpt = workdir / "ckpt"
    assert (ckpt / "latest").read_text().strip() == "global_step_60"
    assert sorted(p.name for p in ckpt.glob("global_step_*")) == ["global_step_30", "global_step_60"]
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt / "export")
    tokenizer = transformers.AutoTokenizer.from_pretrained(ckpt / "export")
    assert model.config.vocab_size == len(tokenizer)
    assert not list(ckpt.glob(".tmp-*"))


def test_killed_run_resumes_exactly(tmp_path):
    reference = tmp_path / "uninterrupted"
    assert run_trainer(reference, RESUMABLE).returncode == 0
    expected = read_metrics(reference / "metrics.jsonl", "train")
    # The HF engine samples with the trained model itself: pi_old is mu, every TIS weight is 1.
    assert {r["policy/tis_weight"] for r in expected} == {1.0}
    # Two optimizer steps per step (mini-batches of 2 of 4 prompts) through a 4-update warm-up.
    assert [r["policy/lr"] for r in expected[:3]] == pytest.approx([3e-3 * 2 / 4, 3e-3, 3e-3])

    # The same run, told to go on for ever, is killed once two checkpoints have landed; a
    # half-written checkpoint is planted as a kill during a write would leave it. Its first
    # start already asks to resume, with nothing there yet.
    killed = tmp_path / "killed"
    killed.mkdir()
    command = trainer_command(killed, RESUMABLE, "max_steps=100000", "resume_mode=latest")
    process = subprocess.Popen(command, cwd=killed,
                               env=trainer_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (killed / "ckpt" / "global_step_4").is_dir():
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "no checkpoint within two minutes"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert "holds no checkpoint; starting fresh" in process.stderr.read()
    process.stderr.close()
    half_written = killed / "ckpt" / ".tmp-global_step_1000"
    half_written.mkdir()
    (half_written / "model.safetensors").write_bytes(b"cut short")

    result = run_trainer(killed, RESUMABLE, "resume_mode=latest")
    assert result.returncode == 0, result.stderr
    assert "resuming from" in result.stderr
    assert not half_written.exists()

    resumed = read_metrics(killed / "metrics.jsonl", "train")
    assert [r["step"] for r in resumed] == list(range(1, 13))
    infos = read_metrics(killed / "metrics.jsonl", "info")
    resumed_at = int(Path(infos[-1]["resumed_from"]).name.removeprefix("global_step_"))
    # The kill lands within a step or two of global_step_4; steps after it must be left to compare.
    assert 4 <= resumed_at < 12
    for want, got in zip(expected, resumed):
        assert got["data/prompt_fingerprint"] == want["data/prompt_fingerprint"], got["step"]
        # One thread on a CPU: the resumed run repeats the uninterrupted one to the bit.
        for key in ("reward/mean", "policy/loss", "policy/grad_norm", "policy/ref_kl", "policy/entropy"):
            assert got[key] == want[key], (got["step"], key)


def test_fresh_run_refuses_existing_checkpoints(tmp_path):
    old = tmp_path / "ckpt" / "global_step_3"
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(b"precious")
    result = run_trainer(tmp_path, RESUMABLE)  # resume_mode defaults to null
    assert result.returncode == 3
    assert "resume_mode" in result.stderr and "global_step_3" in result.stderr
    assert (old / "model.safetensors").read_bytes() == b"precious"
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_the_run_with_its_last_step_checkpointed_and_the_run_goes_on(tmp_path, signum):
    # As at a SLURM time limit (SIGTERM) or Ctrl-C (SIGINT): no periodic checkpoints, yet
    # nothing is lost.
    command = trainer_command(tmp_path, RESUMABLE, "max_steps=100000", "ckpt_interval=0")
    process = subprocess.Popen(command, cwd=tmp_path, env=trainer_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and len(read_metrics(metrics, "train")) >= 2):
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "no second step within two minutes"
        time.sleep(0.05)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)

    assert process.returncode == 128 + signum, stderr
    last = read_metrics(metrics, "train")[-1]["step"]
    assert f"stopped by {signal.Signals(signum).name} after step {last}; checkpointed in" in stderr
    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.glob("global_step_*")) == [f"global_step_{last}"]
    assert (ckpt / "latest").read_text().strip() == f"global_step_{last}"

    result = run_trainer(tmp_path, RESUMABLE, f"max_steps={last + 2}", "resume_mode=latest")
    assert result.returncode == 0, result.stderr
    assert [r["step"] for r in read_metrics(metrics, "train")] == list(range(1, last + 3))


def test_a_signal_that_lands_after_the_steps_checkpoint_decision_still_checkpoints_it(tmp_path, monkeypatch):
    from trainer import loop
    from trainer.config import TrainerConfig
    from trainer.stopping import Stopped

    real_evaluate = loop.evaluate

    def evaluate_then_signal(*args, **kwargs):
        metrics = real_evaluate(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # as if the time limit came during the step's eval
        return metrics

    monkeypatch.setattr(loop, "evaluate", evaluate_then_signal)
    torch.set_num_threads(1)
    cfg = TrainerConfig(**{**RESUMABLE, "ckpt_interval": 0, "eval_interval": 1, "eval_limit": 4})
    with pytest.raises(Stopped) as stopped:
        loop.train(cfg, ckpt_dir=tmp_path / "ckpt", metrics_path=tmp_path / "metrics.jsonl",
                   stdout=io.StringIO(), stderr=io.StringIO())

    assert (stopped.value.step, stopped.value.checkpointed, stopped.value.exit_code) == (1, True, 143)
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("global_step_*")) == ["global_step_1"]


def test_a_signal_after_the_last_step_leaves_a_complete_run(tmp_path, monkeypatch):
    from trainer import loop
    from trainer.config import TrainerConfig

    real_export = loop.checkpoint.export

    def signal_then_export(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C as the run writes its export
        return real_export(*args, **kwargs)

    monkeypatch.setattr(loop.checkpoint, "export", signal_then_export)
    torch.set_num_threads(1)
    cfg = TrainerConfig(**{**RESUMABLE, "max_steps": 2, "ckpt_interval": 0, "export_final": True})
    stderr = io.StringIO()
    loop.train(cfg, ckpt_dir=tmp_path / "ckpt", metrics_path=tmp_path / "metrics.jsonl",
               stdout=io.StringIO(), stderr=stderr)  # returns: no Stopped, no KeyboardInterrupt

    assert sorted(p.name for p in (tmp_path / "ckpt").glob("global_step_*")) == ["global_step_2"]
    assert (tmp_path / "ckpt" / "export").is_dir()
    assert "SIGINT after the last step: the run is complete" in stderr.getvalue()


STOP_SIGNALS_PROGRAM = """
import os, signal, sys, time
from trainer import stopping
stopping.COALESCE_S = float(sys.argv[1])
with stopping.StopRequest() as stop:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGTERM)  # as a sweep's job follows the terminal's Ctrl-C
    time.sleep(0.2)
    print("still running, asked by", signal.Signals(stop.signum).name)
"""


def test_signals_close_together_are_one_request_to_stop_and_a_later_one_kills():
    def run(coalesce_s: float) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", STOP_SIGNALS_PROGRAM, str(coalesce_s)], env=trainer_env(),
                              capture_output=True, text=True, timeout=60)

    together = run(5.0)
    assert together.returncode == 0 and "still running, asked by SIGINT" in together.stdout, together.stderr
    apart = run(0.1)
    assert apart.returncode == -signal.SIGTERM and "still running" not in apart.stdout


def test_a_fresh_run_takes_its_own_reference_policy(tmp_path):
    # One mini-batch per step: at step 1 the policy is still the reference, so the KL is 0.
    config = {**RESUMABLE, "policy_mini_batch_size": 4, "max_steps": 1, "seed": 1}
    clean = run_trainer(tmp_path / "clean", config, "seed=2")
    assert clean.returncode == 0, clean.stderr
    assert read_metrics(tmp_path / "clean" / "metrics.jsonl", "train")[0]["policy/ref_kl"] == 0.0
    # A run with another seed died before its first checkpoint; its reference is still there.
    reused = tmp_path / "reused"
    assert run_trainer(reused, config).returncode == 0
    for leftover in (*reused.glob("ckpt/global_step_*"), reused / "ckpt" / "latest"):
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    (reused / "metrics.jsonl").unlink()
    assert (reused / "ckpt" / "reference.safetensors").is_file()

    result = run_trainer(reused, config, "seed=2")

    assert result.returncode == 0, result.stderr
    assert read_metrics(reused / "metrics.jsonl", "train")[0]["policy/ref_kl"] == 0.0


def test_inert_knobs_name_what_the_run_ignores():
    from trainer.config import TrainerConfig
    from trainer.setup import inert_knobs

    cpu = torch.device("cpu")
    synthetic = inert_knobs(TrainerConfig(backend="hf", use_tis=True, tis_imp_ratio_cap=3.0), cpu)
    assert synthetic["use_tis"]["value"] is True and synthetic["use_tis"]["changed"] is True
    assert "samples with the policy itself" in synthetic["tis_imp_ratio_cap"]["reason"]
    assert {"train_split", "eval_split"} <= synthetic.keys() and "synthetic_size" not in synthetic
    gsm8k = inert_knobs(TrainerConfig(dataset="/data/gsm8k", synthetic_size=64), cpu)
    assert gsm8k["synthetic_size"] == {"value": 64, "default": 512, "changed": True,
                                       "reason": "dataset is '/data/gsm8k', not 'synthetic'"}
    assert "train_split" not in gsm8k and "eval_split" not in gsm8k
    # The static engine reports the log-probs it samples with: TIS is live under it.
    static = inert_knobs(TrainerConfig(backend="static", use_tis=True), cpu)
    assert "use_tis" not in static and "tis_imp_ratio_cap" not in static
    assert "tis_imp_ratio_cap" in inert_knobs(TrainerConfig(backend="static"), cpu)
    assert static["enforce_eager"]["reason"].startswith("CUDA graphs need a CUDA device")
    assert "compute capability 9" in static["decode_pdl"]["reason"]
    assert "decode_pdl" in synthetic  # the HF engine launches no kernels of its own
    # One update per step: no separate old-log-prob forward, so its micro-batch size does nothing.
    assert "micro_forward_batch_size_per_gpu" in static
    assert "micro_forward_batch_size_per_gpu" not in inert_knobs(
        TrainerConfig(train_batch_size=64, policy_mini_batch_size=32), cpu)


def old_logprobs_of(model, batch, cfg):
    from trainer.forward import PolicyScorer
    from trainer.precision import Precision

    scorer = PolicyScorer(model, temperature=cfg.temperature, micro_batch_size=cfg.micro_forward_batch_size_per_gpu,
                          precision=Precision(torch.device("cpu"), torch.float32))
    return scorer.score(batch)


def rollout_for(model, tokenizer, cfg, prompts=("1 2 3 4", "0 0", "4 3 2")):
    from trainer.batch import Batch
    from trainer.losses import group_advantages
    from trainer.rollout import SamplingParams
    from trainer.rollout.hf import HFEngine

    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in prompts]
    n = cfg.n_samples_per_prompt
    generation = HFEngine(model, tokenizer, device="cpu").generate(
        prompts, SamplingParams(n=n, max_new_tokens=cfg.max_generate_length, seed=5))
    batch = Batch.from_generation(prompts, generation, n=n, pad_id=tokenizer.pad_token_id, device="cpu")
    rewards = torch.arange(batch.size, dtype=torch.float32) % 3
    old = old_logprobs_of(model, batch, cfg)
    return attrs.evolve(batch, advantages=group_advantages(rewards, n), old_logprobs=old,
                        ref_logprobs=old - 0.1, rollout_logprobs=old)


@pytest.mark.parametrize("reduction", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_gradient_accumulation_equals_one_big_micro_batch(reduction):
    from trainer.config import TrainerConfig
    from trainer.update import update_policy
    from trainer.models import load_model_and_tokenizer

    torch.set_num_threads(1)
    base = dict(train_batch_size=3, policy_mini_batch_size=3, n_samples_per_prompt=4, max_generate_length=6,
                loss_reduction=reduction, use_kl_loss=True, use_entropy_loss=True)
    weights = []
    for micro in (12, 1, 5):
        cfg = TrainerConfig(**base, micro_train_batch_size_per_gpu=micro)
        model, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype="float32")
        batch = rollout_for(model, tokenizer, cfg)
        # Plain SGD keeps the update linear in the gradient; Adam's g/|g| would amplify rounding noise.
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 1.0)
        stats = update_policy(model, optimizer, scheduler, batch, cfg)
        weights.append(([p.detach().clone() for p in model.parameters()], stats))
    (whole, whole_stats), *accumulated = weights
    for parts, stats in accumulated:
        assert stats["policy/loss"] == pytest.approx(whole_stats["policy/loss"], rel=1e-5, abs=1e-7)
        assert stats["policy/grad_norm"] == pytest.approx(whole_stats["policy/grad_norm"], rel=1e-4)
        for a, b in zip(whole, parts):
            assert torch.allclose(a, b, atol=1e-6)


def reference_gradient(model, batch, cfg):
    """The gradient of the whole step's loss written out directly (token_mean, PPO clip,
    k3 KL to the reference, entropy bonus), with the model's own logits."""
    from trainer.forward import response_logits

    model.zero_grad(set_to_none=True)
    mask = batch.response_mask
    logits = response_logits(model, batch, cfg.temperature)
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch.response_ids[..., None])[..., 0]
    ratio = torch.exp(logprobs - batch.old_logprobs)
    advantages = batch.advantages[:, None]
    clipped = ratio.clamp(1 - cfg.eps_clip_low, 1 + cfg.eps_clip_high)
    pg = -torch.minimum(ratio * advantages, clipped * advantages)
    log_ratio = batch.ref_logprobs - logprobs
    k3 = torch.exp(log_ratio) - log_ratio - 1
    probs = torch.softmax(logits.float(), dim=-1)
    entropy = -(probs * torch.log_softmax(logits.float(), dim=-1)).sum(-1)

    def token_mean(x):
        return (x * mask).sum() / mask.sum()

    loss = token_mean(pg) + cfg.kl_loss_coef * token_mean(k3) - cfg.entropy_loss_coef * token_mean(entropy)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("max_grad_norm", [1e3, 1e-3])
def test_an_update_steps_along_the_full_loss_gradient_clipped_to_max_grad_norm(max_grad_norm):
    from trainer.config import TrainerConfig
    from trainer.update import update_policy
    from trainer.models import load_model_and_tokenizer

    torch.set_num_threads(1)
    cfg = TrainerConfig(train_batch_size=3, policy_mini_batch_size=3, n_samples_per_prompt=4, max_generate_length=6,
                        micro_train_batch_size_per_gpu=5, use_kl_loss=True, kl_loss_coef=0.5,
                        use_entropy_loss=True, entropy_loss_coef=0.3, max_grad_norm=max_grad_norm)
    model, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype="float32")
    model.double()  # weights of order 1 take steps of 1e-6: float32 would round the steps away
    batch = rollout_for(model, tokenizer, cfg)
    before = [p.detach().clone() for p in model.parameters()]
    grads = reference_gradient(model, batch, cfg)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    # The KL and entropy terms move the gradient: leaving either out would show.
    bare = reference_gradient(model, batch, attrs.evolve(cfg, kl_loss_coef=0.0, entropy_loss_coef=0.0))
    assert not all(torch.allclose(g, b, atol=1e-6) for g, b in zip(grads, bare))

    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # the step is minus the (clipped) gradient
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 1.0)
    stats = update_policy(model, optimizer, scheduler, batch, cfg)

    assert stats["policy/grad_norm"] == pytest.approx(float(norm), rel=1e-4)  # reported before clipping
    scale = min(1.0, max_grad_norm / (float(norm) + 1e-6))
    step = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    expected = torch.cat([g.flatten() for g in grads]) * scale
    assert float(torch.linalg.vector_norm(step - expected)) <= 1e-6 * float(torch.linalg.vector_norm(expected))
    if max_grad_norm < float(norm):
        assert float(torch.linalg.vector_norm(step)) == pytest.approx(max_grad_norm, rel=1e-5)


def test_tis_weights_come_from_the_engine_logprobs_and_are_capped():
    from trainer.batch import Batch
    from trainer.config import TrainerConfig
    from trainer.models import load_model_and_tokenizer
    from trainer.rollout import Generation
    from trainer.update import update_policy

    torch.set_num_threads(1)
    cfg = TrainerConfig(train_batch_size=3, policy_mini_batch_size=3, n_samples_per_prompt=4, max_generate_length=6,
                        use_tis=True, tis_imp_ratio_cap=2.0)
    model, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype="float32")
    sampled = rollout_for(model, tokenizer, cfg)
    # An engine whose sampling distribution differs from the trainer's: its log-prob of every
    # token is pi_old's minus 0.5 in the first half of the rows and minus 2 in the rest.
    shift = torch.where(torch.arange(12) < 6, 0.5, 2.0)[:, None]
    engine_lp = (sampled.old_logprobs - shift) * sampled.response_mask
    generation = Generation(response_ids=sampled.response_ids, response_mask=sampled.response_mask,
                            stopped=torch.zeros(12, dtype=torch.bool), logprobs=engine_lp)
    prompts = [ids[mask.bool()].tolist() for ids, mask in zip(sampled.prompt_ids[::4], sampled.prompt_mask[::4])]
    batch = Batch.from_generation(prompts, generation, n=4, pad_id=tokenizer.pad_token_id, device="cpu")
    assert torch.equal(batch.prompt_ids, sampled.prompt_ids)
    batch = attrs.evolve(batch, advantages=sampled.advantages, old_logprobs=sampled.old_logprobs,
                         rollout_logprobs=batch.engine_logprobs)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = update_policy(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 1.0), batch, cfg)

    # min(exp(0.5), 2) on the first rows' tokens, the cap 2 on the rest, averaged per token.
    mask = batch.response_mask
    weights = torch.where(torch.arange(12)[:, None] < 6, math.exp(0.5), 2.0).expand_as(mask)
    assert stats["policy/tis_weight"] == pytest.approx(float((weights * mask).sum() / mask.sum()), rel=1e-5)


# -- padded batches: no query row without a key, and no update from a non-finite gradient --------

def left_padded_rollout(tokenizer, device, *, prompt_lengths, response_length, advantages):
    """Random byte prompts of the given lengths (so left-padded) with full-length responses."""
    from trainer.batch import Batch
    from trainer.rollout import Generation

    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=generator).tolist() for n in prompt_lengths]
    responses = [torch.randint(0, 256, (response_length,), generator=generator).tolist() for _ in prompt_lengths]
    generation = Generation.from_rows(responses, stopped=[False] * len(responses), pad_id=tokenizer.pad_token_id,
                                      device=device)
    batch = Batch.from_generation(prompts, generation, n=1, pad_id=tokenizer.pad_token_id, device=device)
    return attrs.evolve(batch, advantages=torch.as_tensor(advantages, dtype=torch.float32, device=device))


def updated(cfg, batch, model, **kwargs):
    """update_policy on batch with AdamW; (new parameters, metrics)."""
    from trainer.update import update_policy

    old = old_logprobs_of(model, batch, cfg)
    batch = attrs.evolve(batch, old_logprobs=old, rollout_logprobs=old)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 1.0)
    metrics = update_policy(model, optimizer, scheduler, batch, cfg, **kwargs)
    return [p.detach().clone() for p in model.parameters()], metrics, optimizer, scheduler


PADDED = dict(model="tiny-random", dataset="gsm8k", train_batch_size=2, policy_mini_batch_size=2,
              n_samples_per_prompt=2, micro_train_batch_size_per_gpu=4, max_generate_length=16)


def test_training_attention_is_plain_causal_over_left_aligned_rows(monkeypatch):
    """The update's SDPA calls get no mask at all (so the flash kernel can run): every row
    starts at column 0 and its padding trails, where no real token looks."""
    from trainer.config import TrainerConfig
    from trainer.forward import left_aligned
    from trainer.models import load_model_and_tokenizer

    torch.set_num_threads(1)
    cfg = TrainerConfig(**PADDED)
    model, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype="float32")
    batch = left_padded_rollout(tokenizer, "cpu", prompt_lengths=[9, 9, 3, 3], response_length=5,
                                advantages=[1.0, -1.0, 1.0, -1.0])
    ids, starts = left_aligned(batch)
    assert starts.tolist() == [9, 9, 3, 3] and ids.shape == (4, 14)
    assert torch.equal(ids[2, :8], torch.cat([batch.prompt_ids[2, 6:], batch.response_ids[2]]))
    calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(*args, attn_mask=None, is_causal=False, **kwargs):
        calls.append((attn_mask, is_causal, args[0].shape[-2]))
        return real_sdpa(*args, attn_mask=attn_mask, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    updated(cfg, batch, model)
    assert calls and all(mask is None and causal and length == 14 for mask, causal, length in calls)


def two_rows():
    """Prompts of 2 and 4 tokens with responses of 3 and 1."""
    from trainer.batch import Batch
    from trainer.rollout import Generation

    generation = Generation.from_rows([[5, 6, 7], [8]], stopped=[True, True], pad_id=0, device="cpu")
    return Batch.from_generation([[1, 2], [3, 4, 9, 9]], generation, n=1, pad_id=0, device="cpu")


def test_left_aligned_rows_stop_at_the_longest_sampled_token():
    from trainer.forward import left_aligned

    ids, starts = left_aligned(two_rows())
    assert starts.tolist() == [2, 4]
    assert ids[:, :5].tolist() == [[1, 2, 5, 6, 7], [3, 4, 9, 9, 8]] and ids.shape[1] == 5


def test_left_aligned_widths_round_up_to_the_compiled_multiple():
    from trainer.forward import left_aligned

    batch = two_rows()
    ids, starts = left_aligned(batch, width_multiple=8)
    assert ids.shape == (2, 8) and starts.tolist() == [2, 4]
    assert ids[:, :5].tolist() == left_aligned(batch)[0].tolist()
    assert left_aligned(batch, width_multiple=5)[0].shape == (2, 5)  # already a multiple


@pytest.mark.parametrize("width_multiple", [1, 16])
def test_left_aligned_log_probs_equal_each_row_alone(width_multiple):
    """Rows of different prompt and response lengths: the training forward's log-probs are
    each row's own, computed unpadded (also when the width is padded for a compiled body)."""
    from trainer.batch import Batch
    from trainer.config import TrainerConfig
    from trainer.forward import response_logprobs
    from trainer.models import load_model_and_tokenizer
    from trainer.rollout import Generation

    torch.set_num_threads(1)
    cfg = TrainerConfig(**PADDED)
    model, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype="float32")
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=generator).tolist() for n in (9, 2, 5)]
    responses = [torch.randint(0, 256, (n,), generator=generator).tolist() for n in (3, 6, 1)]
    generation = Generation.from_rows(responses, stopped=[True] * 3, pad_id=tokenizer.pad_token_id, device="cpu")
    batch = Batch.from_generation(prompts, generation, n=1, pad_id=tokenizer.pad_token_id, device="cpu")
    model.width_multiple = width_multiple  # as trainer.forward.compile_body sets it
    with torch.no_grad():
        got, entropy = response_logprobs(model, batch, 0.7, with_entropy=True)
        for row, (prompt, response) in enumerate(zip(prompts, responses)):
            ids = torch.tensor([prompt + response])
            logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1] / 0.7
            alone = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(prompt):, None])[:, 0]
            torch.testing.assert_close(got[row, : len(response)], alone, rtol=1e-4, atol=1e-5)
            assert not got[row, len(response):].any() and not entropy[row, len(response):].any()


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_self_attending_padding_leaves_real_token_logits_unchanged(implementation):
    from trainer.config import TrainerConfig
    from trainer.forward import response_logits
    from trainer.models import load_model_and_tokenizer

    torch.set_num_threads(1)
    cfg = TrainerConfig(**PADDED)
    model, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype="float32")
    model.set_attn_implementation(implementation)
    batch = left_padded_rollout(tokenizer, "cpu", prompt_lengths=[9, 2, 5], response_length=4,
                                advantages=[0.0, 0.0, 0.0])
    with torch.no_grad():
        got = response_logits(model, batch, 1.0)
        for row in range(3):  # each row alone, unpadded: the reference
            keep = batch.prompt_mask[row].bool()
            ids = torch.cat([batch.prompt_ids[row, keep], batch.response_ids[row]])[None]
            alone = model(input_ids=ids, logits_to_keep=5, use_cache=False).logits[:, :-1]
            torch.testing.assert_close(got[row : row + 1], alone, rtol=1e-4, atol=1e-5)


def test_non_finite_gradient_skips_the_update_and_says_so():
    from trainer.config import TrainerConfig
    from trainer.models import load_model_and_tokenizer

    torch.set_num_threads(1)
    cfg = TrainerConfig(**{**PADDED, "policy_mini_batch_size": 1})
    model, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype="float32")
    before = [p.detach().clone() for p in model.parameters()]
    # A NaN advantage in the second group only: its mini-batch's gradient is NaN.
    batch = left_padded_rollout(tokenizer, "cpu", prompt_lengths=[7, 7, 4, 4], response_length=5,
                                advantages=[1.0, -1.0, float("nan"), 1.0])
    stderr = io.StringIO()
    after, metrics, optimizer, scheduler = updated(cfg, batch, model, stderr=stderr)
    assert metrics["policy/skipped_updates"] == 1 and metrics["policy/optimizer_steps"] == 1
    assert math.isfinite(metrics["policy/grad_norm"]) and metrics["policy/grad_norm"] > 0
    assert "skipped the update of mini-batch 2" in stderr.getvalue()
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after))  # the first update did apply
    assert scheduler.last_epoch == 1  # the skipped update does not advance the schedule
    assert all(p.grad is None for p in model.parameters())


def zero_advantage_update_keeps_weights(device, dtype, prompt_lengths, response_length):
    from trainer.config import TrainerConfig
    from trainer.models import load_model_and_tokenizer

    cfg = TrainerConfig(**{**PADDED, "device": device, "train_batch_size": len(prompt_lengths) // 2,
                           "policy_mini_batch_size": len(prompt_lengths) // 2,
                           "micro_train_batch_size_per_gpu": len(prompt_lengths),
                           "max_generate_length": response_length})
    model, tokenizer = load_model_and_tokenizer(cfg, device=device, dtype=dtype)
    before = [p.detach().clone() for p in model.parameters()]
    batch = left_padded_rollout(tokenizer, device, prompt_lengths=prompt_lengths,
                                response_length=response_length, advantages=[0.0] * len(prompt_lengths))
    after, metrics, _, _ = updated(cfg, batch, model)
    assert metrics["policy/skipped_updates"] == 0
    assert metrics["policy/grad_norm"] == 0.0 and metrics["policy/loss"] == 0.0
    for a, b in zip(before, after):
        assert torch.equal(a, b)  # zero advantages: zero gradient, and AdamW moves nothing


def test_zero_advantages_on_a_left_padded_batch_leave_the_weights_alone():
    torch.set_num_threads(1)
    zero_advantage_update_keeps_weights("cpu", "bfloat16", [40] * 4 + [7] * 4, 12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_zero_advantages_on_a_left_padded_batch_leave_the_weights_alone_on_cuda():
    # The shape that turned every weight to NaN on an H200 (torch 2.11, cuDNN attention):
    # prompts of 256 and 209 tokens, so 47 left-pad columns, and 64-token responses.
    zero_advantage_update_keeps_weights("cuda", "bfloat16", [256] * 4 + [209] * 4, 64)


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device")])])
def test_compiled_body_gives_the_eager_log_probs_and_gradients(device, monkeypatch, tmp_path):
    """compile_update's body (padded widths; two shapes on CUDA, one on the CPU, where
    inductor compiles for half a minute) against the eager body, in fp32."""
    import copy

    # Inductor writes its cache dir into os.environ; this one goes away with the test.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))

    from trainer.config import TrainerConfig
    from trainer.forward import compile_body, response_logprobs
    from trainer.models import load_model_and_tokenizer

    torch.set_num_threads(1)
    cfg = TrainerConfig(**PADDED)
    eager, tokenizer = load_model_and_tokenizer(cfg, device=device, dtype="float32")
    compiled = copy.deepcopy(eager)
    torch._dynamo.utils.counters.clear()
    assert compile_body(compiled)
    assert compiled.state_dict().keys() == eager.state_dict().keys()  # checkpoints read as before
    widths = [[9, 9, 3, 3], [150, 20, 5, 5]]  # widths 14 and 155: padded to 128 and 256
    for prompt_lengths in widths if device == "cuda" else widths[:1]:
        batch = left_padded_rollout(tokenizer, device, prompt_lengths=prompt_lengths, response_length=5,
                                    advantages=[1.0, -1.0, 1.0, -1.0])
        results = []
        for model in (eager, compiled):
            model.zero_grad(set_to_none=True)
            logprobs, entropy = response_logprobs(model, batch, 0.7, with_entropy=True)
            (-(logprobs * batch.advantages[:, None]).sum() - 0.01 * entropy.sum()).backward()
            results.append((logprobs.detach(), [p.grad.clone() for p in model.parameters()]))
        (want, want_grads), (got, got_grads) = results
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # it did compile
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for a, b in zip(got_grads, want_grads):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    # Packed micro-batches vary in rows, not in padded width: one graph serves them all.
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    if device == "cpu":
        assert graphs == 1  # the decoder layers share one compiled graph (regional compilation)
    for rows in (2, 6):
        batch = left_padded_rollout(tokenizer, device, prompt_lengths=[9, 3] * (rows // 2), response_length=5,
                                    advantages=[1.0, -1.0] * (rows // 2))
        logprobs, _ = response_logprobs(compiled, batch, 0.7)
        want, _ = response_logprobs(eager, batch, 0.7)
        torch.testing.assert_close(logprobs, want, rtol=1e-4, atol=1e-4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
