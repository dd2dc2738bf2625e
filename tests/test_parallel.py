"""One run over several processes (``trainer.parallel``), on two CPU ranks over gloo.

The policy is sharded with FSDP2 exactly as on GPUs (fp32 compute on the CPU), so
these runs check the sharded update, the loss normalisation over ranks, the
gathered weights, the launcher and checkpoints written by rank 0; what only a GPU
shows (NCCL, bf16 mixed precision) is not checked here.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import attrs
import pytest
import torch
import torch.multiprocessing

from test_loop import read_metrics, rollout_for, run_trainer, trainer_command, trainer_env
from trainer import parallel
from trainer.config import TrainerConfig
from trainer.models import load_model_and_tokenizer
from trainer.update import update_policy

WORLD = 2
REDUCTIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
# Two mini-batches of two prompts, each rank one prompt (4 rows) of each, cut into
# micro-batches of 3 (so every rank accumulates), with every loss term on.
UPDATE = dict(device="cpu", train_batch_size=4, policy_mini_batch_size=2, n_samples_per_prompt=4,
              micro_train_batch_size_per_gpu=3, max_generate_length=6, use_kl_loss=True, use_entropy_loss=True,
              kl_loss_coef=0.5, entropy_loss_coef=0.3, num_cpu_ranks=WORLD)
# Small and quick, resumed after a kill (as tests/test_loop.py's RESUMABLE, on two ranks).
TWO_RANKS = {
    "model": "tiny-random", "dataset": "synthetic", "seed": 7, "device": "cpu", "num_cpu_ranks": WORLD,
    "train_batch_size": 4, "policy_mini_batch_size": 2, "n_samples_per_prompt": 4,
    "micro_train_batch_size_per_gpu": 3, "micro_forward_batch_size_per_gpu": 5,
    "max_generate_length": 6, "lr": 3e-3, "epochs": 100, "max_steps": 6, "ckpt_interval": 2,
    "eval_before_train": False, "eval_limit": 5, "export_final": False,
    "use_kl_loss": True, "use_tis": True, "use_entropy_loss": True,
}


def one_update(model, batch, cfg, group=parallel.SINGLE):
    """``update_policy`` with plain SGD at lr 1: the weights move by minus the (clipped) gradient."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 1.0)
    return update_policy(model, optimizer, scheduler, batch, cfg, group=group)


