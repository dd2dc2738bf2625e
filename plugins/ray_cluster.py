"""The Ray bring-up of a multi-node job: a bash fragment the job script includes.

The fragment runs on node 0 of the job. It pins NCCL and Gloo to one network interface
(``ib0``: InfiniBand, not the management ethernet), takes the head's IPv4 from that
interface, starts a Ray head there, starts one worker on each other node through a
launcher (``srun`` on SLURM), waits until every node has joined, and exports
``RAY_ADDRESS``. Each node gets a custom resource ``sweep_node_<i>`` so work can be pinned
to a node. An EXIT trap stops what it started, by process id.

Ray's ``--temp-dir`` must be short: Ray puts an AF_UNIX socket at
``<temp-dir>/session_<timestamp>_<pid>/sockets/plasma_store`` and a socket path has at
most 107 bytes; a temp dir on a Lustre scratch root (about 55 characters already)
overflows it. :func:`socket_path_error` checks this before anything is submitted.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from typing import Optional

import attrs

from sweepkit.hookspec import hookimpl

DEFAULT_INTERFACE = "ib0"
DEFAULT_PORT = 6379
DEFAULT_TEMP_DIR = "/tmp/ray_${SLURM_JOB_ID}"
#: sun_path holds 108 bytes including the terminating NUL.
AF_UNIX_MAX = 107
#: As long as a real session dir name: session_<date>_<time>_<microseconds>_<pid>.
SESSION_DIR = "session_2026-06-24_12-34-56_123456_12345"
#: Stands in for an unset variable of a temp dir when measuring it (as long as a job id).
UNSET_VARIABLE = "x" * 12
SLURM_NODES_COMMAND = 'scontrol show hostnames "$SLURM_JOB_NODELIST"'
SLURM_WORKER_LAUNCHER = 'srun --nodes=1 --ntasks=1 --overlap -w "$RAY_NODE"'
_SAFE_TEMP_DIR = re.compile(r"^[A-Za-z0-9_./${}-]+$")


def _tuple(value) -> tuple:
    return tuple(str(item) for item in value)


@attrs.frozen(kw_only=True)
class RayBringup:
    """What the fragment is rendered from.

    ``ray`` and ``python`` are command prefixes (a container wrapper plus the venv's
    ``ray`` / ``python``). ``nodes_command`` prints the job's hostnames, node 0 first;
    ``worker_launcher`` is put before the worker command and sees ``$RAY_NODE``
    (empty: start the worker as a local background process). Both are shell written by
    plugins, not values from a grid.
    """

    interface: str = attrs.field(default=DEFAULT_INTERFACE)
    port: int = DEFAULT_PORT
    temp_dir: str = attrs.field(default=DEFAULT_TEMP_DIR)
    ray: tuple[str, ...] = attrs.field(default=("ray",), converter=_tuple)
    python: tuple[str, ...] = attrs.field(default=("python",), converter=_tuple)
    nodes_command: str = SLURM_NODES_COMMAND
    worker_launcher: str = SLURM_WORKER_LAUNCHER
    num_gpus: Optional[int] = None
    head_args: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    worker_args: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    timeout_s: int = 300

    @interface.validator
    def _interface(self, attribute, value):
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", value):
            raise ValueError(f"ray interface {value!r}: not a network interface name")

    @temp_dir.validator
    def _temp_dir(self, attribute, value):
        if not _SAFE_TEMP_DIR.match(value):
            raise ValueError(f"ray temp dir {value!r}: only letters, digits, '_./-' and $VARIABLES")


def plasma_socket_path(temp_dir: str, environ: Mapping[str, str]) -> str:
    """The plasma-store socket path Ray will use under ``temp_dir``, variables expanded
    (an unset one counted as 12 characters, the length of a job id and then some)."""
    def value(match: re.Match) -> str:
        return environ.get(match[1] or match[2]) or UNSET_VARIABLE

    expanded = re.sub(r"\$\{(\w+)\}|\$(\w+)", value, temp_dir).rstrip("/")
    return f"{expanded}/{SESSION_DIR}/sockets/plasma_store"


def socket_path_error(temp_dir: str, environ: Mapping[str, str]) -> str | None:
    path = plasma_socket_path(temp_dir, environ)
    size = len(path.encode())
    if size <= AF_UNIX_MAX:
        return None
    room = AF_UNIX_MAX - (size - len(temp_dir.rstrip("/").encode()))
    return (f"ray_temp_dir={temp_dir!r}: Ray's plasma-store socket {path} would be {size} bytes, "
            f"over the {AF_UNIX_MAX}-byte AF_UNIX limit; use a temp dir of at most {room} bytes "
            f"on node-local disk, e.g. {DEFAULT_TEMP_DIR!r}")


def _worker_script(spec: RayBringup) -> str:
    """What runs on each worker node: find its own IP on the interface, join the head."""
    ray = " ".join(shlex.quote(part) for part in spec.ray)
    gpus = f" --num-gpus={spec.num_gpus}" if spec.num_gpus is not None else ""
    extra = "".join(" " + shlex.quote(arg) for arg in spec.worker_args)
    return (
        f'ip=$(ip -o -4 addr show dev {spec.interface} | awk \'{{split($4, a, "/"); print a[1]; exit}}\'); '
        f'[ -n "$ip" ] || {{ echo "ray bring-up: no IPv4 on {spec.interface} of $(hostname)" >&2; exit 1; }}; '
        f'exec {ray} start --block --address="$RAY_ADDRESS" --node-ip-address="$ip" '
        f'--temp-dir="{spec.temp_dir}" --disable-usage-stats{gpus} '
        f'--resources="{{\\"sweep_node_$SWEEP_RAY_NODE_INDEX\\": 1}}"{extra}'
    )


_WAIT = """\
import os, sys, time
import ray
want, deadline = int(sys.argv[1]), time.time() + float(sys.argv[2])
while True:
    try:
        ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
        break
    except ConnectionError:
        if time.time() > deadline:
            sys.exit(f"ray bring-up: no Ray head at {os.environ['RAY_ADDRESS']} in {sys.argv[2]} s")
        time.sleep(1)
