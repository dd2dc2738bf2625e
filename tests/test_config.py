import json
import subprocess
import sys

import pytest

from trainer.config import ConfigError, TrainerConfig, parse_value, schema


def test_defaults_build():
    cfg = TrainerConfig()
    assert cfg.resume_mode is None
    assert cfg.loss_reduction == "token_mean"


def test_every_error_is_reported_with_its_key():
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_dict({"lrr": 1e-5, "train_batch_size": "32", "temperature": True})
    message = str(info.value)
    assert "unknown key 'lrr' (did you mean 'lr'?)" in message
    assert "train_batch_size: expected int, got '32'" in message
    assert "temperature: expected float, got True" in message


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("resume_mode", "latset", "resume_mode: must be one of None, 'latest'"),
        ("loss_reduction", "mean", "loss_reduction: must be one of"),
        ("train_batch_size", 0, "train_batch_size: must be > 0"),
        ("gpu_memory_utilization", 1.5, "gpu_memory_utilization: must be in (0, 1]"),
        ("lr", float("nan"), "lr: expected float"),
        ("eps_clip_low", 1.0, "eps_clip_low: must be in [0, 1)"),
        ("timing_target", 0, "timing_target: must be in (0, 1), got 0.0"),
        ("timing_target", 1.5, "timing_target: must be in (0, 1), got 1.5"),
        ("timing_level", 1, "timing_level: must be in (0, 1), got 1.0"),
        ("timing_min_steps", 1, "timing_min_steps: must be >= 2, got 1"),
    ],
)
def test_bad_values_name_the_key(key, value, words):
    with pytest.raises(ConfigError, match=None) as info:
        TrainerConfig.from_dict({key: value})
    assert words in str(info.value)


def test_mini_batch_must_divide_train_batch():
    with pytest.raises(ConfigError, match="train_batch_size: 48 is not a multiple of policy_mini_batch_size=32"):
        TrainerConfig.from_dict({"train_batch_size": 48, "policy_mini_batch_size": 32})


def test_timing_min_steps_above_max_steps_is_refused_only_where_the_rule_is_on():
    with pytest.raises(ConfigError, match=r"timing_min_steps: 12 is above max_steps=10: the run would end before "
                                          r"the rule could stop it"):
        TrainerConfig.from_dict({"timing_target": 0.02, "timing_min_steps": 12, "max_steps": 10})
    assert TrainerConfig.from_dict({"timing_min_steps": 12, "max_steps": 10}).timing_target is None
    assert TrainerConfig.from_dict({"timing_target": 0.02, "timing_min_steps": 12}).max_steps is None
    cfg = TrainerConfig.from_dict({"timing_target": 0.02, "timing_min_steps": 10, "max_steps": 10})
    assert (cfg.timing_target, cfg.timing_level, cfg.timing_min_steps) == (0.02, 0.95, 10)


def test_ints_widen_to_floats_and_optional_accepts_null():
    cfg = TrainerConfig.from_dict({"lr": 1, "max_steps": None, "eval_limit": 5})
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.max_steps is None and cfg.eval_limit == 5


def test_from_json_applies_overrides_as_json(tmp_path):
    path = tmp_path / "cell.json"
    path.write_text(json.dumps({"lr": 1e-6, "resume_mode": "latest"}))
    cfg = TrainerConfig.from_json(path, ["lr=1e-5", "resume_mode=null", "use_kl_loss=true", "model=tiny-random"])
    assert (cfg.lr, cfg.resume_mode, cfg.use_kl_loss, cfg.model) == (1e-5, None, True, "tiny-random")


def test_from_json_names_the_file_on_errors(tmp_path):
    path = tmp_path / "cell.json"
    path.write_text('{"lr": 1e-6,\n "seed": }')
    with pytest.raises(ConfigError, match=r"cell.json:2: not valid JSON"):
        TrainerConfig.from_json(path)
    path.write_text(json.dumps({"epoch": 2}))
    with pytest.raises(ConfigError, match=r"cell.json: unknown key 'epoch' \(did you mean 'epochs'\?\)"):
        TrainerConfig.from_json(path)
    with pytest.raises(ConfigError, match="expected key=value"):
        TrainerConfig.from_json(_write(tmp_path, {}), ["lr"])


def _write(tmp_path, data):
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(data))
    return path


def test_parse_value():
    assert parse_value("1e-5") == 1e-5
    assert parse_value("null") is None
    assert parse_value("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"


def test_schema_lists_every_field_without_importing_torch():
    fields = schema()
    for key in ("train_batch_size", "policy_mini_batch_size", "micro_train_batch_size_per_gpu",
                "n_samples_per_prompt", "max_prompt_length", "max_generate_length", "lr",
                "use_kl_loss", "kl_loss_coef", "eps_clip_low", "eps_clip_high", "use_entropy_loss",
                "entropy_loss_coef", "temperature", "advantage_estimator", "policy_loss_type",
                "loss_reduction", "gpu_memory_utilization", "enforce_eager", "colocate_all",
                "num_inference_engines", "inference_tp", "epochs", "max_steps", "eval_interval",
                "ckpt_interval", "resume_mode", "seed"):
        assert key in fields, key
    assert fields["resume_mode"]["type_name"] == "str | null"
    assert fields["lr"]["default"] == 1e-6
    code = "import sys, trainer.config as c; c.schema(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_grpo_needs_a_group():
    with pytest.raises(ConfigError, match="n_samples_per_prompt: GRPO needs at least 2"):
        TrainerConfig.from_dict({"n_samples_per_prompt": 1})
    assert TrainerConfig.from_dict({"n_samples_per_prompt": 1, "advantage_estimator": "no_op"})


def test_to_dict_round_trips():
    cfg = TrainerConfig.from_dict({"lr": 3e-6, "adam_betas": [0.9, 0.95]})
    assert TrainerConfig.from_dict(cfg.to_dict()) == cfg
