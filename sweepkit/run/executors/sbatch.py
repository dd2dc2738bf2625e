"""The job script of a cell (or of an array of cells with equal resources), as text.

The script is what submitit would write, with sweepkit's layout: the ``#SBATCH`` header
from a :class:`JobRequest`, the setup (a cluster's preamble, its exported variables, a
Ray bring-up for multi-node cells), then ``srun`` of submitit's job runner on one task
of node 0 (the cell's own command starts its workers, or uses the Ray cluster). The
cell's command and environment travel in submitit's pickle, so no config value is ever
parsed by a shell; the script lists them in comments (:class:`ScriptCell`: per cell, per
array task) so a user reads there exactly what would run.

What does reach the script is quoted: every ``#SBATCH`` value and every exported value goes
through ``shlex.quote``, and a value with a line break, which would end the header (or a
comment) and become a shell command, is refused when the request is made. The listed
commands and variables are quoted the same way; inside a comment they are inert anyway.

No ``--signal`` line: submitit's warning signal makes a job that is not checkpointable
fail early as "timed-out and not checkpointable" (docs/local-slurm.md), whereas without
it SLURM ends the job at its limit and ``sacct`` says ``TIMEOUT``, which is what a chain
link (``sweepkit.run.chain``) is expected to do.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence

import attrs

SBATCH_PREFIX = "#SBATCH"
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]+")
_OPTION_NAME = re.compile(r"^[a-z][a-z0-9-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_NAME = 100


class RequestError(ValueError):
    """A job request with a value that cannot be put into a job script."""


def job_name(grid: str, cell: str) -> str:
    """``<grid>_<cell>`` with every character outside ``[A-Za-z0-9_.+-]`` replaced by ``_``."""
    return _NAME_UNSAFE.sub("_", f"{grid}_{cell}")[:MAX_NAME]


def _check_text(key: str, value: object) -> None:
    if any(char in str(value) for char in "\n\r\0"):
        raise RequestError(f"{key}: {value!r} has a line break or NUL, which would end its line of the "
                           "job script (a header or comment line) and run the rest as a command; give it on one line")


def _tuple(value) -> tuple:
    return tuple(value or ())


def _pairs(value) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value or ()
    return tuple((str(key), "" if val is None or val is True else str(val)) for key, val in items)


@attrs.frozen(kw_only=True)
class JobRequest:
    """Resources and setup of one cell's job. Everything but ``name`` and ``comment`` is the
    array key: cells whose requests differ only by those may share a job array.

    ``time_limit`` is ``[D-]HH:MM:SS`` (None: the partition's default); ``options`` are
    extra ``#SBATCH --name=value`` options (an empty value for a flag); ``preamble`` lines
    run before the command (module loads, a container's setup); ``env`` is exported there;
    ``chain`` is the number of jobs of the cell: a head and ``chain - 1`` links;
    ``comment`` is sweepkit's job comment (whose job it is), after a cell's own ``comment``
    option where it has one.
    """

    name: str
    nodes: int = 1
    gpus_per_node: int = 0
    cpus: int | None = None
    mem_gb: float | None = None
    time_limit: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    options: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_pairs)
    preamble: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    env: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_pairs)
    ray_bringup: str | None = None
    chain: int = 1
    comment: str | None = None

    def __attrs_post_init__(self):
        for key in ("name", "time_limit", "partition", "account", "qos", "comment"):
            _check_text(key, getattr(self, key) or "")
        for name, value in self.options:
            if not _OPTION_NAME.match(name):
                raise RequestError(f"sbatch option {name!r}: not an option name (lowercase, digits, '-'; "
                                   "without the leading '--')")
            _check_text(f"sbatch option {name}", value)
        for line in self.preamble:
            _check_text("preamble line", line)
        for name, value in self.env:
            if not _ENV_NAME.match(name):
                raise RequestError(f"env: {name!r} is not a shell variable name")
            _check_text(f"env {name}", value)
        if self.nodes < 1:
            raise RequestError(f"nodes: must be >= 1, got {self.nodes}")
        if self.chain < 1:
            raise RequestError(f"chain: must be >= 1 job, got {self.chain}")

    def array_key(self) -> "JobRequest":
        return attrs.evolve(self, name="", comment=None)


def _env_pairs(value) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(_pairs(value)))


@attrs.frozen(kw_only=True)
class ScriptCell:
    """What the job function runs for one cell, listed in the job script's comments:
    the cell's node id, its dir (the command's working dir), its full command line (a
    container wrapper, the interpreter, the target's argv, the plugins' arguments) and the
    variables added to the job's environment, sorted by name."""

    nodeid: str
    cell_dir: str
    argv: tuple[str, ...] = attrs.field(converter=_tuple)
    env: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_env_pairs)

    def __attrs_post_init__(self):
        _check_text("cell", self.nodeid)
        _check_text("cell dir", self.cell_dir)
        for n, arg in enumerate(self.argv):
            _check_text(f"command argument {n}", arg)
        for name, value in self.env:
            _check_text(f"env {name}", f"{name}={value}")

    def comment(self, task: int | None = None, *, leave_out: frozenset = frozenset()) -> list[str]:
        """The cell's lines; ``leave_out``: ``(name, value)`` pairs listed elsewhere."""
        lines = [("" if task is None else f"task {task}: ") + f"cell {self.nodeid}",
                 f"  dir:     {shlex.quote(self.cell_dir)}", f"  command: {shlex.join(self.argv)}"]
        lines += env_lines([pair for pair in self.env if pair not in leave_out])
        return ["# " + line for line in lines]


def env_lines(pairs) -> list[str]:
    return [f"  env:     {name}={shlex.quote(value)}" for name, value in pairs]


