"""``python -m trainer.export STEP_DIR --to DIR``: one checkpoint as a Hugging Face model dir.

A run's own export (``export_final``) is its last step; this one takes any complete
``global_step_N`` (``sweep export`` picks the best by a metric) and needs nothing of the
run but that directory (and, where it is, the ``run_info.json`` beside it):

1. the run's config from the step's ``trainer_state.json``;
2. the model and tokenizer built as the run built them (``trainer.models``: a hub model is
   read from the hub cache, ``tiny-random`` is built locally), on the CPU, in fp32;
3. the step's ``model.safetensors`` loaded over it;
4. ``save_pretrained`` into a temporary dir beside ``DIR``, renamed to ``DIR`` once whole:
   safetensors weights in the run's compute dtype (``--dtype``, else the ``dtype`` the run
   recorded in ``run_info.json``, else what its config says), ``config.json``, the tokenizer
   files and a ``generation_config.json`` with the eos / pad ids and the run's rollout
   ``temperature``, ``top_p`` and ``top_k``.

Exit codes: 0 written; 2 bad input (not a trainer checkpoint, a config this trainer cannot
read, ``DIR`` not empty), with a message naming the path; nothing is written then.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Optional

EXIT_OK = 0
EXIT_BAD_INPUT = 2
STATE_FILE = "trainer_state.json"
WEIGHTS_FILE = "model.safetensors"
RUN_INFO_FILE = "run_info.json"  # written by trainer.setup beside the run's checkpoints
DTYPES = ("float32", "bfloat16", "float16")


class ExportError(ValueError):
    """The step dir, its config or the target do not allow an export; the message names the path."""


def read_config(step_dir: Path):
    """The run's :class:`trainer.config.TrainerConfig`, from the step's ``trainer_state.json``."""
    from trainer.config import ConfigError, TrainerConfig

    state_file = step_dir / STATE_FILE
    missing = [name for name in (STATE_FILE, WEIGHTS_FILE) if not (step_dir / name).is_file()]
    if not step_dir.is_dir() or missing:
        what = "no such directory" if not step_dir.is_dir() else f"no {' and no '.join(missing)}"
        raise ExportError(f"{step_dir}: {what}: not a checkpoint of the built-in trainer (global_step_N)")
    try:
        state = json.loads(state_file.read_text())
    except json.JSONDecodeError as error:
        raise ExportError(f"{state_file}: not valid JSON ({error})") from None
    config = state.get("config") if isinstance(state, dict) else None
    if not isinstance(config, dict):
        raise ExportError(f"{state_file}: holds no 'config' object (the run's config)")
    try:
        return TrainerConfig.from_dict(config, source=str(state_file))
    except ConfigError as error:
        raise ExportError(str(error)) from None


def compute_dtype(cfg, step_dir: Path, chosen: Optional[str] = None) -> str:
    """The dtype the export is written in: ``chosen``, else the compute dtype the run recorded
    (``run_info.json``), else its config's (``auto``: bf16 for a CUDA run, else fp32)."""
    if chosen:
        return chosen
    info = step_dir.parent / RUN_INFO_FILE
    try:
        recorded = json.loads(info.read_text()).get("dtype")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if recorded in DTYPES:
        return recorded
    if cfg.dtype != "auto":
        return cfg.dtype
    return "bfloat16" if cfg.device == "cuda" else "float32"


def generation_config(cfg, tokenizer):
    """The run's rollout sampling as a ``GenerationConfig``: eos / pad ids, ``temperature``,
    ``top_p`` and ``top_k`` (0: off, as the run's -1 or 0 is)."""
    import transformers

    return transformers.GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True,
        temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k if cfg.top_k > 0 else 0)


def check_target(to: Path) -> None:
    if to.exists() and (not to.is_dir() or any(to.iterdir())):
        raise ExportError(f"{to}: exists and is not an empty directory; nothing was written")


def export_step(step_dir: Path, to: Path, *, dtype: Optional[str] = None) -> list[Path]:
    """Write ``step_dir``'s model as a Hugging Face model dir ``to``; returns its files."""
    step_dir, to = Path(step_dir), Path(to)
    check_target(to)
    cfg = read_config(step_dir)
    written_dtype = compute_dtype(cfg, step_dir, dtype)

    import safetensors.torch
    import torch

    from trainer import checkpoint
    from trainer.config import ConfigError
    from trainer.models import load_model_and_tokenizer
    from trainer.precision import MASTER_DTYPE

    try:
        model, tokenizer = load_model_and_tokenizer(cfg, device="cpu", dtype=MASTER_DTYPE)
    except ConfigError as error:
        raise ExportError(f"{step_dir / STATE_FILE}: {error}") from None
    safetensors.torch.load_model(model, str(step_dir / WEIGHTS_FILE), device="cpu")
    model.eval()
    model.generation_config = generation_config(cfg, tokenizer)
    to.parent.mkdir(parents=True, exist_ok=True)
    temp = to.parent / f"{checkpoint.TEMP_PREFIX}{to.name}-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    try:
        checkpoint.write_pretrained(temp, model, tokenizer, dtype=getattr(torch, written_dtype))
        os.replace(temp, to)  # over an empty dir too (rename(2) replaces one)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return sorted(path for path in to.rglob("*") if path.is_file())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.export",
        description="Write one checkpoint of the built-in trainer (global_step_N) as a Hugging Face model dir.")
    parser.add_argument("step_dir", type=Path, help="the checkpoint: <ckpt-dir>/global_step_N")
    parser.add_argument("--to", required=True, type=Path, help="the model dir to write (absent or empty)")
    parser.add_argument("--dtype", choices=DTYPES, default=None,
                        help="the weights' dtype (default: the run's compute dtype)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        written = export_step(args.step_dir, args.to, dtype=args.dtype)
    except ExportError as error:
        print(f"trainer.export: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"trainer.export: {args.step_dir} -> {args.to}: {len(written)} files "
          f"({', '.join(path.name for path in written)})")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
