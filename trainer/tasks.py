"""What the loop trains on: examples with prompts, and the reward of a completion.

``load_task(cfg, tokenizer)`` gives a :class:`Task` for ``cfg.dataset``:

* GSM8K (a local path, or ``"gsm8k"`` from the hub): the question with SkyRL's
  suffix asking for the answer after ``####``, through the tokenizer's chat template
  when it has one, else as plain text; graded by :mod:`trainer.rewards`;
* MATH (a local path whose rows have ``problem``; :mod:`trainer.data` says which task a
  path's rows are, so no key names it): the problem with :data:`MATH_SUFFIX` asking for
  the final answer in ``\\boxed{}``, chat template as for GSM8K; graded by
  :mod:`trainer.math_reward` (the last box, math-verify equivalence);
* ``"synthetic"``: a task the tiny random model learns in about a minute on a CPU.

Rewards are computed per sample from the completion text and its example, so a reward
that needs more (a teacher's score) can replace :meth:`Task.reward` without the loop
changing.

The synthetic task
------------------
The prompt is :data:`SYNTHETIC_PROMPT_DIGITS` digits from ``0``-``3`` (``"3 1 2 0"``)
and the right completion is ``"#### 3"``: the first digit, after ``####``, scored by the
same strict extraction as GSM8K. The vocabulary is deliberately tiny (``####``, four
digits, pad, eos, unk): a uniformly random policy then writes ``####`` before eos
about half the time and the right digit after it about one time in five, so about one
sample in ten succeeds (0.098 measured with the tiny random model, seed 42, 8 new
tokens) and most GRPO groups of 8 hold a success to learn from. The same task over a
byte vocabulary, or over ten digits, leaves a random policy almost never right, and
GRPO has nothing to learn from. Train and eval prompts are disjoint: all
``4 ** SYNTHETIC_PROMPT_DIGITS`` prompts are split once (a fifth held out, from the
seed), then each split draws ``synthetic_size`` prompts from its own part.
"""

from __future__ import annotations

import itertools
import random
from typing import Callable, Optional

import attrs

from trainer.config import TrainerConfig
from trainer.data import Example, dataset_rows
from trainer.math_reward import math_correct, math_format_reward
from trainer.rewards import format_reward, gsm8k_reward

GSM8K_SUFFIX = "Let's think step by step and output the final answer after \"####\"."
MATH_SUFFIX = "Let's think step by step and output the final answer within \\boxed{}."
SYNTHETIC_DIGITS = ("0", "1", "2", "3")
SYNTHETIC_WORDS = ("####", *SYNTHETIC_DIGITS)
SYNTHETIC_PROMPT_DIGITS = 4
SYNTHETIC_EVAL_SHARE = 0.2


@attrs.frozen(kw_only=True)
class Grader:
    """How a task grades a completion: strict correctness against the example's answer, and
    whether the answer is well-formed (what ``format_reward_coef`` credits when it is wrong)."""

    correct: Callable[[str, str], bool]
    well_formed: Callable[[str], bool]


GSM8K_GRADER = Grader(correct=lambda completion, answer: gsm8k_reward(completion, answer) == 1.0,
                      well_formed=lambda completion: format_reward(completion) == 1.0)
MATH_GRADER = Grader(correct=math_correct, well_formed=lambda completion: math_format_reward(completion) == 1.0)


@attrs.frozen(kw_only=True)
class Task:
    """Train and eval examples plus the reward; ``eval`` is already cut to ``eval_limit``."""

    name: str
    train: tuple[Example, ...]
    eval: tuple[Example, ...]
    format_reward_coef: float = 0.0
    prompt_builder: Callable[[str], str] = attrs.field(repr=False)
    grader: Grader = attrs.field(default=GSM8K_GRADER, repr=False)

    def reward(self, completion: str, example: Example) -> float:
        """The training reward: 1 if right, ``format_reward_coef`` if well-formed but wrong
        (SkyRL's ``compute_score(format_score=...)``)."""
        if self.grader.correct(completion, example.answer):
            return 1.0
        return self.format_reward_coef if self.grader.well_formed(completion) else 0.0

    def is_correct(self, completion: str, example: Example) -> bool:
        """Strict correctness, without shaping: what eval pass@k counts."""
        return self.grader.correct(completion, example.answer)

    def prompt(self, question: str) -> str:
        """The prompt text for a question, exactly as the examples carry it."""
        return self.prompt_builder(question)


