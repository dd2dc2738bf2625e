"""A cell program run as ``python -m warm_probe``, for the warm-start tests.

It reports, as one JSON line on stdout, what its process looks like from inside (argv,
working directory, environment, sys.path[0], signal dispositions, open descriptors,
process group, whether ``warm_heavy`` was imported in this process or found imported),
writes one metrics line, one stderr line, and then, by ``config.json``'s ``mode``: ends
(``exit`` code), raises, kills itself with SIGKILL, or sleeps until signalled (writing its
pid to ``pid``).
"""

import json
import os
import signal
import sys
import time

import warm_heavy



def inheritable(fd: int) -> bool:
    try:
        return os.get_inheritable(fd)
    except OSError:  # the descriptor listdir itself used
        return False


config = json.load(open("config.json"))
report = {
    "argv": sys.argv[1:],
    "argv0": os.path.basename(sys.argv[0]),
    "orig_argv": sys.orig_argv[1:],
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "name": __name__,
    "env": {key: os.environ.get(key) for key in ("SWEEP_CELL", "PROBE_VAR", "PYTHONUNBUFFERED",
                                                 "CUDA_VISIBLE_DEVICES", "WARM_HEAVY_SET")},
    "sigint": str(signal.getsignal(signal.SIGINT)),
    "sigterm": str(signal.getsignal(signal.SIGTERM)),
    "sigpipe": str(signal.getsignal(signal.SIGPIPE)),
    "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, set())),
    "fds": [fd for fd in sorted(map(int, os.listdir("/proc/self/fd"))) if fd < 3 or inheritable(fd)],
    "pgid": os.getpgrp(),
    "stdin": sys.stdin.read(),
    "stdout_buffered": not sys.stdout.write_through,
}
print(json.dumps(report))
print("probe: started", file=sys.stderr)
with open("metrics.jsonl", "a") as metrics:
    metrics.write(json.dumps({"kind": "train", "step": 1, "value": config.get("value", 0)}) + "\n")
with open("warm.json", "w") as marker:  # apart from the logs: what differs between warm and cold
    json.dump({"warm": warm_heavy.IMPORTED_BY != os.getpid(), "pid": os.getpid()}, marker)
mode = config.get("mode", "exit")
if mode == "raise":
    raise RuntimeError("probe: failed on purpose")
if mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "hang":
    with open("pid", "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(600)
sys.exit(config.get("exit", 0))
