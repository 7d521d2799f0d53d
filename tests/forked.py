"""``rescale`` commands in processes forked from a zygote (``tests/zygote.py``) that has imported
torch, Lightning, W&B and the suite once per test worker, instead of a fresh interpreter paying ~9 s
of imports each time (twice for a DDP pair). The child is a real process of its own (its pid, its
session, its signals, its exit status) running ``python -m <module> <args>`` as a fresh interpreter
would, with the environment, working folder and standard streams given here.

- :func:`popen` / :func:`run` take the same command lists as :mod:`subprocess`:
  ``[sys.executable, "-m", module, *args]``, or this environment's ``rescale`` or ``torchrun``
  script (run as its module); any other command goes to :mod:`subprocess` itself.
- :func:`ddp_run` starts the ranks of a one-node DDP run as ``torchrun`` would (each rank forked,
  ``LOCAL_RANK``/``RANK``/``WORLD_SIZE``/``MASTER_*`` set), which Lightning takes as processes
  created outside it.
- ``rescale fit --trainer.devices 2`` run through :func:`run` launches its other ranks itself, as
  Lightning does (its launcher's command line, environment and ``Popen``), and those are forked from
  the same zygote (:func:`attach`, called in each forked child by ``tests/zygote.py``), and so
  are the workers of ``torchrun`` run through :func:`run`.

What a forked child does not get afresh: malloc's environment (glibc reads ``MALLOC_*`` at process
start; ``tests/tasks/common/system/test_allocator.py`` runs fresh interpreters) and the hash seed
(the zygote's is 0, as the suite's subprocess runs asked for).
"""
from __future__ import annotations

import atexit
import io
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any, Optional

from zygote import read_message, send_message

_ZYGOTE = Path(__file__).with_name("zygote.py")
_server: Optional[subprocess.Popen] = None
_socket_path: Optional[str] = None
_attached: Optional[str] = None  # a forked child's: the socket of the zygote it was forked from


def attach(socket_path: str) -> None:
    """In a child forked from the zygote at ``socket_path``: the commands this process starts
    through :func:`popen`, and the ranks Lightning's subprocess launcher starts, are forked from
    that zygote too (Lightning's launcher calls ``subprocess.Popen`` with ``[python, -m, module,
    *args]``: :func:`popen` takes the same arguments and starts anything else as it would)."""
    global _attached
    _attached = socket_path
    from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
    from lightning.pytorch.strategies.launchers import subprocess_script as trainer_launcher
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    for launcher in (fabric_launcher, trainer_launcher):
        launcher.subprocess = types.SimpleNamespace(**{**vars(subprocess), "Popen": popen})
    subprocess_handler.Popen = popen  # torchrun's workers: Popen(args=(entrypoint, *args), ...)


_starting = threading.Lock()  # threads forking at once (a study's workers) start one zygote


def _zygote() -> str:
    """The socket of this process's zygote, started on first use."""
    if _attached is not None:
        return _attached
    with _starting:
        return _start_zygote()


def _start_zygote() -> str:
    global _server, _socket_path
    if _server is not None and _server.poll() is None:
        return _socket_path
    folder = tempfile.mkdtemp(prefix="zygote-")
    _socket_path = os.path.join(folder, "socket")
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    for name in ("WANDB_SERVICE", "PYTHONPATH"):  # each child sets its own
        env.pop(name, None)
    _server = subprocess.Popen([sys.executable, str(_ZYGOTE), _socket_path], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env=env, text=True)
    line = _server.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"the zygote did not start (exit {_server.wait()})")
    return _socket_path


def _stop() -> None:
    if _server is not None and _server.poll() is None:
        _server.stdin.close()
        try:
            _server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _server.kill()


atexit.register(_stop)


# this environment's console scripts of the suite and of torch: each runs its module's ``main``, as
# ``python -m`` of that module does
_SCRIPTS = {str(Path(sys.executable).parent / "rescale"): "rescale_tasks.cli",
            str(Path(sys.executable).parent / "torchrun"): "torch.distributed.run"}


def _module_of(command) -> Optional[tuple[str, list[str]]]:
    """``(module, args)`` of ``[python, -m, module, *args]`` run by this interpreter, or of one of
    this environment's console scripts (``_SCRIPTS``), else None."""
    command = [str(a) for a in command]
    if command and command[0] == sys.executable:
        command = command[1:]
        if command[:1] == ["-u"]:  # (torchrun's workers: unbuffered output; the streams are pipes or files)
            command = command[1:]
        if len(command) >= 2 and command[0] == "-m":
            return command[1], command[2:]
    if command and command[0] in _SCRIPTS:  # the script itself, or this interpreter running it
        return _SCRIPTS[command[0]], command[1:]
    return None


