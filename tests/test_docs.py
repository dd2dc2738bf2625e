"""The docs' examples run as written: the guard plugin of docs/plugins.md stops a cell."""

from __future__ import annotations

import json
import re

from test_job import readme_block

PROGRAM = '''
import json, os, time
with open(os.environ["SWEEP_METRICS"], "a") as metrics:
    for step in range(1, 41):
        stopped = 0.0 if step > 2 else 0.5  # from step 3 on no sample ends by itself
        metrics.write(json.dumps({"kind": "train", "step": step, "response/stop_frac": stopped}) + "\\n")
        metrics.flush()
        time.sleep(0.2)
'''


def test_the_guard_plugin_of_docs_plugins_stops_a_cell_and_says_why(sweeper):
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    sweeper.write("grids/sweepconf.py", readme_block("# sweepconf.py, next to the grids"))
    sweeper.write("long.py", PROGRAM)
    sweeper.grid("g", 'import sweepkit as sk\ntarget = sk.command("{python}", "{root}/long.py")\nbase = sk.base(x=1)\n')
    result = sweeper.run("run", "grids/g.py")
    assert result.ret == 1, result
    state = json.loads((sweeper.path / "runs/g/base/state.json").read_text())
    attempt = state["attempts"][-1]
    assert attempt["failure_class"] == "GUARD"
    # Records reach the guard as the driver polls: it fires at step 7 or a little later.
    assert re.search(r"no sample stopped by itself for 5 steps \(step (\d+)\)", attempt["failure"]), attempt
    assert int(re.search(r"\(step (\d+)\)", attempt["failure"])[1]) >= 7
    steps = [json.loads(line)["step"] for line in (sweeper.path / "runs/g/base/metrics.jsonl").read_text().splitlines()]
    assert max(steps) < 40  # stopped, not run to its end
