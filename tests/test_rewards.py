import json
from decimal import Decimal
from pathlib import Path

import pytest

from trainer.rewards import extract_answer, format_reward, gsm8k_reward, parse_gold, shaped_reward

GSM8K_TEST = Path("/work/shared/data/gsm8k/test.jsonl")


@pytest.fixture(scope="module")
def gsm8k_test_rows():
    if not GSM8K_TEST.exists():
        pytest.skip(f"{GSM8K_TEST} is not on this machine")
    return [json.loads(line) for line in GSM8K_TEST.read_text().splitlines()]


def test_every_gold_solution_scores_one_against_its_own_answer(gsm8k_test_rows):
    assert len(gsm8k_test_rows) == 1319
    for i, row in enumerate(gsm8k_test_rows):
        assert gsm8k_reward(row["answer"], row["answer"]) == 1.0, f"row {i}: {row['answer'][-60:]!r}"
        gold = row["answer"].rsplit("####", 1)[1].strip()
        assert gsm8k_reward(row["answer"], gold) == 1.0, f"row {i}: bare gold {gold!r}"


def test_every_gold_solution_scores_zero_against_another_questions_number(gsm8k_test_rows):
    golds = [parse_gold(row["answer"]) for row in gsm8k_test_rows]
    pairs = 0
    for i, row in enumerate(gsm8k_test_rows):
        # the next question whose gold number differs (answers repeat across questions)
        j = next(k % len(golds) for k in range(i + 1, i + len(golds)) if golds[k % len(golds)] != golds[i])
        assert gsm8k_reward(row["answer"], gsm8k_test_rows[j]["answer"]) == 0.0, f"rows {i} vs {j}"
        pairs += 1
    assert pairs == 1319


@pytest.mark.parametrize("completion, gold, expected", [
    ("so the total is 1080.\n#### 1,080", "1080", 1.0),   # commas are thousands separators
    ("#### 1080", "x\n#### 1,080", 1.0),                  # ... on the gold side too
    ("#### $18", "18", 1.0),
    ("#### -$3", "-3", 1.0),
    ("#### $-3", "-3", 1.0),
    ("#### -7", "-7", 1.0),
    ("#### -7", "7", 0.0),
    ("#### 7", "-7", 0.0),
    ("#### 18.", "18", 1.0),                               # sentence period is not a decimal
    ("#### 18.0", "18", 1.0),                              # compared as numbers
    ("#### 18.5", "18", 0.0),
    ("#### 0.25", "0.25", 1.0),
    ("#### .25", "0.25", 1.0),
    ("####18", "18", 1.0),
    ("####\t18", "18", 1.0),
    ("the answer is 18", "18", 0.0),                       # no #### -> strict gives nothing
    ("#### eighteen", "18", 0.0),
    ("#### 5\nwait, no.\n#### 18", "18", 0.0),             # the FIRST #### answer counts
    ("#### 18\nor maybe\n#### 5", "18", 1.0),
    ("#### none\n#### 18", "18", 1.0),                     # first #### with a number
    ("", "18", 0.0),
])
def test_strict_cases(completion, gold, expected):
    assert gsm8k_reward(completion, gold) == expected


def test_flexible_falls_back_to_the_last_number_only_when_asked():
    assert gsm8k_reward("3 apples and 4 pears make 7", "7") == 0.0
    assert gsm8k_reward("3 apples and 4 pears make 7", "7", flexible=True) == 1.0
    assert gsm8k_reward("3 apples and 4 pears make 7.", "7", flexible=True) == 1.0
    # a #### answer still wins over a later number
    assert extract_answer("#### 18. It took 3 steps.", flexible=True) == Decimal(18)
    assert extract_answer("no numbers here", flexible=True) is None


def test_format_and_shaped_rewards():
    assert format_reward("#### 12") == 1.0
    assert format_reward("12") == 0.0
    assert shaped_reward("#### 12", "12", 0.1) == 1.0
    assert shaped_reward("#### 13", "12", 0.1) == pytest.approx(0.1)
    assert shaped_reward("13", "12", 0.1) == 0.0
    assert shaped_reward("#### 13", "12") == 0.0


def test_parse_gold_rejects_a_non_number():
    assert parse_gold("work\n#### 2,125") == Decimal(2125)
    assert parse_gold("42") == Decimal(42)
    with pytest.raises(ValueError, match="not a number"):
        parse_gold("#### forty")
    with pytest.raises(ValueError, match="not a number"):
        gsm8k_reward("#### 40", "#### 4 0")
