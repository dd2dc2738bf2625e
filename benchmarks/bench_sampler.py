"""The plain-mode sampler alone: the Triton kernels against torch ops, side by side.

One draw of a token a row from (batch, vocabulary) bf16 logits at temperature 1, the way
a decode step draws it: the torch sampler (:func:`trainer.rollout.sampling.sample_tokens`,
compiled, its Exp(1) noise drawn by a native kernel) and the fused one
(:func:`trainer.rollout.fused_sampling.softmax_sample`) at a few span and block sizes.
Each is captured in a CUDA graph of 20 draws and timed with CUDA events (median of 5).
Also printed: how far each one's token frequencies over many draws of one row are from
the softmax (total variation), as a check that the fast one still samples. On the H200::

    python3 benchmarks/bench_sampler.py --batch 128 256
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from trainer.rollout import fused_sampling  # noqa: E402
from trainer.rollout.sampling import sample_tokens  # noqa: E402

TILES = [(8192, 2048), (4096, 1024), (4096, 2048), (16384, 2048), (8192, 1024)]


def timed_us(draw, repeats=20):
    draw()  # compile, autotune, warm
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            draw()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / repeats)
    return sorted(times)[2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[128])
    parser.add_argument("--vocab", type=int, default=151936)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    temperature = torch.ones(1, device=device)
    seed = torch.zeros(1, dtype=torch.long, device=device)
    torch_sampler = torch.compile(lambda logits, noise: sample_tokens(logits, temperature=temperature, noise=noise),
                                  dynamic=False)
    print(f"{torch.cuda.get_device_name(device)}, vocabulary {args.vocab}, torch {torch.__version__}")
    print(f"{'batch':>6} {'sampler':<28}{'us':>9}{'vs torch':>10}{'TV, 1 row':>11}")
    for batch in args.batch:
        logits = (torch.randn(batch, args.vocab, device=device) * 3).to(torch.bfloat16)
        noise = torch.empty(batch, args.vocab, device=device)

        def torch_draw():
            return torch_sampler(logits, noise.exponential_())

        rows = [("torch ops (compiled)", torch_draw, None)]
        for span, block in TILES:
            rows.append((f"fused span {span} block {block}",
                         lambda span=span, block=block: fused_sampling.softmax_sample(
                             logits, temperature, seed.add_(1), span=span, block=block), (span, block)))
        base = None
        for name, draw, tiles in rows:
            us = timed_us(draw)
            base = base or us
            print(f"{batch:>6} {name:<28}{us:>9.1f}{base / us:>9.2f}x{total_variation(logits[0], tiles, device):>11.4f}",
                  flush=True)
    return 0


def total_variation(row, tiles, device, chunks=8, draws=16384):
    """Half the L1 distance between one row's draw frequencies and its softmax. Sampling noise
    alone makes it nonzero, so compare the samplers with each other, not with zero."""
    logits = row[None].expand(draws, -1).contiguous()
    one = torch.ones(1, device=device)
    counts = torch.zeros(row.numel(), dtype=torch.float64, device=device)
    for chunk in range(chunks):
        if tiles is None:
            tokens, _ = sample_tokens(logits, temperature=one)
        else:
            tokens, _ = fused_sampling.softmax_sample(logits, one, torch.tensor([99 + chunk], device=device),
                                                      span=tiles[0], block=tiles[1])
        counts += torch.bincount(tokens, minlength=row.numel())
    return 0.5 * (counts / counts.sum() - row.double().softmax(-1)).abs().sum().item()


if __name__ == "__main__":
    sys.exit(main())
