"""The synthetic task on one GPU at a real learning rate: do the updates land?

A random-init Qwen2.5-0.5B body (24 layers, 896 wide) over the task's eight tokens,
fp32 master weights with bf16 compute, the static CUDA-graph engine. At lr 1e-5 an
update is far below bf16's resolution for these weights, so a run whose optimizer
stepped bf16 parameters would stay at the random policy's reward (about 0.1); this one
must climb. ``lr3e-06`` is the seeds' order of magnitude.
"""

import sweepkit as sk

marks = [sk.mark.synthetic, sk.mark.gpu]

base = sk.base(
    model="random:qwen2.5-0.5b",
    dataset="synthetic",
    device="cuda",
    backend="static",
    enforce_eager=False,
    num_gpus=1,
    gpus=1,
    seed=42,
    train_batch_size=32,
    policy_mini_batch_size=32,
    n_samples_per_prompt=8,
    micro_train_batch_size_per_gpu=256,
    micro_forward_batch_size_per_gpu=256,
    max_generate_length=8,
    lr=1e-5,
    epochs=100,
    max_steps=120,
    eval_limit=64,
    eval_interval=40,
    export_final=False,
    time_limit="00:20:00",
)

lr = sk.axis("lr", [3e-6], id="lr{lr}")
