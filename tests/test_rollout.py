"""Rollout engines: the registry, the HF engine's sampling contract, and vLLM's clear absence."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import trainer
from trainer.config import TrainerConfig
from trainer.models import load_model_and_tokenizer
from trainer.batch import left_pad
from trainer.names import BACKENDS
from trainer.rollout import ENGINES, BackendUnavailable, Generation, SamplingParams, make_engine, require_backend
from trainer.rollout.hf import HFEngine

NEAR_GREEDY = 1e-4  # temperature at which sampling is the argmax for any realistic logit gap


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer(TrainerConfig(seed=3), device="cpu", dtype="float32")
    return model, tokenizer


def prompts_of(tokenizer, *texts):
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def sample(engine, prompts, **overrides):
    args = dict(n=3, max_new_tokens=6, temperature=1.0, top_p=1.0, seed=0) | overrides
    return engine.generate(prompts, SamplingParams(**args)).token_lists()


def test_group_contiguous_completions_end_at_the_first_stop(policy):
    model, tokenizer = policy
    engine = HFEngine(model, tokenizer, device="cpu")
    out = engine.generate(prompts_of(tokenizer, "1 2 3 4", "0 0", "4 3 2 1 0 1"),
                          SamplingParams(n=5, max_new_tokens=7, seed=0))
    assert len(out) == 15
    assert out.logprobs is None and not engine.reports_logprobs
    eos = tokenizer.eos_token_id
    for tokens, stopped, ids in zip(out.token_lists(), out.stopped.tolist(), out.response_ids):
        assert 1 <= len(tokens) <= 7
        assert eos not in tokens[:-1]  # nothing after a stop
        assert stopped == (tokens[-1] == eos)
        assert stopped or len(tokens) == 7
        assert (ids[len(tokens):] == tokenizer.pad_token_id).all()
    assert set(out.stopped.tolist()) == {True, False}  # both happen at this size


def test_same_seed_same_samples_and_the_global_rng_untouched(policy):
    model, tokenizer = policy
    engine = HFEngine(model, tokenizer, device="cpu")
    prompts = prompts_of(tokenizer, "1 2 3 4", "0 0")
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = sample(engine, prompts, seed=11)
    assert torch.equal(torch.get_rng_state(), before)
    assert sample(engine, prompts, seed=11) == first
    assert sample(engine, prompts, seed=12) != first


def test_padding_and_chunking_do_not_change_what_a_prompt_gets(policy):
    model, tokenizer = policy
    short, long = prompts_of(tokenizer, "3", "1 2 3 4 0 1 2")
    alone = sample(HFEngine(model, tokenizer, device="cpu"), [short], n=1, temperature=NEAR_GREEDY)
    # One sequence per chunk, and the short prompt left-padded next to the long one.
    tiny_chunks = HFEngine(model, tokenizer, device="cpu", tokens_per_chunk=1)
    batched = sample(tiny_chunks, [long, short], n=2, temperature=NEAR_GREEDY)
    assert batched[2] == batched[3] == alone[0]
    assert batched[0] == batched[1]


def test_top_p_keeps_only_the_likeliest_tokens(policy):
    model, tokenizer = policy
    engine = HFEngine(model, tokenizer, device="cpu")
    prompt = prompts_of(tokenizer, "2 2 2")
    narrow = sample(engine, prompt, n=12, max_new_tokens=1, top_p=1e-6)
    wide = sample(engine, prompt, n=12, max_new_tokens=1)
    assert len({tuple(c) for c in narrow}) == 1
    assert len({tuple(c) for c in wide}) > 1


def test_sync_weights_accepts_only_the_policy_it_samples_from(policy):
    model, tokenizer = policy
    engine = make_engine(TrainerConfig(backend="hf"), model=model, tokenizer=tokenizer, device="cpu", max_rows=8)
    engine.sync_weights(model)
    engine.sleep()
    engine.wake()
    other, _ = load_model_and_tokenizer(TrainerConfig(seed=4), device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="another model"):
        engine.sync_weights(other)


def test_left_pad_layout():
    ids, mask = left_pad([[5], [6, 7, 8], [], [9, 4]], 0, "cpu")
    assert ids.tolist() == [[0, 0, 5], [6, 7, 8], [0, 0, 0], [0, 9, 4]]
    assert mask.tolist() == [[0, 0, 1], [1, 1, 1], [0, 0, 0], [0, 1, 1]]
    ids, mask = left_pad([], 0, "cpu")
    assert ids.shape == mask.shape == (0, 1)


def test_generations_from_rows_and_concatenated_keep_rows_and_padding():
    one = Generation.from_rows([[5, 6, 7], [8]], stopped=[True, False], pad_id=0, device="cpu",
                               logprobs=[[-1.0, -2.0, -3.0], [-0.5]])
    two = Generation.from_rows([[9, 9, 9, 9, 9]], stopped=[False], pad_id=0, device="cpu", logprobs=[[-1.0] * 5])
    both = Generation.concat([one, two], pad_id=0)
    assert both.token_lists() == [[5, 6, 7], [8], [9, 9, 9, 9, 9]]
    assert both.response_ids.tolist()[1] == [8, 0, 0, 0, 0]
    assert both.stopped.tolist() == [True, False, False]
    assert both.logprobs[1].tolist() == [-0.5, 0.0, 0.0, 0.0, 0.0]


def test_every_configurable_backend_is_registered():
    assert set(BACKENDS.choices()) == set(ENGINES) | {"auto"}
    with pytest.raises(ValueError, match="unknown rollout backend 'nope'"):
        make_engine(TrainerConfig(), model=None, tokenizer=None, device="cpu", max_rows=1, backend="nope")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_backend_without_vllm_says_so():
    with pytest.raises(BackendUnavailable, match=r"vllm package.*backend='hf'"):
        require_backend("vllm")
    require_backend("hf")


def test_nothing_imports_vllm_unless_selected():
    # vLLM is not installed here, so an import of it anywhere would fail these imports outright.
    import trainer.checkpoint, trainer.cli, trainer.loop, trainer.metrics  # noqa: E401, F401

    assert "trainer.rollout.vllm" not in sys.modules and "vllm" not in sys.modules


def module_imports(root: Path) -> dict[str, set[str]]:
    """Each module of the package at ``root`` -> the package's modules it imports when it is
    imported (module-level statements; imports inside functions run later, when called)."""
    files = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        imported = set()
        for statement in ast.parse(path.read_text()).body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for node in ast.walk(statement):
                if isinstance(node, ast.Import):
                    imported |= {alias.name for alias in node.names if alias.name in files}
                elif isinstance(node, ast.ImportFrom) and node.module in files:
                    submodules = {f"{node.module}.{alias.name}" for alias in node.names} & files.keys()
                    # ``from package import module`` imports the module (the package is its parent, no edge)
                    imported |= submodules if len(submodules) == len(node.names) else {node.module}
        graph[name] = imported - {name}
    return graph


def test_no_two_trainer_modules_import_each_other():
    graph = module_imports(Path(trainer.__file__).parent)
    assert "trainer.rollout.split_kv" in graph["trainer.rollout.fused_attention"]
    circles = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        for imported in graph[name]:
            if imported in path:
                circles.append(path[path.index(imported):] + (imported,))
            elif imported not in done:
                visit(imported, path + (imported,))
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, (name,))
    assert circles == []
