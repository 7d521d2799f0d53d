"""The local engine: a study's grid (:mod:`.grid`) run here, no scheduler of our own (the
cluster engines, SLURM and W&B sweeps, write files for a scheduler: :mod:`.cluster`).

:func:`run_grid` runs the todo, failed and partial points, each as a subprocess of the installed
``rescale`` (``in_process=True``: in this process, for tests), one after another or ``workers``
at once (each with its share of the cores and of the GPUs); seed by seed (the first seed of
every point before the second), so a study stopped half-way has whole tables of its first
seeds. Finished points are never repeated, so running the study again resumes where it stopped.
SIGINT (Ctrl-C) and SIGTERM are passed to every running point as SIGTERM: each saves its
``last.ckpt`` and the study stops, to be resumed by the same command. :func:`run_one` runs one
point (``rescale study run-point``: a SLURM array task, a sweep agent's run).
"""
from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Callable, Optional, TextIO

from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..common.checkpoints import stop_signal
from ..common.cli import run_command, run_lightning
from ..common.errors import UserError
from ..common.run import SUMMARY_FILE
from ..common.system import FolderBusy, folder_lock
from .grid import LOG_FILE, OUTCOME_FILE, Grid, GridPoint, rescale_command, write_json

__all__ = ["StudyInterrupted", "check_workers", "run_grid", "run_one", "run_order", "visible_gpus",
           "worker_devices"]

logger = logging.getLogger(__name__)


class StudyInterrupted(Exception):
    """The running point was stopped by a signal (it saved its ``last.ckpt``, where it had
    started training). ``returncode``: the study's exit status, 128 + the first signal it got
    (130: SIGINT, 143: SIGTERM); ``child``: the point's own (a run killed before it could save
    anything, ``-N`` from ``Popen``, is told as ``128 + N``)."""

    def __init__(self, point: str, returncode: int, child: Optional[int] = None) -> None:
        super().__init__(point)
        self.point, self.returncode = point, returncode
        self.child = returncode if child is None else (128 - child if child < 0 else child)


def _error_line(text: str, code: int = 1) -> Optional[str]:
    """The run's one-line error (``error: ...``); for a run killed by a signal it did not handle
    (``code`` < 0: the out-of-memory killer's SIGKILL ...), which writes none, that signal; else
    its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if code < 0 and not any(line.startswith("error: ") for line in lines):
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        return f"killed by {name}" + (" (out of memory? or killed from outside)" if -code == signal.SIGKILL else "")
    errors = [line[len("error: "):] for line in lines if line.startswith("error: ")]
    if errors:
        return errors[-1]
    return lines[-1][-500:] if lines else None


# --- running points ---------------------------------------------------------------------------------
class _Forwarder:
    """The points' processes running now, and the stop signals this process got while they ran:
    the first SIGINT or SIGTERM reaches every one of them as SIGTERM (each saves its
    ``last.ckpt``), a second as SIGKILL; a point starting after a signal gets it at once."""

    def __init__(self) -> None:
        self.children: dict[subprocess.Popen, int] = {}  # each running point: how many signals it got
        self.received: list[int] = []
        self._lock = threading.Lock()  # (never taken by the handler: it may interrupt its holder)

    def _send(self, proc: subprocess.Popen) -> None:
        level, sent = len(self.received), self.children.get(proc)
        if sent is None or sent >= level:  # ended, or the handler and add() both saw it
            return
        self.children[proc] = level
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM if level == 1 else signal.SIGKILL)

    def forward(self, signum, frame) -> None:
        self.received.append(signum)
        for proc in list(self.children):
            self._send(proc)

    def add(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self.children[proc] = 0
        if self.received:
            self._send(proc)

    def remove(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self.children.pop(proc, None)

    @contextlib.contextmanager
    def installed(self):
        """This forwarder as the process's SIGINT and SIGTERM handler (in the main thread only;
        elsewhere the caller's handlers stay)."""
        previous = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: no handlers
                previous[signum] = signal.signal(signum, self.forward)
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def run_one(grid: Grid, point: GridPoint, in_process: bool = False, echo: bool = False,
            forwarder: Optional[_Forwarder] = None, threads: Optional[int] = None,
            devices: Optional[str] = None) -> int:
    """Run (or resume) one point, its output appended to its ``log.txt``; returns the exit status
    and writes ``outcome.json``. Never raises for a failing run; :class:`~..common.system.FolderBusy`
    when another process is running the point; :class:`UserError` when its configs were edited
    since the grid was written (:meth:`Grid.check_configs`). ``forwarder``: the signal forwarding
    of a study running several points at once (else the point's own); ``threads``: the run's
    ``OMP_NUM_THREADS`` where the environment sets none; ``devices``: its ``CUDA_VISIBLE_DEVICES``
    (:func:`worker_devices`)."""
    grid.check_configs(point)
    with folder_lock(grid.point_dir(point), f"grid point {point.name} at",
                     "the point is running there; wait until it ends"):
        return _run_one(grid, point, in_process, echo, forwarder, threads, devices)


