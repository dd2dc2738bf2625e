"""A fast in-process rollout engine: static KV cache, one decode step per CUDA graph.

Why this design
---------------
The policy is small next to the GPU and every step decodes one batch of equal
settings, so none of vLLM's machinery (paged blocks, a scheduler, prefix
caching) pays here; what costs is the host launching a few hundred small
kernels per token, which is what makes HF ``generate`` slow. gpt-fast answers
that with a static KV cache and a compiled, graph-captured decode step;
flex-nano-vllm and nano-vllm capture one decode graph per batch-size bucket. This
engine takes those two ideas and nothing else:

* **Weights**: the engine keeps its own copy of the policy's weights in the
  compute dtype (bf16 on CUDA), with q/k/v and gate/up fused into one matrix
  each (two fewer matmuls per layer). :meth:`sync_weights` is one in-place
  cast-copy from the policy's fp32 master weights into those buffers: no
  allocation, a few milliseconds for a 0.5B model.
* **KV cache**: one static ``(layers, 2, rows, kv_heads, columns, head_dim)``
  tensor, allocated once, its row count sized from ``gpu_memory_utilization``
  (the share of the GPU's memory the engine may bring into use, on top of what
  is already in use) and from the most rows the run asks for; a larger batch is
  decoded in chunks of that many rows.
* **Layout**: prompts are left-padded to a common column, so every row of a
  chunk writes its next token's K/V at the same column; positions (RoPE) are
  counted from each row's first real token. A decode step is therefore the same
  kernels on the same buffers every time, which is what a CUDA graph needs:
  the step's inputs (last token, position, column, done flags) live in device
  buffers that the step itself advances.
* **Prefill** runs once per distinct prompt (a group of ``n`` samples shares
  its prompt's K/V, copied into its ``n`` rows), eagerly. The ``fused`` attention
  then reads those columns once per block of rows that share them (a chunk's
  ``share``, :func:`trainer.rollout.fused_attention.shared_rows`), not once a row.
* **Decode**: with ``enforce_eager=False`` on CUDA, the whole step (every layer,
  the final norm, lm_head and sampling) is captured once per batch-size bucket
  (powers of two) and replayed, its layer step and its finish (final norm, lm_head, the
  draw and the step's bookkeeping) ``torch.compile``'d first (``compile_decode``, on by
  default: it fuses the norms, RoPE and cache writes, the torch sampler's passes over the
  vocabulary and the bookkeeping, which a graph alone still runs as ~20 small kernels a
  layer and a dozen a step); otherwise it runs eagerly (always on CPU, which
  is how CI tests the same code). Attention (:mod:`trainer.rollout.attention`,
  ``decode_attention``) takes the grouped queries of a KV head as its query rows
  (``(b, kv_heads, q_per_kv, d)`` against the cache's ``(b, kv_heads, columns, d)``),
  so GQA needs no repeated K/V: on CUDA a split-KV Triton kernel that reads only
  the columns in use and (``fused``, the default there) also rotates q and k and
  writes the token's K/V, so a layer's attention is two kernels (split, merge)
  between the qkv and out projections; elsewhere SDPA over every column with a mask.
* **Launch**: on Hopper and later (``pdl``, auto) the engine's own Triton kernels (the
  attention's split and merge, the sampler's two passes) launch with programmatic
  dependent launch: a kernel's programs start while the one before it drains, and wait
  for its writes before reading anything (``split_kv.pdl_runs_on``).
* **Stopping**: a row is done after its first stop token (the model's eos ids);
  done rows keep running with their outputs masked, and the host looks at the
  done flags every :data:`CHECK_EVERY` steps only, so there is no sync per token.
* **Sampling** on the device (:mod:`trainer.rollout.sampling`): temperature,
  top-k, top-p, and each sampled token's log-prob under that distribution. On CUDA
  a temperature-only draw (the plain mode) goes through two Triton kernels instead
  (:mod:`trainer.rollout.fused_sampling`, ``fused_sampler``): the logits' log-sum-exp,
  then the inverse CDF at one uniform a row, keyed by a device seed each step advances.

Supported models: decoder-only Qwen2, Qwen3 and Llama layouts (the HF
modules' own parameters are read; anything else is refused at start, naming the
model type, so a run can choose ``backend="hf"``).
"""