def common_env(cells: Sequence[ScriptCell]) -> tuple[tuple[str, str], ...]:
    """The variables every one of ``cells`` gets with the same value, sorted by name."""
    if not cells:
        return ()
    shared = set(cells[0].env)
    for cell in cells[1:]:
        shared &= set(cell.env)
    return tuple(pair for pair in cells[0].env if pair in shared)


def cells_comment(cells: Sequence[ScriptCell], *, array: bool,
                  exported: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The comment block listing what runs: one cell, or one per array task index.

    A variable the setup exports with the same value is not listed again; of an array,
    the variables common to every task are listed once, before the tasks, which then list
    only their own (an 18-task array listed the same 20 variables 18 times)."""
    if not cells:
        return ["# command: submitit runs sweepkit's job function, which runs the cell"]
    leave_out = frozenset(exported)
    if array:
        lines = ["# command: submitit runs sweepkit's job function, which runs the command of task",
                 "# $SLURM_ARRAY_TASK_ID in its cell's dir, with these variables added to the job's environment",
                 "# (besides those the setup exports):"]
        common = [pair for pair in common_env(cells) if pair not in leave_out]
        if common:
            lines += ["#", "# every task:"] + ["# " + line for line in env_lines(common)]
        leave_out |= frozenset(common)
    else:
        lines = ["# command: submitit runs sweepkit's job function, which runs this command in the cell's",
                 "# dir, with these variables added to the job's environment (besides those the setup exports):"]
    for task, cell in enumerate(cells):
        lines += ["#"] + cell.comment(task if array else None, leave_out=leave_out)
    return lines + ["#"]


def _flag(name: str, value: object) -> str:
    if value == "":
        return f"{SBATCH_PREFIX} --{name}"
    return f"{SBATCH_PREFIX} --{name}={shlex.quote(str(value))}"


def log_paths(folder: str, array: bool) -> tuple[str, str]:
    """stdout and stderr of the job as submitit names them (``%j`` or ``%A_%a``, task 0)."""
    job = "%A_%a" if array else "%j"
    return f"{folder}/{job}_0_log.out", f"{folder}/{job}_0_log.err"


def header(request: JobRequest, *, folder: str, array: tuple[int, int | None] | None = None,
           dependency: str | None = None) -> list[str]:
    """The ``#SBATCH`` lines. ``array``: (number of tasks, parallelism or None)."""
    stdout, stderr = log_paths(folder, array is not None)
    flags: list[tuple[str, object]] = [("job-name", request.name), ("nodes", request.nodes), ("ntasks-per-node", 1)]
    if request.cpus:
        flags.append(("cpus-per-task", request.cpus))
    if request.gpus_per_node:
        flags.append(("gpus-per-node", request.gpus_per_node))
    if request.mem_gb:
        flags.append(("mem", f"{math.ceil(request.mem_gb * 1024)}M"))
    for name in ("time_limit", "partition", "account", "qos"):
        value = getattr(request, name)
        if value:
            flags.append(("time" if name == "time_limit" else name, value))
    if array is not None:
        tasks, parallelism = array
        flags.append(("array", f"0-{tasks - 1}" + (f"%{parallelism}" if parallelism else "")))
    if dependency:
        flags.append(("dependency", dependency))
    flags += [("output", stdout), ("error", stderr), ("open-mode", "append")]
    options = list(request.options)
    if request.comment:
        if any(name == "comment" for name, _ in options):
            options = [(name, f"{value}; {request.comment}" if name == "comment" else value) for name, value in options]
        else:
            flags.append(("comment", request.comment))
    flags += options
    return [_flag(name, value) for name, value in flags]


def render(request: JobRequest, *, folder: str, python: str, array: tuple[int, int | None] | None = None,
           dependency: str | None = None, cells: Sequence[ScriptCell] = ()) -> str:
    """The whole job script; ``folder`` holds submitit's pickles and the job's logs,
    ``python`` runs submitit's job runner (a shell word, already quoted if need be),
    ``cells`` are listed before the command (for an array, in task order)."""
    preamble_flags = [line for line in request.preamble if line.lstrip().startswith(SBATCH_PREFIX)]
    preamble = [line for line in request.preamble if not line.lstrip().startswith(SBATCH_PREFIX)]
    lines = ["#!/bin/bash", f"# sweepkit job {request.name}: submitted through submitit; what the job runs (the",
             "# cell's command and environment, carried in submitit's pickle) is listed above the srun line", ""]
    # sbatch reads #SBATCH lines only before the first command, so a cluster's own ones go here.
    lines += header(request, folder=folder, array=array, dependency=dependency) + preamble_flags
    if preamble or request.env:
        lines += ["", "# setup"] + preamble
        lines += [f"export {name}={shlex.quote(value)}" for name, value in request.env]
    if request.ray_bringup:
        lines += ["", "# Ray cluster over the job's nodes", request.ray_bringup.rstrip("\n")]
    stdout, stderr = log_paths(folder, array is not None)
    srun = ["srun", "--unbuffered", "--output", stdout, "--error", stderr, "--nodes=1", "--ntasks=1"]
    if request.ray_bringup:
        srun.append("--overlap")  # the Ray workers' steps hold the other nodes
    command = " ".join([shlex.join(srun), python, "-u", "-m", "submitit.core._submit", shlex.quote(folder)])
    lines += [""] + cells_comment(cells, array=array is not None, exported=request.env)
    lines += ["export SUBMITIT_EXECUTOR=slurm", command, ""]
    return "\n".join(lines)


def time_text(seconds: int) -> str:
    """``[D-]HH:MM:SS`` of a number of seconds, as sbatch takes it."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    clock = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def dependency_after(job_ids: Sequence[str]) -> str:
    return "afterany:" + ":".join(job_ids)
