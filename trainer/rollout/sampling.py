"""Sampling on the device: temperature, top-k, top-p, and the sampled token's log-prob.

One function, free of host syncs, so an engine can capture it in a CUDA graph
with the rest of its decode step. The draw is the Gumbel-max trick,
``argmax(log p - log E)`` with ``E ~ Exp(1)`` (the same as sampling from p; nano-vllm's
and gpt-fast's samplers draw this way to avoid ``torch.multinomial``'s host sync).

The log-prob returned is that of the distribution the token was drawn from: the
logits divided by the temperature, restricted to the top-k and then the top-p
nucleus, renormalised. That is what truncated importance sampling compares with
the trainer's log-probs. Greedy decoding (``greedy=True``) returns the argmax and
its log-prob under the untempered softmax.
"""

from __future__ import annotations

import torch

NOISE_FLOOR = 1e-10  # Exp(1) draws of exactly 0 would make -log(E) infinite and beat a masked token


def sample_tokens(logits, *, temperature, top_k: int = -1, top_p=None, greedy: bool = False, noise=None):
    """(b, V) logits -> (tokens (b,) long, logprobs (b,) float32).

    ``temperature`` and ``top_p`` may be Python floats or 0-d/1-element tensors
    (a captured graph reads them from device memory). ``top_k`` <= 0 and
    ``top_p=None`` turn those filters off. ``noise``: the Exp(1) draws, (b, V) or
    (b, top_k) when top-k is on, to use instead of drawing them here.
    """
    scores = logits.float()
    if greedy:
        tokens = scores.argmax(dim=-1)
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, logprobs
    scores = scores / temperature
    index = None  # column -> vocabulary id, when the scores were narrowed or sorted
    if 0 < top_k < scores.shape[-1]:
        scores, index = scores.topk(top_k, dim=-1)  # sorted, largest first
    if top_p is not None:
        if index is None:
            scores, index = scores.sort(dim=-1, descending=True)
        probs = torch.softmax(scores, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        # The nucleus: the likeliest tokens until their mass reaches top_p (the first always stays).
        scores = scores.masked_fill(mass_before >= top_p, float("-inf"))
    logprobs = torch.log_softmax(scores, dim=-1)
    if noise is None:
        noise = torch.empty_like(logprobs).exponential_()
    choice = (logprobs - noise.clamp_min(NOISE_FLOOR).log()).argmax(dim=-1)  # (b,)
    picked = logprobs.gather(-1, choice[:, None]).squeeze(-1)
    tokens = index.gather(-1, choice[:, None]).squeeze(-1) if index is not None else choice
    return tokens, picked
