"""Which checkpoint of a finished cell to keep or export: the best by a metric, the last, or a step.

A cell's checkpoints are the entries its plugins name (``sweep_cell_checkpoints``, through
:func:`sweepkit.run.plan.checkpoints_in`) in its ``ckpt/`` and in the dir a plugin keeps
for it (``sweep_cell_ckpt_dir``); a checkpoint's step is its ``global_step_N`` name (the
built-in trainer's and SkyRL's). Other entries (``latest``, SkyRL's latest-step pointer)
are checkpoint entries without a step.

"Best" is measured only where it was measured: a checkpointed step is a candidate when the
cell logged an ``eval`` record at exactly that step with a finite value of the metric (a
train record's reward at that step is a noisier number of another kind). The default
metric is ``eval/pass_at_k``, higher better; ``--by`` takes a metric name the cell logged
(``eval/pass_at_1``, ``eval/reward_mean``) or a report column that reads one metric
(``pass_at_1``), whose direction the column's spec says (``ReportColumn.better``). A metric
no spec gives a direction is lower-better when its name reads like a loss (:data:`LOWER_WORDS`).
Ties go to the earliest step: the same number sooner, trained less.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path

import attrs

from sweepkit.errors import UsageError
from sweepkit.state import metrics
from sweepkit.state import records as st

DEFAULT_METRIC = "eval/pass_at_k"
STEP_ENTRY = re.compile(r"^global_step_(\d+)$")
# Words of a metric's name that make lower better where no column spec says otherwise.
LOWER_WORDS = ("loss", "kl", "grad_norm", "perplexity", "error", "timing/", "memory/")


@attrs.frozen(kw_only=True)
class Metric:
    """The metric that decides "best": its name in metrics.jsonl, the name the user gave it
    (a column or the metric itself), and its direction."""

    name: str
    given: str
    lower_is_better: bool = False


@attrs.frozen(kw_only=True)
class Checkpoint:
    """One checkpointed step of a cell: its ``global_step_N`` entry."""

    step: int
    path: Path


@attrs.frozen(kw_only=True)
class Choice:
    """The checkpoint picked: how (``best``, ``last`` or ``step``), and for ``best`` the metric
    and its value there; ``evaluated`` the checkpointed steps that had an eval of it."""

    checkpoint: Checkpoint
    how: str
    metric: Metric | None = None
    value: float | None = None
    evaluated: tuple[int, ...] = ()

    @property
    def step(self) -> int:
        return self.checkpoint.step

    def describe(self) -> str:
        """``step 40 (eval/pass_at_k = 0.62, the best of the evals at checkpointed steps 20, 40, 60)``."""
        if self.how == "best":
            direction = "lowest" if self.metric.lower_is_better else "best"
            return (f"step {self.step} ({self.metric.name} = {self.value:.4g}, the {direction} of the evals at "
                    f"checkpointed steps {_steps(self.evaluated)})")
        return f"step {self.step} ({'the last checkpoint' if self.how == 'last' else '--step'})"


def _steps(steps: Iterable[int]) -> str:
    return ", ".join(map(str, steps)) or "none"


def step_of(entry: Path) -> int | None:
    """The step of a checkpoint entry named ``global_step_N``; None for any other entry."""
    match = STEP_ENTRY.match(Path(entry).name)
    return int(match.group(1)) if match else None


def checkpoint_dirs(cell, session) -> list[Path]:
    """The cell's checkpoint dirs: its ``ckpt/``, then the one a plugin keeps for it."""
    from sweepkit.run.plan import checkpoint_dir

    own = st.cell_dir(session.runs_dir, cell) / st.CKPT_DIR
    other = checkpoint_dir(cell, session)
    return [own] + ([other] if other is not None and other != own else [])


def checkpoint_entries(cell, session) -> dict[Path, list[Path]]:
    """Each checkpoint dir of the cell and the entries of it the plugins call checkpoints."""
    from sweepkit.run.plan import checkpoints_in

    return {directory: checkpoints_in(cell, directory, session) for directory in checkpoint_dirs(cell, session)}


