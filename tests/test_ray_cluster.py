"""The Ray bring-up fragment, run for real: a head and one worker on loopback."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from sweepkit_plugins.ray_cluster import (AF_UNIX_MAX, RayBringup, plasma_socket_path, render_bringup,
                                          socket_path_error)


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def test_socket_path_uses_a_real_session_dir_length():
    path = plasma_socket_path("/tmp/ray_${SLURM_JOB_ID}", {"SLURM_JOB_ID": "12345678"})
    assert path == "/tmp/ray_12345678/session_2026-06-24_12-34-56_123456_12345/sockets/plasma_store"
    assert socket_path_error("/tmp/ray_${SLURM_JOB_ID}", {}) is None


def test_a_temp_dir_on_lustre_scratch_overflows_af_unix():
    scratch = "/leonardo_scratch/fast/AIFAC_5C0_290/someuser00/ray_tmp/$SLURM_JOB_ID"
    error = socket_path_error(scratch, {"SLURM_JOB_ID": "12345678"})
    assert error is not None and f"over the {AF_UNIX_MAX}-byte AF_UNIX limit" in error
    assert len(plasma_socket_path(scratch, {"SLURM_JOB_ID": "12345678"}).encode()) > AF_UNIX_MAX


def test_validation_refuses_a_long_temp_dir(sweeper):
    long_dir = "/leonardo_scratch/fast/AIFAC_5C0_290/someuser00/ray_tmp_dirs/a_long_name"
    sweeper.grid("g", f'''
        import sweepkit as sk
        target = sk.command("{{python}}", "-c", "pass")
        base = sk.base(lr=1.0, ray_temp_dir={long_dir!r})
    ''')
    result = sweeper.run("run", "--dry-run", "--executor", "debug")
    assert result.ret != 0
    assert "base: ray_temp_dir=" in result.output and "AF_UNIX limit" in result.output


def test_unsafe_temp_dir_is_rejected_when_rendering():
    with pytest.raises(ValueError, match="ray temp dir"):
        RayBringup(temp_dir="/tmp/x; rm -rf ~")


JOB_BODY = '''
python - <<'PY'
import os, ray
ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False, logging_level="ERROR")

@ray.remote(num_cpus=0)
def where():
    return ray.get_runtime_context().get_node_id()

nodes = [ray.get(where.options(resources={f"sweep_node_{i}": 0.01}).remote()) for i in (0, 1)]
print("TASK_NODES", *nodes)
print("RAY_ADDRESS", os.environ["RAY_ADDRESS"], "IFNAMES", os.environ["NCCL_SOCKET_IFNAME"],
      os.environ["GLOO_SOCKET_IFNAME"])
PY
'''


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("ray") is None, reason="needs Ray's CLI: pip install -e '.[ray]'")
def test_bringup_runs_a_task_on_each_of_two_nodes():
    gcs, head_agent, worker_agent = free_ports(3)
    # Short and unique: the AF_UNIX limit applies here too, and it names our processes.
    temp_dir = tempfile.mkdtemp(prefix="skray", dir="/tmp")
    spec = RayBringup(
        interface="lo", port=gcs, temp_dir=temp_dir, nodes_command="printf '%s\\n' node0 node1",
        worker_launcher="",  # the worker is a local background process instead of an srun step
        head_args=(f"--dashboard-agent-listen-port={head_agent}", "--num-cpus=1"),
        worker_args=(f"--dashboard-agent-listen-port={worker_agent}", "--num-cpus=1"),
        timeout_s=120,
    )
    script = Path(temp_dir) / "job.sh"
    script.write_text("set -u\n" + render_bringup(spec) + JOB_BODY)
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # our own process group only
        output, _ = proc.communicate(timeout=60)
        pytest.fail(f"bring-up did not finish:\n{output[-4000:]}")
    finally:
        left = subprocess.run(["pgrep", "-f", temp_dir], capture_output=True, text=True).stdout
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert proc.returncode == 0, output[-4000:]
    lines = {line.split()[0]: line.split()[1:] for line in output.splitlines()
             if line.startswith(("TASK_NODES", "RAY_ADDRESS", "ray bring-up"))}
    first, second = lines["TASK_NODES"]
    assert first != second  # one task ran on the head, the other on the worker
    assert lines["RAY_ADDRESS"] == [f"127.0.0.1:{gcs}", "IFNAMES", "lo", "lo"]
    assert "ray bring-up: 2 nodes at" in output
    # The EXIT trap stopped everything it started.
    assert left.strip() == "", left
