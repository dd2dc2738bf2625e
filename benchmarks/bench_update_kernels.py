"""The update's two costliest non-GEMM kernels, each by how it is compiled.

A profile of the 0.5B update (``bench_trainer.py --profile-update``, an H200) puts about
a quarter of its kernel time outside the GEMMs in two places:

* ``logprob``: the lm_head log-prob's per-chunk statistics and d logits
  (:func:`trainer.logprobs._fused_stats`, :func:`trainer.logprobs._fused_dlogits`), each a
  pass over a (C, V) bf16 chunk of logits. Timed compiled four ways: ``dynamic=True``
  (every size symbolic, the vocabulary too), ``dynamic=None`` (torch.compile's automatic
  dynamic shapes: the rows become symbolic once a second chunk size comes, the vocabulary
  stays a constant), ``rows marked`` (the trainer's: the rows marked dynamic at every call,
  :func:`trainer.logprobs._rows_vary`, so the first compile is the one) and ``dynamic=False``;
  each called with two chunk sizes first, as the trainer's last chunk of a micro-batch is
  shorter. Printed: ms per chunk and the bytes the kernel must move over that time.
* ``flex``: the shared-prompt attention (:mod:`trainer.shared_prompt`), forward and
  backward, over a micro-batch of groups ``[prompt | n responses]`` under its real
  ``BlockMask``, compiled with flex attention's default kernel options and with each
  candidate in :data:`FLEX_CANDIDATES`. Printed: ms and TFLOP/s of the mask's visible
  query-key pairs (4 x pairs x head dim forward, 2.5x that backward).

The H200 run::

    python benchmarks/bench_update_kernels.py
    python benchmarks/bench_update_kernels.py --shape qwen2.5-1.5b

and a quick local check of the log-prob part (the flex part needs CUDA)::

    python benchmarks/bench_update_kernels.py --parts logprob --chunk 64 --vocab 512 --hidden 32 --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer import logprobs as lp  # noqa: E402
from trainer import shared_prompt  # noqa: E402
from trainer.batch import Batch  # noqa: E402

SHAPES = {  # hidden, query heads, kv heads, head dim, vocabulary
    "qwen2.5-0.5b": (896, 14, 2, 64, 151936),
    "qwen2.5-1.5b": (1536, 12, 2, 128, 151936),
}
# Backward options: BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, num_warps, num_stages (None: the default).
FLEX_CANDIDATES = {
    "default": None,
    "bwd 64/64/64/64 w4 s3": dict(bwd_BLOCK_M1=64, bwd_BLOCK_N1=64, bwd_BLOCK_M2=64, bwd_BLOCK_N2=64,
                                  bwd_num_warps=4, bwd_num_stages=3),
    "bwd 64/128/128/64 w8 s2": dict(bwd_BLOCK_M1=64, bwd_BLOCK_N1=128, bwd_BLOCK_M2=128, bwd_BLOCK_N2=64,
                                    bwd_num_warps=8, bwd_num_stages=2),
    "bwd 64/128/128/64 w4 s3": dict(bwd_BLOCK_M1=64, bwd_BLOCK_N1=128, bwd_BLOCK_M2=128, bwd_BLOCK_N2=64,
                                    bwd_num_warps=4, bwd_num_stages=3),
    "bwd 32/128/128/32 w4 s3": dict(bwd_BLOCK_M1=32, bwd_BLOCK_N1=128, bwd_BLOCK_M2=128, bwd_BLOCK_N2=32,
                                    bwd_num_warps=4, bwd_num_stages=3),
    "bwd 128/128/128/128 w8 s2": dict(bwd_BLOCK_M1=128, bwd_BLOCK_N1=128, bwd_BLOCK_M2=128, bwd_BLOCK_N2=128,
                                      bwd_num_warps=8, bwd_num_stages=2),
    "fwd 128/128 w8 s3": dict(fwd_BLOCK_M=128, fwd_BLOCK_N=128, fwd_num_warps=8, fwd_num_stages=3),
    "fwd 128/64 w4 s3": dict(fwd_BLOCK_M=128, fwd_BLOCK_N=64, fwd_num_warps=4, fwd_num_stages=3),
    # torch.compile's own search over its list of flex configs (minutes): the best it finds, for comparison.
    "max-autotune": None,
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--parts", default="logprob,flex")
    parser.add_argument("--chunk", type=int, default=4096, help="the lm_head log-prob's chunk rows")
    parser.add_argument("--groups", type=int, default=14, help="groups in the attention's micro-batch")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=160)
    parser.add_argument("--response-length", type=int, default=512)
    parser.add_argument("--candidates", default=",".join(c for c in FLEX_CANDIDATES if c != "max-autotune"),
                        help="which of: " + ", ".join(FLEX_CANDIDATES))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--vocab", type=int, help="the log-prob part's vocabulary (default: the shape's)")
    parser.add_argument("--hidden", type=int, help="the weight-gradient part's hidden size (default: the shape's)")
    return parser.parse_args(argv)


def time_ms(fn, repeats: int) -> float:
    """Median ms of ``fn()`` over ``repeats`` calls, after two warm-up calls (CUDA events on a
    GPU, the wall clock on a CPU)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if not torch.cuda.is_available():
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def logprob_part(args, vocab: int, device: str) -> None:
    rows, short = args.chunk, args.chunk * 5 // 8
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(rows, vocab, device=device, generator=g).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (rows,), device=device, generator=g)
    lse = torch.logsumexp(logits.float(), dim=1)
    entropy = torch.rand(rows, device=device, generator=g)
    g_lp = torch.randn(rows, device=device, generator=g)
    moved = rows * vocab * 2  # bytes of the bf16 chunk
    print(f"lm_head log-prob chunk kernels: ({rows}, {vocab}) bf16 logits, {moved / 1e9:.2f} GB a pass")
    print(f"  {'compiled':<14} {'stats ms':>9} {'GB/s (1 read)':>14} {'dlogits ms':>11} {'GB/s (read+write)':>18}")
    reference = None
    modes = (("dynamic=True", True, False), ("dynamic=None", None, False), ("rows marked", None, True),
             ("dynamic=False", False, False))
    for label, dynamic, marked in modes:
        torch._dynamo.reset()
        stats = _marking(torch.compile(lp._fused_stats, dynamic=dynamic), marked)
        dlogits = _marking(torch.compile(lp._fused_dlogits, dynamic=dynamic), marked)
        for n in (rows, short):  # the trainer's two chunk sizes: a recompile where it would happen
            stats(logits[:n], None, targets[:n], 1.0, True, torch.float32)
            dlogits(logits[:n], None, targets[:n], lse[:n], entropy[:n], g_lp[:n], None, 1.0, torch.float32, False)
        out = stats(logits, None, targets, 1.0, True, torch.float32), \
            dlogits(logits, None, targets, lse, entropy, g_lp, None, 1.0, torch.float32, False)[0]
        note = ""
        if reference is None:
            reference = out
        else:
            error = max((a - b).abs().max().item() for a, b in zip([*out[0], out[1]], [*reference[0], reference[1]]))
            note = f"  (outputs within {error:.1e} of dynamic=True's)"
        stats_ms = time_ms(lambda: stats(logits, None, targets, 1.0, True, torch.float32), args.repeats)
        dlogits_ms = time_ms(lambda: dlogits(logits, None, targets, lse, entropy, g_lp, None, 1.0, torch.float32,
                                             False), args.repeats)
        print(f"  {label:<14} {stats_ms:>9.3f} {moved / stats_ms / 1e6:>14.0f} {dlogits_ms:>11.3f} "
              f"{2 * moved / dlogits_ms / 1e6:>18.0f}{note}")
    weight_grad_part(args, logits, vocab, device)