from __future__ import annotations

import math
from typing import Optional

import attrs
import torch
import torch.nn.functional as F

from trainer import startup
from trainer.rollout import (
    BackendUnavailable, Generation, RolloutEngine, SamplingParams, pad_token_id, stop_token_ids,
)
from trainer.rollout import attention as decode_attention
from trainer.rollout import fused_sampling
from trainer.rollout.fused_attention import shared_rows
from trainer.rollout.sampling import sample_tokens

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
PLAIN = (-1, False, False)  # the sampling mode of a temperature alone: (no top-k, no top-p, not greedy)
CHECK_EVERY = 16  # decode steps between looks at the done flags (one host sync each)
COLUMN_MULTIPLE = 64  # cache columns are rounded up to this (aligned attention masks)
PREFILL_TOKENS = 1 << 15  # prompt tokens prefilled at once (bounds prefill activations)
# Per-row memory besides the KV cache: a few (V,) float32 rows of logits, noise and sort
# buffers in the decode step, and prefill activations; a generous allowance per row.
WORKSPACE_FLOATS_PER_VOCAB = 6


class UnsupportedModel(BackendUnavailable):
    """The static engine does not know this model's layout."""


@attrs.frozen
class Layer:
    """One decoder layer's weights, as the engine computes with them."""

    input_norm: torch.Tensor  # (H,)
    qkv: torch.Tensor  # ((q_heads + 2 kv_heads) * d, H)
    qkv_bias: Optional[torch.Tensor]
    q_norm: Optional[torch.Tensor]  # (d,) Qwen3
    k_norm: Optional[torch.Tensor]
    out: torch.Tensor  # (H, q_heads * d)
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # (2 I, H)
    down: torch.Tensor  # (H, I)


