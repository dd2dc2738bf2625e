"""Rollouts with ``transformers`` ``generate`` on the policy model itself (CPU or GPU).

The engine holds a reference to the policy, so it always samples from the
current weights: ``sync_weights`` has nothing to copy (the loop still times
it). It does not report per-token log-probabilities: getting them from
``generate`` means keeping a (B, V) score tensor per decoding step, which for a
150k vocabulary costs tens of GB, while the trainer's own no-grad forward
(the "old" log-probs) gives the same numbers for the same weights.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig

from trainer.rollout import Completion, RolloutEngine

# Prompt + completion tokens decoded at once; bounds the KV cache of one chunk
# (~1.5 GB for a 0.5B Qwen2.5 in bf16) while keeping an H200 busy.
DEFAULT_TOKENS_PER_CHUNK = 1 << 17


class HFEngine(RolloutEngine):
    reports_logprobs = False

    def __init__(self, model, tokenizer, *, device, tokens_per_chunk: int = DEFAULT_TOKENS_PER_CHUNK):
        self.model = model
        self.device = torch.device(device)
        self.tokens_per_chunk = tokens_per_chunk
        self.stop_ids = _stop_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]

    def generate(self, prompts, *, n, max_new_tokens, temperature, top_p, seed):
        repeated = [list(p) for p in prompts for _ in range(n)]  # group-contiguous
        if not repeated:
            return []
        longest = max(len(p) for p in repeated)
        per_chunk = max(1, self.tokens_per_chunk // (longest + max_new_tokens))
        generation = GenerationConfig(
            do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
            max_new_tokens=max_new_tokens, pad_token_id=self.pad_id, eos_token_id=self.stop_ids,
        )
        completions = []
        was_training = self.model.training
        self.model.eval()
        devices = [self.device] if self.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                torch.manual_seed(seed)
                for start in range(0, len(repeated), per_chunk):
                    completions += self._generate_chunk(repeated[start : start + per_chunk], generation)
        finally:
            self.model.train(was_training)
        return completions

    def _generate_chunk(self, prompts, generation):
        input_ids, attention_mask = left_pad(prompts, self.pad_id, self.device)  # (B, P)
        output = self.model.generate(input_ids, attention_mask=attention_mask, generation_config=generation)
        new_tokens = output[:, input_ids.shape[1] :]  # (B, R)
        stops = torch.isin(new_tokens, torch.tensor(self.stop_ids, device=new_tokens.device))
        has_stop = stops.any(dim=1)
        # Keep tokens up to and including the first stop token; generate pads after it.
        lengths = torch.where(has_stop, stops.int().argmax(dim=1) + 1, new_tokens.shape[1])
        rows, lengths, has_stop = new_tokens.tolist(), lengths.tolist(), has_stop.tolist()
        return [
            Completion(token_ids=row[:length], finish_reason="stop" if stopped else "length")
            for row, length, stopped in zip(rows, lengths, has_stop)
        ]

    def sync_weights(self, model) -> None:
        if model is not self.model:
            raise ValueError("HFEngine samples from the policy it was built with; got another model")


def left_pad(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id rows -> (ids, attention mask), both (B, longest), padded on the left."""
    longest = max(len(r) for r in rows)
    ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, longest - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, longest - len(row) :] = 1
    return ids.to(device), mask.to(device)


def _stop_token_ids(model, tokenizer) -> list[int]:
    """The model's configured end-of-turn ids (Qwen lists two), else the tokenizer's eos."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if configured is None:
        configured = tokenizer.eos_token_id
    if configured is None:
        raise ValueError("neither the model's generation_config nor the tokenizer defines an eos token")
    return list(configured) if isinstance(configured, (list, tuple)) else [configured]
