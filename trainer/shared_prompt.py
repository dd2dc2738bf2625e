"""The training forward with each group's prompt run once: its samples attend to one copy.

A GRPO step samples ``n`` responses per prompt, and the per-row forward
(:func:`trainer.forward.left_aligned`) runs the prompt once for each of them: with 256-token
prompts, 512-token responses and n = 4, a quarter of the body's tokens are prompt copies.
Here a group's rows become one row of the forward::

    [prompt | response 1 | response 2 | ... | response n | padding]

with each token at its own position (the prompt from 0, every response from the prompt's
length) and a mask in which the prompt is causal and a response sees the prompt and its own
earlier tokens, never another response. Every real token so sees exactly the keys it sees in
its own row, at the same positions: the log-probs are the per-row forward's, and so is the
gradient (the prompt's activations collect the sum of their samples' gradients, as the n
copies' did). Padding sees the prompt and itself, never a real token's query.

The mask goes to the attention as a 4-D mask that HF's mask builders pass through
unchanged, through an attention function registered for the call (:data:`ATTENTION`):

* on CUDA a flex-attention ``BlockMask``: blocks of 128 x 128 that no query may see are
  skipped, blocks all visible run without the mask, so attention costs what the per-row
  forward's causal attention costs;
* elsewhere a dense boolean mask for SDPA (the CPU, where flex attention has no backward).

The implementation is set only while the forward runs, so the shared forward does not
combine with gradient checkpointing (whose recompute runs in the backward, after it):
``trainer.setup`` turns it off there, and for FSDP runs.

A group is a run of adjacent rows that sample one prompt (:func:`prompt_groups`: the
batch's ``prompt_index``, else equal prompt tokens), so any slice of a batch (a scorer's
micro-batch that cuts a group) is laid out correctly, and a batch without repeated prompts
keeps the per-row forward.
"""

from __future__ import annotations

import contextlib
import itertools

import torch

from trainer.batch import Batch, host_to_device
from trainer.models import full_attention_only

#: The name the attention function is registered under in transformers' attention registry.
ATTENTION = "shared_prompt"
#: Flex attention's block: widths are padded to a multiple of it.
BLOCK = 128
#: Query rows whose dense mask is built at once when the block mask is summarised.
SUMMARY_ROWS = 2048


def prompt_groups(batch: Batch) -> list[int]:
    """Sizes of the runs of adjacent rows that sample the same prompt (the same
    ``prompt_index``, else the same prompt tokens), in row order (from the batch's
    :meth:`~trainer.batch.Batch.row_lengths`: no sync once they are read)."""
    if batch.size < 2:
        return [batch.size]
    return batch.row_lengths().groups()


def group_rows(sizes: list[int]) -> list[range]:
    """The rows of each group, from :func:`prompt_groups`' sizes."""
    bounds = list(itertools.accumulate(sizes, initial=0))
    return [range(begin, end) for begin, end in zip(bounds, bounds[1:])]


def supports(model) -> bool:
    """Whether ``model``'s attention can take the shared layout's mask: every layer full
    causal attention (a sliding window would need the window in the mask too)."""
    return full_attention_only(model.config)