def _marking(compiled, marked: bool):
    """``compiled``, its tensor arguments' rows marked dynamic first when ``marked`` (as the
    trainer calls its chunk kernels)."""
    if not marked:
        return compiled

    def call(*args):
        # Views: the mark stays on them, not on the tensors the other modes are then called with.
        tensors = lp._rows_vary(*(a[:] if isinstance(a, torch.Tensor) and a.dim() > 0 else None for a in args))
        return compiled(*(t if t is not None else a for t, a in zip(tensors, args)))

    return call


def weight_grad_part(args, d_logits, vocab: int, device: str) -> None:
    """A chunk's lm_head weight gradient summed into the fp32 (V, H) total: a bf16 product
    then an fp32 add (the trainer's), against one GEMM that accumulates into fp32 itself."""
    hidden = torch.randn(d_logits.shape[0], args.hidden or SHAPES[args.shape][0], device=device).to(torch.bfloat16)
    total = torch.zeros(vocab, hidden.shape[1], device=device)

    def product_then_add():
        total.add_(d_logits.T @ hidden)

    def accumulate_in_gemm():
        torch.addmm(total, d_logits.T, hidden, out_dtype=torch.float32, out=total)

    print(f"  lm_head weight gradient of a chunk into fp32 ({vocab}, {hidden.shape[1]}):")
    for label, fn in (("bf16 product, fp32 add", product_then_add), ("addmm out_dtype=fp32", accumulate_in_gemm)):
        try:
            total.zero_()
            fn()
            value = total.clone()
            print(f"    {label:<24} {time_ms(fn, args.repeats):8.3f} ms  (sum after one: {value.double().sum():.4e})")
        except Exception as exc:
            print(f"    {label:<24} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")


