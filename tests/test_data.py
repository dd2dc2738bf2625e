import json
from pathlib import Path

import pyarrow
import pyarrow.parquet
import pytest

from trainer.config import TrainerConfig
from trainer.data import DataError, Example, PromptSampler, gsm8k_rows
from trainer.models import byte_tokenizer, word_tokenizer
from trainer.tasks import GSM8K_SUFFIX, SYNTHETIC_WORDS, load_task, synthetic_rows

#: A ChatML template (Qwen's shape) for a tokenizer built in a test.
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

SHARED_GSM8K = Path("/work/shared/data/gsm8k")
ROWS = [
    {"question": "Tom has 2 apples and buys 3. How many?", "answer": "2+3=5\n#### 5"},
    {"question": "A shop sells 1,000 pens a day. How many in 2 days?", "answer": "#### 2,000"},
    {"question": "It is -3 degrees, then 4 warmer. Temperature?", "answer": "-3+4=1\n#### 1"},
]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_parquet(path: Path, rows) -> Path:
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    return path


def test_directory_of_jsonl_splits(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "test.jsonl", ROWS[:1])
    assert gsm8k_rows(str(tmp_path), "train") == ROWS
    assert gsm8k_rows(str(tmp_path), "test") == ROWS[:1]


def test_directory_in_the_hub_parquet_layout(tmp_path):
    (tmp_path / "main").mkdir()
    write_parquet(tmp_path / "main" / "train-00000-of-00001.parquet", ROWS)
    assert gsm8k_rows(str(tmp_path), "train") == ROWS


def test_single_parquet_file_serves_every_split(tmp_path):
    path = write_parquet(tmp_path / "gsm.parquet", ROWS)
    assert gsm8k_rows(str(path), "train") == gsm8k_rows(str(path), "test") == ROWS


def test_shared_gsm8k_copy_loads():
    if not SHARED_GSM8K.exists():
        pytest.skip(f"{SHARED_GSM8K} is not on this machine")
    assert len(gsm8k_rows(str(SHARED_GSM8K), "train")) == 7473
    assert len(gsm8k_rows(str(SHARED_GSM8K), "test")) == 1319


@pytest.mark.parametrize("bad_line, message", [
    ("{not json", r"bad\.jsonl:2: not valid JSON"),
    (json.dumps({"question": "q"}), r"bad\.jsonl:2: field 'answer' missing"),
    (json.dumps({"question": "q", "answer": "it is 4"}), r"bad\.jsonl:2: answer has no '#### <number>'"),
    (json.dumps({"question": "q", "answer": "#### four"}), r"bad\.jsonl:2: gold answer 'four' is not a number"),
    (json.dumps(["q", "#### 4"]), r"bad\.jsonl:2: expected an object"),
])
def test_malformed_jsonl_rows_name_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + bad_line + "\n")
    with pytest.raises(DataError, match=message):
        gsm8k_rows(str(path), "train")


def test_malformed_parquet_row_is_named(tmp_path):
    path = write_parquet(tmp_path / "bad.parquet", [ROWS[0], {"question": "q", "answer": "no number"}])
    with pytest.raises(DataError, match=r"bad\.parquet: row 1: answer has no"):
        gsm8k_rows(str(path), "train")