class Layout:
    """A batch laid out one row per group: ``ids``, ``positions`` and ``segments`` (G, L)
    (0 the prompt, i the group's i-th response, -1 padding), and ``predictors`` (N,): for
    each sampled response token in row-major order of ``batch.response_mask``, the flat
    index (into G x L) of the hidden state that predicts it."""

    def __init__(self, batch: Batch, sizes: list[int], *, width_multiple: int = 1):
        device = batch.response_ids.device
        prompt_width = batch.prompt_ids.shape[1]
        response_width = batch.response_ids.shape[1]
        lengths = batch.row_lengths()
        prompt_lengths, ends = lengths.prompt, lengths.ends
        if min(prompt_lengths) < 1:
            raise ValueError("a row has an empty prompt: nothing predicts its first response token")
        rows = group_rows(sizes)
        widths = [prompt_lengths[group[0]] + sum(ends[b] for b in group) for group in rows]
        multiple = max(width_multiple, BLOCK)
        width = -(-max(widths) // multiple) * multiple
        row_width = prompt_width + response_width  # of the flat (B, P + R) ids
        source = torch.zeros(len(sizes), width, dtype=torch.long)  # padding reads flat index 0: any real id
        positions = torch.zeros(len(sizes), width, dtype=torch.long)
        segments = torch.full((len(sizes), width), -1, dtype=torch.int32)
        first = torch.empty(batch.size, dtype=torch.long)  # predicts response token 0: the prompt's last
        start = torch.empty(batch.size, dtype=torch.long)  # the column of response token 0
        for g, group in enumerate(rows):
            prompt = prompt_lengths[group[0]]
            source[g, :prompt] = group[0] * row_width + prompt_width - prompt + torch.arange(prompt)
            positions[g, :prompt] = torch.arange(prompt)
            segments[g, :prompt] = 0
            column = prompt
            for i, b in enumerate(group, start=1):
                end = ends[b]
                source[g, column : column + end] = b * row_width + prompt_width + torch.arange(end)
                positions[g, column : column + end] = prompt + torch.arange(end)
                segments[g, column : column + end] = i
                first[b], start[b] = g * width + prompt - 1, g * width + column
                column += end
        flat = torch.cat([batch.prompt_ids, batch.response_ids], dim=1).reshape(-1)
        self.width = width
        # Built on the host, copied without waiting for the device's queue.
        source, self.positions, self.segments, first, start = (
            host_to_device(t, device) for t in (source, positions, segments, first, start))
        self.ids = flat[source]
        predictors = start[:, None] - 1 + torch.arange(response_width, device=device)  # token j <- column j - 1
        predictors[:, 0] = first
        self.predictors = predictors.reshape(-1)[batch.kept_positions()]

    def dense_mask(self) -> torch.Tensor:
        """(G, 1, L, L) True where a query (row) may attend to a key (column)."""
        return self._allowed(0, self.width)[:, None]

    def _allowed(self, start: int, stop: int) -> torch.Tensor:
        """(G, stop - start, L) the mask's query rows ``start:stop``."""
        keys = torch.arange(self.width, device=self.segments.device)
        queries = keys[start:stop]
        key_segments = self.segments[:, None, :]  # (G, 1, L)
        return (keys[None, None, :] <= queries[None, :, None]) & (
            (key_segments == 0) | (key_segments == self.segments[:, start:stop, None]))

    def block_mask(self):
        """The mask as a flex-attention ``BlockMask`` over blocks of :data:`BLOCK`."""
        from torch.nn.attention.flex_attention import BlockMask

        blocks = self.width // BLOCK
        groups = self.segments.shape[0]
        partial, full = [], []
        step = max(BLOCK, SUMMARY_ROWS // BLOCK * BLOCK)
        for start in range(0, self.width, step):
            stop = min(start + step, self.width)
            tiles = self._allowed(start, stop).view(groups, (stop - start) // BLOCK, BLOCK, blocks, BLOCK)
            seen, whole = tiles.any(dim=4).any(dim=2), tiles.all(dim=4).all(dim=2)
            partial.append(seen & ~whole)
            full.append(whole)
        segments = self.segments

        def mask_mod(b, h, q, kv):
            key = segments[b, kv]
            return (kv <= q) & ((key == 0) | (key == segments[b, q]))

        def indices(chosen):  # (G, Qb, Kb) bool -> counts (G, 1, Qb) and the chosen blocks first (G, 1, Qb, Kb)
            order = torch.argsort(chosen.to(torch.int8), dim=-1, descending=True, stable=True)
            return chosen.sum(dim=-1, dtype=torch.int32)[:, None], order.to(torch.int32)[:, None]

        counts, chosen = indices(torch.cat(partial, dim=1))
        full_counts, full_chosen = indices(torch.cat(full, dim=1))
        return BlockMask.from_kv_blocks(counts, chosen, full_counts, full_chosen, BLOCK_SIZE=BLOCK,
                                        mask_mod=mask_mod, seq_lengths=(self.width, self.width))


def hidden(body, batch: Batch, sizes: list[int], *, width_multiple: int = 1, mask: str = "auto") -> torch.Tensor:
    """(N, H) the body's last hidden states that predict each of the N sampled response tokens
    (row-major over ``batch.response_mask``), from one forward over :class:`Layout`'s rows.
    ``mask``: 'flex', 'dense', or 'auto' (flex on CUDA)."""
    layout = Layout(batch, sizes, width_multiple=width_multiple)
    if mask == "auto":
        mask = "flex" if layout.ids.is_cuda else "dense"
    attention_mask = layout.block_mask() if mask == "flex" else layout.dense_mask()
    if width_multiple > 1:
        torch._dynamo.maybe_mark_dynamic(layout.ids, 0)  # as trainer.forward.response_hidden does
    with attention_implementation(body.config, ATTENTION):
        states = body(input_ids=layout.ids, position_ids=layout.positions, attention_mask=attention_mask,
                      use_cache=False).last_hidden_state  # (G, L, H)
    return states.reshape(-1, states.shape[-1])[layout.predictors]


@contextlib.contextmanager
def attention_implementation(config, name: str, function=None):
    """The model's attention implementation set to ``name`` for a block; ``function``
    (default :func:`attend`) is registered under it the first time."""
    _register(name, function or attend)
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


def attend(module, query, key, value, attention_mask, scaling=None, dropout: float = 0.0, **_):
    """transformers' attention-function signature: (B, Hq, L, D) queries, (B, Hkv, L, D) keys
    and values -> ((B, L, Hq, D), None), under a BlockMask or a dense boolean mask."""
    if dropout:
        raise ValueError("the shared-prompt forward has no attention dropout: set attention_dropout=0")
    grouped = query.shape[1] != key.shape[1]
    if isinstance(attention_mask, torch.Tensor):
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                               scale=scaling, enable_gqa=grouped)
    else:
        out = _flex()(query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=grouped)
    return out.transpose(1, 2).contiguous(), None


_COMPILED_FLEX = None


def _flex():
    """flex_attention itself inside a compiled region (the compiled layer fuses it), else a
    compiled copy (eager flex attention materialises every score), its shapes made dynamic
    once a second shape comes, so a scorer's changing widths do not compile each anew."""
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import flex_attention

    if torch.compiler.is_compiling():
        return flex_attention
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention)
    return _COMPILED_FLEX


_REGISTERED: set[str] = set()


def _register(name: str, function) -> None:
    if name not in _REGISTERED:
        from transformers import AttentionInterface

        AttentionInterface.register(name, function)
        _REGISTERED.add(name)
