"""The policy's forward over a batch: log-probs (and entropies) of the sampled tokens.

:func:`response_logprobs` is the training path: it shifts each row's tokens to
the left edge (:func:`left_aligned`), so padding only ever trails and plain
causal attention is exact: no mask is built and SDPA takes its flash kernel. It
runs the transformer body once, keeps the hidden states of the response tokens
only (none of the prompt, none of the padding), and hands them with the lm_head
weight to :func:`trainer.logprobs.linear_logprobs`, which computes log-probs and
entropies chunk by chunk without ever holding (tokens x vocabulary) logits.
With the model's ``share_prompts`` (set from the config), rows that sample one prompt run
it once instead (:mod:`trainer.shared_prompt`): one row per group, under a mask.
:func:`response_logits` is the plain path (full logits through the HF head), kept
for models without a separate body and head and as the reference the tests
compare against.

Scorers (:class:`PolicyScorer`) share one shape, ``score(batch) -> (B, R)``: the
old policy, the frozen reference and (later) a teacher are each one of them.
"""

from __future__ import annotations

import contextlib

import torch

from trainer import shared_prompt
from trainer.batch import Batch
from trainer.logprobs import linear_logprobs
from trainer.losses import entropy_from_logits, token_logprobs
from trainer.models import full_attention_only


def model_inputs(model, batch: Batch):
    """input ids, the attention mask (see :func:`padded_attention`) and positions for a batch."""
    input_ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)  # (b, P+R)
    attention = torch.cat([batch.prompt_mask, batch.response_mask.long()], dim=1)
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)  # left padding shifts positions
    return input_ids, padded_attention(model, attention), positions


def response_logprobs(model, batch: Batch, temperature: float, *, with_entropy: bool = False):
    """(B, R) fp32 log-probs of the sampled tokens, and entropies (or None), of the sampling
    distribution (logits / temperature); 0 off the response mask. Differentiable."""
    parts = split_head(model)
    if parts is None:
        logits = response_logits(model, batch, temperature)
        return token_logprobs(logits, batch.response_ids), entropy_from_logits(logits) if with_entropy else None
    body, head = parts
    predicting = response_hidden(body, batch, width_multiple=getattr(model, "width_multiple", 1),
                                 share_prompts=getattr(model, "share_prompts", False))  # (N, H)
    kept = batch.kept_positions()  # (N,) flat indices of the sampled tokens
    targets = batch.response_ids.reshape(-1)[kept]  # as response_ids[mask] would, without a sync
    logprobs, entropy = linear_logprobs(predicting, head.weight, targets, temperature=temperature,
                                        with_entropy=with_entropy, matmul_dtype=autocast_dtype(predicting),
                                        fused=getattr(model, "fused_logprobs", False))  # (N,)
    shape = batch.response_mask.shape
    return _scatter(logprobs, kept, shape), _scatter(entropy, kept, shape) if with_entropy else None


#: The update's row widths are padded to a multiple of this when the body is compiled.
COMPILED_WIDTH_MULTIPLE = 128
#: Shapes one compiled body may be specialised to (widths x row counts x grad / no grad).
COMPILED_SHAPES = 64


