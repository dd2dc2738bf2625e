"""What measure-until-sure saves on a grid that has run: each cell's step times, replayed
through the trainer's timing rule (``trainer.timing.TimingRule``) for several targets.

For each cell: the steps it ran and their seconds, and for each ``--targets`` value the step
at which the rule would have ended it (``-`` where its interval never got that tight) and the
seconds of steps up to there. The last lines add the cells up: the seconds with each target
(a cell the rule never ends counts all its steps), against the steps as run and against a
fixed budget of ``--budget-minutes`` a cell (the seeds' throughput cells ran 30 minutes each),
in GPU-seconds (the cell's ``gpus`` launch key, at least 1). Nothing is timed here: the step
times are the cells' own ``metrics.jsonl``.

    python benchmarks/bench_timing_rule.py runs/gsm8k_throughput --targets 0.02,0.05,0.1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.timing import TimingRule, earlier_steps  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid_dir", type=Path, help="a runs/<grid> directory")
    parser.add_argument("--targets", default="0.02,0.05,0.1", help="comma-separated relative half-widths")
    parser.add_argument("--level", type=float, default=0.95)
    parser.add_argument("--min-steps", type=int, default=5)
    parser.add_argument("--budget-minutes", type=float, default=30.0, help="a fixed budget a cell, to compare with")
    return parser.parse_args(argv)


def stop_step(times: list[float], starts: list[int], target: float, level: float, min_steps: int) -> int | None:
    """The step (1-based, among ``times``) at which the rule would have ended the run."""
    rule = TimingRule(target=target, level=level, min_steps=min_steps, earlier_starts=starts)
    for index, seconds in enumerate(times, 1):
        rule.add(seconds)
        if rule.verdict().stop:
            return index
    return None


def main(argv=None) -> int:
    args = parse_args(argv)
    targets = [float(value) for value in args.targets.split(",")]
    totals = {"as run": 0.0, "budget": 0.0, **{target: 0.0 for target in targets}}
    print(f"{'cell':<16} {'gpus':>4} {'steps':>5} {'seconds':>8}  " +
          "  ".join(f"±{target:.0%}: step, s".rjust(18) for target in targets))
    for cell_dir in sorted(path.parent for path in args.grid_dir.glob("*/metrics.jsonl")):
        records = [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        times, starts = earlier_steps(records)
        if not times:
            continue
        cell_file = cell_dir / "cell.json"
        launch = json.loads(cell_file.read_text()).get("launch", {}) if cell_file.exists() else {}
        gpus = max(int(launch.get("gpus") or 1), 1)
        ran = sum(times)
        totals["as run"] += gpus * ran
        totals["budget"] += gpus * args.budget_minutes * 60
        cells = []
        for target in targets:
            stop = stop_step(times, starts, target, args.level, args.min_steps)
            spent = sum(times[:stop]) if stop else ran
            totals[target] += gpus * spent
            cells.append(f"{stop or '-':>5} {spent:>8.1f}".rjust(18))
        print(f"{cell_dir.name:<16} {gpus:>4} {len(times):>5} {ran:>8.1f}  " + "  ".join(cells))
    print(f"GPU-seconds: as run {totals['as run']:.0f}; a fixed {args.budget_minutes:g} min a cell "
          f"{totals['budget']:.0f}")
    for target in targets:
        saved = 1 - totals[target] / totals["as run"] if totals["as run"] else 0.0
        print(f"  timing_target={target:g}: {totals[target]:.0f} ({saved:.0%} less than as run, "
              f"{totals['budget'] / max(totals[target], 1e-9):.0f}x less than the fixed budget)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
