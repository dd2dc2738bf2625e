"""GSM8K-style outcome rewards: the number after ``####`` against the gold number.

Which ``####`` counts
---------------------
The strict reward takes the FIRST ``#### <number>`` in the completion, as SkyRL's
gsm8k environment does (``skyrl-gym/skyrl_gym/envs/gsm8k/utils.py``), so that the
numbers of a run here are comparable with the SkyRL canary runs the grids reproduce.
verl (``verl/utils/reward_score/gsm8k.py``) instead takes the LAST match within the
last 300 characters. Both stop a model from hedging with several answers; first-match
also scores a completion that answers and then rambles on, where verl's clip could
cut the answer off.

How it differs from SkyRL's strict mode
---------------------------------------
* Numbers are compared as numbers (``decimal.Decimal``, exact, no float rounding):
  ``18``, ``18.0`` and ``18.00`` are the same answer; SkyRL compares strings. GSM8K's
  gold answers are integers, so a model writing ``18.0`` did get it right.
* A sentence-ending period is not part of the number: ``#### 18.`` is 18 (SkyRL's
  ``[0-9.,]+`` keeps the period and the string match then fails).
* ``$`` may stand before the number (``#### $18``); SkyRL's pattern cannot match it,
  although it strips ``$`` afterwards. Commas are thousands separators as in SkyRL.
* Spaces or tabs between ``####`` and the number may be any number, including none
  (SkyRL wants exactly one space).
* The gold side is normalised the same way, and may be the dataset's whole answer
  field (the number after its last ``####``) or the bare number.

The flexible fallback (``flexible=True``) is used only when asked: the strict answer
when there is one, else the last number anywhere in the completion.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Optional

# A number: digits with optional thousands commas and decimals, or a bare decimal
# fraction. A trailing "." (end of sentence) is left out by construction.
_NUMBER = r"(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_SIGNED_MONEY = rf"(-?)[ \t]*\$?[ \t]*(-?)({_NUMBER})"
_STRICT = re.compile(rf"####[ \t]*{_SIGNED_MONEY}")
_ANY_NUMBER = re.compile(_SIGNED_MONEY)


def _to_decimal(sign_before: str, sign_after: str, digits: str) -> Optional[Decimal]:
    if sign_before and sign_after:
        return None
    try:
        value = Decimal(digits.replace(",", ""))
    except InvalidOperation:
        return None
    return -value if (sign_before or sign_after) else value


def extract_answer(completion: str, *, flexible: bool = False) -> Optional[Decimal]:
    """The completion's final answer as a number, or None when it gives none.

    Strict: the first ``#### <number>``. Flexible: that, else the last number in the text.
    """
    for match in _STRICT.finditer(completion):
        value = _to_decimal(*match.groups())
        if value is not None:
            return value
    if not flexible:
        return None
    for match in reversed(list(_ANY_NUMBER.finditer(completion))):
        value = _to_decimal(*match.groups())
        if value is not None:
            return value
    return None


def parse_gold(answer: str) -> Decimal:
    """The gold number of a dataset answer: the text after its last ``####``, or the whole
    string when it has none. Raises ValueError when that is not a number."""
    text = answer.rsplit("####", 1)[-1].strip()
    match = re.fullmatch(_SIGNED_MONEY, text)
    value = _to_decimal(*match.groups()) if match else None
    if value is None:
        raise ValueError(f"gold answer {text[-40:]!r} is not a number")
    return value


def gsm8k_reward(completion: str, answer: str, *, flexible: bool = False) -> float:
    """1.0 when the completion's answer equals the gold number, else 0.0.

    :param completion: the generated text (the prompt not included).
    :param answer: the dataset's answer field ending in ``#### N``, or the bare number.
    :param flexible: fall back to the last number in the text when there is no ``####``.
    """
    predicted = extract_answer(completion, flexible=flexible)
    return 1.0 if predicted is not None and predicted == parse_gold(answer) else 0.0


def format_reward(completion: str) -> float:
    """1.0 when the completion gives a well-formed ``#### <number>``, right or wrong."""
    return 1.0 if extract_answer(completion) is not None else 0.0


def shaped_reward(completion: str, answer: str, format_reward_coef: float = 0.0) -> float:
    """The training reward with format shaping, as SkyRL's ``compute_score(format_score=...)``:
    1.0 for a correct answer, ``format_reward_coef`` for a well-formed wrong one, else 0.0."""
    if gsm8k_reward(completion, answer) == 1.0:
        return 1.0
    return format_reward_coef * format_reward(completion)
