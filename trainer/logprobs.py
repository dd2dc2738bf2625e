"""Per-token log-probs and entropy straight from the last hidden state, chunked over tokens.

``linear_logprobs(hidden, weight, targets)`` gives, for N token positions,

    z = (hidden @ weight.T + bias) / temperature          (N, V), never held whole
    logprobs = log_softmax(z)[targets]                    (N,)
    entropy  = lse(z) - sum_j p_j z_j = -sum_j p_j log p_j (N,), when with_entropy

in one ``torch.autograd.Function``. The forward walks ``chunk_tokens`` rows at a
time: the chunk's logits come from a matmul in the inputs' dtype (bf16 on GPU),
are upcast, reduced to a logsumexp, the target's logit and the entropy, and
dropped. Backward keeps only hidden, weight, bias, targets and the per-row
logsumexp and entropy, recomputes each chunk's logits and forms

    d z_j = g_lp (1[j = target] - p_j) + g_ent (-p_j (z_j - sum_k p_k z_k))
          = g_lp 1[j = target] - p_j (g_lp + g_ent (log p_j + H))

(z_j - sum_k p_k z_k = log p_j + lse - (lse - H)), then d logits = d z / T,
grad_hidden = d logits @ weight and grad_weight = sum over chunks of
d logits.T @ hidden. Both outputs may feed the loss, or one of them: an
output the loss does not use gets no gradient (None) and costs nothing.

Memory beyond the inputs and the (V, H) weight gradient is chunk_tokens x V x
6 bytes for bf16 inputs (a bf16 and an fp32 buffer at once), 8 with entropy
(two fp32), never N x V. The naive path (full logits, then
trainer.losses.token_logprobs / entropy_from_logits) keeps the (N, V) logits,
their fp32 upcast and, for entropy, the (N, V) softmax for backward. Measured
on an H200 (benchmarks/bench_logprobs.py, bf16, N = 4096, H = 896,
V = 151936), forward + backward, peak MiB / ms:

    path              logprobs      + entropy
    naive             4752 / 23.3   10096 / 56.2
    chunk_tokens 4096 3829 / 23.3    5015 / 31.9
    chunk_tokens 1024 1418 / 25.9    1715 / 34.6
    chunk_tokens  512  972 / 28.5    1121 / 37.4

Precision
---------
Outputs, the per-row statistics, d z and the cross-chunk sums of grad_weight
and grad_bias are at least fp32 (fp64 inputs stay fp64, for gradcheck). The
matmuls run in promote(hidden.dtype, weight.dtype): bf16 inputs use bf16
tensor-core matmuls (fp32 accumulation inside each), and d logits is rounded
to that dtype before them, as autograd does for a bf16 lm_head. The bias is
added after the upcast. Gradients come back in each input's dtype.

Targets must lie in [0, V) on every row; the caller masks padding rows'
outputs, so any valid id (0, a pad id) works there, and a row whose outputs
get zero gradient contributes exactly zero to every gradient.

Why not liger-kernel
--------------------
Read from the 0.8.5 wheel: pure Python, but it requires triton and
``liger_kernel.ops`` imports it (ModuleNotFoundError on CPU-only torch, where
our tests run). ``chunked_loss``'s GRPO loss is pure torch, takes temperature
and bias, but returns the scalar loss, not per-token log-probs: it computes the
gradient inside forward and backward only rescales it, so TIS weights, our
clamped k3 KL, distillation advantages and aggregate's reductions cannot be
composed with it; it has no entropy (TRL refuses an entropy bonus with it).
``ops.fused_linear_scaled_cross_entropy`` gives per-token NLL and entropy with
temperature, no bias: a CuTe-DSL kernel on SM90 (the ``cutedsl`` extra), else
a torch fallback from verl whose entropy and grad_weight sum stay in bf16.
Worth a look only if the lm_head comes to dominate the H200 step time.

What the references do
----------------------
* TRL (trl/trainer/utils.py, grpo_trainer.py): full (B, T, V) logits from the
  model (``logits_to_keep``), ``logits.div_(temperature)``, then
  ``selective_log_softmax`` (gather minus a per-row logsumexp loop; per-row
  log_softmax for bf16) and ``entropy_from_logits`` (log_softmax over 128-row
  chunks, under no_grad unless the entropy bonus is on). ``use_liger_kernel``
  swaps the whole loss for liger's fused GRPO loss on the last hidden state.
* verl (verl/utils/torch_functional.py): by default the same full-logits path,
  ``logprobs_from_logits`` (flash-attn's Triton cross entropy when installed,
  else a row loop) and ``entropy_from_logits[_with_chunking]``. With
  ``use_fused_kernels`` the model's forward is patched to return log-probs and
  entropy from the hidden states: backend "torch" is
  ``FusedLinearForPPOFunction`` (verl/utils/experimental/torch_functional.py,
  the approach here: 512-row chunks, recompute in backward, temperature, no
  bias, outputs and grad_weight accumulated in the input dtype), backend
  "triton" is verl/utils/kernel/linear_cross_entropy.py.
"""

