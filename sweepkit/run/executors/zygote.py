"""The warm worker ("zygote") and its client: one file, two programs, standard library only.

Both run as a script path, never as ``sweepkit.run.executors.zygote``, so that neither imports
the ``sweepkit`` package (the cell's process must not carry it, and the client must start
in milliseconds):

``python zygote.py serve SOCKET MODULE...`` (the worker) imports the modules once, then
for every request forks a child that becomes the cell's process: the child takes the
client's file descriptors (the same numbers: 0, 1, 2 and every other inheritable one,
such as the cell's lock), environment, working directory, signal dispositions and mask,
and process group, sets ``sys.argv``, ``sys.path[0]`` and the standard streams as the
interpreter would for ``python -m MODULE ARGS``, runs MODULE as ``__main__``, and exits as
the interpreter would (``SystemExit``'s code, 1 with a traceback, or killed by SIGINT for
an uncaught ``KeyboardInterrupt``). The worker sends the child's pid, then its wait status.
It ignores the terminal's signals (its children get them as any process of the group
does), stops taking requests when its stdin ends (the driver closed it, or died), and
exits once its last child has been reported. A child whose client connection ends before
the child does (its client was killed) is killed.

``python -I -S zygote.py run SOCKET -- PYTHON -m MODULE ARGS...`` (the client) is what a
job starts instead of the cell's command. It sends its own descriptors, environment,
working directory and signal state to the worker, forwards every signal it gets to the
child, and ends as the child ended (the same exit code, or killed by the same signal), so
the job that waits for it sees what it would have seen of the command itself. When the
worker cannot be reached or refuses (a preload failed, the environment the modules were
imported under differs), it executes the command itself: the plain cold start.

Known differences from a cold start: the child shares the worker's ``str`` hash seed and
the state of module-level random generators that are not reseeded at fork (Python's
``random`` is); a module file that shadows a preloaded one in the cell's directory is not
seen. Preloaded modules must only be imported (no threads started in Python, no device
initialised): the worker refuses to fork if a Python thread is running after the preload.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

HEADER = struct.Struct("!I")
MAX_FDS = 64
# The variables that the interpreter and the dynamic loader read as a process starts; the
# worker's values must be the cell's for a forked child to be what a cold one would be.
STARTUP_ENV = ("PYTHON*", "LC_*", "LANG", "LANGUAGE", "LD_*")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGALRM, signal.SIGCONT, signal.SIGWINCH)
REFUSED = "refused"


def import_env(environ, patterns) -> dict[str, str]:
    """The variables of ``environ`` that ``patterns`` name (``NAME`` or a ``PREFIX*``)."""
    names = tuple(patterns)
    return {key: value for key, value in environ.items()
            if any(key.startswith(p[:-1]) if p.endswith("*") else key == p for p in names)}


def send_message(sock: socket.socket, message: dict, fds=()) -> None:
    payload = json.dumps(message).encode()
    socket.send_fds(sock, [HEADER.pack(len(payload))], list(fds))
    sock.sendall(payload)


def recv_message(sock: socket.socket, with_fds: bool = False):
    """The next message (None at the end of the connection), and the descriptors sent with it."""
    header, fds, _, _ = socket.recv_fds(sock, HEADER.size, MAX_FDS if with_fds else 0)
    while header and len(header) < HEADER.size:
        more = sock.recv(HEADER.size - len(header))
        if not more:
            break
        header += more
    if len(header) < HEADER.size:
        for fd in fds:
            os.close(fd)
        return None, []
    (length,) = HEADER.unpack(header)
    payload = b""
    while len(payload) < length:
        chunk = sock.recv(length - len(payload))
        if not chunk:
            return None, fds
        payload += chunk
    return json.loads(payload), fds


# --- the worker ---------------------------------------------------------------------------


def serve(socket_path: str, modules: list[str], env_patterns: list[str]) -> int:
    import selectors
    import threading

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    # Run as a script, the worker has its own dir first on sys.path; the cell's dir takes
    # that place in each child, as `python -m` puts its working directory there.
    sys.path.pop(0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)  # requests queue here while the modules are imported
    refusal = None
    before = dict(os.environ)
    imported_under = import_env(before, env_patterns)
    for name in modules:
        try:
            __import__(name)
        except ModuleNotFoundError as error:
            if error.name is None or not name.startswith(error.name):
                refusal = f"preload of {name} failed: {type(error).__name__}: {error}"
                break
            # A module this installation does not have: the cell imports what it needs itself.
            print(f"sweepkit warm worker: no module {name}; not preloaded", file=sys.stderr, flush=True)
        except BaseException as error:  # noqa: BLE001 - a half-done import: start cells cold
            refusal = f"preload of {name} failed: {type(error).__name__}: {error}"
            break
    if refusal is None and threading.active_count() > 1:
        refusal = f"preloading {', '.join(modules)} started Python threads; forking is unsafe"
    if refusal is not None:
        print(f"sweepkit warm worker: {refusal}", file=sys.stderr, flush=True)
    # What the imports did to the environment (torch sets TORCHINDUCTOR_CACHE_DIR), for each
    # child to find done, as its own imports would have done it.
    set_by_imports = {key: os.environ.get(key) for key in {*before, *os.environ}
                      if before.get(key) != os.environ.get(key)}

    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listener")
    selector.register(sys.stdin, selectors.EVENT_READ, "driver")
    children: dict[int, tuple[socket.socket, int | None]] = {}  # pid -> (connection, pidfd)
    listening = True
    while listening or children:
        for key, _ in selector.select(timeout=0.5):
            if key.data == "listener":
                connection, _ = listener.accept()
                started = _start_child(connection, listener, refusal, imported_under, env_patterns,
                                       set_by_imports)
                if started is None:
                    connection.close()
                    continue
                pid, pidfd = started
                children[pid] = (connection, pidfd)
                selector.register(connection, selectors.EVENT_READ, ("client", pid))
                if pidfd is not None:
                    selector.register(pidfd, selectors.EVENT_READ, ("child", pid))
            elif key.data == "driver":
                if not os.read(sys.stdin.fileno(), 4096):
                    selector.unregister(sys.stdin)
                    selector.unregister(listener)
                    listener.close()
                    os.unlink(socket_path)
                    listening = False
            elif key.data[0] == "client":
                # The client sends nothing after its request: readable means it has gone,
                # and its child would run on with nobody to report its end to.
                selector.unregister(key.fileobj)
                _kill(key.data[1])
        for pid in list(children):
            _reap(pid, children, selector)
    _remove_dir(os.path.dirname(socket_path))
    return 0


def _remove_dir(directory: str) -> None:
    """The worker's private dir, its log included: all of it was for this run."""
    try:
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)
    except OSError:
        pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(pid: int, children: dict, selector) -> None:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done == 0:
        return
    connection, pidfd = children.pop(pid)
    try:
        send_message(connection, {"status": status})
    except OSError:
        pass  # the client has gone; the job that started it records the end
    try:
        selector.unregister(connection)
    except KeyError:
        pass  # unregistered when its client went
    connection.close()
    if pidfd is not None:
        selector.unregister(pidfd)
        os.close(pidfd)


