"""A cell's health, for ``sweep status``: the few signs that a run has gone wrong, each a
flag with the reason it was raised.

Every rule is a pure function of what status already reads: the cell's train records (one
dict a step, in step order, the later record of a repeated step; a key the cell never
logged is absent, a key it logged at other steps but not at this one is None), its outcome
and whether its lock is held. The rules, and why each is drawn where it is:

- ``nan``: ``policy/loss``, ``reward/mean`` or ``policy/grad_norm`` is not finite in one of
  the last :data:`NAN_WINDOW` records. The trainer writes a NaN or an infinity as null
  (JSON has neither), so a null counts too once the key has had a finite value at an earlier
  step (the per-step frame cannot tell a null written from a key a step did not log; a key
  logged only at some steps would read as NaN at the others); a ``WANDB_MIRROR`` line may
  carry ``NaN`` itself. A key the cell wrote only as null, never finite, counts too: the
  per-step frame keeps such a key as a column of nulls, and a key never written has none.
- ``collapse``: the report's ``entropy_collapse`` rule, computed by the report's own
  expressions (:data:`sweepkit.report.tables.AGGREGATES`): the mean ``policy/entropy`` of
  the last steps below ``COLLAPSE_FRACTION`` (0.2) of the first steps' (each window a tenth
  of the steps, one to ten of them). ``sweep report`` marks the same cells ``COLLAPSED``.
- ``flat``: the last :data:`FLAT_STEPS` (10) finite values of ``reward/mean`` span less than
  :data:`FLAT_RANGE` (1e-6): a run that learns nothing more, or whose reward is broken
  (stuck at 0 or at 1 counts too: neither gives GRPO an advantage to learn from).
- ``stalled``: a running cell (its lock held) whose metrics source (``metrics.jsonl``, or the
  ``stdout.log`` it reports through) has had no new line for longer than
  ``max(factor x its median timing/step, min_s)`` (:class:`StallRule`: 10 and 60 s unless
  ``--stall-factor`` / ``--stall-min-s`` say otherwise; ``min_s`` alone for a cell that logs
  no step time). The records carry no wall time, so the age is the file's mtime's. A cell
  is judged from its first train record on: loading a model and starting engines before
  it has no pace to compare with.
- ``failed``: the cell's outcome is ``failed`` (an expected failure is ``xfailed``, not
  this). A chain link that ran out of time with a later link to resume it leaves the cell
  ``submitted`` or ``running``, not ``failed``: a TIMEOUT there is a chain's normal end of a
  link (the seeds' rule), and the cell is ``ok``. ``interrupted``, ``cancelled`` and
  ``damaged`` cells are shown as such in the status column and are not judged here: a
  process that died unrecorded, a cancel, or a record that cannot be read says nothing
  about the run's numbers.

A cell with nothing to judge (no train record and no flag: not run, pending, loading) has
no health: an ``ok`` would claim something was checked.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from sweepkit.run.progress import fmt_duration
from sweepkit.state.metrics import REWARD, STEP_TIME

NAN, COLLAPSE, FLAT, STALLED, FAILED = "nan", "collapse", "flat", "stalled", "failed"
OK = "ok"
LOSS, GRAD_NORM, ENTROPY, LOGRATIO = "policy/loss", "policy/grad_norm", "policy/entropy", "policy/kl"
# The mandatory monitoring numbers (the seeds' entropy, log-ratio and grad-norm columns),
# the last finite value of each: status column -> metric.
LAST_VALUES = {"entropy": ENTROPY, "logratio": LOGRATIO, "grad_norm": GRAD_NORM}
FINITE_KEYS = (LOSS, REWARD, GRAD_NORM)
# Every metric a rule or a column reads (status reads no other of a cell's records).
READS = tuple(dict.fromkeys((*FINITE_KEYS, ENTROPY, LOGRATIO, STEP_TIME)))
NAN_WINDOW = 3
FLAT_STEPS = 10
FLAT_RANGE = 1e-6
STALL_FACTOR = 10.0
STALL_MIN_S = 60.0
Record = Mapping[str, Any]


@attrs.frozen(kw_only=True)
class Flag:
    """One sign of trouble: its name (a word of the health column) and why it was raised."""

    name: str
    reason: str


def _positive(instance, attribute, value) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be a number above 0, got {value!r}")


def _not_negative(instance, attribute, value) -> None:
    if not value >= 0:
        raise ValueError(f"{attribute.name} must be a number of seconds of at least 0, got {value!r}")


@attrs.frozen(kw_only=True)
class StallRule:
    """When a running cell counts as stalled: no new metrics line for more than ``factor``
    times its own median step time, and never for less than ``min_s`` seconds."""

    factor: float = attrs.field(default=STALL_FACTOR, validator=_positive)
    min_s: float = attrs.field(default=STALL_MIN_S, validator=_not_negative)

    def limit(self, pace: float | None) -> float:
        """The seconds without a new line that make a cell with median step time ``pace`` stalled."""
        return self.min_s if pace is None else max(self.factor * pace, self.min_s)


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def last_value(records: Sequence[Record], key: str) -> float | None:
    """The last finite value of ``key`` (status's entropy, logratio and grad_norm columns)."""
    return next((float(record[key]) for record in reversed(records) if finite(record.get(key))), None)


def nan_flag(records: Sequence[Record]) -> Flag | None:
    """``nan``: a watched key not finite (or null, after a finite value) in the last records,
    or written at every step as null only."""
    start = max(0, len(records) - NAN_WINDOW)
    for key in FINITE_KEYS:
        for index in reversed(range(start, len(records))):
            record = records[index]
            value = record.get(key)
            if value is None:
                # A null after a finite value is the trainer's NaN; one before any is a step
                # that did not log the key yet.
                if any(finite(earlier.get(key)) for earlier in records[:index]):
                    return Flag(name=NAN, reason=f"{key} is null at step {record['step']} (the trainer writes "
                                                 f"NaN and inf as null)")
            elif not finite(value):
                return Flag(name=NAN, reason=f"{key} is {value} at step {record['step']}")
        if records and key in records[-1] and not any(finite(record.get(key)) for record in records):
            # Written (it is a column), never finite: null from its first step on.
            return Flag(name=NAN, reason=f"{key} has no finite value in {len(records)} steps (null at every "
                                         f"step: the trainer writes NaN and inf as null)")
    return None


def collapse_flag(records: Sequence[Record]) -> Flag | None:
    """``collapse``: the report's ``entropy_collapse`` over the cell's ``policy/entropy``."""
    if not any(finite(record.get(ENTROPY)) for record in records):
        return None
    import polars as pl

    # Imported here: the report's tables import sweepkit.report.status, which imports this module.
    from sweepkit.report.tables import AGGREGATES, COLLAPSE_FRACTION

    frame = pl.DataFrame({"step": [record["step"] for record in records],
                          ENTROPY: [float(v) if finite(v := record.get(ENTROPY)) else None for record in records]},
                         schema={"step": pl.Int64, ENTROPY: pl.Float64})
    row = (frame.lazy()
           .select(AGGREGATES["entropy_first"].alias("entropy_first"), AGGREGATES["entropy_last"].alias("entropy_last"))
           .with_columns(AGGREGATES["entropy_collapse"].alias("entropy_collapse"))
           .collect().row(0, named=True))
    if not row["entropy_collapse"]:
        return None
    return Flag(name=COLLAPSE, reason=f"{ENTROPY} {row['entropy_last']:.3g} over its last steps, below "
                                      f"{COLLAPSE_FRACTION:g} x its first steps' {row['entropy_first']:.3g} "
                                      f"(the report's entropy_collapse)")


def flat_flag(records: Sequence[Record]) -> Flag | None:
    """``flat``: the last :data:`FLAT_STEPS` rewards span less than :data:`FLAT_RANGE`."""
    rewards = [(record["step"], float(record[REWARD])) for record in records if finite(record.get(REWARD))]
    if len(rewards) < FLAT_STEPS:
        return None
    recent = [value for _, value in rewards[-FLAT_STEPS:]]
    if max(recent) - min(recent) >= FLAT_RANGE:
        return None
    first_step, last_step = rewards[-FLAT_STEPS][0], rewards[-1][0]
    return Flag(name=FLAT, reason=f"{REWARD} {recent[-1]:.3g} from step {first_step} to {last_step} "
                                  f"(the last {FLAT_STEPS} steps span less than {FLAT_RANGE:g})")


def median_step_time(records: Sequence[Record]) -> float | None:
    times = [float(record[STEP_TIME]) for record in records if finite(record.get(STEP_TIME))]
    return statistics.median(times) if times else None


def stall_flag(records: Sequence[Record], *, running: bool, updated: float | None, now: float,
               rule: StallRule = StallRule()) -> Flag | None:
    """``stalled``: running (lock held), and no new metrics line for longer than the rule allows.

    :param updated: the mtime of the cell's metrics source (None: it has none).
    :param now: the time to measure the silence to (``time.time()``).
    """
    if not running or updated is None or not records:
        return None
    pace = median_step_time(records)
    limit = rule.limit(pace)
    silent = now - updated
    if silent <= limit:
        return None
    why = (f"{rule.factor:g} x its median {pace:.3g} s/step, at least {rule.min_s:g} s" if pace is not None
           else f"{rule.min_s:g} s (it logs no {STEP_TIME})")
    return Flag(name=STALLED, reason=f"running, but no new metrics line for {fmt_duration(silent)} "
                                     f"(after step {records[-1]['step']}); the limit is {why}")


def failed_flag(outcome: str, failure: str | None = None) -> Flag | None:
    """``failed``: the cell failed, and not as expected (xfail)."""
    if outcome != "failed":
        return None
    return Flag(name=FAILED, reason=failure or "the cell failed")


def cell_health(records: Sequence[Record], *, outcome: str, failure: str | None = None, running: bool = False,
                updated: float | None = None, now: float, rule: StallRule = StallRule()) -> tuple[Flag, ...]:
    """Every flag of one cell, in the order of the rules above."""
    found = (nan_flag(records), collapse_flag(records), flat_flag(records),
             stall_flag(records, running=running, updated=updated, now=now, rule=rule),
             failed_flag(outcome, failure))
    return tuple(flag for flag in found if flag is not None)


def health_text(flags: Iterable[Flag], judged: bool = True) -> str:
    """The health column: ``ok``, the flags' names joined, or '' for a cell not judged."""
    names = [flag.name for flag in flags]
    return ",".join(names) if names else (OK if judged else "")
