"""A decode layer's projections: the fused Triton kernels against the compiled torch ops, side by side.

Each variant runs one decode layer's work outside its attention for every layer of a shape
(each layer its own weights, so the weights come from memory, not L2), captured in one
CUDA graph, timed with CUDA events; printed as microseconds per layer. The attention is
left out in both: its stand-in is the q heads of the qkv projection.

* ``compiled``: what the engine's compiled layer step runs: ``rms_norm(h + mlp)``, cuBLAS
  for the four projections, the norm after the attention, ``silu(gate) * up``;
* ``fused``: :mod:`trainer.rollout.decode_linear`: ``norm_linear`` (norm + qkv),
  ``linear_residual`` (out + residual), ``norm_linear(silu_mul)`` (norm + gate/up + SiLU),
  cuBLAS for down.

``--sweep`` also times each fused kernel alone at several tiles against its compiled
counterpart. On the H200::

    python3 benchmarks/bench_decode_linear.py --shape qwen2.5-0.5b qwen2.5-1.5b --batch 128 --sweep

Only ratios within one run mean anything.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from trainer.rollout import decode_linear  # noqa: E402, F401 (registers torch.ops.trainer.norm_linear)
from trainer.shapes import RANDOM_SHAPES  # noqa: E402

EPS = 1e-6


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", nargs="+", default=["qwen2.5-0.5b"], choices=sorted(RANDOM_SHAPES))
    parser.add_argument("--batch", type=int, nargs="+", default=[128])
    parser.add_argument("--sweep", action="store_true", help="time each fused kernel at several tiles")
    parser.add_argument("--repeats", type=int, default=20)
    return parser.parse_args(argv)


def timed_graph(calls, repeats):
    """Microseconds per call of ``calls`` (a list of thunks), replayed as one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
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


def layers_of(shape, count=None):
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    d = shape.get("head_dim", hidden // heads)
    make = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16) / s[-1] ** 0.5  # noqa: E731
    return [dict(input_norm=1 + torch.rand(hidden, device="cuda", dtype=torch.bfloat16),
                 qkv=make((heads + 2 * kv) * d, hidden), qkv_bias=make((heads + 2 * kv) * d) * 0.1,
                 out=make(hidden, heads * d), post_norm=1 + torch.rand(hidden, device="cuda", dtype=torch.bfloat16),
                 gate_up=make(2 * inter, hidden), down=make(hidden, inter), q_width=heads * d)
            for _ in range(count or shape["num_hidden_layers"])]


def compiled_layer(h, mlp, w):
    h = h + mlp
    qkv = F.linear(F.rms_norm(h, (h.shape[-1],), w["input_norm"], EPS), w["qkv"], w["qkv_bias"])
    attended = qkv[:, : w["q_width"]]
    h = h + (attended[:, None] @ w["out"].T)[:, 0]
    gate, up = F.linear(F.rms_norm(h, (h.shape[-1],), w["post_norm"], EPS), w["gate_up"]).chunk(2, dim=-1)
    return h, F.linear(F.silu(gate) * up, w["down"])


def fused_layer(h, mlp, w, tiles=None):
    tiles = tiles or {}
    h, qkv = torch.ops.trainer.norm_linear(h, mlp, w["input_norm"], w["qkv"], w["qkv_bias"], EPS,
                                           tiles=tiles.get("norm"))
    h = torch.ops.trainer.linear_residual(qkv[:, : w["q_width"]], w["out"], h, tiles=tiles.get("residual"))
    _, act = torch.ops.trainer.norm_linear(h, None, w["post_norm"], w["gate_up"], None, EPS, silu_mul=True,
                                           tiles=tiles.get("silu"))
    return h, F.linear(act, w["down"])


def run_layers(step, layers, h, mlp):
    calls = []
    state = {}

    def call(w, first):
        def go():
            x, m = (h, mlp) if first else (state["h"], state["mlp"])
            state["h"], state["mlp"] = step(x, m, w)
        return go
    calls = [call(w, i == 0) for i, w in enumerate(layers)]
    return calls, state