def test_missing_split_and_missing_path_are_named(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(DataError, match="no validation.jsonl"):
        gsm8k_rows(str(tmp_path), "validation")
    with pytest.raises(DataError, match="neither 'synthetic', 'gsm8k' nor an existing path"):
        gsm8k_rows(str(tmp_path / "nope"), "train")


def test_hub_name_offline_without_cache_asks_for_a_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(DataError, match="HF_HUB_OFFLINE is set; pass the path"):
        gsm8k_rows("gsm8k", "train")


def examples(n):
    return [Example(prompt=f"p{i}", answer=str(i), question=f"q{i}") for i in range(n)]


def test_sampler_covers_each_epoch_once_and_reshuffles():
    sampler = PromptSampler(examples(10), 3, seed=7)
    assert sampler.steps_per_epoch == 3
    epoch0 = [e.answer for _ in range(3) for e in sampler.next_batch()]
    epoch1 = [e.answer for _ in range(3) for e in sampler.next_batch()]
    assert len(set(epoch0)) == 9 and len(set(epoch1)) == 9
    assert sampler.state_dict() == {"epoch": 1, "index": 9}
    assert epoch0 != epoch1
    again = PromptSampler(examples(10), 3, seed=7)
    assert [e.answer for _ in range(3) for e in again.next_batch()] == epoch0
    other_seed = PromptSampler(examples(10), 3, seed=8)
    assert [e.answer for _ in range(3) for e in other_seed.next_batch()] != epoch0


def test_resumed_sampler_sees_exactly_the_same_data_order():
    reference = PromptSampler(examples(10), 3, seed=1)
    order = [reference.next_batch() for _ in range(8)]
    first = PromptSampler(examples(10), 3, seed=1)
    for _ in range(4):
        first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))   # as a checkpoint stores it
    resumed = PromptSampler(examples(10), 3, seed=1)
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(4)] == order[4:]


def test_sampler_rejects_bad_sizes_and_states():
    with pytest.raises(DataError, match="train_batch_size: 11 is more than the 10"):
        PromptSampler(examples(10), 11, seed=0)
    sampler = PromptSampler(examples(10), 3, seed=0)
    with pytest.raises(DataError, match="missing \\['index'\\]"):
        sampler.load_state_dict({"epoch": 0})
    with pytest.raises(DataError, match="bad position"):
        sampler.load_state_dict({"epoch": 0, "index": 4})


def test_synthetic_rows_are_seeded_and_splits_disjoint():
    train, held_out = synthetic_rows(300, seed=3)
    assert len(train) == len(held_out) == 300
    assert synthetic_rows(300, seed=3) == (train, held_out)
    assert synthetic_rows(300, seed=4)[0] != train
    assert not {r["question"] for r in train} & {r["question"] for r in held_out}
    for row in train + held_out:
        words = row["question"].split()
        assert set(words) <= set(SYNTHETIC_WORDS) and row["answer"] == words[0]


def test_synthetic_task_rewards_the_first_digit_after_the_marker():
    cfg = TrainerConfig(dataset="synthetic", synthetic_size=40, eval_limit=5, format_reward_coef=0.1)
    task = load_task(cfg, word_tokenizer(SYNTHETIC_WORDS))
    assert len(task.train) == 40 and len(task.eval) == 5
    example = task.train[0]
    assert example.prompt == example.question       # no chat template: the digits as they are
    digit = example.question.split()[0]
    wrong = next(d for d in "0123" if d != digit)
    assert task.reward(f"#### {digit}", example) == 1.0
    assert task.reward(f"#### {wrong}", example) == pytest.approx(0.1)
    assert task.reward(digit, example) == 0.0
    assert task.is_correct(f"#### {digit} #### {wrong}", example)
    assert not task.is_correct(f"#### {wrong}", example)


def test_gsm8k_prompts_plain_and_through_a_chat_template(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "test.jsonl", ROWS)
    cfg = TrainerConfig(dataset=str(tmp_path), eval_limit=2)
    tokenizer = byte_tokenizer()
    plain = load_task(cfg, tokenizer)
    assert len(plain.eval) == 2
    assert plain.train[0].prompt == f"Question: {ROWS[0]['question']} {GSM8K_SUFFIX}\nAnswer:"
    tokenizer.chat_template = CHAT_TEMPLATE
    chat = load_task(cfg, tokenizer)
    assert chat.train[1].prompt == (
        f"<|im_start|>user\n{ROWS[1]['question']} {GSM8K_SUFFIX}<|im_end|>\n<|im_start|>assistant\n")
    assert chat.reward("so 2000\n#### 2,000", chat.train[1]) == 1.0
