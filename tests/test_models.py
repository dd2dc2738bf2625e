import pytest
import torch
import transformers

from trainer.config import ConfigError, TrainerConfig
from trainer.models import RANDOM_SHAPES, byte_tokenizer, decode_texts, encode_prompts, load_model_and_tokenizer, random_model
from trainer.tasks import load_task

GSM8K_TEXT = "Janet’s ducks lay 16 eggs.\nShe makes 9 * 2 = $<<9*2=18>>18 a day.\n#### 18"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def tiny(dataset="synthetic", seed=0):
    return load_model_and_tokenizer(TrainerConfig(dataset=dataset, seed=seed), device="cpu", dtype="float32")


def test_tiny_model_is_a_small_tied_qwen2_seeded_by_the_config():
    model, tokenizer = tiny(seed=5)
    assert isinstance(model, transformers.Qwen2ForCausalLM)
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config.vocab_size == len(tokenizer) <= 16
    same, _ = tiny(seed=5)
    other, _ = tiny(seed=6)
    assert torch.equal(model.lm_head.weight, same.lm_head.weight)
    assert not torch.equal(model.lm_head.weight, other.lm_head.weight)


@pytest.mark.parametrize("dataset", ["synthetic", "/some/gsm8k/dir"])
def test_tokenizers_are_fast_with_pad_eos_and_left_padding(dataset):
    _, tokenizer = tiny(dataset)
    assert isinstance(tokenizer, transformers.PreTrainedTokenizerFast)
    assert tokenizer.pad_token_id is not None and tokenizer.eos_token_id is not None
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    batch = tokenizer(["0 1", "0 1 2 3"] if dataset == "synthetic" else ["ab", "abcd"],
                      padding=True, add_special_tokens=False)
    assert batch["input_ids"][0][:2] == [tokenizer.pad_token_id] * 2
    assert batch["attention_mask"][0] == [0, 0, 1, 1]