def checkpoints(cell, session) -> list[Checkpoint]:
    """The cell's checkpointed steps (directories named ``global_step_N``), by step."""
    found = {}
    for entries in checkpoint_entries(cell, session).values():
        for entry in entries:
            step = step_of(entry)
            if step is not None and entry.is_dir():
                found.setdefault(step, Checkpoint(step=step, path=entry))
    return [found[step] for step in sorted(found)]


def column_specs(session) -> tuple:
    """The report's column specs (``ReportColumn``): they say which metric a column reads and
    which direction is better."""
    from sweepkit.report.registry import report_registry

    return tuple(report_registry(session).columns().values())


def metric_of(by: str | None, specs: Iterable) -> Metric:
    """The metric ``--by`` names (None: :data:`DEFAULT_METRIC`): a report column that reads one
    metric maps to it, with the column's direction; a metric name keeps its own, from a column
    reading it alone where there is one, else from its words."""
    given = by or DEFAULT_METRIC
    specs = list(specs)
    column = next((spec for spec in specs if spec.name == given and len(spec.reads) == 1), None)
    name = column.reads[0] if column is not None else given
    if column is None:
        column = next((spec for spec in specs if spec.reads == (name,) and spec.better is not None), None)
    if column is not None and column.better is not None:
        lower = column.better == "lower"
    else:
        lower = any(word in name.lower() for word in LOWER_WORDS)
    return Metric(name=name, given=given, lower_is_better=lower)


def eval_values(directory: Path, metric: str) -> tuple[dict[int, float], list[str]]:
    """The cell's eval records: ``{step: value}`` of ``metric`` (finite values only), and every
    metric its eval records carry (what ``--by`` can name)."""
    import polars as pl

    scanned = metrics.scan(directory)
    if scanned is None:
        return {}, []
    frame = scanned.filter(pl.col("kind") == "eval").collect()
    logged = sorted(name for name in frame.columns
                    if name not in ("kind", "step") and frame[name].is_not_null().any())
    if metric not in frame.columns:
        return {}, logged
    values = {int(step): float(value) for step, value in frame.select("step", metric).iter_rows()
              if value is not None and math.isfinite(value)}
    return values, logged


def pick(cell, session, *, by: str | None = None, step: int | None = None, last: bool = False,
         specs: Iterable = ()) -> Choice:
    """The checkpoint of ``cell`` to keep or export (see the module docstring); UsageError,
    naming the cell and what it has, when there is none to pick."""
    found = checkpoints(cell, session)
    where = " and ".join(session.display_path(path) for path in checkpoint_dirs(cell, session))
    if not found:
        raise UsageError(f"{cell.nodeid}: no checkpoint (no global_step_N in {where})")
    if last:
        return Choice(checkpoint=found[-1], how="last")
    if step is not None:
        chosen = [checkpoint for checkpoint in found if checkpoint.step == step]
        if not chosen:
            raise UsageError(f"{cell.nodeid}: --step {step}: no checkpoint at that step; checkpointed steps: "
                             f"{_steps(c.step for c in found)}")
        return Choice(checkpoint=chosen[0], how="step")
    metric = metric_of(by, specs)
    values, logged = eval_values(st.cell_dir(session.runs_dir, cell), metric.name)
    if not values:
        if metric.name not in logged:
            named = metric.name if metric.given == metric.name else f"{metric.given} ({metric.name})"
            raise UsageError(f"{cell.nodeid}: --by {named}: the cell's eval records never logged it; they "
                             f"logged: {', '.join(logged) or 'nothing (no eval records)'}")
    evaluated = tuple(checkpoint.step for checkpoint in found if checkpoint.step in values)
    if not evaluated:
        raise UsageError(f"{cell.nodeid}: no eval of {metric.name} at a checkpointed step (checkpointed steps: "
                         f"{_steps(c.step for c in found)}; evals at steps {_steps(sorted(values))}); "
                         "pick one with --last or --step N")
    sign = 1.0 if metric.lower_is_better else -1.0
    best = min(evaluated, key=lambda s: (sign * values[s], s))  # ties: the earliest step
    chosen = next(checkpoint for checkpoint in found if checkpoint.step == best)
    return Choice(checkpoint=chosen, how="best", metric=metric, value=values[best], evaluated=evaluated)
