"""MATH GRPO grid: long chain-of-thought off the GSM8K accuracy winner, and model-size saturation.

Goal: pass@8 on Hendrycks MATH (SkyRL's ``aime`` env on Leonardo), where chains of
thought are real: GSM8K's run to about 250 tokens, MATH's need room, so generations get
``max_generate_length=4096`` (the operating notes' MATH grid) instead of 1024. The
base is ``combo_acc_stab``, the GSM8K accuracy grid's stable winner (lr 1e-5, n8, the
entropy bonus against collapse), with the MATH data and that length.

The size axis asks where more parameters stop paying: Qwen2.5 1.5B (the base) to 32B,
one 4 x A100-64GB node each, except 32B. A dense 32B model OOMs on one node (FSDP4
backward / weight-sync broadcast), so ``size32b`` is kept as a ceiling probe (XFAIL when
it fails; XPASS means the ceiling moved) and ``size32b_4node`` is the 32B cell that fits:
16 GPUs on 4 nodes hold about 2B parameters' training state each, fewer than the 3.5B
that ``size14b`` holds on one node, and its rollout engines run TP2 (32B in bf16, about
64 GB, is more than one 64 GB card).

Real runs read MATH from ``$SWEEPKIT_MATH``: a directory of train/test .jsonl or .parquet
(fields ``problem`` and ``solution`` or ``answer``), or one such file, pre-staged on the
login node (compute nodes are offline). Unset, the dataset is ``"math"``, which the
trainer refuses with that advice, and the ``smoke`` profile runs the built-in synthetic
task instead.
"""

import os

import sweepkit as sk

marks = [sk.mark.math]

base = sk.base(
    from_cell="gsm8k_accuracy.py::combo_acc_stab",
    dataset=os.environ.get("SWEEPKIT_MATH") or "math",
    max_generate_length=4096,
    # MATH problems (some with [asy] figure code) run longer than GSM8K questions.
    max_prompt_length=1024,
    # Sequences 5x the GSM8K base's: a quarter of its sequences per micro-batch keeps the
    # tokens per micro-batch near it, and activations are recomputed in backward. Both hold
    # for every cell, so the size axis varies the model only.
    micro_train_batch_size_per_gpu=2,
    micro_forward_batch_size_per_gpu=4,
    gradient_checkpointing=True,
    # The first 500 test problems (MATH-500's size): 8 samples of 4096 tokens each on all
    # 5000 would cost more than the training steps between two evals.
    eval_limit=500,
    # Not measured yet for 4096-token generations; under Leonardo's 23:59:00 normal QOS wall.
    time_limit="12:00:00",
)

size = sk.axis("model", [
    "Qwen/Qwen2.5-3B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    sk.param("Qwen/Qwen2.5-14B-Instruct", marks=sk.mark.slow),
    sk.param("Qwen/Qwen2.5-32B-Instruct", marks=[sk.mark.slow, sk.mark.xfail(
        reason="32B OOMs single-node at FSDP4 backward / weight-sync broadcast")]),
], ids=["size3b", "size7b", "size14b", "size32b"])

size32b_4node = sk.cell(
    model="Qwen/Qwen2.5-32B-Instruct",
    num_nodes=4,
    gpus=16,
    num_gpus=16,
    num_inference_engines=8,
    inference_tp=2,
    marks=sk.mark.slow,
)