def rank_update(rank: int, port: int, workdir: Path) -> None:
    """One rank of the sharded update (run by torch.multiprocessing.spawn): rank 0 saves the results."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    case = torch.load(workdir / "case.pt", weights_only=False)
    results = {}
    with parallel.process_group(TrainerConfig(**UPDATE)) as group:
        for reduction in REDUCTIONS:
            cfg = TrainerConfig(**UPDATE, loss_reduction=reduction)
            model, _ = load_model_and_tokenizer(cfg, device="cpu", dtype="float32")
            model.load_state_dict(case["weights"])
            policy = parallel.shard(copy.deepcopy(model), cfg, group)
            n = cfg.n_samples_per_prompt
            prompts = group.share(range(cfg.train_batch_size), cfg.policy_mini_batch_size)
            mine = case["batch"].rows([prompt * n + sample for prompt in prompts for sample in range(n)])
            stats = one_update(policy, mine, cfg, group)
            parallel.gather_weights(policy, model)
            results[reduction] = {"stats": stats, "weights": model.state_dict()}
    if rank == 0:
        torch.save(results, workdir / "two_ranks.pt")
    parallel.exit_rank(0)  # as a launched rank ends: the interpreter's teardown with the group alive may abort


def test_two_ranks_update_equals_one_rank_on_the_same_batch(tmp_path):
    torch.set_num_threads(1)
    cfg = TrainerConfig(**UPDATE)
    model, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype="float32")
    batch = rollout_for(model, tokenizer, cfg, prompts=("1 2 3 4", "0 0", "4 3 2", "2 2 1"))
    initial = copy.deepcopy(model.state_dict())
    torch.save({"weights": initial, "batch": batch}, tmp_path / "case.pt")
    torch.multiprocessing.spawn(rank_update, args=(parallel.free_port(), tmp_path), nprocs=WORLD)
    two_ranks = torch.load(tmp_path / "two_ranks.pt", weights_only=False)

    for reduction in REDUCTIONS:
        one_rank = copy.deepcopy(model)
        one_rank.load_state_dict(initial)
        stats = one_update(one_rank, batch, attrs.evolve(cfg, loss_reduction=reduction, num_cpu_ranks=1))
        sharded = two_ranks[reduction]
        assert sharded["stats"]["policy/optimizer_steps"] == stats["policy/optimizer_steps"] == 2
        for key in ("policy/loss", "policy/grad_norm", "policy/kl", "policy/ref_kl", "policy/entropy"):
            assert sharded["stats"][key] == pytest.approx(stats[key], rel=1e-5, abs=1e-7), (reduction, key)
        moved = False
        for name, weight in one_rank.state_dict().items():
            assert torch.allclose(sharded["weights"][name], weight, rtol=1e-5, atol=1e-6), (reduction, name)
            moved |= not torch.equal(weight, initial[name])
        assert moved, "the update changed no weight: the comparison shows nothing"


def wait_for(path: Path, process: subprocess.Popen, *, within_s: float = 180) -> None:
    deadline = time.monotonic() + within_s
    while not path.exists():
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, f"no {path.name} within {within_s:.0f} s"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_killed_two_rank_run_resumes_on_both_ranks_exactly(tmp_path):
    reference = tmp_path / "uninterrupted"
    result = run_trainer(reference, TWO_RANKS)
    assert result.returncode == 0, result.stderr
    expected = read_metrics(reference / "metrics.jsonl", "train")
    assert [r["step"] for r in expected] == list(range(1, 7))
    assert read_metrics(reference / "metrics.jsonl", "info")[0]["world_size"] == WORLD
    # The launcher writes for the run: one line per step and eval, not one per rank.
    assert len(read_metrics(reference / "metrics.jsonl", "eval")) == 1
    assert json.loads((reference / "ckpt" / "global_step_6" / "trainer_state.json").read_text())["world_size"] == WORLD

    # The same run, told to go on for ever, has its launcher killed once a checkpoint has landed.
    killed = tmp_path / "killed"
    killed.mkdir()
    command = trainer_command(killed, TWO_RANKS, "max_steps=100000", "resume_mode=latest")
    process = subprocess.Popen(command, cwd=killed, env=trainer_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    wait_for(killed / "ckpt" / "global_step_2", process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stderr.close()

    result = run_trainer(killed, TWO_RANKS, "resume_mode=latest")
    assert result.returncode == 0, result.stderr
    assert f"on all {WORLD} ranks" in result.stderr
    infos = read_metrics(killed / "metrics.jsonl", "info")
    resumed_at = int(Path(infos[-1]["resumed_from"]).name.removeprefix("global_step_"))
    assert 2 <= resumed_at < 6
    resumed = read_metrics(killed / "metrics.jsonl", "train")
    assert [r["step"] for r in resumed] == list(range(1, 7))
    # Both ranks came back where they were: their shares of the prompts, their RNG states and
    # their optimizer shards; any of them off would change the steps after the resume.
    for want, got in zip(expected, resumed):
        for key in ("data/prompt_fingerprint", "reward/mean", "policy/loss", "policy/grad_norm", "policy/ref_kl"):
            assert got[key] == want[key], (got["step"], key)

    # A checkpoint of two ranks refuses to resume on one, naming both counts, before any rank starts.
    mismatch = run_trainer(killed, TWO_RANKS, "resume_mode=latest", "max_steps=8", "num_cpu_ranks=1")
    assert mismatch.returncode == 3
    assert "saved by a run of 2 process(es) and this run has 1" in mismatch.stderr


@pytest.mark.slow
def test_a_stop_signal_to_the_launcher_stops_both_ranks_at_one_step_with_its_checkpoint(tmp_path):
    # As at a SLURM time limit: the launcher passes the signal on, the ranks agree on the step
    # to stop after (else one would wait for the other in a collective for ever), rank 0 writes it.
    command = trainer_command(tmp_path, TWO_RANKS, "max_steps=100000")
    process = subprocess.Popen(command, cwd=tmp_path, env=trainer_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    wait_for(tmp_path / "ckpt" / "global_step_2", process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    stopped = re.findall(r"stopped by SIGTERM after step (\d+); checkpointed", stderr)
    assert len(stopped) == 1, stderr  # rank 0 speaks for the run
    latest = (tmp_path / "ckpt" / "latest").read_text().strip()
    assert latest == f"global_step_{stopped[0]}"
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl", "train")] == list(range(1, int(stopped[0]) + 1))


def test_batches_that_do_not_split_into_whole_groups_per_rank_are_refused(tmp_path):
    result = run_trainer(tmp_path, {**TWO_RANKS, "num_cpu_ranks": 4})
    assert result.returncode == 2
    assert "policy_mini_batch_size: 2 prompts do not split into num_cpu_ranks=4" in result.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


def test_share_gives_each_rank_its_part_of_every_mini_batch():
    ranks = [parallel.Group(rank=rank, world=2) for rank in range(2)]
    # Two mini-batches of four prompts: rank 0 takes the first two of each, rank 1 the last two.
    assert [group.share(range(8), 4) for group in ranks] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert parallel.SINGLE.share(range(8), 4) == list(range(8))
    assert [group.seed(11) for group in ranks] == [22, 23] and parallel.SINGLE.seed(11) == 11


@pytest.mark.parametrize("config, gpus", [
    ({"num_gpus": 4}, 4),
    # The trainer colocates (its colocate_all default): each of its processes runs its own engine.
    ({"num_gpus": 4, "num_inference_engines": 4, "inference_tp": 1}, 4),
    ({"num_gpus": 2}, 2),
])
def test_a_trainer_cells_num_gpus_is_its_one_node_request(config, gpus):
    from sweepkit.grid.cell import Cell, Target
    from sweepkit_plugins import clusters, leonardo
    from sweepkit_plugins.trainer import TRAINER_ARGV, gpu_count_errors
    from trainer.config import schema

    launch_keys = {name: default for name, _, default, _ in clusters.LAUNCH_KEYS} | {"gpus": 0}
    cell = Cell(grid="grids/g.py", grid_name="g", name="cell", location=("grids/g.py", 1), launch_keys=launch_keys,
                target=Target(name="trainer", argv=TRAINER_ARGV, schema=schema()), config=config)
    assert clusters.cell_nodes(cell, leonardo.CLUSTER) == 1
    assert clusters.job_gpus_per_node(cell, leonardo.CLUSTER) == gpus
    # A local run hands a cell its `gpus`: fewer than num_gpus is refused at validation.
    cfg = TrainerConfig(num_gpus=config["num_gpus"])
    assert gpu_count_errors(cfg, gpus) == [] and gpu_count_errors(cfg, 0) == []
    assert "set gpus=" in gpu_count_errors(cfg, gpus - 1)[0]


def test_the_inert_knob_report_knows_what_several_processes_make_real():
    from trainer.setup import inert_knobs

    cpu = torch.device("cpu")
    cfg = TrainerConfig(backend="static", num_cpu_ranks=WORLD, reshard_after_forward=False)
    one, two = inert_knobs(attrs.evolve(cfg, num_cpu_ranks=1), cpu), inert_knobs(cfg, cpu, world=WORLD)
    assert one["reshard_after_forward"]["reason"] == "the policy trains in one process, unsharded"
    assert "reshard_after_forward" not in two and "num_cpu_ranks" not in two
    assert two["num_inference_engines"]["reason"].startswith(f"one rollout engine per training process ({WORLD})")
    assert two["num_gpus"]["reason"] == "training on the CPU (num_cpu_ranks sets its processes)"
