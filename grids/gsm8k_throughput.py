"""GSM8K GRPO throughput grid: 18 cells off the Qwen2.5-1.5B canary, one factor at a time.

Goal: lowest sec/step (highest tokens/s) on one 4-GPU node. The levers: batch width,
group size, KV-cache share, CUDA graphs, engine layout, micro-batches, FSDP
resharding, colocation; then combos of the winners. ``combo_C`` is the corner the
accuracy grid starts from. Ceiling probes live in ``gsm8k_ceilings.py``.

Real runs read GSM8K from ``$SWEEPKIT_GSM8K`` (a directory of train/test .jsonl or
.parquet) when set, else from the HF hub cache (``"gsm8k"``).
"""

import os

import sweepkit as sk

target = "trainer"
marks = [sk.mark.gsm8k, sk.mark.throughput]

base = sk.base(
    model="Qwen/Qwen2.5-1.5B-Instruct",
    dataset=os.environ.get("SWEEPKIT_GSM8K") or "gsm8k",
    backend="auto",
    advantage_estimator="grpo",
    use_kl_loss=False,
    lr=1e-6,
    epochs=1,
    train_batch_size=32,
    policy_mini_batch_size=32,
    n_samples_per_prompt=4,
    max_prompt_length=512,
    max_generate_length=512,
    micro_forward_batch_size_per_gpu=16,
    gpu_memory_utilization=0.70,
    enforce_eager=True,
    num_inference_engines=4,
    inference_tp=1,
    colocate_all=True,
    reshard_after_forward=True,
    num_gpus=4,
    gpus=4,
    time_limit="00:30:00",
)

# Batch width: prompts per step and per optimizer step move together.
tbs = sk.axis(
    "train_batch_size, policy_mini_batch_size",
    [(64, 64), (128, 128), (256, 256), sk.param((512, 512), marks=sk.mark.slow)],
    id="tbs{train_batch_size}",
)
# GRPO group size: n8, n16.
n = sk.axis("n_samples_per_prompt", [8, 16])
# KV-cache share of GPU memory; 0.90 is a ceiling probe (gsm8k_ceilings.py).
gmu = sk.axis("gpu_memory_utilization", [0.80, 0.85], ids=["gmu080", "gmu085"])
# CUDA graphs in the rollout engine.
cudagraph = sk.cell(enforce_eager=False)
# Engine layout at 4 GPUs: 4xTP1 (base) vs 2xTP2 vs 1xTP4.
layout = sk.axis("num_inference_engines, inference_tp", [(2, 2), (1, 4)],
                 id="{num_inference_engines}xTP{inference_tp}")
# A fixed micro-batch of 16 rows against base's, packed by tokens within the memory budget.
micro = sk.cell(micro_train_batch_size_per_gpu=16, micro_forward_batch_size_per_gpu=32)
# Keep FSDP2 parameters gathered between forward and backward.
reshard = sk.cell(reshard_after_forward=False)
# Policy on 2 GPUs, two rollout engines on the other 2.
disaggregated = sk.cell(colocate_all=False, num_gpus=2, num_inference_engines=2)

# Combos of the winners.
combo_A = sk.cell(on=cudagraph, gpu_memory_utilization=0.85)
combo_B = sk.cell(on=cudagraph, train_batch_size=128, policy_mini_batch_size=128)
combo_C = sk.cell(on=combo_B, gpu_memory_utilization=0.85)