def test_synthetic_prompts_and_answers_round_trip_through_the_word_tokenizer():
    cfg = TrainerConfig(dataset="synthetic", synthetic_size=64)
    _, tokenizer = tiny()
    task = load_task(cfg, tokenizer)
    for example in task.train + task.eval:
        ids = tokenizer(example.prompt, add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids) == example.prompt
    ids = tokenizer("#### 3", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "#### 3"


def test_byte_tokenizer_round_trips_gsm8k_text():
    _, tokenizer = tiny("/some/gsm8k/dir")
    ids = tokenizer(GSM8K_TEXT, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(GSM8K_TEXT.encode("utf-8"))
    assert tokenizer.decode(ids) == GSM8K_TEXT


@pytest.mark.parametrize("tokenizer", [
    pytest.param(byte_tokenizer(vocab_size=RANDOM_SHAPES["qwen2.5-0.5b"]["vocab_size"]), id="bytes-padded"),
    pytest.param(tiny("synthetic")[1], id="words")])
def test_decode_texts_is_batch_decode(tokenizer):
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(0, len(tokenizer), (16, 40), generator=generator).tolist()
    rows[0][5:] = [tokenizer.eos_token_id] * 35  # a stopped row, padded with eos
    rows[1] = tokenizer(GSM8K_TEXT, add_special_tokens=False)["input_ids"] + [tokenizer.pad_token_id] * 3
    rows.append([])
    texts = decode_texts(tokenizer, rows)
    assert texts == tokenizer.batch_decode(rows, skip_special_tokens=True)
    if len(tokenizer) > 256:
        assert texts[1] == GSM8K_TEXT


def test_encode_prompts_is_each_prompts_own_ids_left_truncated():
    tokenizer = byte_tokenizer(vocab_size=RANDOM_SHAPES["qwen2.5-0.5b"]["vocab_size"])
    prompts = [GSM8K_TEXT, "x", GSM8K_TEXT + " And then?", ""]
    alone = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    assert len(alone[0]) > 20 and 0 < len(alone[1]) < 20
    assert encode_prompts(tokenizer, prompts, 20) == [ids[-20:] for ids in alone]
    assert encode_prompts(tokenizer, prompts, 20)[2][-1] == alone[2][-1]  # the end is kept, not the start
    assert encode_prompts(tokenizer, [], 20) == []


@pytest.mark.parametrize("dataset", ["synthetic", "/some/gsm8k/dir"])
def test_save_pretrained_round_trip_through_the_hf_path(tmp_path, dataset):
    model, tokenizer = tiny(dataset)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = load_model_and_tokenizer(
        TrainerConfig(model=str(tmp_path), dataset=dataset), device="cpu", dtype="float32")
    text = "0 1 2 ####" if dataset == "synthetic" else GSM8K_TEXT
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert torch.equal(loaded_tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"], ids)
    assert loaded_tokenizer.padding_side == "left"
    assert loaded_tokenizer.pad_token_id == tokenizer.pad_token_id
    assert loaded_tokenizer.eos_token_id == tokenizer.eos_token_id
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits)
    assert loaded.generation_config.pad_token_id == tokenizer.pad_token_id


def test_missing_local_model_offline_names_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE is set: pass a local path"):
        load_model_and_tokenizer(TrainerConfig(model="nobody/no-such-model"), device="cpu", dtype="float32")


def test_random_shape_matches_the_published_parameter_count():
    tokenizer = byte_tokenizer(vocab_size=RANDOM_SHAPES["qwen2.5-0.5b"]["vocab_size"])
    assert len(tokenizer) == 151936
    # every id the model can sample decodes, fillers included
    hi = tokenizer("Hi", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode([151000, *hi]) == "<|filler_150744|>Hi"
    with torch.device("meta"):
        model = random_model(RANDOM_SHAPES["qwen2.5-0.5b"], tokenizer, seed=0)
    assert sum(p.numel() for p in model.parameters()) == 494_032_768   # Qwen2.5-0.5B's count
    with pytest.raises(ConfigError, match="known: random:qwen2.5-0.5b"):
        load_model_and_tokenizer(TrainerConfig(model="random:gpt9"), device="cpu", dtype="float32")


def test_a_random_shape_is_built_on_the_device_it_runs_on():
    """Its parameters are created there (on a GPU, not initialised on the host and copied:
    28 s of a 1.5B run's start); "meta" stands in for the GPU here."""
    created = []
    hook = torch.nn.modules.module.register_module_parameter_registration_hook(
        lambda module, name, parameter: created.append(parameter.device.type))
    try:
        model, _ = load_model_and_tokenizer(TrainerConfig(model="random:qwen2.5-1.5b"), device="meta",
                                            dtype="float32")
    finally:
        hook.remove()
    assert len(created) > 300 and set(created) == {"meta"}
    assert {p.device.type for p in model.parameters()} == {"meta"}


@pytest.mark.parametrize("dataset, vocabulary", [("synthetic", 8), ("gsm8k", 151936)])
def test_random_shape_on_the_synthetic_task_speaks_its_eight_tokens(dataset, vocabulary):
    """A 0.5B body on the synthetic task gets the task's vocabulary (a random policy is then
    right about one time in ten); on any other dataset, the shape's own vocabulary."""
    with torch.device("meta"):
        model, tokenizer = load_model_and_tokenizer(TrainerConfig(model="random:qwen2.5-0.5b", dataset=dataset),
                                                    device="meta", dtype="float32")
    assert len(tokenizer) == vocabulary == model.get_output_embeddings().weight.shape[0]
    assert model.config.num_hidden_layers == 24 and model.config.hidden_size == 896


def test_random_policy_solves_the_synthetic_task_often_enough_for_grpo():
    """A group of 8 must hold a success often, yet the task must leave room to learn."""
    cfg = TrainerConfig(dataset="synthetic", synthetic_size=256, seed=42)
    model, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype="float32")
    task = load_task(cfg, tokenizer)
    prompts = tokenizer([e.prompt for e in task.train], return_tensors="pt", padding=True,
                        add_special_tokens=False)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(**prompts, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                             max_new_tokens=8, num_return_sequences=4)
    texts = tokenizer.batch_decode(out[:, prompts["input_ids"].shape[1]:], skip_special_tokens=True)
    rewards = [task.reward(text, e) for text, e in zip(texts, [e for e in task.train for _ in range(4)])]
    rate = sum(rewards) / len(rewards)
    print(f"random-policy success rate: {rate:.3f} over {len(rewards)} samples")
    assert 0.03 < rate < 0.5
