"""One step's samples as padded device tensors, and the fields each stage adds to them.

A :class:`Batch` is frozen: a stage returns ``attrs.evolve(batch, field=...)`` with
what it computed, so the step reads as a pipeline of named stages (generate ->
score -> advantages -> update) and a new scorer (a teacher, say) is one more field
and one more stage, not another branch inside the loop.
"""

from __future__ import annotations

import itertools
from typing import Optional, Sequence, Union

import attrs
import torch

from trainer.rollout import Generation


@attrs.frozen(kw_only=True, eq=False)
class Batch:
    """Rows are group-contiguous (prompt i owns rows [i*n, (i+1)*n)).

    Prompts are left-padded and responses right-padded, so every row's response
    starts at the same column and the forward can skip the prompt positions' logits.
    """

    prompt_ids: torch.Tensor  # (B, P) long
    prompt_mask: torch.Tensor  # (B, P) long
    response_ids: torch.Tensor  # (B, R) long
    response_mask: torch.Tensor  # (B, R) float, 1 on sampled tokens
    stopped: Optional[torch.Tensor] = None  # (B,) bool, ended on a stop token
    prompt_index: Optional[torch.Tensor] = None  # (B,) long, which of the step's prompts a row samples
    engine_logprobs: Optional[torch.Tensor] = None  # (B, R) the engine's, when it reports them
    rewards: Optional[torch.Tensor] = None  # (B,) the task's
    token_rewards: Optional[torch.Tensor] = None  # (B, R) per-token rewards (OPD: -KL to the teacher)
    advantages: Optional[torch.Tensor] = None  # (B,) or (B, R)
    old_logprobs: Optional[torch.Tensor] = None  # (B, R) pi_old; None: the update is exactly on-policy
    ref_logprobs: Optional[torch.Tensor] = None  # (B, R) the frozen reference
    rollout_logprobs: Optional[torch.Tensor] = None  # (B, R) mu for TIS

    @classmethod
    def from_generation(cls, prompts: list[list[int]], generation: Generation, *, n: int, pad_id: int,
                        device) -> "Batch":
        """The batch of ``prompts`` (each repeated ``n`` times) and their sampled completions."""
        prompt_ids, prompt_mask = (t.repeat_interleave(n, dim=0) for t in left_pad(prompts, pad_id, device))
        return cls(prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                   response_ids=generation.response_ids.to(device),
                   response_mask=generation.response_mask.to(device, torch.float32),
                   stopped=generation.stopped.to(device),
                   prompt_index=torch.arange(len(prompts), device=device).repeat_interleave(n),
                   engine_logprobs=generation.logprobs.to(device) if generation.logprobs is not None else None)

    @property
    def size(self) -> int:
        return self.response_ids.shape[0]

    def response_ends(self) -> torch.Tensor:
        """(B,) one past each row's last sampled token (0 for a row that sampled none)."""
        columns = torch.arange(1, self.response_ids.shape[1] + 1, device=self.response_ids.device)
        return (self.response_mask.bool() * columns).amax(dim=1)

    def rows(self, index: Union[slice, Sequence[int], torch.Tensor]) -> "Batch":
        """A subset of rows, trimmed to its own longest prompt and response."""
        if not isinstance(index, slice):
            index = torch.as_tensor(index, dtype=torch.long, device=self.response_ids.device)
        prompt_mask = self.prompt_mask[index]
        response_mask = self.response_mask[index]
        prompt_from = int((prompt_mask.sum(dim=0) == 0).sum().item())  # all-padding left columns
        response_to = max(1, int(response_mask.sum(dim=1).max().item()))

        def cut(t):
            if t is None:
                return None
            t = t[index]
            return t[:, :response_to] if t.dim() == 2 else t

        fields = {f.name: cut(getattr(self, f.name)) for f in attrs.fields(Batch)
                  if f.name not in ("prompt_ids", "prompt_mask")}
        return Batch(prompt_ids=self.prompt_ids[index][:, prompt_from:], prompt_mask=prompt_mask[:, prompt_from:],
                     **fields)


def left_pad(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id rows -> (ids, attention mask), both (B, longest), padded on the left.

    One tensor of all the rows' ids, scattered through the mask (row-major, as the rows
    are concatenated): a tensor a row cost 7 ms a step for 128 rows of 256 ids."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    longest = max(1, int(lengths.max())) if rows else 1
    mask = torch.arange(longest)[None, :] >= (longest - lengths)[:, None]  # (B, longest)
    ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    ids[mask] = torch.tensor(list(itertools.chain.from_iterable(rows)), dtype=torch.long)
    return ids.to(device), mask.long().to(device)
