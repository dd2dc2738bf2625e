"""On-policy distillation on Leonardo: Qwen3-32B teacher -> Qwen3-1.7B student, as the seed runs it.

The student samples GSM8K rollouts, the frozen teacher scores every one of the
student's tokens and the per-token reward is -KL(student || teacher) over the
teacher's top-k (``teacher_top_k``, the seed's TOPK; trainer.distill says which
estimator). Layout: two 4 x A100-64GB nodes, the student colocated with its four
TP1 rollout engines on node 0, the teacher at TP2 on node 1 (32B in bf16 is about
64 GB, more than one card). The sweep: top_k x lr (the seed found top_k the speed
lever, about 1.6-1.85x per halving, and lr the convergence lever, knee 3e-5);
``prod`` is the recommended production cell. ``--profile smoke`` runs every cell on
a CPU with a tiny random student and teacher, where the KL falls within two steps.
"""

import os

import sweepkit as sk

target = "trainer"
marks = [sk.mark.opd, sk.mark.gsm8k]

base = sk.base(
    model="Qwen/Qwen3-1.7B",
    teacher_model="Qwen/Qwen3-32B",
    dataset=os.environ.get("SWEEPKIT_GSM8K") or "gsm8k",
    backend="auto",
    use_kl_in_reward=True,
    use_kl_loss=False,
    advantage_estimator="no_op",
    policy_loss_type="importance_sampling",
    teacher_top_k=128,
    lr=3e-5,
    epochs=2,
    max_steps=60,
    train_batch_size=64,
    policy_mini_batch_size=64,
    n_samples_per_prompt=8,
    max_generate_length=1024,
    micro_forward_batch_size_per_gpu=16,
    teacher_micro_batch_size=16,
    enforce_eager=True,
    num_inference_engines=4,
    inference_tp=1,
    colocate_all=True,
    num_gpus=4,
    gpus=4,
    teacher_num_gpus=2,
    time_limit="08:00:00",
)

# top_k (the speed lever) x lr (the convergence lever): the 4 x 3 square, base its
# (128, 3e-5) corner.
sweep = sk.product(teacher_top_k=[16, 32, 64], lr=[1e-5, 3e-5, 1e-4], id="topk{teacher_top_k}_lr{lr}")
lr = sk.axis("lr", [1e-5, 1e-4], id="topk128_lr{lr}")
# The recommended production cell: lr 3e-5, top_k 64 (pass@8 about 0.75-0.78, about 832 s/step).
prod = sk.cell(teacher_top_k=64, lr=3e-5, max_steps=200, time_limit="23:59:00")