def compile_body(model, *, dynamic: bool = False, width_multiple: int = COMPILED_WIDTH_MULTIPLE) -> bool:
    """``torch.compile`` the policy's transformer body in place (False: the model has no
    separate body); its parameters and state-dict keys stay as they are.

    It fuses the body's norms, RoPE, activations and residual adds (1.38x on a 0.5B
    micro-batch of the update on an H200, ``benchmarks/bench_update.py``). The
    compilation is regional: each decoder layer is compiled, and the layers, alike in
    code and shapes, share one graph, so the first step compiles one layer's forward
    and backward instead of the whole body's (130 s of a cold first step on an H100
    when the body was one graph; ``benchmarks/bench_defaults.py``). The embedding and
    the final norm stay eager. Widths are static: :func:`response_hidden` pads every
    row width to ``width_multiple`` (the padding trails, so causal attention keeps it
    out of every real token's view) and only the row count is symbolic, which packed
    micro-batches vary: a run meets a few widths, each compiled once.
    """
    parts = split_head(model)
    if parts is None:
        return False
    body = parts[0]
    config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, limit, max(getattr(config, limit), COMPILED_SHAPES))
    layers = getattr(body, "layers", None)
    embed = body.get_input_embeddings() if hasattr(body, "get_input_embeddings") else None
    if isinstance(layers, torch.nn.ModuleList) and len(layers) and embed is not None:
        for layer in layers:
            layer.compile(dynamic=dynamic)
        # The first layer's input carries the symbolic row count into the shared graph.
        embed.register_forward_hook(_rows_symbolic)
    else:
        body.compile(dynamic=dynamic)
    model.width_multiple = width_multiple  # read by response_logprobs
    return True


def _rows_symbolic(module, args, output):
    torch._dynamo.maybe_mark_dynamic(output, 0)
    return output


def split_head(model):
    """(transformer body, lm_head) of a causal LM, or None when it has no separate body or its
    head has a bias: those take the full logits of :func:`response_logits`."""
    body = getattr(model, "model", None)
    head = model.get_output_embeddings()
    if body is None or head is None or getattr(head, "bias", None) is not None:
        return None
    return body, head


def response_hidden(body, batch: Batch, *, width_multiple: int = 1, share_prompts: bool = False) -> torch.Tensor:
    """(N, H) the body's last hidden states that predict each of the N sampled response tokens
    (row-major over ``batch.response_mask``), from one left-aligned forward; with
    ``share_prompts``, rows that repeat a prompt run it once (:mod:`trainer.shared_prompt`)."""
    if share_prompts:
        sizes = shared_prompt.prompt_groups(batch)
        if max(sizes) > 1:
            return shared_prompt.hidden(body, batch, sizes, width_multiple=width_multiple)
    input_ids, starts = left_aligned(batch, width_multiple=width_multiple)
    if width_multiple > 1:
        # A compiled body: the row count varies with packing (trainer.packing), so it is left
        # symbolic; one graph per padded width serves every micro-batch of that width.
        torch._dynamo.maybe_mark_dynamic(input_ids, 0)
    with causal_without_mask(body.config):
        hidden = body(input_ids=input_ids, use_cache=False).last_hidden_state  # (b, L, H), causal, no mask
    kept = batch.kept_positions()  # (N,) flat (row, response column) of each sampled token
    width, response_width = hidden.shape[1], batch.response_ids.shape[1]
    rows, columns = kept // response_width, kept % response_width
    predictors = rows * width + starts[rows] - 1 + columns  # column j of a row is predicted at starts - 1 + j
    return hidden.reshape(-1, hidden.shape[-1])[predictors]


#: The per-row forward's attention implementation: transformers' SDPA, causal, with no mask built.
CAUSAL = "causal_sdpa"


def causal_without_mask(config):
    """For a body of full causal attention under SDPA: its attention, for the block, under a
    name transformers builds no mask for. SDPA then runs its causal kernel, as it does for a
    batch without padding, and transformers skips its mask preprocessing, which for a body
    called without a mask checks the position ids it makes up for packed sequences: an ``if``
    on a device tensor, a sync every forward. Other bodies (another attention, a sliding
    window) keep transformers' own path."""
    if getattr(config, "_attn_implementation", None) != "sdpa" or not full_attention_only(config):
        return contextlib.nullcontext()
    return shared_prompt.attention_implementation(config, CAUSAL, _causal_sdpa)


def _causal_sdpa(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, None, **kwargs)


