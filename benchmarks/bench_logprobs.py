"""Forward + backward time and peak memory of the lm_head log-prob: full logits vs trainer.logprobs.

Both paths start from the last hidden state (N, H) and the lm_head weight
(V, H), both requiring grad, and back-propagate a GRPO-like loss
sum(a * logprobs) (+ 0.01 * sum(entropy) with entropy):

* naive: logits = hidden @ weight.T as (B, T, V), then
  trainer.losses.token_logprobs and entropy_from_logits;
* fused: trainer.logprobs.linear_logprobs, once per --chunk-tokens value.

Peak memory is what the step adds above the inputs (weight, hidden, targets),
the (V, H) and (N, H) gradients included: torch.cuda.max_memory_allocated on
CUDA; on CPU the process's resident high-water mark (Linux /proc, reset before
each case), which is only indicative. The H200 run the numbers are wanted for
(Qwen2.5-0.5B's lm_head, 8 x 512 response tokens)::

    python benchmarks/bench_logprobs.py

and a quick local one::

    python benchmarks/bench_logprobs.py --device cpu --sequences 4 --length 256 --vocab 8192 \\
        --chunk-tokens 1024,256
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer import losses  # noqa: E402
from trainer.logprobs import linear_logprobs  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="'auto': bfloat16 on cuda, float32 on cpu (as the trainer)")
    parser.add_argument("--sequences", type=int, default=8, help="B")
    parser.add_argument("--length", type=int, default=512, help="T, response tokens per sequence")
    parser.add_argument("--hidden", type=int, default=896, help="H (Qwen2.5-0.5B: 896)")
    parser.add_argument("--vocab", type=int, default=151936, help="V (Qwen2.5-0.5B: 151936)")
    parser.add_argument("--chunk-tokens", default="4096,1024", help="comma-separated chunk sizes for the fused path")
    parser.add_argument("--naive-chunk", type=int, default=1024, help="chunk_size of trainer.losses' row chunking")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    return parser.parse_args(argv)


def naive_path(hidden, weight, targets, *, temperature, with_entropy, batch, chunk_size):
    logits = (hidden @ weight.T).view(batch, -1, weight.shape[0])  # (B, T, V)
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = losses.token_logprobs(logits, targets.view(batch, -1), chunk_size=chunk_size)
    entropy = losses.entropy_from_logits(logits, chunk_size=chunk_size) if with_entropy else None
    return logprobs.view(-1), None if entropy is None else entropy.view(-1)


def fused_path(hidden, weight, targets, *, temperature, with_entropy, chunk_tokens):
    return linear_logprobs(hidden, weight, targets, temperature=temperature, with_entropy=with_entropy,
                           chunk_tokens=chunk_tokens)


class Meter:
    """Wall time of one call and the peak memory a case adds, per device."""

    def __init__(self, device):
        self.device = device

    def start_case(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.baseline = torch.cuda.memory_allocated()
        else:
            self.baseline = _cpu_reset_peak()

    def peak_mib(self):
        if self.device.type == "cuda":
            return (torch.cuda.max_memory_allocated() - self.baseline) / 2**20
        peak = _cpu_status_kib("VmHWM")
        return None if peak is None or self.baseline is None else (peak - self.baseline) / 1024

    def time_ms(self, fn):
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end)
        began = time.perf_counter()
        fn()
        return (time.perf_counter() - began) * 1e3


def _cpu_status_kib(key):
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _cpu_mmap_large_blocks():
    """Have glibc map every block of 64 KiB or more on its own, so that freeing a tensor lowers
    the resident size at once; by default it keeps freed blocks and a later case would reuse
    them unseen. Setting the threshold also turns off glibc's adjusting it upwards."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _cpu_reset_peak():
    """Reset the resident high-water mark (Linux >= 4.0); the current RSS, or None where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return _cpu_status_kib("VmRSS")


def run_case(meter, path, hidden, weight, targets, advantages, *, with_entropy, warmup, repeats):
    def step():
        logprobs, entropy = path(hidden, weight, targets, with_entropy=with_entropy)
        loss = (advantages * logprobs).sum()
        if with_entropy:
            loss = loss + 0.01 * entropy.sum()
        loss.backward()

    for _ in range(warmup):
        step()
    hidden.grad = weight.grad = None
    meter.start_case()
    times = []
    for _ in range(repeats):
        times.append(meter.time_ms(step))
        hidden.grad = weight.grad = None  # each step allocates its gradients anew, and they count
    return statistics.median(times), meter.peak_mib()


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(
        args.dtype, torch.bfloat16 if device.type == "cuda" else torch.float32)
    chunks = [int(c) for c in args.chunk_tokens.split(",") if c]
    if device.type == "cpu":
        _cpu_mmap_large_blocks()
    rows = args.sequences * args.length
    g = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(rows, args.hidden, device=device, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(args.vocab, args.hidden, device=device, generator=g) * args.hidden**-0.5) \
        .to(dtype).requires_grad_()
    targets = torch.randint(0, args.vocab, (rows,), device=device, generator=g)
    advantages = torch.randn(rows, device=device, generator=g)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}, {str(dtype).removeprefix('torch.')}, N = {args.sequences} x {args.length} = {rows}, "
          f"H = {args.hidden}, V = {args.vocab}, T = {args.temperature}; median of {args.repeats} "
          f"forward+backward after {args.warmup} warm-up; N x V fp32 = {rows * args.vocab * 4 / 2**20:.0f} MiB")
    print(f"{'entropy':<8} {'path':<20} {'ms':>9} {'peak MiB':>10} {'ms/naive':>9} {'mem/naive':>10}")
    meter = Meter(device)
    for with_entropy in (False, True):
        cases = [("naive", lambda h, w, t, with_entropy: naive_path(
            h, w, t, temperature=args.temperature, with_entropy=with_entropy, batch=args.sequences,
            chunk_size=args.naive_chunk))]
        cases += [(f"fused chunk={c}", lambda h, w, t, with_entropy, c=c: fused_path(
            h, w, t, temperature=args.temperature, with_entropy=with_entropy, chunk_tokens=c)) for c in chunks]
        reference = None
        for label, path in cases:
            ms, peak = run_case(meter, path, hidden, weight, targets, advantages, with_entropy=with_entropy,
                                warmup=args.warmup, repeats=args.repeats)
            reference = reference or (ms, peak)
            peak_text = "-" if peak is None else f"{peak:.0f}"
            mem_ratio = "-" if peak is None or not reference[1] else f"{peak / reference[1]:.2f}"
            print(f"{'yes' if with_entropy else 'no':<8} {label:<20} {ms:>9.1f} {peak_text:>10} "
                  f"{ms / reference[0]:>9.2f} {mem_ratio:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
