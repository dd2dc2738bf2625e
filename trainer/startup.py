"""Where a run's start goes: the seconds before and inside its first step, by phase.

A sweep's first cell pays the model build, every ``torch.compile`` (inductor's codegen and
autotuning) and one CUDA graph capture per decode bucket before its first step ends; later
cells pay what the compile cache does not hold. :data:`LEDGER` adds up the phases this
process timed with :func:`phase`; :func:`summary` adds what dynamo says it spent compiling
(which overlaps the phases: a capture's warm-up steps compile the decode step) and the
number of graphs it compiled. The loop prints the summary after the first step;
``benchmarks/bench_trainer.py`` reports it.

:func:`warm_compile_workers` starts inductor's compile workers before the model builds, so
that their start overlaps the build instead of the run's first compile.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from contextlib import contextmanager

LEDGER: Counter = Counter()  # phase -> seconds, this process
COUNTS: Counter = Counter()  # phase -> times entered


@contextmanager
def phase(name: str):
    started = time.perf_counter()
    try:
        yield
    finally:
        LEDGER[name] += time.perf_counter() - started
        COUNTS[name] += 1


def warm_compile_workers() -> None:
    """Start inductor's pool of compile worker processes now.

    Inductor starts it itself at a run's first compile, whose Triton kernels then wait for the
    workers to come up. Started before the model builds, the workers come up meanwhile: on an
    H200 the cold first step of the 0.5B shape took 32.9 and 33.0 s against 34.8 and 35.7 s, the
    process 68.8 and 72.8 s against 74.4 and 76.3 s (two runs each, alternated; ``benchmarks/
    RESULTS.md``). From the trainer's call site (an H100, two runs a side) its first steps, 33.7 and
    31.2 s against 32.2 and 34.4 s, showed no difference either way; those runs did not time the
    build. Importing inductor (about 5 s there) moves with it from the first step into the build:
    compare the two together across this change (``benchmarks/bench_ab.py --cold`` does). With a
    warm cache it changes only when the pool starts: inductor starts it at every run's first
    compile, cache hits included.
    ``TORCH_WARM_POOL=0`` (inductor's own switch) turns both off.
    """
    from torch._inductor.async_compile import maybe_warm_pool

    maybe_warm_pool()


def compile_seconds() -> tuple[float, int]:
    """Dynamo's own total compile time in this process (tracing, inductor, autotuning) and
    the graphs it compiled; (0, 0) when nothing was compiled or torch is not loaded."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "_dynamo"):
        return 0.0, 0
    from torch._dynamo import utils

    names, values = utils.compile_times(repr="csv", aggregate=True)
    total = dict(zip(names, values)).get("_compile.compile_inner", 0.0)
    return float(total), int(utils.counters["stats"]["unique_graphs"])


def summary() -> dict:
    """The phases timed so far, each with its count, and dynamo's compile total."""
    compiled, graphs = compile_seconds()
    return {"phases": {name: {"seconds": round(seconds, 3), "count": COUNTS[name]}
                       for name, seconds in LEDGER.items()},
            "compile_seconds": round(compiled, 3), "compiled_graphs": graphs}


def describe(first_step_s: float) -> str:
    """One line for the log: the first step and what it spent where."""
    facts = summary()
    parts = [f"{name} {entry['seconds']:.1f} s" + (f" ({entry['count']}x)" if entry["count"] > 1 else "")
             for name, entry in facts["phases"].items()]
    parts.append(f"compile {facts['compile_seconds']:.1f} s over {facts['compiled_graphs']} graphs "
                 "(inside the phases)")
    return f"first step {first_step_s:.1f} s; " + ", ".join(parts)
