"""Decode throughput of the rollout engines, side by side in one process.

For each engine variant and batch size: the wall time of one ``generate`` call of
``--batch`` rows x ``--new-tokens`` tokens after ``--prompt-length`` prompt tokens
(prefill included, every row run to full length: a random model rarely samples its
eos and the benchmark sets none), its tokens/s, and for graph-captured variants the
time of one decode step alone (graph replays timed with CUDA events, from the cache's
first column: a step late in a long decode attends to more columns and takes longer). Then the time of
``sync_weights`` (fp32 policy -> the engine's bf16 buffers). On the H200::

    python3 benchmarks/bench_rollout.py --model random:qwen2.5-0.5b --batch 128 256 512

``--samples 4`` decodes batch / 4 prompts four times each, as a GRPO step does, and
``--share on off`` times the fused attention reading each prompt's columns once for its
samples against once a row, and ``--pdl on off`` the engine's kernels with programmatic
dependent launch against without (run each value in a process of its own: on an H100 a PDL
engine built after one without it ran no faster than that one, benchmarks/RESULTS.md).
``--profile`` also prints how busy the device was over
back-to-back replays of the step (kernel time against the gaps between kernels).

Variants: ``hf`` (transformers generate), ``static-eager`` (enforce_eager=True),
``static-graph`` (CUDA graphs), ``static-compiled`` (torch.compile'd layer step inside
the graphs). Only ratios within one run mean anything: host-bound code varies 2x
between machines.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from bench_trainer import idle_gaps  # noqa: E402

from trainer.config import TrainerConfig  # noqa: E402
from trainer.models import load_model_and_tokenizer  # noqa: E402
from trainer.rollout import SamplingParams  # noqa: E402
from trainer.rollout.attention import DECODE_ATTENTION  # noqa: E402
from trainer.rollout.hf import HFEngine  # noqa: E402
from trainer.rollout.static import StaticEngine  # noqa: E402

VARIANTS = ("hf", "static-eager", "static-graph", "static-compiled")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--batch", type=int, nargs="+", default=[8])
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--hf-max-batch", type=int, default=128, help="skip hf above this batch (slow)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", help="also write every number to this file")
    parser.add_argument("--attention", nargs="+", default=["auto"], choices=["auto", *DECODE_ATTENTION],
                        help="decode attention of the static variants (each variant runs with each)")
    parser.add_argument("--sampler", nargs="+", default=["auto"], choices=["auto", "fused", "torch"],
                        help="the static variants' sampler in the plain mode: the fused Triton one, torch ops, "
                             "or auto (fused on CUDA)")
    parser.add_argument("--profile", type=int, default=0, metavar="BATCH",
                        help="profile decode steps at this batch and print the top kernels (of each --attention)")
    parser.add_argument("--profile-variant", default="static-eager", choices=VARIANTS[1:],
                        help="what --profile profiles: eager steps, or replays of a variant's captured graph")
    parser.add_argument("--samples", type=int, nargs="+", default=[1],
                        help="rows a prompt (GRPO's n): batch / samples distinct prompts; each value runs")
    parser.add_argument("--share", nargs="+", default=["on"], choices=["on", "off"],
                        help="whether the fused attention reads a prompt's columns once for its samples' rows")
    parser.add_argument("--blas", nargs="+", default=["default"], choices=["default", "cublas", "cublaslt"],
                        help="torch's BLAS library for the GEMMs (torch.backends.cuda.preferred_blas_library); "
                             "each static variant runs with each")
    parser.add_argument("--pdl", nargs="+", default=["auto"], choices=["auto", "on", "off"],
                        help="programmatic dependent launch for the static engine's kernels (auto: where it runs; "
                             "each value runs)")
    return parser.parse_args(argv)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make(variant, model, tokenizer, device, dtype, rows, columns, attention="auto", sampler="auto", share="on",
         pdl="auto"):
    if variant == "hf":
        return HFEngine(model, tokenizer, device=device, autocast_dtype=dtype if dtype != torch.float32 else None)
    return StaticEngine(model, tokenizer, device=device, dtype=dtype, max_rows=rows, max_columns=columns,
                        memory_fraction=0.9, cuda_graphs=variant != "static-eager",
                        compile_step=variant == "static-compiled", attention=attention,
                        fused_sampler={"auto": None, "fused": True, "torch": False}[sampler],
                        share_prompts=share == "on", pdl={"auto": None, "on": True, "off": False}[pdl])


def step_ms(engine, rows, device):
    """Median time of one captured decode step, from graph replays timed with CUDA events."""
    graphs = [g for (bucket, *_), g in engine.graphs.items() if bucket == engine._bucket(rows)]
    if not graphs or device.type != "cuda":
        return None
    graph = graphs[0]
    times = []
    for _ in range(5):
        # Replays advance the step state; start each round where a chunk's decode starts, so
        # the positions and cache columns stay inside the cache.
        engine.column.fill_(0)
        engine.out_index.fill_(0)
        engine.positions.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end) / 20)
    return sorted(times)[len(times) // 2]


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cfg = TrainerConfig(model=args.model, dataset="/nonexistent" if args.model != "tiny-random" else "synthetic")
    model, tokenizer = load_model_and_tokenizer(cfg, device=device, dtype=torch.float32)  # fp32 masters
    model.generation_config.eos_token_id = None  # every row runs to full length
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    columns = args.prompt_length + args.new_tokens
    results = []
    print(f"{args.model} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
          f"prompt {args.prompt_length}, {args.new_tokens} new tokens, torch {torch.__version__}")
    runs = [(v, None, None, "default", 1, "on", "auto") if v == "hf" else (v, a, f, blas, n, share, pdl)
            for v in args.variants for a in args.attention for f in args.sampler for blas in args.blas
            for n in args.samples for share in args.share for pdl in args.pdl]
    default_blas = torch.backends.cuda.preferred_blas_library() if device.type == "cuda" else None
    for variant, attention, sampler, blas, samples, share, pdl in dict.fromkeys(runs):
        if device.type == "cuda":
            torch.backends.cuda.preferred_blas_library(default_blas if blas == "default" else blas)
        for batch in args.batch:
            if variant == "hf" and batch > args.hf_max_batch:
                continue
            if batch % samples:
                continue
            prompts = torch.randint(min(300, vocab // 2), vocab, (batch // samples, args.prompt_length),
                                    generator=generator).tolist()
            params = SamplingParams(n=samples, max_new_tokens=args.new_tokens, temperature=1.0, seed=1)
            try:
                built = time.perf_counter()
                engine = make(variant, model, tokenizer, device, dtype, batch, columns, attention or "auto",
                              sampler or "auto", share, pdl)
                engine.stop_ids = [-1] if variant != "hf" else engine.stop_ids
                if variant != "hf":
                    engine.stop_tensor = torch.tensor([-1], device=device)
                warm = time.perf_counter()
                # The warm-up's rows are the timed call's (one graph bucket): its capture is not timed.
                engine.generate(prompts, SamplingParams(n=samples, max_new_tokens=8, seed=0))
                sync(device)
                setup_s = time.perf_counter() - built
                del warm
                started = time.perf_counter()
                out = engine.generate(prompts, params)
                sync(device)
                seconds = time.perf_counter() - started
                tokens = int(out.response_mask.sum().item())
                label = variant if variant == "hf" else \
                    f"{variant}/{engine.attention.name}/{'fused' if engine.fused_sampler else 'torch'}"
                label += "" if blas == "default" else f"/{blas}"
                label += "" if samples == 1 else f"/n{samples}" + ("" if engine.share_prompts else "/unshared")
                label += "/pdl" if engine.pdl else ""
                row = {"variant": label, "batch": batch, "seconds": seconds, "tokens": tokens,
                       "tokens_per_s": tokens / seconds, "setup_s": setup_s,
                       "step_ms": step_ms(engine, batch, device) if variant != "hf" else None}
                if variant != "hf":
                    times = []
                    for _ in range(10):
                        sync(device)
                        t0 = time.perf_counter()
                        engine.sync_weights(model)
                        sync(device)
                        times.append(time.perf_counter() - t0)
                    row["sync_ms"] = sorted(times)[5] * 1000
                    row["kv_rows"] = engine.rows
                if device.type == "cuda":
                    row["peak_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
            except Exception as exc:  # one variant's failure must not lose the others' numbers
                row = {"variant": f"{variant}/{attention}/{sampler}" if attention else variant, "batch": batch,
                       "error": f"{type(exc).__name__}: {exc}"[:500]}
            results.append(row)
            print(json.dumps(row), flush=True)
            engine = out = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
    print(f"\n{'variant':<40}{'batch':>6}{'s':>8}{'tok/s':>10}{'step ms':>9}{'sync ms':>9}{'setup s':>9}")
    for row in results:
        if "error" in row:
            print(f"{row['variant']:<40}{row['batch']:>6}  error: {row['error'][:80]}")
            continue
        step = f"{row['step_ms']:.2f}" if row.get("step_ms") else "-"
        syncs = f"{row['sync_ms']:.2f}" if row.get("sync_ms") is not None else "-"
        print(f"{row['variant']:<40}{row['batch']:>6}{row['seconds']:>8.2f}{row['tokens_per_s']:>10.0f}"
              f"{step:>9}{syncs:>9}{row['setup_s']:>9.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if device.type == "cuda":
        torch.backends.cuda.preferred_blas_library(default_blas if args.blas[0] == "default" else args.blas[0])
    for attention in args.attention if args.profile else ():
        profile_decode(model, tokenizer, device, dtype, args.profile, columns, args.profile_variant, attention,
                       args.sampler[0], args.samples[0], args.share[0], args.prompt_length)
    return 0


def profile_decode(model, tokenizer, device, dtype, batch, columns, variant, attention, sampler, samples=1,
                   share="on", prompt_length=16):
    """Kernel time of decode steps, by kernel: where a step's time goes on the device.

    ``static-eager`` profiles eager steps; a graph variant profiles replays of its captured
    step (the kernels a run's decode actually launches). Then how busy the device was over
    back-to-back replays: the span from the first kernel's start to the last one's end
    against the time some kernel ran; the rest is the gaps between kernels, which fusing
    kernels (fewer of them) would cut and faster kernels would not."""
    from torch.profiler import ProfilerActivity, profile

    engine = make(variant, model, tokenizer, device, dtype, batch, columns, attention, sampler, share)
    prompts = [[7 + i] * prompt_length for i in range(batch // samples)]
    engine.generate(prompts, SamplingParams(n=samples, max_new_tokens=4, seed=0))
    mode = engine._mode(SamplingParams(n=1, max_new_tokens=1))
    graph = engine.graphs.get((engine._bucket(batch), mode, engine.share))
    engine.column.fill_(columns // 2)  # a step halfway through the cache
    engine.positions.fill_(columns // 2)
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(5):
            engine.column.fill_(columns // 2)
            engine.positions.fill_(columns // 2)
            engine.out_index.fill_(1)
            graph.replay() if graph is not None else engine._decode_step(batch, mode)
        sync(device)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(f"profile: {variant}/{engine.attention.name}/{'fused' if engine.fused_sampler else 'torch'}, "
          f"batch {batch} ({samples} a prompt of {prompt_length} tokens, share {engine.share}), "
          f"5 steps at column {columns // 2}")
    print(prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=70))
    if device.type != "cuda" or graph is None:
        return
    engine.column.fill_(columns // 2)
    engine.positions.fill_(columns // 2)
    engine.out_index.fill_(1)
    sync(device)
    replays = 10
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        sync(device)
    print(busy_line(kernel_intervals(prof), replays))


def kernel_intervals(prof) -> list[tuple[float, float]]:
    """(start, end) in us of every device kernel the profiler saw, by start."""
    from torch.autograd import DeviceType

    return sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                  if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start)


def busy_line(intervals: list[tuple[float, float]], steps: int) -> str:
    """The device's busy time against the span of ``intervals`` (overlaps counted once)."""
    if not intervals:
        return "busy: no device kernels seen"
    span = max(end for _, end in intervals) - intervals[0][0]
    gaps = sum(gap for gap, _, _ in idle_gaps([("", start, end) for start, end in intervals]))
    busy = span - gaps
    return (f"busy over {steps} back-to-back steps: span {span / steps:.1f} us a step, kernels {busy / steps:.1f} us "
            f"({100 * busy / span:.1f} %), gaps {gaps / steps:.1f} us, {len(intervals) / steps:.0f} kernels a step "
            f"({gaps / max(1, len(intervals) - 1):.2f} us between kernels on average)")

if __name__ == "__main__":
    sys.exit(main())
