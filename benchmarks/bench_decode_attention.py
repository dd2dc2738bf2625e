"""Decode attention alone: the split-KV kernel's tile sizes against SDPA, side by side.

One decode step's attention for every layer of a model shape (``--layers`` calls, each
on its own layer's cache, captured in one CUDA graph so launch gaps are the run's own),
timed with CUDA events at a few step columns. Prints microseconds per layer call and
the cache bytes each call reads (the columns in use), as GB/s. On the H200::

    python3 benchmarks/bench_decode_attention.py --batch 128 256

``--fused 4`` times the engine's default op instead (``fused_decode_attention``: RoPE, the
cache write and the attention in the split kernel, then the merge), with rows in blocks of 4
sampling one prompt whose columns each block reads once, at ``--at`` step columns (default
four through the decode); GB/s then counts the prompt's columns once a block::

    python3 benchmarks/bench_decode_attention.py --fused 4 --configs 64x2 64x4 128x4 128x8 256x8

Shape defaults: Qwen2.5-0.5B's (2 KV heads, 7 query heads each, head dim 64, 24 layers),
a 768-column cache of 256-token prompts. Only ratios within one run mean anything.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from trainer.rollout.attention import split_kv_decode  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[128])
    parser.add_argument("--columns", type=int, default=768)
    parser.add_argument("--prompt", type=int, default=256, help="the first decode column")
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--group", type=int, default=7)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--configs", nargs="+", default=["64x2", "128x4", "256x4", "64x2-all", "128x4-all"],
                        help="split-kv tiles as SPLITxWARPS; '-all' runs every split's program in full, "
                             "instead of returning at once from a split with none of its row's columns")
    parser.add_argument("--fused", type=int, default=0, metavar="SHARE",
                        help="time the fused op (the engine's), rows in blocks of SHARE sampling one prompt")
    parser.add_argument("--at", type=int, nargs="+", help="the step columns to time at")
    return parser.parse_args(argv)


def timed_graph(calls, repeats=20):
    """Microseconds per call of ``calls`` (a list of thunks), replayed as one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:  # compile and warm up outside the graph
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / repeats / len(calls)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_decode_attention needs a CUDA device")
        return 1
    torch.manual_seed(0)
    dtype = torch.bfloat16
    if args.fused:
        return fused_main(args, dtype)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.layers} layers, {args.kv_heads} KV heads "
          f"x {args.group} queries, d {args.head_dim}, {args.columns} columns")
    print(f"{'batch':>6}{'column':>8}  {'attention':<18}{'us/layer':>10}{'GB/s':>8}{'x sdpa':>8}")
    for batch in args.batch:
        caches = torch.randn((args.layers, 2, batch, args.kv_heads, args.columns, args.head_dim), dtype=dtype,
                             device="cuda")
        q = torch.randn((batch, args.kv_heads, args.group, args.head_dim), dtype=dtype, device="cuda")
        first = torch.zeros(batch, dtype=torch.long, device="cuda")
        column = torch.zeros(1, dtype=torch.long, device="cuda")
        columns = torch.arange(args.columns, device="cuda")
        for at in (args.prompt, (args.prompt + args.columns) // 2, args.columns - 1):
            column.fill_(at)
            used = at + 1
            read = 2 * batch * args.kv_heads * used * args.head_dim * caches.element_size()
            mask = torch.zeros((batch, 1, 1, args.columns), dtype=dtype, device="cuda").masked_fill_(
                (columns > at)[None, None, None, :], float("-inf"))
            sdpa = timed_graph([lambda i=i: F.scaled_dot_product_attention(q, caches[i, 0], caches[i, 1],
                                                                           attn_mask=mask)
                                for i in range(args.layers)])
            rows = [("sdpa", sdpa)]
            for config in args.configs:
                tile, _, every = config.partition("-")
                split, warps = (int(part) for part in tile.split("x"))
                rows.append((f"split-kv {config}", timed_graph([
                    lambda i=i, s=split, w=warps, e=every != "all": split_kv_decode(
                        q, caches[i, 0], caches[i, 1], first, column, split=s, num_warps=w, skip_empty=e)
                    for i in range(args.layers)])))
            for name, us in rows:
                print(f"{batch:>6}{at:>8}  {name:<18}{us:>10.2f}{read / us / 1e3:>8.0f}{sdpa / us:>8.2f}")
        caches = None  # before the next batch's cache is allocated
        torch.cuda.empty_cache()
    return 0


def fused_main(args, dtype) -> int:
    """The fused op of the engine's decode step, by tile config and step column."""
    from trainer.rollout.fused_attention import fused_decode_attention

    share, d, kv, group = args.fused, args.head_dim, args.kv_heads, args.group
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; fused op, {args.layers} layers, {kv} KV heads "
          f"x {group} queries, d {d}, {args.columns} columns, prompt {args.prompt} read once a block of {share}")
    print(f"{'batch':>6}{'column':>8}  {'fused SPLITxWARPS':<18}{'us/layer':>10}{'GB/s':>8}")
    for batch in args.batch:
        caches = torch.randn((args.layers, 2, batch, kv, args.columns, d), dtype=dtype, device="cuda")
        qkv = torch.randn((batch, (kv * group + 2 * kv) * d), dtype=dtype, device="cuda")
        angles = torch.rand((batch, d), device="cuda") * 6.28
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        first = torch.zeros(batch, dtype=torch.long, device="cuda")
        column = torch.zeros(1, dtype=torch.long, device="cuda")
        shared_end = torch.full((1,), args.prompt, dtype=torch.long, device="cuda")
        span = args.columns - args.prompt
        per_column = 2 * kv * d * caches.element_size()  # bytes of K and V a row reads a column
        for at in args.at or [args.prompt + span * k // 8 for k in (1, 3, 5, 7)]:
            column.fill_(at)
            # What the step must read: the prompt's columns once a block, the rest once a row.
            read = per_column * (batch // share * min(args.prompt, at) + batch * max(0, at + 1 - args.prompt))
            for config in args.configs:
                split, warps = (int(part) for part in config.partition("-")[0].split("x"))
                us = timed_graph([lambda i=i, s=split, w=warps: fused_decode_attention(
                    qkv, cos, sin, caches[i], first, column, None, None, 1e-6, kv * group, split=s, num_warps=w,
                    shared_end=shared_end, share=share) for i in range(args.layers)])
                print(f"{batch:>6}{at:>8}  {config:<18}{us:>10.2f}{read / us / 1e3:>8.0f}")
        caches = None  # before the next batch's cache is allocated
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