class ForkedProcess:
    """The :class:`subprocess.Popen` surface the suite's tests use, for a forked child.
    ``controlling_terminal``: the child leads a new session whose controlling terminal is its
    standard input (a terminal), as a login shell's job is. ``rlimits``: the child's resource
    limits (``{"RLIMIT_FSIZE": (soft, hard)}``), set before its module runs."""

    def __init__(self, module: str, args: list[str], *, cwd=None, env=None, stdout=None, stderr=None,
                 stdin=subprocess.DEVNULL, text: bool = False, start_new_session: bool = False,
                 controlling_terminal: bool = False, rlimits: Optional[dict] = None):
        self.args = [sys.executable, "-m", module, *args]
        self.returncode: Optional[int] = None
        self._text = text
        theirs: list[int] = []   # the child's stdin, stdout, stderr
        streams: list = []       # this process's end of each pipe (None: not a pipe)
        for spec, default in ((stdin, 0), (stdout, 1), (stderr, 2)):
            mine = None
            if spec == subprocess.PIPE:
                r, w = os.pipe()
                mine, child = (w, r) if default == 0 else (r, w)
            elif spec == subprocess.DEVNULL:
                child = os.open(os.devnull, os.O_RDWR)
            elif spec == subprocess.STDOUT:
                child = os.dup(theirs[1])
            elif spec is None:
                child = os.dup(default)
            else:
                child = os.dup(spec if isinstance(spec, int) else spec.fileno())
            theirs.append(child)
            streams.append(mine)
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(_zygote())
        request = {"module": module, "args": args, "cwd": str(cwd or os.getcwd()),
                   "env": dict(os.environ if env is None else env), "new_session": start_new_session,
                   "controlling_terminal": controlling_terminal, "rlimits": dict(rlimits or {})}
        try:
            send_message(self._conn, request, theirs)
            reply, _ = read_message(self._conn)
        finally:
            for fd in theirs:
                os.close(fd)
        self.pid = reply["pid"]
        wrap = (lambda fd, mode: io.open(fd, mode + ("" if text else "b"), encoding="utf-8" if text else None))
        self.stdin = wrap(streams[0], "w") if streams[0] is not None else None
        self.stdout = wrap(streams[1], "r") if streams[1] is not None else None
        self.stderr = wrap(streams[2], "r") if streams[2] is not None else None

    def _status(self, timeout: Optional[float]) -> Optional[int]:
        if self.returncode is not None:
            return self.returncode
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return None
        message, _ = read_message(self._conn)
        self._conn.close()
        self.returncode = os.waitstatus_to_exitcode(message["status"])
        return self.returncode

    def poll(self) -> Optional[int]:
        return self._status(0)

    def wait(self, timeout: Optional[float] = None) -> int:
        code = self._status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def communicate(self, input=None, timeout: Optional[float] = None) -> tuple[Any, Any]:
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        results: dict[str, Any] = {}
        readers = []
        for name in ("stdout", "stderr"):
            stream = getattr(self, name)
            if stream is not None:
                thread = threading.Thread(target=lambda n=name, s=stream: results.__setitem__(n, s.read()),
                                          daemon=True)
                thread.start()
                readers.append(thread)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in readers:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return results.get("stdout"), results.get("stderr")

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)


def popen(command: Optional[list[str]] = None, **kwargs: Any):
    """:class:`subprocess.Popen` for ``command``, forked from the zygote where it is a module run."""
    if command is None:
        command = kwargs.pop("args")
    module = _module_of(command)
    if module is None or kwargs.get("preexec_fn") is not None:  # code to run in the child: a real fork
        return subprocess.Popen(command, **kwargs)
    return ForkedProcess(*module, **kwargs)


def run(command: list[str], *, capture_output: bool = False, timeout: Optional[float] = None,
        check: bool = False, text: bool = False, **kwargs: Any) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` for ``command``, forked from the zygote where it is a module run."""
    if _module_of(command) is None:
        return subprocess.run(command, capture_output=capture_output, timeout=timeout, check=check, text=text,
                              **kwargs)
    if capture_output:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc = popen(command, text=text, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_run(module: str, args: list[str], nprocs: int, *, env: Optional[dict] = None, cwd=None,
            timeout: Optional[float] = None, text: bool = True) -> subprocess.CompletedProcess:
    """``module args`` as ``nprocs`` ranks of one node started outside Lightning (``torchrun``'s
    environment), each forked from the zygote; the ranks' output is joined, rank 0's first; the
    return code is the first non-zero one."""
    base = dict(os.environ if env is None else env)
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(nprocs),
                NODE_RANK="0", GROUP_RANK="0", LOCAL_WORLD_SIZE=str(nprocs))
    procs = [ForkedProcess(module, args, cwd=cwd, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text)
             for r in range(nprocs)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    code = next((p.returncode for p in procs if p.returncode), 0)
    join = "".join if text else b"".join
    return subprocess.CompletedProcess([sys.executable, "-m", module, *args], code,
                                       join(o for o, _ in outputs), join(e for _, e in outputs))