while (alive := sum(node["Alive"] for node in ray.nodes())) < want:
    if time.time() > deadline:
        sys.exit(f"ray bring-up: {alive} of {want} nodes joined in {sys.argv[2]} s")
    time.sleep(1)
print(f"ray bring-up: {alive} nodes at {os.environ['RAY_ADDRESS']}", flush=True)
"""


def render_bringup(spec: RayBringup) -> str:
    """The bash fragment (bash 4+, run on node 0 of the job)."""
    ray = " ".join(shlex.quote(part) for part in spec.ray)
    python = " ".join(shlex.quote(part) for part in spec.python)
    gpus = f" --num-gpus={spec.num_gpus}" if spec.num_gpus is not None else ""
    head_extra = "".join(" " + shlex.quote(arg) for arg in spec.head_args)
    launcher = (spec.worker_launcher + " ") if spec.worker_launcher else ""
    iface = spec.interface
    return f"""\
# --- Ray bring-up (sweepkit_plugins.ray_cluster): head here, one worker per other node ---
export NCCL_SOCKET_IFNAME={iface} GLOO_SOCKET_IFNAME={iface}
mapfile -t SWEEP_RAY_NODES < <({spec.nodes_command})
RAY_HEAD_IP=$(ip -o -4 addr show dev {iface} | awk '{{split($4, a, "/"); print a[1]; exit}}')
if [ -z "$RAY_HEAD_IP" ]; then
  echo "ray bring-up: no IPv4 address on interface {iface} of $(hostname)" >&2
  exit 1
fi
export RAY_HEAD_IP RAY_ADDRESS="$RAY_HEAD_IP:{spec.port}"
SWEEP_RAY_PIDS=()
sweep_ray_stop() {{
  kill -TERM "${{SWEEP_RAY_PIDS[@]}}" 2>/dev/null
  wait "${{SWEEP_RAY_PIDS[@]}}" 2>/dev/null
  return 0
}}
trap sweep_ray_stop EXIT
{ray} start --head --block --node-ip-address="$RAY_HEAD_IP" --port={spec.port} \\
  --temp-dir="{spec.temp_dir}" --disable-usage-stats --include-dashboard=false{gpus} \\
  --resources='{{"sweep_node_0": 1}}'{head_extra} &
SWEEP_RAY_PIDS+=($!)
SWEEP_RAY_WORKER={shlex.quote(_worker_script(spec))}
for ((i = 1; i < ${{#SWEEP_RAY_NODES[@]}}; i++)); do
  RAY_NODE=${{SWEEP_RAY_NODES[$i]}}
  SWEEP_RAY_NODE_INDEX=$i {launcher}bash -c "$SWEEP_RAY_WORKER" &
  SWEEP_RAY_PIDS+=($!)
done
{python} - "${{#SWEEP_RAY_NODES[@]}}" {spec.timeout_s} <<'SWEEP_RAY_WAIT' || exit 1
{_WAIT}SWEEP_RAY_WAIT
# --- end of Ray bring-up ---
"""


# -- the cell's side ------------------------------------------------------------------------

LAUNCH_KEYS = (
    ("ray_interface", Optional[str], None,
     f"network interface of a multi-node cell's NCCL/Gloo traffic and Ray head IP "
     f"(None: $SWEEP_RAY_IFNAME, else {DEFAULT_INTERFACE})"),
    ("ray_temp_dir", Optional[str], None,
     f"Ray's --temp-dir on each node; short, node-local (None: {DEFAULT_TEMP_DIR})"),
    ("ray_port", int, DEFAULT_PORT, "port of the Ray head (GCS)"),
)


def interface_of(cell, environ: Mapping[str, str]) -> str:
    return cell.launch().get("ray_interface") or environ.get("SWEEP_RAY_IFNAME") or DEFAULT_INTERFACE


def temp_dir_of(cell) -> str:
    return cell.launch().get("ray_temp_dir") or DEFAULT_TEMP_DIR


def bringup_for(cell, environ: Mapping[str, str], *, prefix=(), ray: str = "ray",
                python: str = "python", num_gpus: int | None = None) -> RayBringup:
    """The spec of a cell's bring-up on SLURM; ``prefix`` is the container wrapper."""
    return RayBringup(interface=interface_of(cell, environ), port=cell.launch().get("ray_port") or DEFAULT_PORT,
                      temp_dir=temp_dir_of(cell), ray=(*prefix, ray), python=(*prefix, python),
                      num_gpus=num_gpus)


@hookimpl
def sweep_register_keys(register):
    for name, tp, default, doc in LAUNCH_KEYS:
        register(name, tp, default, doc)


@hookimpl
def sweep_validate_cell(cell, session):
    temp_dir = temp_dir_of(cell)
    if not _SAFE_TEMP_DIR.match(temp_dir):
        return [f"ray_temp_dir={temp_dir!r}: only letters, digits, '_./-' and $VARIABLES"]
    error = socket_path_error(temp_dir, os.environ)
    return [error] if error else []
