"""``sweep-train CONFIG.json [KEY=VALUE ...] --ckpt-dir DIR [--metrics PATH]``.

The config is validated before torch is imported, so a typo costs
milliseconds and exits 2 with the key named. A fresh run over existing
checkpoints (``resume_mode=null``) exits 3 and deletes nothing. SIGTERM,
SIGINT (Ctrl-C) or SIGUSR1 stops the run after its current step, with a
checkpoint, and exits 128 + the signal (143 for SIGTERM, 130 for SIGINT); once
the last step has run there is nothing to stop: the run ends complete, exit 0.

A run of several processes (``num_gpus`` > 1 on CUDA, ``num_cpu_ranks`` > 1 on
the CPU) is checked here once, then started as one process per rank
(``trainer.parallel.launch``), each running this same command; the launcher
passes stop signals on and exits with the ranks' code. Ranks other than 0 keep
their messages to themselves (rank 0 speaks for the run). A rank's process ends
without the interpreter's teardown once its run is over
(``trainer.parallel.exit_rank`` says why).
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
from pathlib import Path

from trainer.config import ConfigError, TrainerConfig, schema

EXIT_CONFIG = 2
EXIT_CHECKPOINT = 3


def config_keys_help() -> str:
    """Every config key with its type, default and meaning (the schema sweepkit validates with)."""
    lines = ["config keys (in the JSON file or as KEY=VALUE):"]
    for key, field in schema().items():
        lines.append(f"  {key} ({field['type_name']}, default {field['default']!r}): {field['doc']}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sweep-train", description="Train a policy with GRPO from a JSON config.",
        epilog=config_keys_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="JSON file of trainer config keys")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="override a key; the value is parsed as JSON when it parses (lr=1e-5, "
                             "use_kl_loss=true, resume_mode=null), else taken as a string")
    parser.add_argument("--ckpt-dir", required=True, type=Path, help="checkpoint directory of this run")
    parser.add_argument("--metrics", type=Path, default=None,
                        help="metrics.jsonl path (default: $SWEEP_METRICS, else ./metrics.jsonl)")
    return parser


def _stacks_on_fatal_signals() -> None:
    """A process that dies on a fatal signal (a segfault inside a collective library, say)
    writes every thread's Python stack to stderr, where the cell's log keeps it; without
    this, a rank of a several-process run dies with its exit status (139) alone."""
    try:
        faulthandler.enable()
    except (AttributeError, ValueError, OSError):  # a stderr without a file descriptor (captured in-process)
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_intermixed_args(argv)
    _stacks_on_fatal_signals()
    try:
        cfg = TrainerConfig.from_json(args.config, args.overrides)
    except FileNotFoundError:
        print(f"sweep-train: config file {args.config} does not exist", file=sys.stderr)
        return EXIT_CONFIG
    except ConfigError as exc:
        print(f"sweep-train: bad config:\n{exc}", file=sys.stderr)
        return EXIT_CONFIG
    metrics = args.metrics or Path(os.environ.get("SWEEP_METRICS", "metrics.jsonl"))

    from trainer import checkpoint, parallel
    from trainer.rollout import BackendUnavailable, require_backend

    stderr = sys.stderr if parallel.env_rank() == 0 else open(os.devnull, "w")
    try:
        start_from = checkpoint.plan_start(args.ckpt_dir, cfg.resume_mode)
        require_backend(cfg.backend)
        world = parallel.world_size(cfg)
        parallel.check_layout(cfg, world)
        if start_from is not None:
            checkpoint.check_world_size(start_from, world)
    except checkpoint.CheckpointError as exc:
        print(f"sweep-train: {exc}", file=stderr)
        return EXIT_CHECKPOINT
    except BackendUnavailable as exc:
        print(f"sweep-train: backend: {exc}", file=stderr)
        return EXIT_CONFIG
    except ConfigError as exc:
        print(f"sweep-train: bad config:\n{exc}", file=stderr)
        return EXIT_CONFIG
    if world > 1 and not parallel.started_as_rank():
        return parallel.launch(argv, world)
    code = run(cfg, ckpt_dir=args.ckpt_dir, metrics=metrics, stderr=stderr)
    if parallel.started_as_rank():
        parallel.exit_rank(code)  # past the teardown that a live process group makes unsafe
    return code


def run(cfg: TrainerConfig, *, ckpt_dir: Path, metrics: Path, stderr) -> int:
    """Train (this process's rank of) the run; the exit code."""
    from trainer.data import DataError
    from trainer.loop import train
    from trainer.stopping import SIGNALS, Stopped

    try:
        train(cfg, ckpt_dir=ckpt_dir, metrics_path=metrics, stderr=stderr)
    except (ConfigError, DataError) as exc:  # only checkable against the data, model or machine
        print(f"sweep-train: bad config or data:\n{exc}", file=stderr)
        return EXIT_CONFIG
    except Stopped as stopped:
        where = (f"checkpointed in {ckpt_dir} (resume with resume_mode=latest)" if stopped.checkpointed
                 else "no step had run, nothing to checkpoint")
        print(f"sweep-train: {stopped}; {where}", file=stderr)
        return stopped.exit_code
    # The run is complete, so a stop signal has nothing left to stop while the process
    # exits (a sweep's job follows the terminal's Ctrl-C with a SIGTERM a moment later).
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    return 0


if __name__ == "__main__":
    sys.exit(main())