def whole_layers(shape, batch, repeats, tiles=None):
    layers = layers_of(shape)
    hidden = shape["hidden_size"]
    h = torch.randn(batch, hidden, device="cuda", dtype=torch.bfloat16)
    mlp = torch.randn(batch, hidden, device="cuda", dtype=torch.bfloat16) * 0.1
    compiled = torch.compile(compiled_layer, dynamic=False)
    # Agreement on one layer first.
    ref_h, ref_mlp = compiled(h, mlp, layers[0])
    new_h, new_mlp = fused_layer(h, mlp, layers[0])
    error = max(float((ref_h - new_h).abs().max()), float((ref_mlp - new_mlp).abs().max()))
    scale = float(ref_mlp.abs().max())
    results = {}
    for name, step in (("compiled", compiled), ("fused", lambda x, m, w: fused_layer(x, m, w, tiles))):
        calls, _ = run_layers(step, layers, h, mlp)
        results[name] = timed_graph(calls, repeats)
    print(f"| {batch} | {tiles or 'defaults'} | {results['compiled']:.2f} | {results['fused']:.2f} | "
          f"{results['compiled'] / results['fused']:.2f}x | {error:.3g} (of {scale:.3g}) |", flush=True)


def sweep(shape, batch, repeats):
    layers = layers_of(shape)
    hidden = shape["hidden_size"]
    h = torch.randn(batch, hidden, device="cuda", dtype=torch.bfloat16)
    mlp = torch.randn(batch, hidden, device="cuda", dtype=torch.bfloat16) * 0.1
    q = torch.randn(batch, layers[0]["q_width"], device="cuda", dtype=torch.bfloat16)
    act_in = torch.randn(batch, shape["intermediate_size"], device="cuda", dtype=torch.bfloat16)

    def norm_qkv_torch(w):
        return lambda: F.linear(F.rms_norm(h + mlp, (hidden,), w["input_norm"], EPS), w["qkv"], w["qkv_bias"])

    def out_torch(w):
        return lambda: h + (q[:, None] @ w["out"].T)[:, 0]

    def silu_torch(w):
        def go():
            gate, up = F.linear(F.rms_norm(h, (hidden,), w["post_norm"], EPS), w["gate_up"]).chunk(2, dim=-1)
            return F.silu(gate) * up
        return go

    def down_torch(w):
        return lambda: F.linear(act_in, w["down"])

    parts = {
        "norm": (norm_qkv_torch,
                 lambda w, t: lambda: torch.ops.trainer.norm_linear(h, mlp, w["input_norm"], w["qkv"], w["qkv_bias"],
                                                                    EPS, tiles=t)),
        "residual": (out_torch, lambda w, t: lambda: torch.ops.trainer.linear_residual(q, w["out"], h, tiles=t)),
        "silu": (silu_torch,
                 lambda w, t: lambda: torch.ops.trainer.norm_linear(h, None, w["post_norm"], w["gate_up"], None, EPS,
                                                                    silu_mul=True, tiles=t)),
    }
    print("| part | tiles (M, N, K, warps, stages) | us/layer | compiled torch us/layer | vs compiled |")
    print("|---|---|---|---|---|")
    down = timed_graph([torch.compile(down_torch(w), dynamic=False) for w in layers], repeats)
    print(f"| down (cuBLAS, both variants) | | | {down:.2f} | |", flush=True)
    grid = list(itertools.product((64, 128), (16, 32, 64), (64, 128), (4,), (3,))) + [(128, 32, 64, 8, 3),
                                                                                     (64, 16, 128, 4, 4)]
    best = {}
    for part, (torch_op, fused_op) in parts.items():
        base = timed_graph([torch.compile(torch_op(w), dynamic=False) for w in layers], repeats)
        for tiles in grid:
            try:
                us = timed_graph([fused_op(w, list(tiles)) for w in layers], repeats)
            except Exception as error:  # a tile the compiler refuses (shared memory) is skipped
                print(f"| {part} | {tiles} | failed: {type(error).__name__} | | |", flush=True)
                continue
            print(f"| {part} | {tiles} | {us:.2f} | {base:.2f} | {base / us:.2f}x |", flush=True)
            if part not in best or us < best[part][1]:
                best[part] = (tiles, us)
    for part, (tiles, us) in best.items():
        print(f"best {part}: {tiles} {us:.2f} us/layer")
    return {part: list(tiles) for part, (tiles, _) in best.items()}


def main(argv=None):
    args = parse_args(argv)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name in args.shape:
        shape = RANDOM_SHAPES[name]
        for batch in args.batch:
            print(f"\n## {name}, batch {batch}\n")
            best = sweep(shape, batch, args.repeats) if args.sweep else None
            print("\n| batch | tiles | compiled us/layer | fused us/layer | compiled / fused | max abs diff |")
            print("|---|---|---|---|---|---|")
            whole_layers(shape, batch, args.repeats)
            if best:
                whole_layers(shape, batch, args.repeats, best)


if __name__ == "__main__":
    main()