import torch

__all__ = ["linear_logprobs"]


def _chunk_logits(hidden_chunk, weight, bias, temperature, stats_dtype):
    """(C, H) rows -> (C, V) logits / T in stats_dtype; hidden_chunk and weight share the matmul dtype."""
    logits = hidden_chunk @ weight.T  # (C, V)
    scaled = logits.to(stats_dtype)  # a fresh tensor unless the dtypes match; either way ours to modify
    del logits
    if bias is not None:
        scaled.add_(bias.to(stats_dtype))
    return scaled.div_(temperature)


def _fused_stats(logits, bias, targets, temperature: float, with_entropy: bool, stats_dtype):
    """A chunk's (C, V) matmul-dtype logits -> (lse, logprobs, entropy or None), (C,) each.

    The same statistics as the in-place forward below, written as plain expressions for
    ``torch.compile`` to fuse into a few passes over the bf16 logits (eagerly it holds
    several (C, V) fp32 temporaries; :func:`linear_logprobs` uses it only compiled).
    """
    z = logits.to(stats_dtype)
    if bias is not None:
        z = z + bias.to(stats_dtype)
    z = z / temperature
    peak = z.amax(dim=1, keepdim=True)
    shifted = z - peak
    exps = shifted.exp()
    total = exps.sum(dim=1)
    lse = peak.squeeze(1) + total.log()
    logprobs = z.gather(1, targets[:, None]).squeeze(1) - lse
    entropy = total.log() - (exps * shifted).sum(dim=1) / total if with_entropy else None
    return lse, logprobs, entropy


def _fused_dlogits(logits, bias, targets, lse, entropy, g_lp, g_ent, temperature: float, stats_dtype,
                   want_bias: bool):
    """A chunk's d logits (C, V), in the logits' dtype, and its bias gradient (V,) or None,
    from its recomputed logits: the backward's formula (module docstring) as one
    expression for ``torch.compile`` to fuse."""
    z = logits.to(stats_dtype)
    if bias is not None:
        z = z + bias.to(stats_dtype)
    log_p = z / temperature - lse[:, None]
    factor = g_lp[:, None] if g_ent is None else g_lp[:, None] + g_ent[:, None] * (log_p + entropy[:, None])
    target = torch.arange(z.shape[1], device=z.device)[None, :] == targets[:, None]
    d_logits = (torch.where(target, g_lp[:, None], 0.0) - log_p.exp() * factor) / temperature
    return d_logits.to(logits.dtype), d_logits.sum(dim=0) if want_bias else None


_compiled = {}


def _compiled_kernels():
    """The fused chunk functions under torch.compile (built on first use).

    Compiled once, with the chunk's rows symbolic (the callers mark them, :func:`_rows_vary`)
    and every other size a constant: the vocabulary is then a constant inside each kernel.
    With every size symbolic (``dynamic=True``) the same two passes over a (4096, 151936) bf16
    chunk took 1.6 and 2.2 ms against 1.0 and 1.1 on an H100
    (``benchmarks/bench_update_kernels.py``). Left to torch.compile's automatic dynamic shapes,
    the first compile is static and a later chunk size recompiles: on an H100 that came in the
    second step, 1.6 s into it (``benchmarks/RESULTS.md``)."""
    if not _compiled:
        _compiled["stats"] = torch.compile(_fused_stats, dynamic=None)  # the marked rows only
        _compiled["dlogits"] = torch.compile(_fused_dlogits, dynamic=None)
    return _compiled["stats"], _compiled["dlogits"]


def _rows_vary(*tensors):
    """Mark the row dimension of each (not None) chunk tensor dynamic: one compiled kernel
    serves every chunk size, from the first call on."""
    for tensor in tensors:
        if tensor is not None:
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
    return tensors


