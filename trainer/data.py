"""GSM8K and MATH rows from disk or the hub, the Example value, and the resumable prompt sampler.

A source is one of

* a directory holding ``<split>.jsonl`` or ``<split>.parquet`` (or the hub's layout,
  ``[main/]<split>-00000-of-00001.parquet``);
* a single ``.jsonl`` / ``.parquet`` file, which then serves every split;
* ``"gsm8k"`` / ``"openai/gsm8k"``: the hub's ``main`` config, downloaded once into the
  HF cache; with ``HF_HUB_OFFLINE=1`` only an already cached copy is used.

What the rows hold says which task they are (:func:`dataset_rows`), so a path needs no
second key naming its task:

* GSM8K rows have ``question`` and ``answer``, the answer ending in ``#### <number>``;
* MATH rows have ``problem`` and either ``answer`` (the reference answer itself, as
  MATH-500 has it) or ``solution``, whose last ``\\boxed{...}`` is the reference answer
  (Hendrycks MATH); ``answer`` wins when a row has both. Only local MATH copies are read:
  ``"math"`` (:data:`MATH_NAMES`) names the task, and the error says to pass a path.

Every row is checked as it is read; the first bad one stops the load, naming its file and
line (jsonl) or row (parquet). Rows come out as ``{"question", "answer"}`` for either task.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Iterator, Sequence

import attrs

from trainer.math_reward import last_boxed
from trainer.rewards import parse_gold

HUB_NAMES = ("gsm8k", "openai/gsm8k")
MATH_NAMES = ("math",)
HUB_REPO = "openai/gsm8k"
HUB_CONFIG = "main"


class DataError(ValueError):
    """A dataset cannot be read; the message names the file and line or row."""


@attrs.frozen(kw_only=True)
class Example:
    """One prompt: the rendered ``prompt`` text, the gold ``answer`` (a GSM8K answer field
    or a bare number) and the raw ``question``."""

    prompt: str
    answer: str
    question: str


def gsm8k_rows(source: str, split: str) -> list[dict]:
    """The ``{"question", "answer"}`` rows of ``split`` from a path or the hub name."""
    return dataset_rows(source, split, task="gsm8k")[1]


def math_rows(source: str, split: str) -> list[dict]:
    """The ``{"question", "answer"}`` rows of a MATH ``split`` (``answer``: the reference answer)."""
    return dataset_rows(source, split, task="math")[1]


def dataset_rows(source: str, split: str, *, task: str | None = None) -> tuple[str, list[dict]]:
    """``(task, rows)`` of ``split``: the task the rows' fields say (``"gsm8k"`` or ``"math"``),
    or ``task`` when given, every row then checked against it."""
    if source in HUB_NAMES:
        path = _split_file(_hub_snapshot(), split)
        task = task or "gsm8k"
    elif source in MATH_NAMES:
        raise DataError(f"dataset: {source!r} is read from a local copy only; pass the path of a "
                        f"directory holding train/test .jsonl or .parquet with problem and solution "
                        f"(or answer) fields, or of one such file (dataset=/path/to/math)")
    else:
        path = Path(source)
        if not path.exists():
            raise DataError(f"dataset: {source!r} is neither 'synthetic', 'gsm8k' nor an existing path")
        if not path.is_file():
            path = _split_file(path, split)
    rows = _raw_rows(path)
    task = task or _task_of(*rows[0])
    check = _checked_math if task == "math" else _checked_gsm8k
    return task, [check(where, row) for where, row in rows]


def _task_of(where: str, row) -> str:
    if isinstance(row, dict) and "problem" in row:
        return "math"
    if isinstance(row, dict) and "question" in row:
        return "gsm8k"
    raise DataError(f"{where}: expected an object with 'question' and 'answer' (GSM8K) or 'problem' "
                    f"and 'solution' or 'answer' (MATH)")


def _split_file(directory: Path, split: str) -> Path:
    candidates = [directory / f"{split}.jsonl", directory / f"{split}.parquet"]
    for base in (directory, directory / HUB_CONFIG):
        candidates += sorted(base.glob(f"{split}-*.parquet"))
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise DataError(f"dataset: {directory} has no {split}.jsonl, {split}.parquet "
                    f"or {split}-*.parquet for split {split!r}")


def _raw_rows(path: Path) -> list[tuple[str, object]]:
    if path.suffix == ".jsonl":
        rows = _read_jsonl(path)
    elif path.suffix == ".parquet":
        import pyarrow.parquet

        table = pyarrow.parquet.read_table(path)
        rows = [(f"{path}: row {i}", row) for i, row in enumerate(table.to_pylist())]
    else:
        raise DataError(f"dataset: {path} is neither .jsonl nor .parquet")
    if not rows:
        raise DataError(f"dataset: {path} holds no rows")
    return rows


def _read_jsonl(path: Path) -> list[tuple[str, object]]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rows.append((f"{path}:{number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON: {exc.msg}") from None
    return rows


def _checked_gsm8k(where: str, row) -> dict:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with 'question' and 'answer'")
    for key in ("question", "answer"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise DataError(f"{where}: field {key!r} missing or not a non-empty string")
    if "####" not in row["answer"]:
        raise DataError(f"{where}: answer has no '#### <number>' line")
    try:
        parse_gold(row["answer"])
    except ValueError as exc:
        raise DataError(f"{where}: {exc}") from None
    return {"question": row["question"], "answer": row["answer"]}


def _checked_math(where: str, row) -> dict:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with 'problem' and 'solution' or 'answer'")
    problem = row.get("problem")
    if not isinstance(problem, str) or not problem.strip():
        raise DataError(f"{where}: field 'problem' missing or not a non-empty string")
    answer = row.get("answer")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if answer is not None and (not isinstance(answer, str) or not answer.strip()):
        raise DataError(f"{where}: field 'answer' is not a non-empty string or a number")
    if answer is None:
        solution = row.get("solution")
        if not isinstance(solution, str) or not solution.strip():
            raise DataError(f"{where}: neither an 'answer' nor a 'solution' field (a non-empty string)")
        answer = last_boxed(solution)
        if answer is None or not answer.strip():
            raise DataError(f"{where}: solution has no closed \\boxed{{...}} to take the answer from")
    return {"question": problem, "answer": answer.strip()}


def _hub_snapshot() -> Path:
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        root = huggingface_hub.snapshot_download(
            HUB_REPO, repo_type="dataset", allow_patterns=[f"{HUB_CONFIG}/*"],
            local_files_only=offline)
    except LocalEntryNotFoundError:
        raise DataError(
            "dataset: 'gsm8k' is not in the HF cache and HF_HUB_OFFLINE is set; pass the path of "
            "a directory holding train/test .jsonl or .parquet (dataset=/path/to/gsm8k)") from None
    except Exception as exc:  # network or hub errors: the fix is the same for all of them
        raise DataError(f"dataset: cannot download {HUB_REPO} ({exc}); pass a local path instead") from None
    return Path(root) / HUB_CONFIG


class PromptSampler:
    """Batches of examples, reshuffled every epoch from ``seed``; resumable exactly.

    A batch never spans two epochs: the last ``len(examples) % batch_size`` examples of
    each epoch's order are skipped (a different tail each epoch). ``state_dict()`` is the
    position of the next batch; a sampler loaded with it yields what the original would.
    """

    def __init__(self, examples: Sequence, batch_size: int, *, seed: int):
        if batch_size > len(examples):
            raise DataError(f"train_batch_size: {batch_size} is more than the "
                            f"{len(examples)} training examples")
        self.examples = list(examples)
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.index = 0
        self._order = self._order_of(0)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.examples) // self.batch_size

    def _order_of(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(f"prompt-sampler:{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self) -> list:
        """The next ``batch_size`` examples, moving to the next epoch when one is used up."""
        if self.index + self.batch_size > len(self.examples):
            self.epoch += 1
            self.index = 0
            self._order = self._order_of(self.epoch)
        batch = [self.examples[i] for i in self._order[self.index: self.index + self.batch_size]]
        self.index += self.batch_size
        return batch

    def __iter__(self) -> Iterator[list]:
        """Batches without end; the caller stops (after epochs * steps_per_epoch or max_steps)."""
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        missing = {"epoch", "index"} - set(state)
        if missing:
            raise DataError(f"sampler state: missing {sorted(missing)}")
        epoch, index = state["epoch"], state["index"]
        if not (isinstance(epoch, int) and epoch >= 0 and isinstance(index, int)
                and 0 <= index <= len(self.examples) and index % self.batch_size == 0):
            raise DataError(f"sampler state: bad position epoch={epoch!r} index={index!r} for "
                            f"{len(self.examples)} examples in batches of {self.batch_size}")
        self.epoch, self.index = epoch, index
        self._order = self._order_of(epoch)
