"""On-policy distillation: the KL forms, the teacher's scoring, and a student that learns from it."""

from __future__ import annotations

import json
import math

import attrs
import pytest
import torch

from trainer.batch import Batch
from trainer.config import ConfigError, TrainerConfig
from trainer.distill import Teacher, position_logprobs, sampled_kl, top_k_tail_kl
from trainer.precision import Precision
from trainer.rollout import Generation

# --- the KL forms against a direct computation ------------------------------------------


def _distributions(seed: int, vocab: int = 7, positions: int = 5):
    g = torch.Generator().manual_seed(seed)
    student = torch.log_softmax(torch.randn(positions, vocab, generator=g, dtype=torch.float64) * 2, dim=-1)
    teacher = torch.log_softmax(torch.randn(positions, vocab, generator=g, dtype=torch.float64) * 2, dim=-1)
    return student, teacher


def _expected_over_samples(kl_of_token, student):
    """sum_y q(y) kl(y) at each position: the estimator's expectation, exactly."""
    vocab = student.shape[-1]
    values = torch.stack([kl_of_token(torch.full(student.shape[:1], y)) for y in range(vocab)], dim=-1)
    return (student.exp() * values).sum(dim=-1)


def test_sampled_token_kl_is_unbiased_for_the_reverse_kl():
    student, teacher = _distributions(0)
    rows = torch.arange(student.shape[0])

    def kl(y):
        return sampled_kl(student[rows, y], teacher[rows, y])

    direct = (student.exp() * (student - teacher)).sum(dim=-1)  # KL(q || p)
    torch.testing.assert_close(_expected_over_samples(kl, student), direct)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_top_k_tail_kl_is_unbiased_for_the_folded_reverse_kl_and_bounded_by_the_full_one(k):
    student, teacher = _distributions(1)
    rows = torch.arange(student.shape[0])
    top_ids = teacher.topk(k, dim=-1).indices  # (N, K), the teacher's top-k
    student_top, teacher_top = student.gather(-1, top_ids), teacher.gather(-1, top_ids)

    def kl(y):
        return top_k_tail_kl(student[rows, y], teacher[rows, y], y, top_ids, student_top, teacher_top)

    # the (K+1)-category distributions, folded by hand
    q = torch.cat([student_top.exp(), 1 - student_top.exp().sum(-1, keepdim=True)], dim=-1)
    p = torch.cat([teacher_top.exp(), 1 - teacher_top.exp().sum(-1, keepdim=True)], dim=-1)
    folded = (q * (q.log() - p.log())).sum(dim=-1)
    full = (student.exp() * (student - teacher)).sum(dim=-1)
    torch.testing.assert_close(_expected_over_samples(kl, student), folded)
    assert (folded <= full + 1e-12).all()


def test_top_k_over_the_whole_vocabulary_is_the_sampled_token_kl():
    student, teacher = _distributions(2)
    rows = torch.arange(student.shape[0])
    top_ids = teacher.topk(student.shape[-1], dim=-1).indices
    y = torch.tensor([0, 3, 6, 2, 1])
    folded = top_k_tail_kl(student[rows, y], teacher[rows, y], y, top_ids,
                           student.gather(-1, top_ids), teacher.gather(-1, top_ids))
    torch.testing.assert_close(folded, sampled_kl(student[rows, y], teacher[rows, y]))


# --- the teacher's scoring ---------------------------------------------------------------

OPD = dict(teacher_model="tiny-random", use_kl_in_reward=True, advantage_estimator="no_op",
           policy_loss_type="importance_sampling")


def _batch(tokenizer):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, len(tokenizer), (n,), generator=g).tolist() for n in (4, 2, 5)]
    responses = [torch.randint(3, len(tokenizer), (n,), generator=g).tolist() for n in (3, 5, 1)]
    generation = Generation.from_rows(responses, stopped=[True] * 3, pad_id=tokenizer.pad_token_id, device="cpu")
    return Batch.from_generation(prompts, generation, n=1, pad_id=tokenizer.pad_token_id, device="cpu"), \
        prompts, responses


def test_position_logprobs_match_the_models_own_softmax():
    from trainer.models import load_model_and_tokenizer

    torch.set_num_threads(1)
    cfg = TrainerConfig(seed=5)
    model, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype="float32")
    batch, prompts, responses = _batch(tokenizer)
    at_ids = torch.randint(0, len(tokenizer), (*batch.response_ids.shape, 2))
    got = position_logprobs(model, batch, 0.8, top_k=3, at_ids=at_ids, micro_batch_size=2,
                            precision=Precision(torch.device("cpu"), torch.float32), chunk_tokens=2)
    with torch.no_grad():
        for row, (prompt, response) in enumerate(zip(prompts, responses)):
            ids = torch.tensor([prompt + response])
            logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1] / 0.8
            direct = torch.log_softmax(logits, dim=-1)  # (r, V)
            r = len(response)
            torch.testing.assert_close(got["sampled"][row, :r], direct.gather(-1, ids[0, len(prompt):, None])[:, 0])
            top = direct.topk(3, dim=-1)
            torch.testing.assert_close(got["top_logprobs"][row, :r], top.values)
            assert torch.equal(got["top_ids"][row, :r], top.indices)
            torch.testing.assert_close(got["at"][row, :r], direct.gather(-1, at_ids[row, :r]))
            assert not got["sampled"][row, r:].any() and not got["top_logprobs"][row, r:].any()


