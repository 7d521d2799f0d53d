"""The engines that run a study's grid (:mod:`.grid`); no scheduler of our own.

- local (:func:`run_grid`): the todo, failed and partial points one after another, each as a
  subprocess of the installed ``rescale`` (``in_process=True``: in this process, for tests);
  finished points are never repeated, so running the study again resumes where it stopped.
  SIGINT (Ctrl-C) and SIGTERM are passed to the running point as SIGTERM: it saves its
  ``last.ckpt`` and the study stops, to be resumed by the same command.
- SLURM (:func:`write_slurm`): ``<study_dir>/slurm.sbatch``, a job array with one task per
  point running ``rescale study run-point <study_dir> $SLURM_ARRAY_TASK_ID`` (requeued on
  preemption, resuming from ``last.ckpt``).
- W&B sweep (:func:`write_sweep`): ``<study_dir>/sweep.yaml``, a grid sweep over the point
  index for ``wandb agent``, running the same ``run-point`` command.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Optional, TextIO

import yaml

from ..common.cli import run_command, run_lightning
from ..common.errors import UserError
from ..common.run import SUMMARY_FILE
from ..common.system import FolderBusy, atomic_open, folder_lock, write_atomically
from .grid import GRID_FILE, LOG_FILE, OUTCOME_FILE, Grid, GridPoint, rescale_command, write_json

__all__ = ["StudyInterrupted", "run_grid", "run_one", "write_slurm", "write_sweep"]

logger = logging.getLogger(__name__)


class StudyInterrupted(Exception):
    """The running point was stopped by a signal (it saved its ``last.ckpt``)."""

    def __init__(self, point: str, returncode: int) -> None:
        super().__init__(point)
        self.point, self.returncode = point, returncode


def _error_line(text: str) -> Optional[str]:
    """The run's one-line error (``error: ...``), else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line[len("error: "):] for line in lines if line.startswith("error: ")]
    if errors:
        return errors[-1]
    return lines[-1][-500:] if lines else None


# --- running points ---------------------------------------------------------------------------------
def run_one(grid: Grid, point: GridPoint, in_process: bool = False, echo: bool = False) -> int:
    """Run (or resume) one point, its output appended to its ``log.txt``; returns the exit status
    and writes ``outcome.json``. Never raises for a failing run; :class:`~..common.system.FolderBusy`
    when another process is running the point; :class:`UserError` when its configs were edited
    since the grid was written (:meth:`Grid.check_configs`)."""
    grid.check_configs(point)
    with folder_lock(grid.point_dir(point), f"grid point {point.name} at",
                     "the point is running there; wait until it ends"):
        return _run_one(grid, point, in_process, echo)


def _run_one(grid: Grid, point: GridPoint, in_process: bool, echo: bool) -> int:
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
                code = _run_subprocess(command, log, cwd=grid.cwd if os.path.isdir(grid.cwd) else None, echo=echo)
        except StudyInterrupted as stop:
            stop.point = point.name
            log.write(f"=== stopped by a signal (exit status {stop.returncode}) after {time.time() - start:.1f} s\n")
            write_json(os.path.join(folder, OUTCOME_FILE), {
                "returncode": stop.returncode, "error": "stopped by a signal", "resumed_from": resumed,
                "seconds": time.time() - start, "ended": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": argv})
            raise
        log.write(f"=== exit status {code} after {time.time() - start:.1f} s\n")
    with open(log_path, errors="replace") as f:
        f.seek(offset)
        output = f.read()
    summary = grid.state(point)
    error = None
    if code != 0:
        error = _error_line(output.rsplit("=== exit status", 1)[0])
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
    """The point's ``rescale fit`` in this process, ending as the command does (:func:`run_command`)."""
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), _logging_to(log):
        try:
            return int(run_command(lambda: _fit(argv)) or 0)
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # noqa: BLE001 - a failing point is a result, not a crash
            if isinstance(err, SystemExit):
                return err.code if isinstance(err.code, int) else 1
            traceback.print_exc(file=log)
            log.write(f"error: {type(err).__name__}: {err}\n")  # the point's own log file
            return 1


def _fit(argv: list[str]) -> None:
    run_lightning(list(argv))


def _run_subprocess(command: list[str], log: TextIO, cwd: Optional[str], echo: bool) -> int:
    """The run as a child in its own session, its output streamed to the log (and the console with
    ``echo``); SIGINT and SIGTERM reaching this process reach it as SIGTERM (it saves ``last.ckpt``)."""
    env = dict(os.environ)
    env.pop("WANDB_SERVICE", None)  # a W&B service of this process: the run starts its own
    env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                            start_new_session=True)
    received: list[int] = []

    def forward(signum, frame) -> None:
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM if len(received) == 1 else signal.SIGKILL)

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread: no handlers
            previous[signum] = signal.signal(signum, forward)
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
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        raise StudyInterrupted("", code if code else 128 + received[0])
    return code


