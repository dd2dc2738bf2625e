"""A Leonardo job script, as sweepkit renders it, run for real on the local SLURM cluster.

The cell is the built-in trainer (tiny random model, CPU, one step) under ``--cluster
leonardo``: its job runs ``singularity exec ... $SWEEP_VENV/bin/python -m trainer ...``.
There is no Singularity here, so a stand-in ``singularity`` on PATH plays the container:
it checks the arguments the way the real one depends on them (``exec --nv --no-home``,
every ``--bind`` source there, the project root and the trainer's source tree bound, a
``--pwd`` that is the cell dir, ``--env PYTHONPATH=`` the trainer's source tree, an
existing image) and fails loudly otherwise, then runs the command with only what the
container would give it: the job's environment with ``PYTHONPATH`` from ``--env`` alone,
in ``--pwd``.

What makes the test mean something: the cell's venv (the one the container would hold)
has torch and the trainer's other dependencies but *not* sweepkit's editable install, so
``python -m trainer`` works there only through the bind and ``PYTHONPATH`` the script
sets; and the driver runs from a venv under ``$WORK`` (outside the project tree), the
interpreter ``srun`` starts for submitit's job runner on the compute node.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "local-slurm"
DEADLINE_S = 120  # a guard against hanging; the job takes about 15 s

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(shutil.which("sbatch") is None,
                       reason="sbatch is not on PATH: no SLURM here (start one with `sudo scripts/local-slurm start`)"),
]

STAND_IN = '''#!{python}
"""Stand-in for `singularity exec`: check the arguments, then run the command as the container would."""
import json, os, sys

def fail(message):
    sys.stderr.write("stand-in singularity: " + message + "\\n")
    sys.exit(97)

args = sys.argv[1:]
record = {{"argv": args}}
if not args or args[0] != "exec":
    fail(f"expected 'exec' first, got {{args[:1]}}")
args = args[1:]
flags, binds, pwd, env = set(), [], None, {{}}
while args and args[0].startswith("-"):
    option = args.pop(0)
    if option in ("--nv", "--no-home"):
        flags.add(option)
    elif option == "--bind":
        binds += [item.split(":", 1)[0] for item in args.pop(0).split(",") if item]
    elif option == "--pwd":
        pwd = args.pop(0)
    elif option == "--env":
        name, _, value = args.pop(0).partition("=")
        env[name] = value
    else:
        fail(f"unexpected option {{option}}")
if flags != {{"--nv", "--no-home"}}:
    fail(f"expected --nv and --no-home, got {{sorted(flags)}}")
if len(args) < 2:
    fail(f"expected an image and a command, got {{args}}")
image, command = args[0], args[1:]
if not os.path.isdir(image):
    fail(f"image {{image}} is not a sandbox dir")
for bind in binds:
    if not os.path.exists(bind):
        fail(f"bind source {{bind}} does not exist")
def bound(path):
    return any(path == b or path.startswith(b.rstrip("/") + "/") for b in binds)
for path in os.environ["STAND_IN_MUST_BIND"].split(os.pathsep):
    if not bound(path):
        fail(f"{{path}} is not bound (binds: {{binds}}): the container would not see it")
if pwd is None or not os.path.isdir(pwd) or not bound(pwd):
    fail(f"--pwd {{pwd}} is missing, not a dir or not bound")
if not bound(os.path.dirname(os.path.dirname(command[0]))):
    fail(f"the interpreter {{command[0]}} is not under a bind")
if env.get("PYTHONPATH") != os.environ["STAND_IN_PYTHONPATH"]:
    fail(f"--env PYTHONPATH={{env.get('PYTHONPATH')}}, expected {{os.environ['STAND_IN_PYTHONPATH']}}")
record.update(binds=binds, pwd=pwd, env=env, image=image, command=command)
with open(os.environ["STAND_IN_LOG"], "a") as log:
    log.write(json.dumps(record) + "\\n")
inside = {{k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("STAND_IN_")}}
inside.update(env)
os.chdir(pwd)
os.execve(command[0], command, inside)
'''

GRID = '''
import sweepkit as sk
base = sk.base(model="tiny-random", dataset="synthetic", device="cpu", backend="hf", num_gpus=0, gpus=0,
               train_batch_size=2, policy_mini_batch_size=2, n_samples_per_prompt=2, max_generate_length=4,
               max_steps=1, eval_before_train=False, eval_limit=2, export_final=False, synthetic_size=8,
               cpus=1, mem_gb=2, time_limit="00:05:00")
'''

#: Variables a developer's shell may carry that would change what the plugins render.
CLEARED = ("SWEEP_CLUSTER", "SWEEP_SLURM", "SWEEP_CONTAINER_PWD", "SWEEP_CONTAINER_BINDS", "SWEEP_HOME",
           "SWEEP_HF_HOME", "SWEEP_RESERVATION", "SWEEP_SINGULARITY", "SWEEP_DEBUG_QOS", "SWEEP_GCC_BIN",
           "SWEEP_QOS", "SWEEP_ACCOUNT", "CHECKPOINTS_DIR", "SCRATCH", "PYTHONPATH", "SLURM_JOB_ID")


@pytest.fixture
def healthy_cluster():
    status = subprocess.run([str(SCRIPT), "status"], capture_output=True, text=True)
    if status.returncode != 0:
        pytest.skip(f"the local SLURM cluster is not healthy (scripts/local-slurm start):\n{status.stdout}")


def make_venv(path: Path, *, system_site_packages: bool) -> Path:
    args = [sys.executable, "-m", "venv", "--without-pip", str(path)]
    subprocess.run(args + (["--system-site-packages"] if system_site_packages else []), check=True)
    return path / "bin" / "python"


def container_venv(path: Path) -> Path:
    """A venv that sees this interpreter's packages (torch, transformers, attrs) as plain
    path entries, so the ``.pth`` files there, sweepkit's editable finder among them, are
    not run: ``import trainer`` fails in it unless PYTHONPATH names the source tree."""
    python = make_venv(path, system_site_packages=False)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "host_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_a_rendered_leonardo_job_runs_the_trainer_in_its_container(tmp_path, healthy_cluster):
    work, scratch, project = tmp_path / "work", tmp_path / "scratch_fast", tmp_path / "project"
    for directory in (work, scratch, project / "grids"):
        directory.mkdir(parents=True)
    (project / "grids" / "boxed.py").write_text(textwrap.dedent(GRID))
    sandbox = scratch / "sandbox"
    sandbox.mkdir()
    venv = scratch / "venv"
    cell_python = container_venv(venv)
    driver_python = make_venv(work / "driver_venv", system_site_packages=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "singularity"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    log = tmp_path / "singularity.jsonl"

    # The precondition that makes the run mean something: the cell's venv alone cannot import the trainer.
    bare = subprocess.run([str(cell_python), "-c", "import torch, transformers, attrs; import trainer"],
                          cwd=tmp_path, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert bare.returncode != 0 and "No module named 'trainer'" in bare.stderr, bare.stderr

    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(WORK=str(work), SCRATCH_FAST=str(scratch), SWEEP_CONTAINER=str(sandbox), SWEEP_VENV=str(venv),
               SWEEP_PARTITION="debug", PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", COLUMNS="200",
               STAND_IN_MUST_BIND=os.pathsep.join([str(project), str(REPO)]), STAND_IN_PYTHONPATH=str(REPO),
               STAND_IN_LOG=str(log))
    runs = work / "runs"
    started = time.monotonic()
    result = subprocess.run([str(driver_python), "-m", "sweepkit", "run", "grids/boxed.py", "--cluster", "leonardo",
                             "--runs-dir", str(runs)], cwd=project, env=env, capture_output=True, text=True,
                            timeout=DEADLINE_S)
    elapsed = time.monotonic() - started
    cell_dir = runs / "boxed" / "base"
    logs = "\n".join(f"--- {path}\n{path.read_text()[-3000:]}" for path in
                     [*cell_dir.glob("*.log"), *(runs / "boxed" / ".slurm").glob("*_log.*")] if path.is_file())
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{logs}"
    assert "1 passed" in result.stdout, result.stdout

    state = json.loads((cell_dir / "state.json").read_text())
    assert state["state"] == "completed", state
    metrics = [json.loads(line) for line in (cell_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert any(row.get("step") == 1 for row in metrics), metrics

    # The job went through the stand-in container exactly once, with the script's arguments.
    (call,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert call["image"] == str(sandbox)
    assert call["pwd"] == str(cell_dir)
    assert call["command"][:3] == [f"{venv}/bin/python", "-m", "trainer"]
    assert {str(work), str(scratch)} <= set(call["binds"])
    # srun started the driver's own interpreter, the one under $WORK, for submitit's job runner.
    script = next((runs / "boxed" / ".slurm").rglob("*submission.sh")).read_text()
    assert f"{driver_python} -u -m submitit.core._submit" in script
    assert elapsed < DEADLINE_S


def test_a_driver_interpreter_on_node_local_disk_is_refused_before_submit(tmp_path, healthy_cluster):
    """The same cell, with the driver's venv under /tmp, outside $WORK: nothing is submitted."""
    work, project = tmp_path / "work", tmp_path / "project"
    (project / "grids").mkdir(parents=True)
    (project / "grids" / "boxed.py").write_text(textwrap.dedent(GRID))
    if Path("/tmp").resolve() not in tmp_path.resolve().parents:
        pytest.skip(f"the test's tmp dir {tmp_path} is not under /tmp")
    driver_python = make_venv(tmp_path / "driver_venv", system_site_packages=True)  # not under $WORK
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(WORK=str(work), SCRATCH_FAST=str(tmp_path / "scratch_fast"), SWEEP_PARTITION="debug",
               HOME=str(work), TMPDIR="", COLUMNS="200")
    result = subprocess.run([str(driver_python), "-m", "sweepkit", "run", "grids/boxed.py", "--cluster",
                             "leonardo", "--runs-dir", str(work / "runs")], cwd=project, env=env,
                            capture_output=True, text=True, timeout=DEADLINE_S)
    assert result.returncode == 4, f"{result.stdout}\n{result.stderr}"
    output = result.stdout + result.stderr
    assert f"srun starts this driver's interpreter {driver_python}" in output, output
    assert "which every node has its own of" in output and "python -m venv $WORK/venvs/sweep" in output, output
    assert not (work / "runs" / "boxed" / ".slurm").exists()  # nothing was submitted