def _differences(one: dict[str, str], other: dict[str, str]) -> list[str]:
    return sorted(key for key in {*one, *other} if one.get(key) != other.get(key))


def _start_child(connection, listener, refusal, imported_under, env_patterns, set_by_imports):
    """Fork the child of one request; (pid, pidfd), or None when refused or broken."""
    connection.settimeout(10)
    try:
        request, fds = recv_message(connection, with_fds=True)
    except (OSError, ValueError):
        return None
    if request is None:
        return None
    try:
        connection.settimeout(None)
        differ = _differences(import_env(request["env"], env_patterns), imported_under)
        if refusal is None and differ:
            refusal = f"the modules were imported with other values of {', '.join(differ)}"
        if refusal is not None:
            send_message(connection, {REFUSED: refusal})
            return None
        pid = os.fork()
        if pid == 0:
            env = {**request["env"], **set_by_imports}
            request = {**request, "env": {key: value for key, value in env.items() if value is not None}}
            _become_cell(request, fds, keep={connection.fileno(), listener.fileno()})
        send_message(connection, {"pid": pid})
    except OSError:
        return None
    finally:
        for fd in fds:
            os.close(fd)
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None  # reaped by the select timeout instead
    return pid, pidfd


def _become_cell(request: dict, fds: list[int], keep: set[int]) -> None:
    """In the forked child: turn into the process ``python -m MODULE ARGS`` would have
    started, run it, and exit. Never returns."""
    try:
        # The client's descriptors onto their own numbers, everything else of the worker closed.
        numbers = request["fds"]
        high = max([*numbers, *fds, *keep, 2]) + 1
        staged = [os.dup2(fd, high + n) for n, fd in enumerate(fds)]
        for number, fd in zip(numbers, staged):
            os.dup2(fd, number, inheritable=True)
        for fd in _open_fds():
            if fd not in numbers:
                try:
                    os.close(fd)
                except OSError:
                    pass
        try:
            os.setpgid(0, request["pgid"])
        except OSError:
            pass  # another session: stays in the worker's group (the driver's)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        ignored = set(request["ignored"])
        for signum in signal.valid_signals():
            if signum in (signal.SIGKILL, signal.SIGSTOP):
                continue
            try:
                signal.signal(signum, signal.SIG_IGN if signum in ignored else signal.SIG_DFL)
            except (OSError, ValueError):
                pass
        # What the interpreter itself does at start-up.
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_IGN)
        if signal.SIGINT not in ignored:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.set_wakeup_fd(-1)
        argv = request["argv"]
        module = argv[2]
        sys.argv = ["-m", *argv[3:]]
        sys.orig_argv = list(argv)
        sys.path.insert(0, request["cwd"])
        _reopen_stdio()
        signal.pthread_sigmask(signal.SIG_SETMASK, set(request["mask"]))
    except BaseException as error:  # noqa: BLE001 - the child must never return into the worker
        os.write(2, f"sweepkit warm worker: could not start the cell: {error!r}\n".encode())
        os._exit(127)
    _run_as_main(module)


