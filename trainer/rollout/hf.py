"""Rollouts with ``transformers`` ``generate`` on the policy model itself (CPU or GPU).

The engine holds a reference to the policy, so it always samples from the
current weights: ``sync_weights`` has nothing to copy (the loop still times
it). It does not report per-token log-probabilities: getting them from
``generate`` means keeping a (B, V) score tensor per decoding step, which for a
150k vocabulary costs tens of GB, while the trainer's own forward gives the same
numbers for the same weights. The policy's master weights are fp32; on CUDA the
engine generates under bf16 autocast, as the trainer computes.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig

from trainer.batch import left_pad
from trainer.rollout import Generation, RolloutEngine, SamplingParams, pad_token_id, stop_token_ids

# Prompt + completion tokens decoded at once; bounds the KV cache of one chunk
# (~1.5 GB for a 0.5B Qwen2.5 in bf16) while keeping an H200 busy.
DEFAULT_TOKENS_PER_CHUNK = 1 << 17


class HFEngine(RolloutEngine):
    reports_logprobs = False

    def __init__(self, model, tokenizer, *, device, tokens_per_chunk: int = DEFAULT_TOKENS_PER_CHUNK,
                 autocast_dtype=None):
        self.model = model
        self.device = torch.device(device)
        self.tokens_per_chunk = tokens_per_chunk
        self.autocast_dtype = autocast_dtype
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.pad_id = pad_token_id(tokenizer, self.stop_ids)

    @classmethod
    def from_config(cls, cfg, *, model, tokenizer, device, max_rows):
        compute = torch.bfloat16 if cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda") \
            else None
        return cls(model, tokenizer, device=device, autocast_dtype=compute)

    @classmethod
    def inert_knobs(cls, cfg) -> dict[str, str]:
        reasons = dict.fromkeys(
            ("gpu_memory_utilization", "enforce_eager", "compile_decode", "decode_attention", "decode_pdl",
             "num_inference_engines", "inference_tp", "colocate_all"),
            "the HF engine generates with the policy model itself")
        # pi_old and the sampling distribution are the same model's: every TIS weight is 1.
        reasons |= dict.fromkeys(("use_tis", "tis_imp_ratio_cap"),
                                 "the HF engine samples with the policy itself (rollout and trainer log-probs agree)")
        return reasons

    def generate(self, prompts, params: SamplingParams) -> Generation:
        repeated = [list(p) for p in prompts for _ in range(params.n)]  # group-contiguous
        if not repeated:
            return Generation(response_ids=torch.zeros((0, 1), dtype=torch.long, device=self.device),
                              response_mask=torch.zeros((0, 1), device=self.device),
                              stopped=torch.zeros(0, dtype=torch.bool, device=self.device))
        longest = max(len(p) for p in repeated)
        per_chunk = max(1, self.tokens_per_chunk // (longest + params.max_new_tokens))
        greedy = params.temperature <= 0
        generation = GenerationConfig(
            do_sample=not greedy, temperature=None if greedy else params.temperature,
            top_p=None if greedy else params.top_p, top_k=params.top_k if params.top_k > 0 else None,
            max_new_tokens=params.max_new_tokens, pad_token_id=self.pad_id, eos_token_id=self.stop_ids,
        )
        parts = []
        was_training = self.model.training
        self.model.eval()
        devices = [self.device] if self.device.type == "cuda" else []
        autocast = torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                                  enabled=self.autocast_dtype is not None)
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad(), autocast:
                torch.manual_seed(params.seed)
                for start in range(0, len(repeated), per_chunk):
                    parts.append(self._generate_chunk(repeated[start : start + per_chunk], generation))
        finally:
            self.model.train(was_training)
        return Generation.concat(parts, pad_id=self.pad_id)

    def _generate_chunk(self, prompts, generation) -> Generation:
        input_ids, attention_mask = left_pad(prompts, self.pad_id, self.device)  # (B, P)
        output = self.model.generate(input_ids, attention_mask=attention_mask, generation_config=generation)
        new_tokens = output[:, input_ids.shape[1] :]  # (B, R)
        return Generation.cut_at_stop(new_tokens, torch.tensor(self.stop_ids, device=new_tokens.device),
                                      pad_id=self.pad_id)

    def sync_weights(self, model) -> None:
        if model is not self.model:
            raise ValueError("HFEngine samples from the policy it was built with; got another model")


ENGINE = HFEngine
