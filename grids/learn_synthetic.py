"""The trainer's synthetic task on a CPU: a learning-rate sweep that learns in minutes.

The task: the prompt is four digits, the right completion ``#### <first digit>``.
The tiny random model starts near 1 in 10 and climbs within 60 steps at lr 3e-3.
"""

import sweepkit as sk

marks = [sk.mark.synthetic, sk.mark.cpu]

base = sk.base(
    model="tiny-random",
    dataset="synthetic",
    device="cpu",
    backend="hf",
    num_gpus=0,
    gpus=0,
    seed=42,
    train_batch_size=16,
    policy_mini_batch_size=8,
    n_samples_per_prompt=8,
    micro_train_batch_size_per_gpu=64,
    micro_forward_batch_size_per_gpu=128,
    max_generate_length=8,
    lr=3e-3,
    epochs=5,
    max_steps=60,
    eval_limit=16,
    eval_interval=30,
    time_limit="00:20:00",
)

lr = sk.axis("lr", [3e-4, 1e-3, 1e-2], id="lr{lr}")