def grouped_batch(args) -> Batch:
    """``groups`` prompts of ``prompt_length`` tokens, ``samples`` full-length responses each."""
    rows = args.groups * args.samples
    prompt = torch.randint(1, 1000, (args.groups, args.prompt_length), device="cuda").repeat_interleave(
        args.samples, dim=0)
    return Batch(prompt_ids=prompt, prompt_mask=torch.ones_like(prompt),
                 response_ids=torch.randint(1, 1000, (rows, args.response_length), device="cuda"),
                 response_mask=torch.ones(rows, args.response_length, device="cuda"),
                 prompt_index=torch.arange(args.groups, device="cuda").repeat_interleave(args.samples))


def flex_part(args, heads: int, kv_heads: int, head_dim: int) -> None:
    from torch.nn.attention.flex_attention import flex_attention

    layout = shared_prompt.Layout(grouped_batch(args), [args.samples] * args.groups)
    mask = layout.block_mask()
    visible = int(layout.dense_mask().sum())  # query-key pairs the mask lets through
    width = layout.width
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(args.groups, heads, width, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(args.groups, kv_heads, width, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    grad = torch.randn_like(q)
    flops = 4 * visible * heads * head_dim
    print(f"shared-prompt attention: {args.groups} groups x {width} wide ({args.prompt_length} prompt + "
          f"{args.samples} x {args.response_length}), {heads}/{kv_heads} heads of {head_dim}, "
          f"{visible / 1e6:.1f} M visible pairs a head")
    print(f"  {'kernel options':<28} {'fwd ms':>8} {'TFLOP/s':>8} {'fwd+bwd ms':>11} {'bwd TFLOP/s':>12}")
    reference = None
    for label in args.candidates.split(","):
        options = FLEX_CANDIDATES[label]
        torch._dynamo.reset()
        attend = torch.compile(flex_attention, mode="max-autotune-no-cudagraphs" if label == "max-autotune" else None)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]

        def forward():
            return attend(*leaves, block_mask=mask, enable_gqa=heads != kv_heads, kernel_options=options)

        def forward_backward():
            forward().backward(grad)

        try:
            fwd_ms = time_ms(lambda: forward().detach(), args.repeats)
            total_ms = time_ms(forward_backward, args.repeats)
        except Exception as exc:  # an option set the template rejects (shared memory, block sizes)
            print(f"  {label:<28} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        for leaf in leaves:
            leaf.grad = None
        forward_backward()
        grads = [leaf.grad.float() for leaf in leaves]
        if reference is None:
            reference = grads
            note = ""
        else:
            note = f"  (grad max diff {max((a - b).abs().max().item() for a, b in zip(grads, reference)):.1e})"
        bwd_ms = total_ms - fwd_ms
        print(f"  {label:<28} {fwd_ms:>8.3f} {flops / fwd_ms / 1e9:>8.0f} {total_ms:>11.3f} "
              f"{2.5 * flops / bwd_ms / 1e9:>12.0f}{note}")


def main(argv=None) -> int:
    args = parse_args(argv)
    parts = args.parts.split(",")
    cuda = torch.cuda.is_available()
    if "flex" in parts and not cuda:
        print("bench_update_kernels: the flex part needs a CUDA device (flex attention has no CPU backward); "
              "on a CPU run --parts logprob", file=sys.stderr)
        return 2
    hidden, heads, kv_heads, head_dim, vocab = SHAPES[args.shape]
    print(f"{torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__}, shape {args.shape}")
    if "logprob" in parts:
        logprob_part(args, args.vocab or vocab, "cuda" if cuda else "cpu")
    if "flex" in parts:
        flex_part(args, heads, kv_heads, head_dim)
    return 0


if __name__ == "__main__":
    sys.exit(main())
