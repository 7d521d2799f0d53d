"""The process the suite forks its ``rescale`` commands from (``tests/forked.py``).

Started once per test worker, it imports torch, Lightning, W&B and the suite (~9 s on 2 cores, what
every ``python -m rescale_tasks.cli`` pays before its first line), then serves requests on a Unix
socket: each names a module to run as ``python -m`` would, its arguments, working folder and
environment, and brings the three standard streams as file descriptors. It forks, and the child
runs the module as ``__main__`` (``runpy``) with those streams, in that folder and environment, and
exits as a fresh interpreter would (its exit status; other threads joined, atexit handlers,
W&B's included, run, open files flushed) but for the interpreter's teardown (``_exit``). The
server tells the requester the child's pid, and its wait status once it has reaped it. A child's
own module runs (Lightning launching a run's other ranks) are forked from here too
(``forked.attach``).

Run as ``python tests/zygote.py SOCKET``; it prints ``ready`` once it listens.
"""
from __future__ import annotations

import fcntl
import gc
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import termios

# what a child would otherwise import after the fork: the suite and every task, the parts of W&B
# that its run start imports (its launch inputs, ~1.4 s) and of scikit-learn the digits split with
PRELOAD = ("torch", "torchvision", "lightning.pytorch", "wandb", "wandb.sdk.launch.inputs.internal",
           "sklearn.model_selection", "sklearn.datasets", "rescale_core", "rescale_tasks.cli",
           "rescale_tasks.common.cli.command", *(f"rescale_tasks.{task}.{part}" for task in
                                                  ("classification", "detection", "translation", "video")
                                                  for part in ("module", "data")))


def send_message(conn: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    payload = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(conn, [payload], list(fds))
    else:
        conn.sendall(payload)


def read_message(conn: socket.socket, nfds: int = 0) -> tuple[dict, list[int]]:
    """One length-prefixed JSON message and the descriptors that came with its first bytes."""
    fds: list[int] = []
    if nfds:
        head, fds, _, _ = socket.recv_fds(conn, 4, nfds)
    else:
        head = conn.recv(4)
    while len(head) < 4:
        more = conn.recv(4 - len(head))
        if not more:
            raise EOFError("the peer closed the connection")
        head += more
    (size,) = struct.unpack("!I", head)
    data = b""
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise EOFError("the peer closed the connection")
        data += more
    return json.loads(data), fds


def _serve(path: str) -> tuple[dict, list[int]]:
    """Serve until the listener closes; returns (in a forked child only) the request it runs."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [], 0.05)
        if sys.stdin in readable and not sys.stdin.readline():
            return {}, []  # the test worker went away
        if listener in readable:
            conn, _ = listener.accept()
            request, fds = read_message(conn, 3)
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in waiting.values():
                    other.close()
                conn.close()
                return request, fds
            for fd in fds:
                os.close(fd)
            send_message(conn, {"pid": pid})
            waiting[pid] = conn
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                try:
                    send_message(conn, {"status": status})
                except OSError:
                    pass
                conn.close()


def _become(request: dict, fds: list[int]) -> None:
    """This forked child as the process the request describes, before its module runs."""
    if request.get("new_session") or request.get("controlling_terminal"):
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for name, limits in request.get("rlimits", {}).items():  # e.g. RLIMIT_FSIZE: a full disk
        resource.setrlimit(getattr(resource, name), tuple(limits))
    if request.get("controlling_terminal"):  # a login shell's job: its terminal (stdin) controls it
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # a fresh interpreter's signal dispositions: Ctrl-C raises KeyboardInterrupt, the rest default
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False, buffering=1 if os.isatty(1) else -1)
    sys.stderr = open(2, "w", closefd=False, buffering=1)
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator from the OS
        sys.modules["numpy"].random.seed()
    # ``python -m``'s path: the working folder, then PYTHONPATH, then the installation's (this
    # script's own folder, the zygote's first entry, is not a child's)
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:1] = [os.getcwd(), *extra]
    sys.argv = [request["module"], *request["args"]]


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # read once, when torch's OpenMP loads
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)
    import forked  # this script's folder is still the first on the path
    # what the preloading made is never garbage: moved out of the collector's generations, so a
    # child's collections do not traverse it and its exit looks for open files among what it made
    gc.collect()
    gc.freeze()
    socket_path = sys.argv[1]
    request, fds = _serve(socket_path)
    if not request:  # the test worker went away: no teardown either (see _exit)
        sys.stdout.flush()
        os._exit(0)
    _become(request, fds)
    forked.attach(socket_path)
    # as in a fresh interpreter, the module run as __main__ is not also an imported module (a preloaded
    # one would be, and runpy would warn)
    sys.modules.pop(request["module"], None)
    _exit(*_run_as_main(request["module"]))


def _run_as_main(module: str) -> tuple[int, bool]:
    """Runs ``module`` as ``python -m`` does; returns the exit status the interpreter would give
    and whether an uncaught Ctrl-C ended it (the interpreter then dies by SIGINT)."""
    import runpy
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return (stop.code or 0) & 0xFF, False
        print(stop.code, file=sys.stderr)
        return 1, False
    except BaseException as error:  # the interpreter's report of an uncaught exception
        sys.excepthook(type(error), error, error.__traceback__)
        return 1, isinstance(error, KeyboardInterrupt)
    return 0, False


def _exit(status: int, interrupted: bool) -> None:
    """The end of a fresh interpreter, less its teardown: other threads joined, the atexit handlers
    (W&B's, logging's) run, every open file flushed, then the process ends. The teardown (every
    module's and object's finalizer) took 2 to 3 s per process with torch, Lightning and W&B
    imported, more than most runs the suite forks."""
    import _io
    import atexit
    import threading

    # CPython's own steps (private names of the interpreter, not of a pinned library)
    threading._shutdown()  # what the interpreter does first: waits for the non-daemon threads
    atexit._run_exitfuncs()
    # every file object the child made (the zygote's own are frozen, out of gc.get_objects()): a
    # subclass of io.IOBase's C base (io.IOBase's own ABC check took 1 s a process); type():
    # isinstance would look into weak proxies
    for obj in gc.get_objects():
        if issubclass(type(obj), _io._IOBase):
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError):
                pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


if __name__ == "__main__":
    main()