def _open_fds() -> list[int]:
    return [int(name) for name in os.listdir("/proc/self/fd")]


def _reopen_stdio() -> None:
    """sys.stdin/stdout/stderr over fds 0-2, buffered as this interpreter, run in the
    cell's environment, would have made them (PYTHONUNBUFFERED, a terminal or not)."""
    import io

    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED")) or sys.flags.unbuffered

    def stream(fd, mode, old, line_buffering):
        try:
            raw = io.FileIO(fd, mode, closefd=False)
        except OSError:
            return None
        if mode == "rb":
            buffered = io.BufferedReader(raw)
        elif unbuffered:
            buffered = raw
        else:
            buffered = io.BufferedWriter(raw)
        return io.TextIOWrapper(buffered, encoding=old.encoding, errors=old.errors,
                                line_buffering=line_buffering, write_through=unbuffered and mode != "rb")

    sys.stdin = sys.__stdin__ = stream(0, "rb", sys.__stdin__, False)
    sys.stdout = sys.__stdout__ = stream(1, "wb", sys.__stdout__, os.isatty(1))
    sys.stderr = sys.__stderr__ = stream(2, "wb", sys.__stderr__, True)


def _run_as_main(module: str) -> None:
    import atexit
    import builtins
    import runpy
    import threading
    import types

    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    code = 0
    interrupted = False
    try:
        runpy._run_module_as_main(module, alter_argv=True)  # what `python -m` itself calls
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except KeyboardInterrupt:
        _report_uncaught()
        interrupted = True
    except BaseException:  # noqa: BLE001 - reported as the interpreter reports it
        _report_uncaught()
        code = 1
    # The interpreter's shutdown, in its order: non-daemon threads, atexit, the streams.
    try:
        threading._shutdown()
    except BaseException:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    if interrupted:  # as the interpreter ends on an uncaught KeyboardInterrupt: killed by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _report_uncaught() -> None:
    """The traceback as `python -m` prints it: from runpy's frames on, without this file's."""
    kind, value, trace = sys.exc_info()
    trace = trace.tb_next if trace is not None else None
    sys.excepthook(kind, value.with_traceback(trace), trace)


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except BaseException:  # noqa: BLE001
        pass
    return 1


# --- the client ---------------------------------------------------------------------------


def run(socket_path: str, argv: list[str]) -> None:
    """Run ``argv`` as a child of the worker at ``socket_path``, or cold. Never returns."""
    fds = sorted(fd for fd in _open_fds() if _inheritable(fd))
    ignored = [int(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)
               and signal.getsignal(s) == signal.SIG_IGN and s not in (signal.SIGPIPE, signal.SIGXFSZ)]
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "fds": fds, "ignored": ignored,
               "mask": [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, set())],
               "pgid": os.getpgrp()}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # A signal now (before the child exists) must not be lost: held until it can be forwarded.
    signal.pthread_sigmask(signal.SIG_BLOCK, set(FORWARDED))
    try:
        sock.connect(socket_path)
        send_message(sock, request, fds)
        answer, _ = recv_message(sock)
    except OSError:
        answer = None  # no worker (it has stopped taking requests): start cold
    if answer is None or "pid" not in answer:
        if answer is not None:
            os.write(2, f"sweepkit warm worker: {answer.get(REFUSED)}; starting cold\n".encode())
        sock.close()
        _exec_cold(argv, request)
    pid = answer["pid"]

    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:  # even one the child ignores: the client must not die of it
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, set(request["mask"]) - set(FORWARDED))
    try:
        message, _ = recv_message(sock)
    except OSError:
        message = None
    if message is None:  # the worker died: its child cannot be followed any further
        _kill(pid)
        os.write(2, f"sweepkit warm worker: lost the cell's process (pid {pid}); killed it\n".encode())
        os._exit(1)
    _end_as(message["status"])


def _inheritable(fd: int) -> bool:
    try:
        return os.get_inheritable(fd)
    except OSError:
        return False


def _exec_cold(argv: list[str], request: dict) -> None:
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # as subprocess restores them
        signal.signal(signum, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:  # a Ctrl-C held until now ends it as it would a cold start
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set(request["mask"]))
    try:
        os.execv(argv[0], argv)
    except OSError as error:
        os.write(2, f"sweepkit warm worker: cannot execute {argv[0]}: {error.strerror}\n".encode())
        os._exit(127)


def _end_as(status: int) -> None:
    """Exit as the child did: its exit code, or killed by its signal."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the child dumped its core, if any
        except (ImportError, OSError, ValueError):
            pass
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "serve":
        patterns, modules = argv[2].split(",") if argv[2] else [], argv[3:]
        return serve(argv[1], modules, [*STARTUP_ENV, *patterns])
    if len(argv) >= 4 and argv[0] == "run" and argv[2] == "--":
        run(argv[1], argv[3:])
    print("usage: zygote.py serve SOCKET ENV_PATTERNS MODULE... | run SOCKET -- PYTHON -m MODULE ARGS...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
