r"""The MATH task: the last ``\boxed{...}``, math-verify equivalence, rows from disk, off-main-thread
grading, and one trainer step on a tiny MATH file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow
import pyarrow.parquet
import pytest

from test_data import CHAT_TEMPLATE
from trainer.config import TrainerConfig
from trainer.data import DataError, dataset_rows, math_rows
from trainer.math_reward import HARD_LIMIT_S, last_boxed, math_correct, math_format_reward, math_reward
from trainer.models import byte_tokenizer
from trainer.tasks import MATH_SUFFIX, load_task

REPO = Path(__file__).resolve().parents[1]

# (completion, reference answer, correct?)
CASES = [
    # fractions, and the forms one fraction takes
    (r"So the probability is $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}", True),
    (r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}", True),
    (r"\boxed{\frac12}", r"\dfrac{1}{2}", True),
    (r"\boxed{0.5}", r"\frac{1}{2}", True),
    (r"\boxed{1/2}", "0.5", True),
    (r"\boxed{\frac{2}{3}}", r"\frac{1}{2}", False),
    # intervals keep their open and closed ends
    (r"\boxed{(1, 3]}", "(1,3]", True),
    (r"\boxed{[1,3]}", "(1,3]", False),
    (r"\boxed{(-\infty, 2)}", r"(-\infty,2)", True),
    # text answers
    (r"The answer is \boxed{\text{Evelyn}}.", r"\text{Evelyn}", True),
    (r"\boxed{\text{(C)}}", r"\text{(C)}", True),
    (r"\boxed{\text{(D)}}", r"\text{(C)}", False),
    (r"\boxed{\text{even}}", r"\text{odd}", False),
    # no box: no answer, whatever the text says
    ("The answer is 1/2.", r"\frac{1}{2}", False),
    ("#### 4", "4", False),
    (r"\boxed{}", "4", False),
    # nested braces inside the box
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}", True),
    (r"\boxed{\{1, 2\}}", r"\{2,1\}", True),
    (r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}", r"\begin{pmatrix}1\\2\end{pmatrix}", True),
    # several boxes: the last counts, and a last box cut off is no answer
    (r"First \boxed{3}; no, recount: \boxed{4}", "4", True),
    (r"First \boxed{3}; no, recount: \boxed{4}", "3", False),
    (r"\boxed{3} then \boxed{4", "3", False),
    # other spellings of the box
    (r"\fbox{7}", "7", True),
    (r"so $\boxed 5$.", "5", True),
    # algebra, wrong answers
    (r"\boxed{x^2+2x+1}", "(x+1)^2", True),
    (r"\boxed{3\sqrt{2}}", r"\sqrt{18}", True),
    (r"\boxed{\sqrt{2}}", "2", False),
    (r"\boxed{5}", "4", False),
    (r"\boxed{-4}", "4", False),
]


@pytest.mark.parametrize("completion, answer, correct", CASES)
def test_reward_table(completion, answer, correct):
    assert math_correct(completion, answer) is correct
    assert math_reward(completion, answer) == (1.0 if correct else 0.0)


@pytest.mark.parametrize("text, boxed", [
    (r"a \boxed{1} b \boxed{\frac{1}{2}} c", r"\frac{1}{2}"),
    (r"\boxed{\boxed{3}}", r"\boxed{3}"),  # a box inside a box belongs to the outer one
    (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces are text, not groups
    (r"\boxed {12}", "12"),
    (r"\boxedx{1}", None),  # another command, not a box
    (r"\boxed{1", None),
    ("no box", None),
])
def test_last_boxed_matches_braces(text, boxed):
    assert last_boxed(text) == boxed


def test_format_reward_credits_a_closed_box_only():
    assert math_format_reward(r"\boxed{wrong}") == 1.0
    assert math_format_reward(r"\boxed{ }") == 0.0
    assert math_format_reward(r"\boxed{3} \boxed{4") == 0.0
    assert math_format_reward("4") == 0.0


def test_reward_off_the_main_thread_grades_as_on_it():
    on_main = [math_correct(completion, answer) for completion, answer, _ in CASES]
    with ThreadPoolExecutor(max_workers=4) as pool:
        off_main = list(pool.map(lambda case: (threading.current_thread() is threading.main_thread(),
                                               math_correct(case[0], case[1])), CASES))
    assert not any(main for main, _ in off_main)
    assert [correct for _, correct in off_main] == on_main == [correct for _, _, correct in CASES]


def test_a_check_that_never_ends_is_graded_wrong_in_bounded_time_off_the_main_thread():
    # Comparing 10^(10^10) with anything keeps sympy busy for ever; math-verify's alarm stops it
    # in the helper process, where a thread's own check could not have set one.
    result = {}

    def grade():
        start = time.monotonic()
        result["correct"] = math_correct(r"\boxed{10^{10^{10}}}", "3")
        result["seconds"] = time.monotonic() - start

    worker = threading.Thread(target=grade)
    worker.start()
    worker.join(timeout=HARD_LIMIT_S + 30)
    assert not worker.is_alive()
    assert result["correct"] is False and result["seconds"] < HARD_LIMIT_S
    assert math_correct(r"\boxed{3}", "3")  # the helper still answers afterwards


# -- rows and the task ------------------------------------------------------------------------

ROWS = [
    {"problem": "What is $1+1$?", "solution": r"Adding, $1+1=\boxed{2}$."},
    {"problem": "Simplify $\\frac{2}{4}$.", "solution": r"Try \boxed{\frac{2}{4}}; reduced: $\boxed{\frac{1}{2}}$."},
    {"problem": "Which is odd, 3 or 4?", "solution": r"$\boxed{\text{3}}$", "level": "Level 1"},
]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_rows_from_a_directory_of_jsonl_splits_take_the_last_box_of_the_solution(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "test.jsonl", ROWS[:1])
    assert math_rows(str(tmp_path), "train") == [
        {"question": "What is $1+1$?", "answer": "2"},
        {"question": "Simplify $\\frac{2}{4}$.", "answer": r"\frac{1}{2}"},
        {"question": "Which is odd, 3 or 4?", "answer": r"\text{3}"},
    ]
    assert dataset_rows(str(tmp_path), "test") == ("math", [{"question": "What is $1+1$?", "answer": "2"}])


def test_rows_from_one_parquet_file_prefer_the_answer_field(tmp_path):
    # MATH-500's layout: the answer itself next to the solution; numbers are answers too.
    rows = [{"problem": "p1", "solution": r"\boxed{\dfrac{1}{2}}", "answer": r"\frac12"},
            {"problem": "p2", "solution": "no box here", "answer": "7"}]
    path = tmp_path / "math500.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    assert math_rows(str(path), "train") == math_rows(str(path), "test") == [
        {"question": "p1", "answer": r"\frac12"}, {"question": "p2", "answer": "7"}]
    write_jsonl(tmp_path / "numbers.jsonl", [{"problem": "p", "answer": 12}])
    assert math_rows(str(tmp_path / "numbers.jsonl"), "train") == [{"question": "p", "answer": "12"}]


@pytest.mark.parametrize("bad_row, message", [
    ({"problem": "p", "solution": "it is 4"}, r"bad\.jsonl:2: solution has no closed \\boxed\{\.\.\.\}"),
    ({"problem": "p", "solution": r"\boxed{4"}, r"bad\.jsonl:2: solution has no closed"),
    ({"problem": "p"}, r"bad\.jsonl:2: neither an 'answer' nor a 'solution'"),
    ({"problem": "", "answer": "4"}, r"bad\.jsonl:2: field 'problem' missing"),
    ({"problem": "p", "answer": ""}, r"bad\.jsonl:2: field 'answer' is not a non-empty string"),
    ({"question": "q", "answer": "#### 4"}, r"bad\.jsonl:2: field 'problem' missing"),
])
def test_a_bad_math_row_names_its_file_and_line(tmp_path, bad_row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(bad_row) + "\n")
    with pytest.raises(DataError, match=message):
        dataset_rows(str(path), "train")


def test_the_name_math_asks_for_a_local_copy():
    with pytest.raises(DataError, match=r"'math' is read from a local copy only; pass the path"):
        load_task(TrainerConfig(dataset="math"), byte_tokenizer())


def test_rows_with_a_problem_make_the_math_task_with_boxed_prompts_and_shaped_rewards(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "test.jsonl", ROWS)
    cfg = TrainerConfig(dataset=str(tmp_path), eval_limit=2, format_reward_coef=0.1)
    tokenizer = byte_tokenizer()
    plain = load_task(cfg, tokenizer)
    assert len(plain.train) == 3 and len(plain.eval) == 2
    assert plain.train[0].prompt == f"Problem: What is $1+1$?\n\n{MATH_SUFFIX}\nSolution:"
    assert MATH_SUFFIX.endswith(r"within \boxed{}.")
    half = plain.train[1]
    assert plain.reward(r"Reduce: \boxed{0.5}", half) == 1.0 and plain.is_correct(r"\boxed{0.5}", half)
    assert plain.reward(r"\boxed{\frac{1}{3}}", half) == pytest.approx(0.1)  # boxed but wrong
    assert not plain.is_correct(r"\boxed{\frac{1}{3}}", half)
    assert plain.reward("1/2", half) == 0.0  # right, but not boxed
    tokenizer.chat_template = CHAT_TEMPLATE
    chat = load_task(cfg, tokenizer)
    assert chat.train[2].prompt == (
        f"<|im_start|>user\nWhich is odd, 3 or 4?\n\n{MATH_SUFFIX}<|im_end|>\n<|im_start|>assistant\n")


def test_splits_of_two_tasks_are_refused(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "test.jsonl", [{"question": "q", "answer": "#### 4"}])
    with pytest.raises(DataError, match=r"test\.jsonl:1: field 'problem' missing"):
        load_task(TrainerConfig(dataset=str(tmp_path)), byte_tokenizer())


# -- end to end -----------------------------------------------------------------------------

def test_trainer_runs_one_step_on_a_tiny_math_file(tmp_path):
    data = tmp_path / "math"
    data.mkdir()
    write_jsonl(data / "train.jsonl", ROWS + ROWS)
    write_jsonl(data / "test.jsonl", ROWS)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model": "tiny-random", "dataset": str(data), "train_batch_size": 2, "policy_mini_batch_size": 2,
        "n_samples_per_prompt": 2, "max_prompt_length": 64, "max_generate_length": 8, "max_steps": 1,
        "eval_limit": 2, "eval_n_samples_per_prompt": 2, "format_reward_coef": 0.1, "export_final": False,
        "device": "cpu"}))
    result = subprocess.run(
        [sys.executable, "-m", "trainer", str(config), "--ckpt-dir", str(tmp_path / "ckpt"),
         "--metrics", str(tmp_path / "metrics.jsonl")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in records] == [("info", 0), ("eval", 0), ("train", 1), ("eval", 1)]
    train = records[2]
    assert train["throughput/tokens_generated"] > 0 and 0 <= train["reward/mean"] <= 1
    assert (tmp_path / "ckpt" / "global_step_1" / "model.safetensors").is_file()