def run_grid(grid: Grid, in_process: bool = False, dry_run: bool = False, echo: bool = False,
             say: Callable[[str], None] = logger.info) -> dict[str, int]:
    """The local engine: every point not done, one after another; returns counts per outcome
    (``skipped``, ``ran``, ``resumed``, ``failed``, ``busy``: run by another process meanwhile). Raises :class:`StudyInterrupted` when a signal
    stopped the running point (the study resumes when run again)."""
    counts = {"skipped": 0, "ran": 0, "resumed": 0, "failed": 0, "busy": 0}
    n = len(grid.points)
    for i, point in enumerate(grid.points):
        state = grid.state(point)
        tag = f"[{i + 1}/{n}] {point.name}"
        if state.state == "done":
            counts["skipped"] += 1
            say(f"{tag}: done ({state.summary.get('status')}), skipped")
            continue
        if dry_run:
            say(f"{tag}: {state.state}\n  {shlex.join([*rescale_command(), *grid.point_argv(point)])}")
            continue
        resuming = state.state == "partial"
        say(f"{tag}: {'resuming from ' + str(state.checkpoint) if resuming else 'running'} "
            f"(log: {os.path.join(grid.point_dir(point), LOG_FILE)})")
        start = time.time()
        try:
            code = run_one(grid, point, in_process=in_process, echo=echo)  # StudyInterrupted: stop here
        except FolderBusy as busy:  # a SLURM task or another study runs it: leave it to them
            counts["busy"] += 1
            say(f"{tag}: running in another process ({busy.holder}), skipped")
            continue
        after = grid.state(point)
        if code == 0 and after.state == "done":
            counts["resumed" if resuming else "ran"] += 1
            status = after.summary.get("status")
            if status == "diverged":
                status += f" at step {after.summary.get('diverged_step')}"
            say(f"{tag}: {status} ({time.time() - start:.1f} s)")
        else:
            counts["failed"] += 1
            error = (after.outcome or {}).get("error")
            say(f"{tag}: failed (exit status {code}): {error}")
    return counts


# --- cluster engines ----------------------------------------------------------------------------------
def write_slurm(grid: Grid, partition: Optional[str] = None, gres: Optional[str] = "gpu:1",
                time_limit: str = "24:00:00", cpus_per_task: int = 8, max_parallel: Optional[int] = None,
                extra: tuple[str, ...] = (), job_name: Optional[str] = None) -> str:
    """``<study_dir>/slurm.sbatch``: one array task per grid point (task id = point index), each
    running or resuming its point; SIGTERM two minutes before the time limit, requeued on
    preemption (143). Submitting it again only runs the points not done."""
    n = len(grid.points)
    if n == 0:
        raise UserError("the grid has no points: nothing to submit")
    os.makedirs(os.path.join(grid.study_dir, "slurm"), exist_ok=True)
    array = f"0-{n - 1}" + (f"%{max_parallel}" if max_parallel else "")
    lines = ["#!/bin/bash",
             f"# rescale study {grid.kind}: {n} grid points, one array task each ({GRID_FILE} lists them).",
             "# A task runs its point, or resumes it from last.ckpt; a point already done exits at once,",
             "# so the script can be submitted again to finish a study. Results: rescale study aggregate "
             + shlex.quote(grid.study_dir),
             f"#SBATCH --job-name={job_name or 'rescale-' + grid.kind}",
             f"#SBATCH --array={array}"]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if gres:
        lines.append(f"#SBATCH --gres={gres}")
    lines += [f"#SBATCH --cpus-per-task={cpus_per_task}",
              f"#SBATCH --time={time_limit}",
              f"#SBATCH --output={os.path.join(grid.study_dir, 'slurm', '%A_%a.out')}",
              "#SBATCH --signal=TERM@120",
              "#SBATCH --requeue",
              "#SBATCH --open-mode=append"]
    lines += [f"#SBATCH {option}" for option in extra]
    lines += ["",
              f"cd {shlex.quote(grid.cwd)}",
              f"srun {shlex.join(rescale_command())} study run-point {shlex.quote(grid.study_dir)} "
              '"$SLURM_ARRAY_TASK_ID"',
              "status=$?",
              'if [ "$status" -eq 143 ]; then scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"; fi',
              'exit "$status"', ""]
    path = os.path.join(grid.study_dir, "slurm.sbatch")
    write_atomically(path, "\n".join(lines))
    os.chmod(path, 0o755)
    return path


def write_sweep(grid: Grid, project: Optional[str] = None) -> str:
    """``<study_dir>/sweep.yaml``: a W&B grid sweep over the point index. ``wandb agent`` runs
    ``rescale study run-point <study_dir> --point=<i>`` (``${args}`` expands to ``--point=<i>``),
    and the run joins the sweep through the agent's ``WANDB_RUN_ID``."""
    if not grid.points:
        raise UserError("the grid has no points: nothing to sweep")
    program, *rest = rescale_command()
    sweep: dict[str, Any] = {
        "name": f"rescale-study-{grid.kind}-{os.path.basename(grid.study_dir)}",
        "description": f"rescale study {grid.kind}: {len(grid.points)} grid points of {grid.path}",
        "program": program,
        "method": "grid",
        "parameters": {"point": {"values": list(range(len(grid.points)))}},
        "command": ["${env}", "${program}", *rest, "study", "run-point", grid.study_dir, "${args}"],
    }
    if project:
        sweep["project"] = project
    path = os.path.join(grid.study_dir, "sweep.yaml")
    with atomic_open(path) as f:
        f.write(f"# wandb sweep {shlex.quote(path)}; then wandb agent <entity>/<project>/<sweep id>\n")
        yaml.safe_dump(sweep, f, sort_keys=False)
    return path