def test_the_same_model_as_teacher_gives_zero_kl():
    from trainer.models import load_model_and_tokenizer

    cfg = TrainerConfig(**OPD, seed=5, teacher_top_k=2)
    student, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype="float32")
    teacher = Teacher(cfg, student_tokenizer=tokenizer, device=torch.device("cpu"),
                      precision=Precision(torch.device("cpu"), torch.float32))
    assert not torch.equal(next(teacher.model.parameters()), next(student.parameters()))  # its own seed
    teacher.model = student
    batch, _, _ = _batch(tokenizer)
    for top_k in (0, 2):
        teacher.cfg = attrs.evolve(cfg, teacher_top_k=top_k)
        kl, metrics = teacher.token_kl(batch, student)
        assert kl.abs().max() < 1e-5 and abs(metrics["distill/token_kl_mean"]) < 1e-5
        assert metrics["teacher/chosen_logprob_mean"] < 0


def test_a_teacher_with_another_tokenizer_is_refused_naming_both(tmp_path):
    from trainer.models import load_model_and_tokenizer

    other, other_tokenizer = load_model_and_tokenizer(TrainerConfig(dataset="gsm8k"), device="cpu", dtype="float32")
    other.save_pretrained(tmp_path / "bytes")
    other_tokenizer.save_pretrained(tmp_path / "bytes")
    cfg = TrainerConfig(**{**OPD, "teacher_model": str(tmp_path / "bytes")})
    _, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype="float32")
    with pytest.raises(ConfigError, match=r"teacher_model: the teacher '.*bytes' has a different tokenizer from "
                                          r"the student 'tiny-random' \(\d+ vs 8 tokens\)"):
        Teacher(cfg, student_tokenizer=tokenizer, device=torch.device("cpu"),
                precision=Precision(torch.device("cpu"), torch.float32))


@pytest.mark.parametrize("change, key", [
    (dict(teacher_model="tiny-random"), "use_kl_in_reward"),
    (dict(use_kl_in_reward=True), "use_kl_in_reward"),
    (dict(OPD, advantage_estimator="grpo"), "advantage_estimator"),
])
def test_opd_knobs_that_do_not_fit_together_are_refused(change, key):
    with pytest.raises(ConfigError, match=f"^{key}: "):
        TrainerConfig(**change)


# --- a student that learns from a trained teacher -----------------------------------------

LEARN = dict(model="tiny-random", dataset="synthetic", device="cpu", backend="static", train_batch_size=16,
             policy_mini_batch_size=16, n_samples_per_prompt=8, micro_train_batch_size_per_gpu=128,
             micro_forward_batch_size_per_gpu=128, max_generate_length=8, epochs=10, eval_before_train=False,
             eval_limit=16, progress_bar=False)


@pytest.fixture(scope="module")
def trained_teacher(tmp_path_factory):
    """A tiny model GRPO-trained on the synthetic task (reward about 0.9): its export/."""
    from trainer.loop import train

    directory = tmp_path_factory.mktemp("teacher")
    last = train(TrainerConfig(**LEARN, lr=3e-3, max_steps=60, seed=42), ckpt_dir=directory,
                 metrics_path=directory / "metrics.jsonl", stdout=open("/dev/null", "w"))
    assert last["reward/mean"] >= 0.75, last
    return directory / "export"


@pytest.mark.slow
# top-k 3: 3 of the task's 8 tokens and a tail bucket, the folded KL.
@pytest.mark.parametrize("top_k", [0, 3])
def test_opd_halves_the_kl_and_lifts_a_fresh_student_to_the_teachers_reward(trained_teacher, tmp_path, top_k):
    from trainer.loop import train

    # lr 5e-3: the student reached 0.94-0.96 after 100 steps on each of four seeds, at either
    # top-k; at 1e-2 it ranged 0.45-0.91 (some seeds overshoot and fall back), so one seed's
    # result there moved with the machine's float rounding.
    reward_after = 0.8
    cfg = TrainerConfig(**LEARN, lr=5e-3, max_steps=100, seed=3, teacher_model=str(trained_teacher),
                        use_kl_in_reward=True, advantage_estimator="no_op", policy_loss_type="importance_sampling",
                        teacher_top_k=top_k, export_final=False)
    train(cfg, ckpt_dir=tmp_path / "student", metrics_path=tmp_path / "metrics.jsonl", stdout=open("/dev/null", "w"))
    rows = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    kl = [r["distill/token_kl_mean"] for r in rows]
    reward = [r["reward/mean"] for r in rows]
    assert all(math.isfinite(value) for value in kl) and all("timing/teacher" in r for r in rows)
    assert sum(reward[:3]) / 3 <= 0.3, reward[:3]
    assert sum(kl[-10:]) / 10 <= kl[0] / 2, (kl[0], kl[-10:])
    assert sum(reward[-10:]) / 10 >= reward_after, reward[-10:]
    # the teacher is not a checkpoint: nothing of it is in the student's directory
    assert not any("teacher" in path.name for path in (tmp_path / "student").rglob("*"))
