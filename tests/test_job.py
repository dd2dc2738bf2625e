"""What a cell's job runs: the target's command with its placeholders filled, in the cell dir."""

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_block(first_line: str) -> str:
    """The ```python block of the README or a page of docs/ that starts with ``first_line``,
    as written (exactly one)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    blocks = [block for page in pages for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]
    found = [block for block in blocks if block.startswith(first_line + "\n")]
    assert len(found) == 1, f"README and docs/ have {len(found)} python blocks starting with {first_line!r}"
    return found[0]


def test_readme_command_target_example_runs_as_written(sweeper):
    sweeper.env["CUDA_VISIBLE_DEVICES"] = ""
    sweeper.write("grids/my_script.py", readme_block("# grids/my_script.py"))
    sweeper.write("train.py", readme_block("# train.py, at the project root"))

    run = sweeper.run("run", "grids/my_script.py")
    assert run.ret == 0, run
    assert "3 passed" in run.stdout
    cells = sweeper.path / "runs" / "my_script"
    losses = {name: float((cells / name / "final_loss.txt").read_text()) for name in ("base", "lr0.3", "lr0.5")}
    assert losses == {"base": 0.9 ** 3, "lr0.3": 0.7 ** 3, "lr0.5": 0.5 ** 3}

    report = sweeper.run("report", "grids/my_script.py", "--format", "json")
    assert report.ret == 0, report
    accuracy = json.loads(report.stdout)["tables"]["accuracy"]
    rewards = {row["cell"]: row["reward_last"] for row in accuracy}
    assert rewards == {name: 1 - loss for name, loss in losses.items()}


def test_placeholders_name_the_project_while_the_process_runs_in_its_cell_dir(sweeper):
    sweeper.write("tools/grids/show.py", """
        import json, os, sys
        print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(),
                          "env": [os.environ["SWEEP_ROOT"], os.environ["SWEEP_GRID_DIR"]]}))
    """)
    sweeper.write("tools/grids/g.py", """
        import sweepkit as sk
        target = sk.command("{python}", "{grid_dir}/show.py", "{root}", "{grid_dir}", "{cell_dir}",
                            "{config}", "{unknown}")
        base = sk.base(lr=1.0)
    """)
    run = sweeper.run("run", "tools/grids/g.py", "--executor", "debug")
    assert run.ret == 0, run
    cell_dir = sweeper.path / "runs" / "g" / "base"
    shown = json.loads((cell_dir / "stdout.log").read_text())
    assert Path(shown["cwd"]) == cell_dir
    assert shown["argv"] == [str(sweeper.path), str(sweeper.path / "tools" / "grids"), str(cell_dir),
                             str(cell_dir / "config.json"), "{unknown}"]
    assert shown["env"] == [str(sweeper.path), str(sweeper.path / "tools" / "grids")]

    # Where the project lies is not part of the cell: the same cell from another root is
    # still the completed one.
    again = sweeper.run("--rootdir", "tools", "--runs-dir", "runs", "run", "tools/grids/g.py", "--executor", "debug")
    assert again.ret == 0, again
    assert "1 skipped" in again.stdout
