"""The live table of ``sweep run`` on a terminal: each cell's state, step, sec/step and reward."""

import re

from cell_program import record
from test_run import script_grid

from sweepkit.state.metrics import summarize
from sweepkit.run.progress import fmt_number

# Colours, cursor moves and line erasing: what a terminal interprets and a test strips.
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
COLUMNS = ["cell", "state", "try", "step", "s/step", "reward", "elapsed"]


def last_table(stdout: str) -> dict[str, list[str]]:
    """node id -> its row's columns, from the last frame the live display drew."""
    lines = re.split(r"[\r\n]", ESCAPE.sub("", stdout))
    header = max(i for i, line in enumerate(lines) if line.split() == COLUMNS)
    rows = {}
    for line in lines[header + 1:]:
        if not line.startswith("grids/"):
            break
        rows[line.split()[0]] = line.split()[1:]
    return rows


def test_live_table_shows_state_step_and_reward_of_each_cell(sweeper):
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    script_grid(sweeper, "g", "broken = sk.cell(fail_at=2)", steps=3, sleep=0.05)
    result = sweeper.run("run", env={"TTY_COMPATIBLE": "1"})  # rich then draws as on a terminal
    assert result.ret == 1, result
    rows = last_table(result.stdout)
    assert set(rows) == {"grids/g.py::base", "grids/g.py::broken"}, result.stdout

    config = {"steps": 3}
    for nodeid, state, steps in (("grids/g.py::base", "PASSED", 3), ("grids/g.py::broken", "FAILED", 2)):
        expected = summarize([record(config, step) for step in range(1, steps + 1)])
        assert rows[nodeid][:5] == [state, "1", str(steps), fmt_number(expected.sec_per_step),
                                    fmt_number(expected.reward)], rows
        assert rows[nodeid][5].endswith("s")  # elapsed
