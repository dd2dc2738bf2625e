"""Micro-batches of the update packed by tokens, within the memory the device can give.

A micro-batch's activation memory grows with its padded tokens (rows x the longest
row's width), not with its row count: 8 rows of 768 tokens hold as much as 24 of 256.
So unless ``micro_train_batch_size_per_gpu`` names a row count, the update cuts each
mini-batch (rows sorted longest first, as :mod:`trainer.update` does) into micro-batches
of at most :attr:`Packing.tokens` padded tokens each, shorter rows going more to a
micro-batch. The gradient is the same however rows are cut: every micro-batch's loss is
normalised by its whole mini-batch's totals (``tests/test_packing.py`` compares packed and
unpacked updates in fp64).

The token budget is, fastest first:

* ``micro_train_tokens_per_gpu`` when set;
* else on a GPU: what the memory budget leaves after what the update holds anyway
  (weights, gradients, AdamW's moments, the engine's cache, all measured or counted when
  the first update starts) over an activation cost per token counted from the model's
  shape (:func:`activation_bytes_per_token`, which errs high), at most
  :data:`SATURATING_TOKENS`: on an H200 the 0.5B update's step time stops falling there
  (micro-batch 32 x 768 tokens: 1.49 s; 128: 1.47 s, at 3x the memory);
* else (CPU): :data:`CPU_TOKENS`.

The memory budget is ``train_memory_gb``, else 90 % of the device's memory, at most
:data:`DEFAULT_MEMORY_GB` (an A100-64GB's worth with room for the CUDA context): the
default run fits the cards the seeds' clusters have, whatever card it is measured on.

Row counts of 8 and more are rounded down to a multiple of 8, so a compiled body meets
few shapes (:data:`trainer.forward.COMPILED_SHAPES`).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

#: Padded tokens a micro-batch need not exceed: more buys no speed (see the module doc).
SATURATING_TOKENS = 32768
#: The token budget on the CPU, where memory is no constraint and micro-batches are small.
CPU_TOKENS = 4096
#: The default memory budget's cap, in GB.
DEFAULT_MEMORY_GB = 56.0
#: The share of the device's memory the default budget takes.
DEVICE_SHARE = 0.9
#: Row counts from this on are multiples of it.
ROW_MULTIPLE = 8
GB = 1e9


@attrs.frozen(kw_only=True)
class Packing:
    """How one run cuts mini-batches: ``rows`` per micro-batch (an explicit count), or
    ``tokens``, the padded tokens a micro-batch may hold; ``why`` says where it came from."""

    rows: int | None = None
    tokens: int | None = None
    why: str = ""

    def cut(self, widths: Sequence[int], *, unit_rows: Sequence[int] | None = None) -> list[int]:
        """How many units each successive micro-batch takes, over units of these padded
        ``widths``, longest first (each micro-batch's width is its first unit's). A unit is a
        row, or (``unit_rows``: the rows each holds) a group of rows that the shared-prompt
        forward lays out as one row: a count of rows is then met in whole groups, at least
        one, and a token budget counts each group's one row. Counts of single rows from
        :data:`ROW_MULTIPLE` on are rounded down to a multiple of it."""
        total, sizes, start = len(widths), [], 0
        while start < total:
            if self.rows is not None and unit_rows is not None:
                size, held = 1, unit_rows[start]
                while start + size < total and held + unit_rows[start + size] <= self.rows:
                    held += unit_rows[start + size]
                    size += 1
            elif self.rows is not None:
                size = self.rows
            else:
                size = max(1, self.tokens // max(1, widths[start]))
                if unit_rows is None and size >= ROW_MULTIPLE:
                    size -= size % ROW_MULTIPLE
            size = min(size, total - start)
            sizes.append(size)
            start += size
        return sizes

    def describe(self) -> str:
        size = f"{self.rows} rows" if self.rows is not None else f"up to {self.tokens} padded tokens"
        return f"{size} ({self.why})"


def activation_bytes_per_token(config) -> int:
    """Bytes a token of the update's forward keeps for its backward, counted from a HF
    config's shape in the compute dtype (2 bytes): per layer the MLP's four intermediate-
    wide tensors (gate, up, activation, product), six hidden-wide ones (norms, residuals,
    attention output) and the attention's q, k, v and output. Measured on an H200 the
    0.5B update kept about 1.05 MB a token, where this counts 1.30 MB."""
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    per_layer = 4 * config.intermediate_size + 6 * hidden + 2 * (heads * head_dim + 2 * kv * head_dim)
    return 2 * config.num_hidden_layers * per_layer


def held_bytes(model, optimizer, *, allocated: int) -> int:
    """What the update holds whatever its micro-batches: ``allocated`` now, plus the fp32
    gradients and AdamW's two moments if they are not allocated yet (the first update)."""
    params = [p for p in model.parameters() if p.requires_grad]
    elements = sum(p.numel() for p in params)
    missing = 0
    if any(p.grad is None for p in params):
        missing += 4 * elements
    if not optimizer.state:
        missing += 8 * elements
    return allocated + missing


def plan_packing(cfg, model, optimizer, device) -> Packing:
    """The run's :class:`Packing`, decided when its first update starts."""
    if cfg.micro_train_batch_size_per_gpu is not None:
        return Packing(rows=cfg.micro_train_batch_size_per_gpu, why="micro_train_batch_size_per_gpu")
    if cfg.micro_train_tokens_per_gpu is not None:
        return Packing(tokens=cfg.micro_train_tokens_per_gpu, why="micro_train_tokens_per_gpu")
    if device.type != "cuda":
        return Packing(tokens=CPU_TOKENS, why="the CPU's default")
    import torch

    total = torch.cuda.get_device_properties(device).total_memory
    share = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # a process capped to a smaller card
    if share is not None:
        total = int(total * share(device))
    budget = cfg.train_memory_gb * GB if cfg.train_memory_gb is not None \
        else min(DEVICE_SHARE * total, DEFAULT_MEMORY_GB * GB)
    held = held_bytes(model, optimizer, allocated=torch.cuda.memory_allocated(device))
    per_token = activation_bytes_per_token(model.config)
    tokens = int((budget - held) // per_token)
    if tokens < 1:
        raise MemoryError(f"train_memory_gb: the update holds {held / GB:.1f} GB before its first micro-batch, "
                          f"over the budget of {budget / GB:.1f} GB; raise train_memory_gb or use a smaller model")
    why = (f"{budget / GB:.1f} GB budget - {held / GB:.1f} GB held, over {per_token / 1e6:.2f} MB a token"
           + (f", capped at {SATURATING_TOKENS}" if tokens > SATURATING_TOKENS else ""))
    return Packing(tokens=min(tokens, SATURATING_TOKENS), why=why)