def autocast_dtype(tensor: torch.Tensor):
    """The dtype autocast computes matmuls in on ``tensor``'s device, or None outside autocast."""
    device_type = tensor.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def left_aligned(batch: Batch, *, width_multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's prompt then response tokens from column 0, padding trailing: (b, L) ids
    and (b,) the column where each row's response starts.

    A token then sits at its own position (column = position) and sees exactly
    the tokens before it under a plain causal mask, so the forward needs neither
    position ids nor an attention mask. Trailing padding is never seen by a real
    token; L stops at the longest row's last sampled token, rounded up to a
    multiple of ``width_multiple`` (a compiled body's few shapes).
    """
    prompt_width = batch.prompt_ids.shape[1]
    prompt_lengths = batch.prompt_mask.sum(dim=1)  # (b,)
    lengths = batch.row_lengths()
    width = max([1, *(prompt + end for prompt, end in zip(lengths.prompt, lengths.ends))])
    width = -(-width // width_multiple) * width_multiple
    ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)  # (b, P+R), prompts left-padded
    source = torch.arange(width, device=ids.device) + (prompt_width - prompt_lengths)[:, None]
    return ids.gather(1, source.clamp(max=ids.shape[1] - 1)), prompt_lengths


def _scatter(values: torch.Tensor, kept: torch.Tensor, shape) -> torch.Tensor:
    """(N,) values at the flat positions ``kept`` -> ``shape`` (B, R), 0 elsewhere
    (differentiable; by index, where masked_scatter's backward would sync on the mask)."""
    return values.new_zeros(shape.numel()).index_copy(0, kept, values).view(shape)


def response_logits(model, batch: Batch, temperature: float) -> torch.Tensor:
    """Logits that predict each response token: (b, R, V), of the sampling distribution."""
    input_ids, attention, positions = model_inputs(model, batch)
    response_len = batch.response_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                   logits_to_keep=response_len + 1, use_cache=False).logits[:, :-1]
    return logits / temperature if temperature != 1.0 else logits  # (b, R, V)


def padded_attention(model, attention: torch.Tensor) -> torch.Tensor:
    """The attention mask for a left-padded (b, L) batch in which no query row is empty.

    With the plain 2-D mask a left-pad position sees no key at all (every key
    before it is padding). Its output is never used and its upstream gradient
    is zero, but cuDNN's SDPA backward (torch's pick on an H200 in bf16) still
    returns NaN dQ for such rows, and 0 * NaN poisons q_proj and everything
    below it. Here every pad query attends to its own key, which no real
    token can see, so real tokens' outputs are unchanged.

    Only SDPA and eager attention take a dense 4-D mask; other kernels (the
    flash-attention family) unpad instead and get the 2-D mask, as do models
    with sliding-window layers, whose windows a hand-built mask would drop.
    """
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in ("sdpa", "eager") or not full_attention_only(model.config):
        return attention
    valid = attention.bool()  # (b, L)
    length = valid.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=valid.device).tril()
    own_key = torch.eye(length, dtype=torch.bool, device=valid.device)
    allowed = (causal & valid[:, None, :]) | (own_key & ~valid[:, :, None])  # (b, L query, L key)
    if implementation == "sdpa":
        return allowed[:, None]  # (b, 1, L, L), True = attend
    dtype = next(model.parameters()).dtype
    return torch.zeros(allowed.shape, dtype=dtype, device=valid.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min)[:, None]  # eager adds the mask to the scores


class PolicyScorer:
    """Log-probs of a batch's sampled tokens under a model, without gradients, in micro-batches."""

    def __init__(self, model, *, temperature: float, micro_batch_size: int, precision):
        self.model = model
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size
        self.precision = precision

    @torch.no_grad()
    def score(self, batch: Batch) -> torch.Tensor:
        was_training = self.model.training
        self.model.eval()
        logprobs = torch.zeros_like(batch.response_mask)
        size = self.micro_batch_size
        with self.precision.autocast():
            for start in range(0, batch.size, size):
                micro = batch.rows(slice(start, start + size))
                values, _ = response_logprobs(self.model, micro, self.temperature)
                logprobs[start : start + size, : values.shape[1]] = values
        self.model.train(was_training)
        return logprobs * batch.response_mask
