"""``sweep export``: each selected finished cell's chosen checkpoint as a Hugging Face model dir.

For every cell (:mod:`sweepkit.end.cells`) a checkpoint is picked (:mod:`sweepkit.end.pick`:
the best eval by ``--by``, ``--last`` or ``--step N``) and converted by the plugin that
knows it (``sweep_export_checkpoint``) into ``<DIR>/<grid>/<cell>/``; ``DIR`` is ``--to``,
else the cluster plugin's (``sweep_export_dir``), else ``./exports`` under the project root.
Every cell is checked before anything is written: a cell without a checkpoint to pick, an
unknown ``--by`` metric, a ``--step`` without a checkpoint or a target dir that exists and
is not empty is an error, and nothing is written. A cell that is not finished is refused
(named, with why) and the others are exported.

Next to the model files goes ``manifest.json``: which grid, cell, config and step the model
is, how the step was chosen, the run's git commit where one was recorded, and each file's
size and sha256. Nothing is uploaded: the command to run on a login node is printed.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from sweepkit.end.cells import human_bytes, refusal, selected_cells
from sweepkit.end.pick import Choice, column_specs, pick
from sweepkit.errors import ExitCode, UsageError
from sweepkit.state import records as st
from sweepkit.state.files import write_json

MANIFEST = "manifest.json"
DEFAULT_DIR = "exports"
# Keys a cell.json or the run's info record may carry the run's code version under.
COMMIT_KEYS = ("git_commit", "commit", "git_sha")


def export_root(session) -> Path:
    """``--to``, else the plugins' ``sweep_export_dir``, else ``<rootdir>/exports``."""
    given = getattr(session.options, "to", None)
    if given:
        return Path(given).absolute()
    answer = session.hook.sweep_export_dir(session=session)
    return Path(answer) if answer is not None else session.rootdir / DEFAULT_DIR


def _occupied(target: Path) -> bool:
    return target.exists() and (not target.is_dir() or any(target.iterdir()))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def git_commit(directory: Path) -> str | None:
    """The run's git commit where its cell.json or its run's first ``info`` record has one."""
    from sweepkit.report.tables import run_info

    view = st.view(directory)
    for record in (view.record or {}, run_info(view)):
        for key in COMMIT_KEYS:
            if isinstance(record.get(key), str) and record[key]:
                return record[key]
    return None


def manifest(session, cell, choice: Choice, target: Path) -> dict:
    """What ``manifest.json`` records of an exported model (see the module docstring)."""
    directory = st.cell_dir(session.runs_dir, cell)
    state = st.read_state(directory)
    files = sorted(path for path in target.rglob("*") if path.is_file() and path.name != MANIFEST)
    return {
        "grid_file": cell.grid,
        "nodeid": cell.nodeid,
        "cell": cell.name,
        "config_hash": state.config_hash if state is not None else cell.config_hash(),
        "step": choice.step,
        "chosen_by": choice.how,
        "metric": choice.metric.name if choice.metric is not None else choice.how,
        "metric_value": choice.value,
        "lower_is_better": choice.metric.lower_is_better if choice.metric is not None else None,
        "checkpoint": str(choice.checkpoint.path),
        "git_commit": git_commit(directory),
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": [{"path": path.relative_to(target).as_posix(), "bytes": path.stat().st_size,
                   "sha256": sha256(path)} for path in files],
    }


def plan_exports(session, cells, root: Path) -> tuple[list[tuple], list[tuple]]:
    """``(cell, choice, target)`` of each finished cell and ``(cell, why)`` of each refused one;
    UsageError with every cell's problem when any cannot be exported as asked."""
    options, specs = session.options, column_specs(session)
    planned, refused, errors = [], [], []
    for cell in cells:
        why = refusal(session, cell)
        if why is not None:
            refused.append((cell, why))
            continue
        try:
            choice = pick(cell, session, by=options.by, step=options.step, last=options.last, specs=specs)
        except UsageError as error:
            errors.extend(error.lines)
            continue
        target = root / cell.grid_name / cell.name
        if _occupied(target):
            errors.append(f"{cell.nodeid}: {session.display_path(target)} exists and is not empty; "
                          "remove it or export elsewhere with --to DIR")
            continue
        planned.append((cell, choice, target))
    if errors:
        raise UsageError(*errors, "nothing was written")
    return planned, refused


def export_command(session) -> int:
    options = session.options
    if options.by and (options.last or options.step is not None):
        raise UsageError(f"--by {options.by}: picks the best checkpoint; --last and --step pick another way")
    cells = selected_cells(session)
    root = export_root(session)
    planned, refused = plan_exports(session, cells, root)
    for cell, why in refused:
        session.err_console.print(f"REFUSED  {cell.nodeid}: {why}; nothing exported", markup=False)
    for cell, choice, target in planned:
        path = choice.checkpoint.path
        written = session.hook.sweep_export_checkpoint(cell=cell, step_dir=path, to=target, session=session)
        if written is None:
            raise UsageError(f"{cell.nodeid}: no plugin exports {session.display_path(path)} (target "
                             f"{cell.target.name!r}); nothing was written for it")
        record = manifest(session, cell, choice, target)
        write_json(target / MANIFEST, record)
        size = sum(entry["bytes"] for entry in record["files"])
        session.console.print(f"EXPORTED {cell.nodeid}: {choice.describe()} -> {session.display_path(target)} "
                              f"({len(record['files'])} files, {human_bytes(size)}, {MANIFEST})", markup=False)
        session.console.print(f"  upload from a login node: huggingface-cli upload <hf-user>/<repo-id> {target} .",
                              markup=False)
    return ExitCode.CELLS_FAILED if refused else ExitCode.OK
