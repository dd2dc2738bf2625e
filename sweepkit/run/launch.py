"""Core plugin: the launch keys every executor understands, and the default executor.

Launch keys shape how a cell is started (GPUs, wall time, environment, SLURM
placement); they are validated like target keys but never reach ``config.json``.
"""

from __future__ import annotations

import re
from typing import Optional, Union

from sweepkit.hookspec import hookimpl

LAUNCH_KEYS = (
    ("gpus", Optional[int], None,
     "GPUs the cell needs (None: as many as its target asks for, see sweep_cell_gpus, else 0; 0: CPU only)"),
    ("time_limit", Optional[Union[str, int]], None,
     "wall-time limit, 'HH:MM:SS', 'D-HH:MM:SS' or minutes (None: the executor's default)"),
    ("max_restarts", int, 0, "times a failed or preempted cell is started again"),
    ("env", dict[str, str], {}, "extra environment variables of the cell's process"),
    ("cpus", Optional[int], None, "CPU cores the cell needs (None: the executor's default)"),
    ("mem_gb", Optional[float], None, "host memory in GB (None: the executor's default)"),
    ("partition", Optional[str], None, "SLURM partition"),
    ("account", Optional[str], None, "SLURM account"),
    ("qos", Optional[str], None, "SLURM quality of service"),
)

_CLOCK = re.compile(r"^(?:(?P<days>\d+)-)?(?:(?P<h>\d+):)?(?P<m>\d+):(?P<s>\d+)$")


def parse_time_limit(value: str | int) -> int:
    """Seconds of a time limit given as minutes or ``[D-][HH:]MM:SS``; ValueError if malformed."""
    if isinstance(value, bool):
        raise ValueError(f"time_limit: expected 'HH:MM:SS' or minutes, got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"time_limit: must be > 0 minutes, got {value}")
        return value * 60
    match = _CLOCK.match(str(value).strip())
    if not match:
        raise ValueError(f"time_limit: expected 'HH:MM:SS' or minutes, got {value!r}")
    days, hours, minutes, seconds = (int(match[g] or 0) for g in ("days", "h", "m", "s"))
    if minutes >= 60 and match["h"] is not None or seconds >= 60:
        raise ValueError(f"time_limit: {value!r} has minutes or seconds over 59")
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise ValueError(f"time_limit: must be > 0, got {value!r}")
    return total


@hookimpl
def sweep_register_keys(register):
    for name, tp, default, doc in LAUNCH_KEYS:
        register(name, tp, default, doc)


@hookimpl
def sweep_validate_cell(cell, session):
    errors = []
    launch = cell.launch()
    if launch["time_limit"] is not None:
        try:
            parse_time_limit(launch["time_limit"])
        except ValueError as exc:
            errors.append(str(exc))
    for key in ("gpus", "max_restarts"):
        if isinstance(launch[key], int) and launch[key] < 0:
            errors.append(f"{key}: must be >= 0, got {launch[key]}")
    return errors


@hookimpl(trylast=True)
def sweep_choose_executor(session):
    return "local"