def _add_product(total, a, b):
    """total += a @ b, in total's dtype. On CUDA a half-precision product is accumulated by
    the GEMM itself (``addmm`` with ``out_dtype``), where ``total += a @ b`` would write the
    product in half precision and add it in a second pass (a (V, H) temporary)."""
    if total.is_cuda and a.dtype in (torch.bfloat16, torch.float16) and total.dtype == torch.float32:
        torch.addmm(total, a, b, out_dtype=total.dtype, out=total)
    else:
        total += a @ b


class _LinearLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, with_entropy, chunk_tokens, matmul_dtype,
                fused=False):
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None
        matmul_dtype = matmul_dtype or torch.promote_types(hidden.dtype, weight.dtype)
        stats_dtype = torch.promote_types(matmul_dtype, torch.float32)
        rows = hidden.shape[0]
        lse = hidden.new_empty(rows, dtype=stats_dtype)
        logprobs = torch.empty_like(lse)
        entropy = torch.empty_like(lse) if with_entropy else None
        weight_matmul = weight.to(matmul_dtype)
        ctx.fused = fused
        for start in range(0, rows, chunk_tokens):
            end = min(start + chunk_tokens, rows)
            if fused:
                stats, _ = _compiled_kernels()
                logits, chunk_targets = _rows_vary(hidden[start:end].to(matmul_dtype) @ weight_matmul.T,
                                                   targets[start:end])
                chunk_lse, chunk_logprobs, chunk_entropy = stats(logits, bias, chunk_targets, temperature,
                                                                 with_entropy, stats_dtype)
                del logits
                lse[start:end], logprobs[start:end] = chunk_lse, chunk_logprobs
                if with_entropy:
                    entropy[start:end] = chunk_entropy
                continue
            z = _chunk_logits(hidden[start:end].to(matmul_dtype), weight_matmul, bias, temperature, stats_dtype)
            picked = z.gather(1, targets[start:end, None]).squeeze(1)
            peak = z.amax(dim=1, keepdim=True)
            shifted = z.sub_(peak)  # in place: only one more (C, V) buffer below
            if with_entropy:
                exps = shifted.exp()
                total = exps.sum(dim=1)
                # H = log S - sum(e s) / S with s = z - max, e = exp(s), S = sum(e)
                weighted = exps.mul_(shifted).sum(dim=1)
                entropy[start:end] = total.log() - weighted / total
                del exps
            else:
                total = shifted.exp_().sum(dim=1)
            lse[start:end] = peak.squeeze(1) + total.log()
            logprobs[start:end] = picked - lse[start:end]
            del z, shifted
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.temperature = temperature
        ctx.chunk_tokens = chunk_tokens
        ctx.dtypes = (matmul_dtype, stats_dtype)
        return (logprobs, entropy) if with_entropy else logprobs

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logprobs, grad_entropy=None):
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        matmul_dtype, stats_dtype = ctx.dtypes
        want_hidden, want_weight, want_bias = ctx.needs_input_grad[:3]
        if grad_logprobs is None and grad_entropy is None:
            return (None,) * 9
        rows = hidden.shape[0]
        grad_logprobs = lse.new_zeros(rows) if grad_logprobs is None else grad_logprobs.to(stats_dtype)
        # Each row's grad_hidden comes whole from one chunk; weight and bias sum over chunks, in
        # fp32 unless there is only one chunk (then nothing is summed and a (V, H) fp32 buffer is saved).
        sum_dtype = matmul_dtype if rows <= ctx.chunk_tokens else stats_dtype
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = weight.new_zeros(weight.shape, dtype=sum_dtype) if want_weight else None
        grad_bias = bias.new_zeros(bias.shape, dtype=stats_dtype) if want_bias else None
        weight_matmul = weight.to(matmul_dtype)
        for start in range(0, rows, ctx.chunk_tokens):
            end = min(start + ctx.chunk_tokens, rows)
            hidden_chunk = hidden[start:end].to(matmul_dtype)
            chunk = slice(start, end)
            g_ent = None if grad_entropy is None else grad_entropy[chunk].to(stats_dtype)
            chunk_entropy = None if entropy is None else entropy[chunk]
            if ctx.fused:
                _, dlogits = _compiled_kernels()
                logits, chunk_targets, chunk_lse, chunk_entropy, g_lp, g_ent = _rows_vary(
                    hidden_chunk @ weight_matmul.T, targets[chunk], lse[chunk], chunk_entropy, grad_logprobs[chunk],
                    g_ent)
                d_logits, bias_part = dlogits(logits, bias, chunk_targets, chunk_lse, chunk_entropy, g_lp, g_ent,
                                              ctx.temperature, stats_dtype, want_bias)
                del logits
            else:
                d_z = _chunk_dlogits(hidden_chunk, weight_matmul, bias, targets[chunk], lse[chunk], chunk_entropy,
                                     grad_logprobs[chunk], g_ent, ctx.temperature, stats_dtype)
                bias_part = d_z.sum(dim=0) if want_bias else None
                d_logits = d_z.to(matmul_dtype)
                del d_z
            if want_bias:
                grad_bias += bias_part
            if want_hidden:
                grad_hidden[start:end] = d_logits @ weight_matmul
            if want_weight and sum_dtype == matmul_dtype:
                grad_weight.addmm_(d_logits.T, hidden_chunk)  # no (V, H) temporary
            elif want_weight:
                _add_product(grad_weight, d_logits.T, hidden_chunk)
            del d_logits
        return (
            grad_hidden,
            grad_weight.to(weight.dtype) if want_weight else None,
            grad_bias.to(bias.dtype) if want_bias else None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


def _chunk_dlogits(hidden_chunk, weight_matmul, bias, targets, lse, entropy, g_lp, g_ent, temperature: float,
                   stats_dtype):
    """A chunk's d logits (C, V) in stats_dtype, eagerly, in at most two (C, V) buffers."""
    z = _chunk_logits(hidden_chunk, weight_matmul, bias, temperature, stats_dtype)
    log_probs = z.sub_(lse[:, None])  # (C, V), in place
    g_lp = g_lp[:, None]  # (C, 1)
    if g_ent is None:
        d_z = log_probs.exp_().mul_(-g_lp)  # -g_lp p, still one buffer
    else:
        d_z = log_probs.exp()  # p
        # -p (g_lp + g_ent (log p + H)), the factor built in log p's buffer
        factor = log_probs.add_(entropy[:, None]).mul_(g_ent[:, None]).add_(g_lp)
        d_z.mul_(factor).neg_()
        del factor
    del z, log_probs
    d_z.scatter_add_(1, targets[:, None], g_lp)
    return d_z.div_(temperature)  # d logits


def linear_logprobs(hidden, weight, targets, *, temperature=1.0, with_entropy=False, chunk_tokens=4096, bias=None,
                    matmul_dtype=None, fused=False):
    """log softmax((hidden @ weight.T + bias) / temperature)[targets] per row, without (N, V) logits.

    hidden (N, H) any float dtype; weight (V, H), the lm_head weight (tied or
    not); targets (N,) integer ids in [0, V); bias (V,) or None.
    Returns (logprobs, entropy): (N,) each, fp32 (fp64 for fp64 inputs);
    entropy is None unless with_entropy. Gradients reach hidden, weight and
    bias through both outputs. Peak extra memory is O(chunk_tokens x V).

    ``matmul_dtype`` is the dtype of the two matmuls (default: the inputs'
    promoted dtype). Under autocast pass its dtype: an fp32 master weight and
    an fp32 residual stream would otherwise run the (N, V) matmuls in fp32,
    which an autograd Function does not autocast (on an H200 that was 45 % of
    the update's GPU time). The statistics and the cross-chunk gradient sums
    stay fp32 and the gradients come back in the inputs' own dtypes.

    ``fused=True`` computes each chunk's statistics and its d logits with
    ``torch.compile``'d expressions (:func:`_fused_stats`, :func:`_fused_dlogits`)
    instead of the in-place eager passes: on an H200 those passes over the (C, V) fp32
    logits were a quarter of the update's GPU time, and fused they read the bf16 logits
    about twice. Same results within rounding; meant for CUDA.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"need hidden (N, H) and weight (V, H), got {tuple(hidden.shape)} and {tuple(weight.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets shape {tuple(targets.shape)} != (N,) = {tuple(hidden.shape[:1])}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias shape {tuple(bias.shape)} != (V,) = {tuple(weight.shape[:1])}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    out = _LinearLogprobs.apply(
        hidden, weight, bias, targets.long(), float(temperature), bool(with_entropy), int(chunk_tokens), matmul_dtype,
        bool(fused),
    )
    return out if with_entropy else (out, None)
