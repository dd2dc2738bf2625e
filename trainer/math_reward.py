r"""MATH-style outcome rewards: the last ``\boxed{...}`` of a completion against the reference.

Which box counts
----------------
The LAST top-level ``\boxed{...}`` (or ``\fbox{...}``) of the completion, its braces
matched (``\boxed{\frac{1}{2}}`` is ``\frac{1}{2}``; escaped ``\{`` / ``\}`` are text, not
groups), as verl's ``math`` reward and the MATH reference solutions do: a model that boxes
a draft and then a corrected answer is graded on the correction. A box still open when
the completion ends (cut off at ``max_generate_length``) is no answer, and an earlier
closed box does not stand in for it. ``\boxed 5`` (no braces, as a few MATH solutions
write it) is the token up to the next space or ``$``. There is no fallback to an unboxed
answer: that is the strict grade, and the only one.

Equivalence
-----------
`math-verify <https://github.com/huggingface/Math-Verify>`_ parses both sides
(``latex2sympy2_extended`` into sympy) and compares them: ``\dfrac{1}{2}``, ``\frac12``,
``0.5`` and ``1/2`` are one answer; intervals keep their open/closed ends (``(1,3]`` is not
``[1,3]``); ``2, 3`` and ``\{3,2\}`` are sets; ``\text{(C)}`` is ``C``; ``x=3`` answers
``3``; ``10\%`` is ``10``, ``90^\circ`` is ``90``. The gold side is parsed once per distinct
answer and kept (:func:`_parsed` is cached).

Threads and the bound on the work
---------------------------------
A few characters can keep sympy busy for ever: comparing ``\boxed{10^{10^{10}}}`` with
any number never ends. math-verify bounds its parse and its comparison with
``signal.alarm`` (:data:`PARSE_TIMEOUT_S`, :data:`VERIFY_TIMEOUT_S`), which exists only on
a process's main thread; off it, math-verify 0.9.0 refuses to parse (``ValueError``: it
"doesn't support threaded environment"), and with its timeouts off nothing bounds the
work. So:

* on the main thread (the training loop scores there) the check runs in this process,
  bounded by math-verify's own alarms;
* on any other thread it runs on the main thread of one helper process (spawned on first
  use, shared by every thread), where the same alarms work. If the helper has not
  answered within :data:`HARD_LIMIT_S` (work the alarm cannot interrupt, such as one huge
  integer operation in C) the answer is graded wrong and the helper is killed; the next
  call starts a new one.

Either way a check is bounded and its grade is the same on every thread; the helper costs
one process start (about a second, importing sympy) and a round trip per check.
"""

from __future__ import annotations

import logging
import multiprocessing
import re
import signal
import threading
from functools import lru_cache
from typing import Optional

PARSE_TIMEOUT_S = 5
VERIFY_TIMEOUT_S = 5
HARD_LIMIT_S = PARSE_TIMEOUT_S * 2 + VERIFY_TIMEOUT_S + 5
_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BARE_TOKEN = re.compile(r"[ \t]+([^\s$]+)")


def _closing_brace(text: str, start: int) -> Optional[int]:
    """Index of the ``}`` that closes the group opened at ``text[start] == "{"``, or None."""
    depth = 0
    index = start
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2  # an escaped character (\{, \}, \\) opens or closes no group
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    return None


def last_boxed(text: str) -> Optional[str]:
    r"""The content of the last top-level ``\boxed{...}`` in ``text``, or None when the text has
    no box, or its last box is still open (nested boxes belong to the box around them)."""
    found = None
    position = 0
    while (match := _BOX.search(text, position)) is not None:
        after = match.end()
        while after < len(text) and text[after] in " \t":
            after += 1
        if after < len(text) and text[after] == "{":
            end = _closing_brace(text, after)
            if end is None:
                return None  # the last box never closes: no answer
            found, position = text[after + 1:end], end + 1
        elif (bare := _BARE_TOKEN.match(text, match.end())) is not None:
            found, position = bare.group(1), bare.end()
        else:
            position = after
    return found


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@lru_cache(maxsize=8192)
def _parsed(answer: str) -> tuple:
    """math-verify's parse of one boxed answer (sympy forms and the string); () when unparsable."""
    import math_verify

    config = [math_verify.LatexExtractionConfig(boxed_match_priority=0)]
    return tuple(math_verify.parse("\\boxed{" + answer + "}", extraction_config=config,
                                   parsing_timeout=PARSE_TIMEOUT_S))


def _equivalent(gold: str, predicted: str) -> bool:
    """math-verify's verdict on two box contents; on a main thread only (its timeouts are alarms)."""
    import math_verify

    gold_forms, predicted_forms = _parsed(gold), _parsed(predicted)
    if not gold_forms or not predicted_forms:
        return False
    return bool(math_verify.verify(list(gold_forms), list(predicted_forms), timeout_seconds=VERIFY_TIMEOUT_S))


def _helper_start() -> None:
    # Ctrl-C reaches the whole process group; the trainer handles it, the helper must not.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    import math_verify  # noqa: F401  (imported once, before the first check waits on it)


class _Helper:
    """The helper process that checks answers for threads other than the main one."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pool = None

    def equivalent(self, gold: str, predicted: str) -> bool:
        with self._lock:
            if self._pool is None:
                # spawn, not fork: forking a process that runs torch threads can deadlock the child.
                self._pool = multiprocessing.get_context("spawn").Pool(1, initializer=_helper_start)
            pool = self._pool
        pending = pool.apply_async(_equivalent, (gold, predicted))
        try:
            return pending.get(timeout=HARD_LIMIT_S)
        except multiprocessing.TimeoutError:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.terminate()
            return False


_HELPER = _Helper()


def math_correct(completion: str, answer: str) -> bool:
    r"""Whether the last ``\boxed{...}`` of ``completion`` is equivalent to ``answer``.

    :param completion: the generated text (the prompt not included).
    :param answer: the reference answer, the content of a box (``\frac{1}{2}``), not boxed.
    """
    predicted = last_boxed(completion)
    if predicted is None or not predicted.strip():
        return False
    if _on_main_thread():
        return _equivalent(answer, predicted)
    return _HELPER.equivalent(answer, predicted)


def math_reward(completion: str, answer: str) -> float:
    """1.0 when the completion's boxed answer is equivalent to ``answer``, else 0.0."""
    return 1.0 if math_correct(completion, answer) else 0.0


def math_format_reward(completion: str) -> float:
    r"""1.0 when the completion ends its reasoning with a closed, non-empty ``\boxed{...}``."""
    boxed = last_boxed(completion)
    return 1.0 if boxed is not None and boxed.strip() else 0.0