class StaticEngine(RolloutEngine):
    reports_logprobs = True

    def __init__(self, model, tokenizer, *, device, dtype, max_rows: int, max_columns: int,
                 memory_fraction: float = 0.7, cuda_graphs: bool = False, compile_step: bool = False,
                 attention: str = "auto", fused_sampler: Optional[bool] = None, share_prompts: bool = True,
                 pdl: Optional[bool] = None):
        config = model.config
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModel(
                f"backend='static' supports {', '.join(SUPPORTED_MODEL_TYPES)} models, not "
                f"{config.model_type!r}; use backend='hf'")
        layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
        if layer_types != {"full_attention"} or getattr(config, "use_sliding_window", False):
            raise UnsupportedModel("backend='static' does not implement sliding-window attention; use backend='hf'")
        self.device = torch.device(device)
        self.dtype = dtype
        try:
            self.attention = decode_attention.choose(attention, self.device)
        except ValueError as error:
            raise BackendUnavailable(str(error)) from None
        if fused_sampler is None:
            fused_sampler = self.device.type == "cuda" and decode_attention.triton_runs_on(self.device)
        elif fused_sampler and not decode_attention.triton_runs_on(self.device):
            raise BackendUnavailable("the fused sampler needs Triton on a CUDA device (or TRITON_INTERPRET=1)")
        self.fused_sampler = fused_sampler
        # Programmatic dependent launch for the engine's own Triton kernels (None: wherever it
        # runs); inductor's kernels in the compiled step launch as before.
        if pdl and not decode_attention.pdl_runs_on(self.device):
            raise BackendUnavailable("pdl=True needs compiled Triton on a CUDA device of compute capability 9 or more")
        self.pdl = decode_attention.pdl_runs_on(self.device) if pdl is None else pdl
        # Whether the attention may read a prompt's columns once for the rows sampling it (it
        # changes no result; off only to measure it).
        self.share_prompts = share_prompts and getattr(self.attention, "shares_prompts", False)
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.pad_id = pad_token_id(tokenizer, self.stop_ids)
        self.q_heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.q_heads
        self.hidden = config.hidden_size
        self.eps = config.rms_norm_eps
        self.vocab = config.vocab_size
        self._copies: list[tuple[torch.Tensor, torch.Tensor]] = []  # (engine buffer, policy parameter)
        self._bind_weights(model)
        self.sync_weights(model)

        self.columns = _round_up(max_columns, COLUMN_MULTIPLE)
        self.rows = self._rows_that_fit(max_rows, memory_fraction)
        self.cache = torch.zeros((config.num_hidden_layers, 2, self.rows, self.kv_heads, self.columns,
                                  self.head_dim), dtype=dtype, device=self.device)
        rotary = model.model.rotary_emb
        positions = torch.arange(self.columns, dtype=torch.float32, device=self.device)
        freqs = positions[:, None] * rotary.inv_freq.to(self.device, torch.float32)[None, :]
        angles = torch.cat([freqs, freqs], dim=-1)  # (columns, d), HF's rotate-half layout
        self.cos = (angles.cos() * rotary.attention_scaling).to(dtype)
        self.sin = (angles.sin() * rotary.attention_scaling).to(dtype)
        self.stop_tensor = torch.tensor(self.stop_ids, device=self.device)

        # The decode step's state, advanced by the step itself (so a captured graph can replay it).
        rows = self.rows
        self.tokens = torch.zeros(rows, dtype=torch.long, device=self.device)  # last sampled token
        self.positions = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.first_column = torch.zeros(rows, dtype=torch.long, device=self.device)  # first real column
        self.done = torch.ones(rows, dtype=torch.bool, device=self.device)
        self.column = torch.zeros(1, dtype=torch.long, device=self.device)  # where this step's K/V go
        self.shared_end = torch.zeros(1, dtype=torch.long, device=self.device)  # the chunk's prompt columns
        self.share = 1  # rows a block of which sample one prompt (the attention reads its columns once)
        self.out_index = torch.zeros(1, dtype=torch.long, device=self.device)
        self.out_tokens = torch.full((rows, self.columns), self.pad_id, dtype=torch.long, device=self.device)
        self.out_logprobs = torch.zeros((rows, self.columns), dtype=torch.float32, device=self.device)
        self.temperature = torch.ones(1, dtype=torch.float32, device=self.device)
        self.top_p = torch.ones(1, dtype=torch.float32, device=self.device)
        self.sample_seed = torch.zeros(1, dtype=torch.long, device=self.device)  # the fused sampler's, per step
        self.all_columns = torch.arange(self.columns, device=self.device)
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.graph_pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
        compiled = compile_step and self.device.type == "cuda"
        # Default mode: max-autotune's Triton GEMMs made a step at batch 128 slower on an H200
        # (1.62 against 1.33 ms, benchmarks/RESULTS.md); the engine captures its own graphs.
        self._layer_step = torch.compile(_decode_layer, dynamic=False) if compiled else _decode_layer
        self._finish_step = torch.compile(_finish_step, dynamic=False) if compiled else _finish_step

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_config(cls, cfg, *, model, tokenizer, device, max_rows):
        dtype = torch.bfloat16 if cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda") \
            else torch.float32
        return cls(model, tokenizer, device=device, dtype=dtype, max_rows=max_rows,
                   max_columns=cfg.max_prompt_length + cfg.max_generate_length,
                   memory_fraction=cfg.gpu_memory_utilization, cuda_graphs=not cfg.enforce_eager,
                   compile_step=cfg.compile_decode and not cfg.enforce_eager,
                   attention=cfg.decode_attention, pdl=None if cfg.decode_pdl else False)

    @classmethod
    def inert_knobs(cls, cfg) -> dict[str, str]:
        reasons = dict.fromkeys(("num_inference_engines", "inference_tp", "colocate_all"),
                                "the static engine is one in-process engine, colocated with the policy")
        if cfg.device == "cpu":
            reasons["enforce_eager"] = "CUDA graphs need a CUDA device; on the CPU every step runs eagerly"
            reasons["compile_decode"] = "the decode step is compiled only inside CUDA graphs"
            reasons["gpu_memory_utilization"] = "on the CPU the KV cache is sized for the run's largest batch"
            reasons["decode_pdl"] = "programmatic dependent launch needs a CUDA device of compute capability 9 or more"
            if cfg.decode_attention == "auto":
                reasons["decode_attention"] = "on the CPU 'auto' is sdpa (the Triton kernels need CUDA)"
        elif cfg.enforce_eager:
            reasons["compile_decode"] = "the decode step is compiled only inside CUDA graphs (enforce_eager=False)"
        if cfg.device == "cuda" and torch.cuda.is_available() and not decode_attention.pdl_runs_on(
                torch.device("cuda")):
            major, minor = torch.cuda.get_device_capability()
            reasons["decode_pdl"] = (f"programmatic dependent launch needs compute capability 9 or more "
                                     f"(this GPU has {major}.{minor})")
        return reasons

    @classmethod
    def supports(cls, model) -> bool:
        return getattr(model.config, "model_type", None) in SUPPORTED_MODEL_TYPES

    def _bind_weights(self, model) -> None:
        """Allocate the engine's weight buffers and record which policy parameter fills each."""
        base = model.model

        def own(*sources):
            buffer = torch.empty((sum(s.shape[0] for s in sources), *sources[0].shape[1:]),
                                 dtype=self.dtype, device=self.device)
            offset = 0
            for source in sources:
                self._copies.append((buffer[offset : offset + source.shape[0]], source))
                offset += source.shape[0]
            return buffer

        self.layers = []
        for block in base.layers:
            attention, mlp = block.self_attn, block.mlp
            biases = [attention.q_proj.bias, attention.k_proj.bias, attention.v_proj.bias]
            self.layers.append(Layer(
                input_norm=own(block.input_layernorm.weight),
                qkv=own(attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight),
                qkv_bias=own(*biases) if all(b is not None for b in biases) else None,
                q_norm=own(attention.q_norm.weight) if hasattr(attention, "q_norm") else None,
                k_norm=own(attention.k_norm.weight) if hasattr(attention, "k_norm") else None,
                out=own(attention.o_proj.weight),
                post_norm=own(block.post_attention_layernorm.weight),
                gate_up=own(mlp.gate_proj.weight, mlp.up_proj.weight),
                down=own(mlp.down_proj.weight),
            ))
        self.embed = own(base.embed_tokens.weight)
        self.final_norm = own(base.norm.weight)
        lm_head = model.get_output_embeddings().weight
        self.lm_head = self.embed if lm_head is base.embed_tokens.weight else own(lm_head)

    def _rows_that_fit(self, wanted: int, memory_fraction: float) -> int:
        """Rows of KV cache: all ``wanted`` if they fit the memory budget, else as many as do."""
        element = torch.finfo(self.dtype).bits // 8
        per_row = (len(self.layers) * 2 * self.kv_heads * self.columns * self.head_dim * element
                   + WORKSPACE_FLOATS_PER_VOCAB * self.vocab * 4)
        if self.device.type != "cuda":
            return max(1, wanted)
        free, total = torch.cuda.mem_get_info(self.device)
        budget = memory_fraction * total - (total - free)  # what the engine may still bring into use
        fits = int(budget // per_row)
        if fits < 1:
            raise BackendUnavailable(
                f"gpu_memory_utilization={memory_fraction}: the static engine's budget is "
                f"{budget / 2**30:.1f} GiB of the GPU's {total / 2**30:.1f} GiB after what is already in use "
                f"({(total - free) / 2**30:.1f} GiB), too little for one sequence of {self.columns} tokens "
                f"({per_row / 2**20:.0f} MiB); raise gpu_memory_utilization or shorten the sequences")
        return max(1, min(wanted, fits))

    # -- the RolloutEngine contract -------------------------------------------------------------

    @torch.no_grad()
    def sync_weights(self, model) -> None:
        torch._foreach_copy_([dst for dst, _ in self._copies], [src.detach() for _, src in self._copies])

    @torch.no_grad()
    def generate(self, prompts, params: SamplingParams) -> Generation:
        if not prompts:
            return Generation(response_ids=torch.zeros((0, 1), dtype=torch.long, device=self.device),
                              response_mask=torch.zeros((0, 1), device=self.device),
                              stopped=torch.zeros(0, dtype=torch.bool, device=self.device),
                              logprobs=torch.zeros((0, 1), device=self.device))
        if any(len(p) == 0 for p in prompts):
            raise ValueError("the static engine needs at least one prompt token per prompt")
        longest = max(len(p) for p in prompts)
        if longest + params.max_new_tokens > self.columns:
            raise ValueError(f"prompt of {longest} tokens + {params.max_new_tokens} new tokens exceeds the "
                             f"engine's {self.columns} columns (max_prompt_length + max_generate_length)")
        owner = [i for i in range(len(prompts)) for _ in range(params.n)]  # row -> prompt, group-contiguous
        devices = [self.device] if self.device.type == "cuda" else []
        parts = []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(params.seed)
            for start in range(0, len(owner), self.rows):
                parts.append(self._generate_chunk(prompts, owner[start : start + self.rows], params))
        return Generation.concat(parts, pad_id=self.pad_id)

    # -- one chunk: prefill, then decode steps -----------------------------------------------------

    def _generate_chunk(self, prompts, owner: list[int], params: SamplingParams) -> Generation:
        rows = len(owner)
        distinct = sorted(set(owner))
        width = max(len(prompts[i]) for i in distinct)  # the chunk's prompt columns
        bucket = self._bucket(rows)
        mode = self._mode(params)
        self.share = self._share(owner, bucket)
        self.temperature.fill_(params.temperature if params.temperature > 0 else 1.0)
        self.top_p.fill_(params.top_p)
        if self.cuda_graphs and (bucket, mode, self.share) not in self.graphs:
            # Before the prefill: the capture's warm-up steps (which compile the decode step) scribble on the state.
            with startup.phase("decode graph capture"):
                self._capture(bucket, mode)

        # Prefill: each distinct prompt once, its K/V copied into the rows of its samples.
        repeats = torch.tensor([owner.count(i) for i in distinct], device=self.device)
        ids = torch.full((len(distinct), width), self.pad_id, dtype=torch.long)
        for slot, i in enumerate(distinct):
            ids[slot, width - len(prompts[i]) :] = torch.tensor(prompts[i], dtype=torch.long)
        first = torch.tensor([width - len(prompts[i]) for i in distinct], device=self.device)
        last_logits = self._prefill(ids.to(self.device), first, repeats)  # (rows, V)

        self.done.fill_(True)  # rows past the chunk (bucket padding) stay done
        self.done[:rows] = False
        self.first_column.zero_()
        self.first_column[:rows] = first.repeat_interleave(repeats)
        self.positions.zero_()
        self.positions[:rows] = width - self.first_column[:rows]
        token, logprob = sample_tokens(last_logits, temperature=self.temperature, top_k=params.top_k,
                                       top_p=self.top_p if mode[1] else None, greedy=mode[2])
        self.out_tokens[:, :1] = self.pad_id
        self.out_tokens[:rows, 0] = token
        self.out_logprobs[:rows, 0] = logprob
        self.tokens.zero_()
        self.tokens[:rows] = token
        self.done[:rows] = is_stop(token, self.stop_tensor)
        self.column.fill_(width)
        self.shared_end.fill_(width)
        self.out_index.fill_(1)
        if self.fused_sampler and mode == PLAIN:
            # Its noise's key, from the run's seeded generator; drawn only for the fused sampler,
            # so the torch sampler's noise stays what the seed gave it before.
            self.sample_seed.fill_(int(torch.randint(0, 2**62, (1,))))

        steps = 1
        while steps < params.max_new_tokens:
            if steps % CHECK_EVERY == 0 and bool(self.done[:rows].all()):
                break
            if self.cuda_graphs:
                self.graphs[bucket, mode, self.share].replay()
            else:
                self._decode_step(bucket, mode)
            steps += 1
        return self._collect(rows, steps)

    def _collect(self, rows: int, steps: int) -> Generation:
        return Generation.cut_at_stop(self.out_tokens[:rows, :steps].clone(), self.stop_tensor, pad_id=self.pad_id,
                                      logprobs=self.out_logprobs[:rows, :steps].clone())

    def _share(self, owner: list[int], bucket: int) -> int:
        """The chunk's ``share``: 1 unless its attention reads a prompt's columns once for the rows
        that sample it; a power of two that divides the bucket (its padding rows share nothing)."""
        if not self.share_prompts:
            return 1
        share = shared_rows(owner, self.q_heads // self.kv_heads)
        while bucket % share:
            share //= 2
        return share

    def _bucket(self, rows: int) -> int:
        if not self.cuda_graphs:
            return rows
        return min(self.rows, 1 << max(0, math.ceil(math.log2(rows))))

    @staticmethod
    def _mode(params: SamplingParams) -> tuple:
        """What changes the decode step's kernels: (top_k, top_p on, greedy); values live on the device."""
        return (params.top_k if params.top_k > 0 else -1, params.top_p < 1.0, params.temperature <= 0)

    def _capture(self, bucket: int, mode: tuple) -> None:
        # Warm-up steps run on whatever the buffers hold (the prefill that follows resets them)
        # and draw random numbers of their own, which must not shift the run's samples.
        self.done[:bucket] = True
        self.column.zero_()
        self.shared_end.zero_()
        self.out_index.zero_()
        self.positions.zero_()  # a finished chunk leaves them at the end of the cache
        self.tokens.zero_()
        with torch.random.fork_rng(devices=[self.device]):
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # allocator and kernel warm-up outside the graph
                    self._decode_step(bucket, mode)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.graph_pool):
                self._decode_step(bucket, mode)
        self.graphs[bucket, mode, self.share] = graph

    # -- the model, written out for the engine's buffers ------------------------------------------

    def _prefill(self, ids: torch.Tensor, first: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
        """Run the distinct prompts (u, P), fill their rows' cache columns [0, P); last logits (rows, V)."""
        width = ids.shape[1]
        per_chunk = max(1, PREFILL_TOKENS // width)
        row_of = torch.cat([torch.zeros(1, dtype=torch.long, device=self.device), repeats.cumsum(0)])
        logits = []
        for start in range(0, ids.shape[0], per_chunk):
            stop = min(start + per_chunk, ids.shape[0])
            chunk_repeats = repeats[start:stop]
            rows = slice(int(row_of[start]), int(row_of[stop]))
            last = self._prefill_chunk(ids[start:stop], first[start:stop], chunk_repeats, rows)
            logits.append(last.repeat_interleave(chunk_repeats, dim=0))
        return torch.cat(logits)

    def _prefill_chunk(self, ids, first, repeats, rows: slice) -> torch.Tensor:
        count, width = ids.shape
        columns = torch.arange(width, device=self.device)
        valid = columns[None, :] >= first[:, None]  # (u, P)
        positions = (columns[None, :] - first[:, None]).clamp(min=0)
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).tril()
        own = torch.eye(width, dtype=torch.bool, device=self.device)
        # Pad queries attend to their own key only: a query row with no key at all gives NaN,
        # and NaN in a pad column's V would poison every real row that multiplies it by 0.
        allowed = ((causal & valid[:, None, :]) | (own & ~valid[:, :, None]))[:, None]  # (u, 1, P, P)
        cos, sin = self.cos[positions][:, :, None], self.sin[positions][:, :, None]  # (u, P, 1, d)
        group = self.q_heads // self.kv_heads
        h = self.embed[ids]  # (u, P, H)
        for index, layer in enumerate(self.layers):
            x = F.rms_norm(h, (self.hidden,), layer.input_norm, self.eps)
            q, k, v = self._qkv(x, layer, cos, sin)  # (u, P, heads, d)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (u, heads, P, d)
            self.cache[index, 0, rows, :, :width] = k.repeat_interleave(repeats, dim=0)
            self.cache[index, 1, rows, :, :width] = v.repeat_interleave(repeats, dim=0)
            attended = F.scaled_dot_product_attention(
                q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), attn_mask=allowed)
            h = h + F.linear(attended.transpose(1, 2).reshape(count, width, -1), layer.out)
            h = h + _mlp(F.rms_norm(h, (self.hidden,), layer.post_norm, self.eps), layer)
        last = F.rms_norm(h[:, -1], (self.hidden,), self.final_norm, self.eps)  # left padding: the last column
        return last @ self.lm_head.T  # (u, V)

    def _qkv(self, x, layer: Layer, cos, sin):
        """Projections of x (..., H), rotated: q (..., q_heads, d), k and v (..., kv_heads, d)."""
        return self._rotary(F.linear(x, layer.qkv, layer.qkv_bias), layer, cos, sin)

    def _rotary(self, qkv, layer: Layer, cos, sin):
        """The fused projection (..., (q_heads + 2 kv_heads) d) split into heads, q and k rotated."""
        d, heads = self.head_dim, self.q_heads + self.kv_heads
        qk, v = qkv.split([heads * d, self.kv_heads * d], dim=-1)
        qk = qk.unflatten(-1, (heads, d))
        if layer.q_norm is not None:
            q, k = qk.split([self.q_heads, self.kv_heads], dim=-2)
            qk = torch.cat([F.rms_norm(q, (d,), layer.q_norm, self.eps),
                            F.rms_norm(k, (d,), layer.k_norm, self.eps)], dim=-2)
        qk = _rotate(qk, cos, sin)  # q and k in one pass
        q, k = qk.split([self.q_heads, self.kv_heads], dim=-2)
        return q, k, v.unflatten(-1, (self.kv_heads, d))

    def _decode_step(self, b: int, mode: tuple) -> None:
        """One token for rows [0, b): reads and advances the step state in place."""
        top_k, top_p_on, greedy = mode
        cos = self.cos[self.positions[:b]][:, None]  # (b, 1, d)
        sin = self.sin[self.positions[:b]][:, None]
        context = self.attention.prepare(self, b)  # what attention reads this step (a mask, or the columns)
        h = self.embed[self.tokens[:b]]  # (b, H)
        mlp = torch.zeros_like(h)  # a layer's MLP output still to add: the first layer's has none
        for index, layer in enumerate(self.layers):
            h, mlp = self._layer_step(self, h, mlp, layer, self.attention.layer_cache(self.cache, index, b), cos, sin,
                                      context)
        # The noise is drawn outside the (maybe compiled) step: native RNG kernels advance their
        # offset on each graph replay. The fused sampler keys its own from a seed the step advances.
        noise = None if greedy or (self.fused_sampler and mode == PLAIN) else torch.empty(
            (b, top_k if 0 < top_k < self.vocab else self.vocab), device=self.device).exponential_()
        self._finish_step(self, h, mlp, noise, mode, b)

    def sleep(self) -> None:
        """The cache stays allocated: captured graphs hold its address (it was sized for that)."""


def _decode_layer(engine: StaticEngine, h, mlp, layer: Layer, cache, cos, sin, context):
    """One layer of one decode step for b rows; writes K/V into its cache (the attention's
    ``layer_cache``) at the step's column.

    h (b, H) is the residual stream before the previous layer's MLP output ``mlp`` (zeros at
    the first layer: one compiled graph serves every layer) is added; returns this layer's
    (h, mlp) the same way. Each residual add is then an epilogue of the RMS norm that
    follows it (one kernel when compiled), where ``addmm`` would first copy the residual
    into its output."""
    h = h + mlp
    x = F.rms_norm(h, (engine.hidden,), layer.input_norm, engine.eps)
    qkv = F.linear(x, layer.qkv, layer.qkv_bias)  # (b, (q_heads + 2 kv_heads) d), before RoPE
    attended = engine.attention.decode(engine, layer, qkv, cache, cos, sin, context)  # (b, q_heads d)
    # (b, 1, H) through a view: inductor turns add(h, mm) into addmm, which copies h into its
    # output first (a copy a layer); past the view, the add is the norm kernel's prologue.
    h = h + (attended[:, None] @ layer.out.T)[:, 0]
    return h, _mlp(F.rms_norm(h, (engine.hidden,), layer.post_norm, engine.eps), layer)


def _finish_step(engine: StaticEngine, h, mlp, noise, mode: tuple, b: int) -> None:
    """The final norm, lm_head, the draw and its bookkeeping of one decode step for rows [0, b):
    each row's token and log-prob (padding and 0 once it is done) written at ``out_index``, the
    rows that drew a stop token marked done, the step state advanced. Compiled, inductor fuses
    the bookkeeping's dozen eager kernels into a few (11 ms less a 512-token rollout of the 0.5B
    shape at batch 128 on an H100, benchmarks/RESULTS.md)."""
    if engine.fused_sampler and mode == PLAIN:
        # Two light passes over the logits, one uniform a row from a seed the step advances.
        token, logprob = fused_sampling.softmax_sample(_last_logits(engine, h, mlp), engine.temperature,
                                                       engine.sample_seed, pdl=engine.pdl)
        engine.sample_seed += 1
    else:
        token, logprob = _sample_last(engine, h, mlp, noise, mode)
    done = engine.done[:b]
    token = torch.where(done, engine.pad_id, token)
    engine.out_tokens[:b].index_copy_(1, engine.out_index, token[:, None])
    engine.out_logprobs[:b].index_copy_(1, engine.out_index, torch.where(done, 0.0, logprob)[:, None])
    done |= is_stop(token, engine.stop_tensor)
    engine.tokens[:b] = token
    engine.positions[:b] += 1
    engine.column += 1
    engine.out_index += 1


def is_stop(token: torch.Tensor, stop_ids: torch.Tensor) -> torch.Tensor:
    """Which of ``token`` (b,) are stop ids: each compared with every id, a (b, stop ids) mask.
    ``torch.isin`` sorts a stop set larger than about 10 b^0.145 ids (inductor's rule too), and a
    CUDA graph capture refuses the sort; a tokenizer's eos ids are a handful, so the mask is small."""
    return (token[:, None] == stop_ids).any(dim=1)


def _last_logits(engine: StaticEngine, h, mlp):
    """The last MLP's add, the final norm and lm_head of one decode step: logits (b, V), compute dtype."""
    return F.rms_norm(h + mlp, (engine.hidden,), engine.final_norm, engine.eps) @ engine.lm_head.T


def _sample_last(engine: StaticEngine, h, mlp, noise, mode: tuple):
    """The final norm, lm_head and sampling of one decode step: (tokens, logprobs)."""
    top_k, top_p_on, greedy = mode
    return sample_tokens(_last_logits(engine, h, mlp), temperature=engine.temperature, top_k=top_k,
                         top_p=engine.top_p if top_p_on else None, greedy=greedy, noise=noise)


def _mlp(x, layer: Layer):
    gate, up = F.linear(x, layer.gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, layer.down)


def _rotate(x, cos, sin):
    """RoPE in HF's rotate-half layout; x (..., d), cos/sin broadcastable to it."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


ENGINE = StaticEngine
