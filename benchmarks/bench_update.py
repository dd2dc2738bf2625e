"""Forward + backward of the policy update's micro-batch: the two attention layouts, by micro size.

One micro-batch of rows (prompt + response tokens), the trainer's mixed precision
(fp32 masters, bf16 autocast on CUDA), the loss sum(a * logprob) + 0.01 * entropy
back-propagated into every parameter:

* ``padded-mask``: prompts left-padded, responses right-padded, position ids from
  the mask and a dense (b, 1, L, L) boolean mask in which each pad query sees its
  own key (the trainer's layout before 2026-12-01; SDPA cannot take its flash
  kernel with a mask);
* ``left-aligned``: :func:`trainer.forward.response_logprobs` as the trainer runs
  it: each row shifted to column 0, padding trailing, plain causal attention, no
  mask, the row width cut at the longest sampled token;
* ``left-aligned-fused`` (ask for these with ``--layouts``): the same with the lm_head's
  log-prob chunks computed by compiled expressions (``linear_logprobs(fused=True)``),
  what the trainer runs on CUDA (``fused_logprobs``);
* ``left-aligned-compiled``: that, and the body under ``torch.compile``
  (:func:`trainer.forward.compile_body`, once per shape); ``-dynamic`` compiles it with
  dynamic shapes. Compile time is in the warm-up, not in the timed repeats: ``first s``
  is the first warm-up repeat, compilation included (a new micro size is a new shape).

``--ragged`` draws each row's prompt and response lengths uniformly (a quarter to
all of ``--prompt-length`` / ``--response-length``), as a real batch whose
completions stop; without it every row is full length (the bench_trainer shape).
The H200 run::

    python benchmarks/bench_update.py --model random:qwen2.5-0.5b --micro 16,32,64
    python benchmarks/bench_update.py --model random:qwen2.5-0.5b --micro 32 --ragged

A quick local one::

    python benchmarks/bench_update.py --micro 4,8 --prompt-length 32 --response-length 32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.batch import Batch  # noqa: E402
from trainer.config import TrainerConfig  # noqa: E402
from trainer.forward import autocast_dtype, compile_body, model_inputs, response_logprobs  # noqa: E402
from trainer.logprobs import linear_logprobs  # noqa: E402
from trainer.models import load_model_and_tokenizer  # noqa: E402
from trainer.precision import Precision  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--micro", default="16,32", help="comma-separated micro-batch sizes (rows)")
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--response-length", type=int, default=512)
    parser.add_argument("--ragged", action="store_true", help="random lengths per row (see above)")
    parser.add_argument("--layouts", default="padded-mask,left-aligned")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true",
                        help="after the table, torch.profiler's top kernels for each layout at the last micro size")
    return parser.parse_args(argv)


def padded_mask_logprobs(model, batch: Batch, temperature: float, *, with_entropy: bool = False):
    """The old layout: left-padded rows, position ids and a dense 4-D mask."""
    input_ids, attention, positions = model_inputs(model, batch)
    hidden = model.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                         use_cache=False).last_hidden_state
    prompt_width, response_width = batch.prompt_ids.shape[1], batch.response_ids.shape[1]
    predicting = hidden[:, prompt_width - 1 : prompt_width - 1 + response_width]
    keep = batch.response_mask.bool()
    head = model.get_output_embeddings()
    logprobs, entropy = linear_logprobs(predicting[keep], head.weight, batch.response_ids[keep],
                                        temperature=temperature, with_entropy=with_entropy,
                                        matmul_dtype=autocast_dtype(predicting))
    return logprobs, entropy


def fused_head(model):
    model.fused_logprobs = True


def compiled(model, *, dynamic: bool = False):
    compile_body(model, dynamic=dynamic)
    fused_head(model)


def compiled_dynamic(model):
    compiled(model, dynamic=True)


#: layout -> (forward, how its own copy of the policy is set up, or None: the plain policy)
LAYOUTS = {"padded-mask": (padded_mask_logprobs, None), "left-aligned": (response_logprobs, None),
           "left-aligned-fused": (response_logprobs, fused_head),
           "left-aligned-compiled": (response_logprobs, compiled),
           "left-aligned-compiled-dynamic": (response_logprobs, compiled_dynamic)}


def make_batch(rows: int, args, vocab: int, device, generator) -> Batch:
    def lengths(full):
        if not args.ragged:
            return torch.full((rows,), full)
        return torch.randint(max(1, full // 4), full + 1, (rows,), generator=generator)

    prompt_lengths, response_lengths = lengths(args.prompt_length), lengths(args.response_length)
    columns = torch.arange(args.prompt_length)
    prompt_mask = (columns >= args.prompt_length - prompt_lengths[:, None]).long()
    response_mask = (torch.arange(args.response_length) < response_lengths[:, None]).float()
    prompt_ids = torch.randint(0, vocab, (rows, args.prompt_length), generator=generator) * prompt_mask
    response_ids = torch.randint(0, vocab, (rows, args.response_length), generator=generator)
    batch = Batch(prompt_ids=prompt_ids.to(device), prompt_mask=prompt_mask.to(device),
                  response_ids=(response_ids * response_mask.long()).to(device), response_mask=response_mask.to(device))
    return batch.rows(slice(None))  # trimmed as update_policy's micro-batches are


def measure(model, precision, layout, batch, advantages, args, device) -> dict:
    forward, _ = LAYOUTS[layout]
    times = []
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    for repeat in range(args.warmup + args.repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with precision.autocast():
            logprobs, entropy = forward(model, batch, 1.0, with_entropy=True)
        keep = batch.response_mask.bool()
        values = logprobs[keep] if logprobs.dim() == 2 else logprobs
        spread = entropy[keep] if entropy.dim() == 2 else entropy
        loss = -(advantages[: values.shape[0]] * values).sum() - 0.01 * spread.sum()
        loss.backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if repeat == 0:
            first = time.perf_counter() - start
        if repeat >= args.warmup:
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return {"seconds": statistics.median(times), "peak_gb": peak, "first_s": first}


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    cfg = TrainerConfig(model=args.model, device=device.type, dataset="gsm8k")  # a model's full vocabulary
    layouts = args.layouts.split(",")
    models, plain = {}, None  # layout -> its policy: the same weights, set up as the layout needs
    for layout in layouts:
        prepare = LAYOUTS[layout][1]
        if prepare is None and plain is not None:
            models[layout] = plain  # the layouts without a setup share one policy
            continue
        model, tokenizer = load_model_and_tokenizer(cfg, device=device, dtype="float32")
        model.train()
        if prepare is None:
            plain = model
        else:
            prepare(model)
        models[layout] = model
    precision = Precision.for_run(cfg, device)
    parameters = sum(p.numel() for p in model.parameters())
    generator = torch.Generator().manual_seed(args.seed)
    print(f"model {args.model} ({parameters / 1e6:.0f}M parameters), device {device}, compute {precision.compute}, "
          f"prompt {args.prompt_length} + response {args.response_length}{' ragged' if args.ragged else ''}")
    print(f"{'micro':>5} {'layout':<28} {'tokens':>7} {'ms':>9} {'tok/s':>9} {'TFLOP/s':>8} {'peak GB':>8} "
          f"{'vs ' + layouts[0]:>14} {'first s':>8}")
    for micro in [int(m) for m in args.micro.split(",")]:
        batch = make_batch(micro, args, len(tokenizer), device, generator)
        advantages = torch.randn(int(batch.response_mask.sum()), generator=generator).to(device)
        tokens = int(batch.prompt_mask.sum() + batch.response_mask.sum())
        first = None
        for layout in layouts:
            result = measure(models[layout], precision, layout, batch, advantages, args, device)
            first = first or result["seconds"]
            flops = 6 * parameters * tokens / result["seconds"] / 1e12
            print(f"{micro:>5} {layout:<28} {tokens:>7} {result['seconds'] * 1e3:>9.1f} "
                  f"{tokens / result['seconds']:>9.0f} {flops:>8.1f} {result['peak_gb']:>8.1f} "
                  f"{first / result['seconds']:>13.2f}x {result['first_s']:>8.1f}")
    if args.profile:
        for layout in layouts:
            profile(models[layout], precision, layout, batch, advantages, args, device)
    return 0


def profile(model, precision, layout, batch, advantages, args, device, rows: int = 25) -> None:
    """One measured forward + backward under torch.profiler: where the time goes."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    quiet = argparse.Namespace(**{**vars(args), "warmup": 0, "repeats": 1})
    with torch_profile(activities=activities) as prof:
        measure(model, precision, layout, batch, advantages, quiet, device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"\n{layout}, micro {batch.size}: top {rows} ops by {key}")
    print(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60))


if __name__ == "__main__":
    sys.exit(main())