def load_task(cfg: TrainerConfig, tokenizer) -> Task:
    """The task named by ``cfg.dataset``, its prompts rendered for ``tokenizer``.

    Prompts are final text (a chat template already applied): tokenize them with
    ``add_special_tokens=False``.
    """
    grader = GSM8K_GRADER
    if cfg.dataset == "synthetic":
        builder = _synthetic_prompt_builder(tokenizer)
        train_rows, eval_rows = synthetic_rows(cfg.synthetic_size, seed=cfg.seed)
    else:
        kind, train_rows = dataset_rows(cfg.dataset, cfg.train_split)
        eval_rows = dataset_rows(cfg.dataset, cfg.eval_split, task=kind)[1]
        if kind == "math":
            builder, grader = _math_prompt_builder(tokenizer), MATH_GRADER
        else:
            builder = _gsm8k_prompt_builder(tokenizer)
    if cfg.eval_limit is not None:
        eval_rows = eval_rows[: cfg.eval_limit]
    return Task(
        name=cfg.dataset,
        train=tuple(_example(row, builder) for row in train_rows),
        eval=tuple(_example(row, builder) for row in eval_rows),
        format_reward_coef=cfg.format_reward_coef,
        prompt_builder=builder,
        grader=grader,
    )


def _example(row: dict, builder: Callable[[str], str]) -> Example:
    return Example(prompt=builder(row["question"]), answer=row["answer"], question=row["question"])


def chat_or_plain(tokenizer, content: str, plain: str) -> str:
    """``content`` as one user turn through the chat template, or ``plain`` without one."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)
    return plain


def _gsm8k_prompt_builder(tokenizer) -> Callable[[str], str]:
    def build(question: str) -> str:
        content = f"{question} {GSM8K_SUFFIX}"
        # Plain text models continue the prompt, so end it where the answer starts.
        return chat_or_plain(tokenizer, content, plain=f"Question: {content}\nAnswer:")

    return build


def _math_prompt_builder(tokenizer) -> Callable[[str], str]:
    def build(problem: str) -> str:
        content = f"{problem}\n\n{MATH_SUFFIX}"
        return chat_or_plain(tokenizer, content, plain=f"Problem: {content}\nSolution:")

    return build


def _synthetic_prompt_builder(tokenizer) -> Callable[[str], str]:
    def build(question: str) -> str:
        return chat_or_plain(tokenizer, f"Repeat the first digit of: {question}. Output it after \"####\".",
                             plain=question)

    return build


def synthetic_rows(size: int, *, seed: int, prompt_digits: Optional[int] = None) -> tuple[list[dict], list[dict]]:
    """``size`` train rows and ``size`` eval rows of the synthetic task, disjoint prompts."""
    prompt_digits = prompt_digits or SYNTHETIC_PROMPT_DIGITS
    prompts = [" ".join(digits) for digits in itertools.product(SYNTHETIC_DIGITS, repeat=prompt_digits)]
    random.Random(f"synthetic-split:{seed}").shuffle(prompts)
    held_out = max(1, round(len(prompts) * SYNTHETIC_EVAL_SHARE))
    pools = {"train": prompts[held_out:], "eval": prompts[:held_out]}
    splits = []
    for name, pool in pools.items():
        rng = random.Random(f"synthetic-{name}:{seed}")
        questions = [rng.choice(pool) for _ in range(size)]
        splits.append([{"question": q, "answer": q.split()[0]} for q in questions])
    return splits[0], splits[1]