def _run_one(grid: Grid, point: GridPoint, in_process: bool, echo: bool,
             forwarder: Optional[_Forwarder] = None, threads: Optional[int] = None,
             devices: Optional[str] = None) -> int:
    folder = grid.point_dir(point)
    argv = grid.point_argv(point)
    resumed = argv[argv.index("--ckpt_path") + 1] if "--ckpt_path" in argv else None
    command = [*rescale_command(), *argv]
    log_path = os.path.join(folder, LOG_FILE)
    start = time.time()
    with open(log_path, "a", buffering=1) as log:
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} "
                  f"{'resume from ' + resumed if resumed else 'start'} (point {point.name})\n"
                  f"$ {shlex.join(command)}\n")
        offset = log.tell()
        try:
            if in_process:
                code = _run_in_process(argv, log)
            else:
                code = _run_subprocess(command, log, cwd=grid.cwd if os.path.isdir(grid.cwd) else None, echo=echo,
                                       forwarder=forwarder, threads=threads, devices=devices)
        except StudyInterrupted as stop:
            stop.point = point.name
            log.write(f"=== stopped by a signal (exit status {stop.child}) after {time.time() - start:.1f} s\n")
            write_json(os.path.join(folder, OUTCOME_FILE), {
                "returncode": stop.child, "error": "stopped by a signal", "resumed_from": resumed,
                "seconds": time.time() - start, "ended": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": argv})
            raise
        log.write(f"=== exit status {code} after {time.time() - start:.1f} s\n")
    with open(log_path, errors="replace") as f:
        f.seek(offset)
        output = f.read()
    summary = grid.state(point)
    error = None
    if code != 0:
        error = _error_line(output.rsplit("=== exit status", 1)[0], code)
    elif summary.state != "done":
        code, error = 1, f"the run ended without a final {SUMMARY_FILE}"
    write_json(os.path.join(folder, OUTCOME_FILE), {
        "returncode": code, "error": error, "resumed_from": resumed, "seconds": time.time() - start,
        "ended": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": argv})
    return code


@contextlib.contextmanager
def _logging_to(stream: TextIO):
    """Lightning's and jsonargparse's log handlers (bound to the console when they were made)
    write to ``stream`` for a while."""
    handlers = [h for name in ("lightning.pytorch", "lightning.fabric", "lightning", "")
                for h in logging.getLogger(name).handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    previous = [h.setStream(stream) for h in handlers]
    try:
        yield
    finally:
        for handler, old in zip(handlers, previous):
            if old is not None:
                handler.setStream(old)


def _run_in_process(argv: list[str], log: TextIO) -> int:
    """The point's ``rescale fit`` in this process, ending as the command does (:func:`run_command`);
    :class:`StudyInterrupted` when a stop signal (SIGTERM, Ctrl-C ...) stopped it, which is the
    study's too, as for a point run as a subprocess."""
    stopped: list[int] = []

    def fit() -> None:
        try:
            _fit(argv)
        except SIGTERMException as err:  # the run saved its last.ckpt (LastCheckpoint)
            stopped.append(128 + stop_signal(err))
            raise

    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), _logging_to(log):
        try:
            code = int(run_command(fit) or 0)
            if stopped:
                raise StudyInterrupted("", stopped[0], code)
            return code
        except (KeyboardInterrupt, StudyInterrupted):
            raise
        except BaseException as err:  # noqa: BLE001 - a failing point is a result, not a crash
            if isinstance(err, SystemExit):
                return err.code if isinstance(err.code, int) else 1
            traceback.print_exc(file=log)
            log.write(f"error: {type(err).__name__}: {err}\n")  # the point's own log file
            return 1


def _fit(argv: list[str]) -> None:
    run_lightning(list(argv))


def _run_subprocess(command: list[str], log: TextIO, cwd: Optional[str], echo: bool,
                    forwarder: Optional[_Forwarder] = None, threads: Optional[int] = None,
                    devices: Optional[str] = None) -> int:
    """The run as a child in its own session, its output streamed to the log (and the console with
    ``echo``); SIGINT and SIGTERM reaching this process reach it as SIGTERM (it saves ``last.ckpt``)."""
    env = dict(os.environ)
    env.pop("WANDB_SERVICE", None)  # a W&B service of this process: the run starts its own
    env.setdefault("PYTHONUNBUFFERED", "1")
    if threads:
        env.setdefault("OMP_NUM_THREADS", str(threads))
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    own = forwarder is None
    forwarder = forwarder or _Forwarder()
    with forwarder.installed() if own else contextlib.nullcontext():
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                start_new_session=True)
        forwarder.add(proc)
        try:
            assert proc.stdout is not None
            for raw in iter(proc.stdout.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                log.write(line)
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
            code = proc.wait()
        finally:
            forwarder.remove(proc)
            proc.stdout.close()
    if forwarder.received:
        raise StudyInterrupted("", 128 + forwarder.received[0], code)
    return code


def run_order(grid: Grid) -> list[GridPoint]:
    """The points seed by seed: every point's first seed (in grid order), then every second seed
    ...; a grid without seeds in its points keeps its order."""
    seeds = list(dict.fromkeys(p.params.get("seed") for p in grid.points))
    rank = {seed: i for i, seed in enumerate(seeds)}
    return sorted(grid.points, key=lambda p: rank[p.params.get("seed")])  # stable: grid order within a seed


def _cores() -> int:
    """The cores this process may run on (a SLURM allocation's, not the machine's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def visible_gpus() -> list[str]:
    """The GPUs this process's children may use: the entries of ``CUDA_VISIBLE_DEVICES`` where
    it is set (up to the first that hides the rest, as ``-1`` does), else every GPU torch counts."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    gpus = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry or entry.startswith("-"):
            break
        gpus.append(entry)
    return gpus


def worker_devices(workers: int, gpus: list[str]) -> tuple[list[Optional[str]], Optional[str]]:
    """Each worker's ``CUDA_VISIBLE_DEVICES`` (None: left as it is) and a line saying how the
    GPUs were shared (None without GPUs or with one worker). Every worker gets as many GPUs as
    every other, so that each point trains on the same devices (a GPU count changes
    ``devices: auto``'s batch): ``len(gpus) // workers`` each, those left over unused; with fewer
    GPUs than workers, one each in turn, shared."""
    if workers < 2 or not gpus:
        return [None] * workers, None
    if len(gpus) >= workers:
        share = len(gpus) // workers
        chosen = [",".join(gpus[i * share:(i + 1) * share]) for i in range(workers)]
        unused = gpus[workers * share:]
        note = f"unused: {','.join(unused)} ({len(gpus)} GPUs do not split evenly over {workers} workers)" \
            if unused else f"{share} each"
    else:
        chosen = [gpus[i % len(gpus)] for i in range(workers)]
        note = f"{workers} workers share {len(gpus)} GPUs"
    return chosen, "GPUs (CUDA_VISIBLE_DEVICES) per worker: " + "; ".join(
        f"{i + 1}: {d}" for i, d in enumerate(chosen)) + f" ({note})"


def check_workers(workers: int, in_process: bool) -> None:
    """Refuse ``workers`` the local engine cannot run, in one line."""
    if workers < 1:
        raise UserError(f"--workers {workers}: give 1 or more")
    if workers > 1 and in_process:
        raise UserError(f"--workers {workers} runs each point as a subprocess: drop --in_process "
                        "(one process trains one point at a time)")


def run_grid(grid: Grid, in_process: bool = False, dry_run: bool = False, echo: bool = False,
             say: Callable[[str], None] = logger.info, workers: int = 1) -> dict[str, int]:
    """The local engine: every point not done (:func:`run_order`), ``workers`` at a time; returns
    counts per outcome (``skipped``, ``ran``, ``resumed``, ``failed``, ``busy``: run by another
    process meanwhile). Raises :class:`StudyInterrupted` when a signal stopped the running points
    (the study resumes when run again), after every running point saved its ``last.ckpt``.
    ``workers`` > 1 runs subprocesses only; each gets ``OMP_NUM_THREADS`` = its share of the
    cores where the environment sets none, and its share of the GPUs as ``CUDA_VISIBLE_DEVICES``
    (:func:`worker_devices`)."""
    check_workers(workers, in_process)
    counts = {"skipped": 0, "ran": 0, "resumed": 0, "failed": 0, "busy": 0}
    order = run_order(grid)
    n = len(order)
    forwarder = _Forwarder() if workers > 1 else None
    threads = max(1, _cores() // workers) if workers > 1 else None
    devices, shared = worker_devices(workers, visible_gpus() if workers > 1 and not dry_run else [])
    if shared:
        say(shared)
    lock = threading.Lock()

    def count(outcome: str) -> None:
        with lock:
            counts[outcome] += 1

    def finished(position: int, point: GridPoint, state) -> bool:
        """Whether the point is done already (then counted and said as skipped)."""
        if state.state == "done":
            count("skipped")
            say(f"[{position + 1}/{n}] {point.name}: done ({state.summary.get('status')}), skipped")
        return state.state == "done"

    def attempt(position: int, point: GridPoint, worker: int = 0) -> None:
        state = grid.state(point)  # read as the point is taken: another process may have run it meanwhile
        tag = f"[{position + 1}/{n}] {point.name}"
        if finished(position, point, state):
            return
        if dry_run:
            say(f"{tag}: {state.state}\n  {shlex.join([*rescale_command(), *grid.point_argv(point)])}")
            return
        resuming = state.state == "partial"
        gpus = f" on GPU {devices[worker]}" if devices[worker] is not None else ""
        say(f"{tag}: {'resuming from ' + str(state.checkpoint) if resuming else 'running'}{gpus} "
            f"(log: {os.path.join(grid.point_dir(point), LOG_FILE)})")
        start = time.time()
        try:
            code = run_one(grid, point, in_process=in_process, echo=echo, forwarder=forwarder, threads=threads,
                           devices=devices[worker])
        except FolderBusy as busy:  # a SLURM task or another study runs it: leave it to them
            count("busy")
            say(f"{tag}: running in another process ({busy.holder}), skipped")
            return
        after = grid.state(point)
        if code == 0 and after.state == "done":
            count("resumed" if resuming else "ran")
            status = after.summary.get("status")
            if status == "diverged":
                status += f" at step {after.summary.get('diverged_step')}"
            say(f"{tag}: {status} ({time.time() - start:.1f} s)")
        else:
            count("failed")
            error = (after.outcome or {}).get("error")
            say(f"{tag}: failed (exit status {code}): {error}")

    if forwarder is None or dry_run:
        for position, point in enumerate(order):
            attempt(position, point)  # StudyInterrupted: stop here
        return counts
    # the finished points said here, in order, not by the workers
    todo = [(position, point) for position, point in enumerate(order)
            if not finished(position, point, grid.state(point))]
    _in_parallel(todo, attempt, workers, forwarder)
    return counts


def _in_parallel(items: list, attempt: Callable, workers: int, forwarder: _Forwarder) -> None:
    """``attempt(*item, worker)`` for every item, ``workers`` threads (``worker``: 0, 1, ...)
    taking the next item as they are free; none taken after a signal or an error, which is raised
    once every thread has ended."""
    pending, lock, stops = iter(items), threading.Lock(), []

    def work(worker: int) -> None:
        while True:
            with lock:
                item = None if stops or forwarder.received else next(pending, None)
            if item is None:
                return
            try:
                attempt(*item, worker)
            except BaseException as err:  # noqa: BLE001 - raised in the main thread below
                with lock:
                    stops.append(err)
                return

    threads = [threading.Thread(target=work, args=(i,), name=f"study-worker-{i}", daemon=True)
               for i in range(workers)]
    with forwarder.installed():
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    interrupted = [e for e in stops if isinstance(e, StudyInterrupted)]
    if stops:
        raise (interrupted or stops)[0]
