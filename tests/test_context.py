"""One ``sweep run`` decides once (``sweepkit.run.context``): each cell is planned once, for
validation, ``--dry-run`` and the run alike; the executor is chosen once; a cell's cluster
resources are asked once."""

from __future__ import annotations

import json
from collections import Counter

COUNTING = '''
import json, os
from sweepkit import hookimpl

def _count(hook, cell=None):
    with open(os.environ["HOOK_CALLS"], "a") as calls:
        calls.write(json.dumps([hook, cell.name if cell is not None else None]) + "\\n")

@hookimpl(tryfirst=True)
def sweep_choose_executor(session):
    _count("choose")

@hookimpl
def sweep_cell_ckpt_dir(cell, session):
    _count("ckpt_dir", cell)

@hookimpl
def sweep_job_resources(cell, session):
    _count("resources", cell)
'''

GRID = '''
import sweepkit as sk
target = sk.command("{python}", "-c", "pass")
base = sk.base(lr=1.0)
other = sk.cell(lr=2.0)
chained = sk.cell(lr=3.0, time_limit="00:01:00", max_restarts=1)
'''


def calls(sweeper) -> Counter:
    path = sweeper.path / "calls.jsonl"
    found = Counter(tuple(json.loads(line)) for line in path.read_text().splitlines()) if path.exists() else Counter()
    path.unlink(missing_ok=True)
    return found


def test_each_cell_is_planned_once_and_the_executor_chosen_once(sweeper):
    sweeper.write("grids/sweepconf.py", COUNTING)
    sweeper.grid("g", GRID)
    sweeper.env.update({"HOOK_CALLS": str(sweeper.path / "calls.jsonl"), "CUDA_VISIBLE_DEVICES": "",
                        "CHECKPOINTS_DIR": "", "SWEEP_CLUSTER": ""})
    cells = ("base", "other", "chained")

    dry = sweeper.run("run", "--dry-run")
    assert dry.ret == 0, dry
    assert calls(sweeper) == Counter({("choose", None): 1, **{("ckpt_dir", cell): 1 for cell in cells}})

    run = sweeper.run("run")
    assert run.ret == 0 and "3 passed" in run.stdout, run
    assert calls(sweeper) == Counter({("choose", None): 1, **{("ckpt_dir", cell): 1 for cell in cells}})


def test_a_cells_cluster_resources_are_asked_once(sweeper):
    sweeper.write("grids/sweepconf.py", COUNTING)
    sweeper.grid("g", GRID)
    sweeper.env.update({"HOOK_CALLS": str(sweeper.path / "calls.jsonl"), "SWEEP_CLUSTER": ""})
    dry = sweeper.run("run", "--executor", "slurm", "--dry-run")
    assert dry.ret == 0 and "job script" in dry.stdout, dry
    found = calls(sweeper)
    assert {cell: found[("resources", cell)] for cell in ("base", "other", "chained")} == {
        "base": 1, "other": 1, "chained": 1}, found
    assert found[("choose", None)] == 0  # --executor names it
