"""A step's batch (trainer/batch.py): subsets of rows trimmed by lengths read from the device once."""

from __future__ import annotations

import attrs
import pytest
import torch

from trainer.batch import Batch, RowLengths
from trainer.config import TrainerConfig
from trainer.rollout import Generation


def batch_of(prompts, responses, *, n, prompt_index=True) -> Batch:
    generation = Generation.from_rows(responses, stopped=[True] * len(responses), pad_id=0, device="cpu")
    batch = Batch.from_generation(prompts, generation, n=n, pad_id=0, device="cpu")
    return batch if prompt_index else attrs.evolve(batch, prompt_index=None)


def three_prompts(**keys) -> Batch:
    """Prompts of 2, 5 and 1 tokens, two samples each: responses of 3, 1, 6, 2, 4 and 5 tokens
    (ids under 8: the built-in tiny model's vocabulary)."""
    return batch_of([[1, 2], [3, 4, 5, 6, 7], [6]],
                    [[7, 5, 7], [5], [7] * 6, [4, 3], [7] * 4, [2] * 5], n=2, **keys)


def test_lengths_are_read_once_from_the_masks():
    batch = three_prompts()
    assert batch.row_lengths() == RowLengths(prompt=(2, 2, 5, 5, 1, 1), ends=(3, 1, 6, 2, 4, 5),
                                             sampled=(3, 1, 6, 2, 4, 5), key=(0, 0, 1, 1, 2, 2))
    assert batch.row_lengths() is batch.row_lengths()
    # Without a prompt index, runs of equal prompts get one key.
    assert three_prompts(prompt_index=False).row_lengths().key == (0, 0, 1, 1, 2, 2)


@pytest.mark.parametrize("index", [slice(2, 4), slice(None), [5, 0, 3], [1]])
def test_a_subset_is_trimmed_and_knows_its_lengths_as_if_read(index):
    batch = three_prompts()
    subset = batch.rows(index)
    fresh = attrs.evolve(subset)  # built anew: its lengths are read from its own masks
    assert subset.row_lengths() == fresh.row_lengths()
    rows = list(range(batch.size)[index]) if isinstance(index, slice) else index
    lengths = fresh.row_lengths()
    assert subset.prompt_ids.shape[1] == max(lengths.prompt) and subset.response_ids.shape[1] == max(lengths.ends)
    assert torch.equal(subset.prompt_mask.sum(1), batch.prompt_mask[rows].sum(1))  # only padding was cut
    assert torch.equal(subset.response_ids, batch.response_ids[rows, : max(lengths.ends)])
    assert torch.equal(subset.prompt_index, batch.prompt_index[rows])


def test_an_empty_subset_has_no_lengths_and_no_columns():
    for keys in ({}, {"prompt_index": False}):
        empty = three_prompts(**keys).rows([])
        assert empty.size == 0 and empty.row_lengths() == RowLengths((), (), (), ())
        assert attrs.evolve(empty).row_lengths() == RowLengths((), (), (), ())


def test_a_changed_mask_is_never_described_by_the_old_lengths():
    batch = three_prompts()
    batch.row_lengths()
    mask = batch.response_mask.clone()
    mask[2, 3:] = 0
    changed = attrs.evolve(batch, response_mask=mask)
    assert changed.row_lengths().sampled == (3, 1, 3, 2, 4, 5)


def test_kept_positions_are_the_masks_sampled_tokens_row_major():
    batch = three_prompts().rows([2, 1, 4])
    expected = batch.response_mask.reshape(-1).nonzero()[:, 0]
    assert torch.equal(batch.kept_positions(), expected)


def test_an_update_reads_the_rows_lengths_once_however_many_micro_batches(monkeypatch):
    """Each read is a device sync; the update cuts every mini- and micro-batch from the one
    read at its start (a GPU test checks that the micro-batches' forward and backward make none)."""
    from trainer.models import load_model_and_tokenizer
    from trainer.packing import Packing
    from trainer.update import update_policy

    torch.set_num_threads(1)
    reads = []
    real = RowLengths.read.__func__
    counted = classmethod(lambda cls, batch: reads.append(batch.size) or real(cls, batch))
    monkeypatch.setattr(RowLengths, "read", counted)
    cfg = TrainerConfig(train_batch_size=3, policy_mini_batch_size=1, n_samples_per_prompt=2, max_generate_length=8)
    model, _ = load_model_and_tokenizer(cfg, device="cpu", dtype=torch.float32)
    model.share_prompts = True
    batch = attrs.evolve(three_prompts(), advantages=torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 1.0)
    stats = update_policy(model, optimizer, scheduler, batch, cfg, packing=Packing(rows=1, why="a row at a time"))
    assert stats["policy/optimizer_steps"] == 3  # three mini-batches of one group, six micro-batches
    assert reads == [6]
