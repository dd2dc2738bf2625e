"""The trainer's GSM8K reward (trainer/rewards.py) against SkyRL's own: the gsm8k env of
``skyrl-gym`` (installed by .ci/run), scored on the real GSM8K test set.

SkyRL's env gets the ground truth its dataset script (``examples/train/gsm8k/gsm8k_dataset.py``)
puts in ``reward_spec``: the number after ``#### `` with commas dropped, which is what
``skyrl_gym.envs.gsm8k.utils.extract_solution`` returns for a gold answer. On the 1,319 golds
and on shuffled pairs the two rewards agree everywhere; where they differ by design (numbers
compared as numbers, and the other points of trainer/rewards.py's docstring), the last test
lists each case.
"""

from __future__ import annotations

import random

import pytest

from test_rewards import gsm8k_test_rows  # noqa: F401 (a fixture: the real GSM8K test split)
from trainer.rewards import gsm8k_reward

env = pytest.importorskip("skyrl_gym.envs.gsm8k.env", reason="skyrl-gym is not installed (.ci/run installs it)")
utils = pytest.importorskip("skyrl_gym.envs.gsm8k.utils")


def skyrl_reward(completion: str, answer: str) -> float:
    """What SkyRL's gsm8k env pays for ``completion`` on the question whose answer is ``answer``."""
    ground_truth = utils.extract_solution(answer, method="strict")
    return float(env.GSM8kEnv(extras={"reward_spec": {"ground_truth": ground_truth}}).step(completion)["reward"])


def scored(pairs) -> list[tuple[int, int, float, float]]:
    """``(completion row, answer row, SkyRL's reward, the trainer's)`` of every pair."""
    return [(i, j, skyrl_reward(completion, answer), gsm8k_reward(completion, answer))
            for i, j, completion, answer in pairs]


def disagreements(scores) -> list[tuple[int, int, float, float]]:
    """The scored pairs on which SkyRL and the trainer differ."""
    return [score for score in scores if score[2] != score[3]]


def test_every_gold_scores_one_with_both(gsm8k_test_rows):
    assert len(gsm8k_test_rows) == 1319
    scores = scored([(i, i, row["answer"], row["answer"]) for i, row in enumerate(gsm8k_test_rows)])
    assert disagreements(scores) == []
    assert all(theirs == 1.0 for _, _, theirs, _ in scores)


def test_shuffled_pairs_score_the_same_with_both(gsm8k_test_rows):
    rows = [row["answer"] for row in gsm8k_test_rows]
    order = list(range(len(rows)))
    random.Random(0).shuffle(order)
    neighbours = [(i, (i + 1) % len(rows)) for i in range(len(rows))]
    pairs = [(i, j, rows[i], rows[j]) for i, j in [*enumerate(order), *neighbours] if i != j]
    scores = scored(pairs)
    assert len(pairs) > 2600 and disagreements(scores) == []
    # Not vacuous: answers repeat across questions, so some pairs pay 1.0 with both.
    paid = [(ours, theirs) for _, _, theirs, ours in scores if theirs == 1.0]
    assert 0 < len(paid) < 100 and all(ours == 1.0 for ours, _ in paid)


@pytest.mark.parametrize("completion, gold, skyrl, ours", [
    # Where the trainer differs on purpose (trainer/rewards.py): SkyRL compares strings after
    # exactly one space, with its [0-9.,]+ pattern.
    ("#### 18.0", "#### 18", 0.0, 1.0),          # numbers compared as numbers
    ("#### 18.", "#### 18", 0.0, 1.0),           # a sentence's period is not a decimal point
    ("#### $18", "#### 18", 0.0, 1.0),           # a dollar sign before the number
    ("####18", "#### 18", 0.0, 1.0),             # no space after ####
    ("####  18", "#### 18", 0.0, 1.0),           # two spaces
    # Where they agree: commas, signs, the first #### answer counts, strict needs ####.
    ("#### 1,080", "#### 1,080", 1.0, 1.0),
    ("#### -7", "#### -7", 1.0, 1.0),
    ("#### 5\nno wait\n#### 18", "#### 18", 0.0, 0.0),
    ("the answer is 18", "#### 18", 0.0, 0.0),
])
def test_each_known_difference(completion, gold, skyrl, ours):
    assert (skyrl_reward(completion, gold), gsm8k_reward(completion, gold)) == (skyrl, ours)
