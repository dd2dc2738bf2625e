"""GSM8K GRPO accuracy grid: 20 cells off the throughput winner ``combo_C``.

Goal: pass@8 at convergence. lr is the dominant lever (GRPO knee near 1e-5; 3e-7
undertrains, 3e-5 is unstable); then group size, generation length, KL loss,
temperature, DAPO clip-higher, an entropy bonus and format-reward shaping.
``combo_acc`` (lr 1e-5 + n8 + gen1024) scores best but its entropy collapses;
``combo_acc_stab`` adds the entropy bonus that holds it up.
"""

import sweepkit as sk

marks = [sk.mark.gsm8k, sk.mark.accuracy]

base = sk.base(
    from_cell="gsm8k_throughput.py::combo_C",
    # Every knob this grid sweeps is written here, so each axis has a base value.
    lr=1e-6,
    temperature=1.0,
    eps_clip_high=0.2,
    kl_loss_coef=0.001,
    use_entropy_loss=False,
    entropy_loss_coef=0.01,
    format_reward_coef=0.0,
    eval_n_samples_per_prompt=8,
    eval_interval=25,
    time_limit="04:00:00",
)

lr = sk.axis("lr", [3e-7, 3e-6, 1e-5, 3e-5], id="lr{lr}")
n = sk.axis("n_samples_per_prompt", [8, 16])
gen1024 = sk.cell(max_generate_length=1024)
kl = sk.axis("use_kl_loss, kl_loss_coef", [(True, 0.001), (True, 0.01)], id="kl{kl_loss_coef}")
temp = sk.axis("temperature", [0.7, 1.2], id="temp{temperature}")
clip_high = sk.cell(eps_clip_high=0.28)
entbonus = sk.cell(use_entropy_loss=True, entropy_loss_coef=0.01)
shaped = sk.axis("format_reward_coef", [0.1, 0.2], id="shaped{format_reward_coef}")

combo_acc = sk.cell(lr=1e-5, n_samples_per_prompt=8, max_generate_length=1024)
combo_acc_stab = sk.cell(on=combo_acc, use_entropy_loss=True, entropy_loss_coef=0.01)
combo_acc_clip = sk.cell(on=combo_acc, eps_clip_high=0.28)
combo_acc_kl = sk.cell(on=combo_acc, use_kl_loss=True, kl_loss_coef=0.001)
