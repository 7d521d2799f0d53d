"""A study's grid of ordinary ``rescale fit`` runs, and the engines that run it.

A study is a list of grid points; each point is one ``rescale fit`` with the study's base config,
the study's overrides and the point's own (its scheme, depth, batch size, learning rate or seed).
:class:`Grid` writes ``<study_dir>/grid.json`` (the points, configs and overrides), so every
engine and the aggregation read the same grid, wherever they run. Each point has a folder
``<study_dir>/points/<name>/`` holding everything of its run:

- ``run_summary.json`` (``--run_summary.path``): what the run ended with, read by the tables;
- ``checkpoints/[<run id>/]last.ckpt`` (``--last_checkpoint.dirpath``): the resume point;
- the logger's files (``--trainer.logger.init_args.save_dir``: ``wandb/offline-run-*``);
- ``log.txt``: the run's output, appended by every attempt, and ``outcome.json``: the exit
  status and error line of the last attempt.

A point is *done* when its summary says ``finished`` or ``diverged`` (a divergence is a result,
never a failure: runs get ``--divergence.raise_error false``), *partial* when it has a
``last.ckpt`` but no final summary (it resumes with ``--ckpt_path``), *failed* when its last
attempt exited with an error and left nothing to resume (it is tried again), else *todo*.

Engines (no scheduler of our own):

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
import glob
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, TextIO

from ..common.errors import UserError
from ..common.run_summary import SUMMARY_FILE, read_summary
from ..common.lock import FolderBusy, folder_lock

__all__ = ["GridPoint", "Grid", "PointState", "GRID_FILE", "rescale_command", "run_grid", "run_one",
           "write_slurm", "write_sweep", "StudyInterrupted"]

GRID_FILE = "grid.json"
POINTS_DIR = "points"
LOG_FILE = "log.txt"
OUTCOME_FILE = "outcome.json"
DONE = ("finished", "diverged")
_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.+=")


@dataclass
class GridPoint:
    """One run of a study: ``rescale fit --config <configs> <grid overrides> <overrides>``.

    ``params`` are the point's coordinates in the study (``{"depth": 100, "scheme": "rescale"}``),
    read back by the tables; ``group`` is its W&B group (points compared with each other share one).
    """

    name: str
    configs: list[str]
    overrides: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    group: Optional[str] = None

    def __post_init__(self) -> None:
        if not self.name or not set(self.name) <= _NAME_OK or self.name.startswith("."):
            raise UserError(f"grid point name {self.name!r}: use letters, digits and - _ . + = only")


@dataclass
class PointState:
    """Where a point stands: ``done``, ``partial``, ``failed`` or ``todo``."""

    state: str
    summary: Optional[dict] = None
    checkpoint: Optional[str] = None
    outcome: Optional[dict] = None


class StudyInterrupted(Exception):
    """The running point was stopped by a signal (it saved its ``last.ckpt``)."""

    def __init__(self, point: str, returncode: int) -> None:
        super().__init__(point)
        self.point, self.returncode = point, returncode


def rescale_command() -> list[str]:
    """The installed ``rescale`` command: the script beside this Python, else ``python -m``."""
    script = os.path.join(os.path.dirname(sys.executable), "rescale")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-m", "rescale_tasks.cli"]


class Grid:
    """The points of one study and their folders under ``study_dir``.

    Args:
        study_dir: the study's folder (``grid.json``, ``points/<name>/``, tables and plots).
        points: the grid points, in the order of their index (the SLURM array task id).
        kind: the study (``depth``, ``batch-lr``, ``seeds``): how ``aggregate`` reads it.
        settings: the study's own settings (depths, schemes, metric ...), kept for ``aggregate``.
        overrides: ``rescale fit`` arguments every point gets (before its own).
        seed: ``--seed_everything`` of every point (a point's overrides may set its own).
        cwd: the folder runs start in (relative paths in configs and overrides are read there).
    """

    def __init__(self, study_dir: str, points: list[GridPoint], kind: str = "grid",
                 settings: Optional[dict] = None, overrides: Optional[list[str]] = None,
                 seed: int = 0, cwd: Optional[str] = None) -> None:
        names = [p.name for p in points]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate:
            raise UserError(f"grid point {duplicate!r} appears twice; each point needs its own name")
        self.study_dir = os.path.abspath(study_dir)
        self.points = list(points)
        self.kind = kind
        self.settings = dict(settings or {})
        self.overrides = list(overrides or [])
        self.seed = int(seed)
        self.cwd = os.path.abspath(cwd or os.getcwd())

    # --- grid.json ------------------------------------------------------------------------------
    @property
    def path(self) -> str:
        return os.path.join(self.study_dir, GRID_FILE)

    def to_dict(self) -> dict:
        return {"version": 1, "kind": self.kind, "cwd": self.cwd, "seed": self.seed,
                "overrides": self.overrides, "settings": self.settings,
                "points": [asdict(p) for p in self.points]}

    @classmethod
    def load(cls, study_dir: str) -> "Grid":
        path = os.path.join(study_dir, GRID_FILE)
        if not os.path.isfile(path):
            raise UserError(f"{study_dir} is not a study folder (no {GRID_FILE}); create it with "
                            "rescale study depth|batch-lr|seeds --out <folder>")
        with open(path) as f:
            data = json.load(f)
        points = [GridPoint(**p) for p in data["points"]]
        return cls(study_dir, points, data.get("kind", "grid"), data.get("settings"),
                   data.get("overrides"), data.get("seed", 0), data.get("cwd"))

    def _signature(self, point: GridPoint) -> list:
        return [point.configs, self.seed, self.overrides, point.overrides]

    def save(self) -> str:
        """Write ``grid.json``; refuse when the folder holds a point of the same name that ran with
        other settings (its results would be mixed up with this grid's)."""
        if os.path.isfile(self.path):
            old = Grid.load(self.study_dir)
            by_name = {p.name: p for p in old.points}
            for point in self.points:
                before = by_name.get(point.name)
                if before is not None and old._signature(before) != self._signature(point) \
                        and os.path.isdir(self.point_dir(point)):
                    raise UserError(
                        f"{self.study_dir} already holds point {point.name} run with other settings "
                        f"(configs, seed or overrides differ); give the study another --out folder, or "
                        f"delete {self.point_dir(point)} to run it again")
        os.makedirs(self.study_dir, exist_ok=True)
        _write_json(self.path, self.to_dict())
        return self.path

    # --- one point --------------------------------------------------------------------------------
    def point(self, key: "int | str") -> GridPoint:
        """A point by index (the SLURM array task id, the sweep's ``point``) or by name."""
        if isinstance(key, str) and not key.lstrip("-").isdigit():
            found = next((p for p in self.points if p.name == key), None)
            if found is None:
                raise UserError(f"no grid point named {key!r} in {self.study_dir}")
            return found
        index = int(key)
        if not 0 <= index < len(self.points):
            raise UserError(f"grid point {index} out of range: {self.study_dir} has points 0 to {len(self.points) - 1}")
        return self.points[index]

    def point_dir(self, point: GridPoint) -> str:
        return os.path.join(self.study_dir, POINTS_DIR, point.name)

    def state(self, point: GridPoint) -> PointState:
        folder = self.point_dir(point)
        summary = None
        summary_path = os.path.join(folder, SUMMARY_FILE)
        if os.path.isfile(summary_path):
            try:
                summary = read_summary(summary_path)
            except (OSError, ValueError):
                summary = None  # unreadable: run it again
        outcome = _read_json(os.path.join(folder, OUTCOME_FILE))
        if summary is not None and summary.get("status") in DONE:
            return PointState("done", summary, None, outcome)
        checkpoint = self.last_checkpoint(point)
        if checkpoint:
            return PointState("partial", summary, checkpoint, outcome)
        if (outcome and outcome.get("returncode")) or summary is not None:
            return PointState("failed", summary, None, outcome)
        return PointState("todo", summary, None, outcome)

    def status(self, point: GridPoint) -> str:
        """``done``, ``partial``, ``failed`` or ``todo``."""
        return self.state(point).state

    def last_checkpoint(self, point: GridPoint) -> Optional[str]:
        """The newest ``last.ckpt`` of the point (under ``checkpoints/``, any run id)."""
        pattern = os.path.join(self.point_dir(point), "checkpoints", "**", "last.ckpt")
        found = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
        return max(found, key=os.path.getmtime) if found else None

    def logger_class(self, point: GridPoint) -> Optional[str]:
        """The logger's class path after configs and overrides (None: no logger), read from the
        YAML files without building anything."""
        return configured_logger(point.configs, [*self.overrides, *point.overrides])

    def point_argv(self, point: GridPoint, resume: bool = True) -> list[str]:
        """The exact ``rescale fit`` arguments of the point (with ``--ckpt_path`` when it has a
        ``last.ckpt`` to resume from and ``resume``)."""
        folder = self.point_dir(point)
        argv = ["fit"]
        for config in point.configs:
            argv += ["--config", config]
        argv += ["--seed_everything", str(self.seed), "--divergence.raise_error", "false", *self.overrides,
                 "--trainer.default_root_dir", folder,
                 "--run_summary.path", os.path.join(folder, SUMMARY_FILE),
                 "--last_checkpoint.dirpath", os.path.join(folder, "checkpoints")]
        logger = self.logger_class(point)
        if logger:  # Lightning's loggers all take save_dir and name; group is W&B's
            argv += ["--trainer.logger.init_args.save_dir", folder, "--trainer.logger.init_args.name", point.name]
            if point.group and "wandb" in logger.lower():
                argv += ["--trainer.logger.init_args.group", point.group]
        argv += point.overrides
        state = self.state(point) if resume else None
        if state is not None and state.state == "partial":
            argv += ["--ckpt_path", state.checkpoint]
        return argv


def _config_layers(configs: list[str]):
    """The YAML mappings the CLI applies in order: the ``_defaults.yaml`` files, then the configs;
    a missing or broken file is skipped (the run itself reports it)."""
    import yaml

    from ..cli import defaults_for

    for path in [*defaults_for(configs), *configs]:
        try:
            with open(path) as f:
                data = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict):
            yield data


def _last_override(overrides: list[str], keys: tuple[str, ...]) -> Optional[str]:
    """The value the last of ``--key value`` / ``--key=value`` gives one of ``keys`` (None: none does;
    a key at the end without a value gives '')."""
    found = None
    for i, arg in enumerate(overrides):
        key, sep, value = arg.partition("=")
        if key in keys:
            found = value if sep else (overrides[i + 1] if i + 1 < len(overrides) else "")
    return found


def configured_logger(configs: list[str], overrides: list[str]) -> Optional[str]:
    """``trainer.logger``'s class path as the CLI would resolve it: the suite's W&B logger unless a
    ``_defaults.yaml``, a config or an override sets another or none (``false``/``null``)."""
    import yaml

    from ..cli import trainer_defaults

    logger: Any = trainer_defaults()["logger"]
    for data in _config_layers(configs):
        trainer = data.get("trainer")
        if isinstance(trainer, dict) and "logger" in trainer:
            value = trainer["logger"]
            if isinstance(value, dict) and isinstance(logger, dict) and "class_path" not in value:
                value = {**logger, **value}  # init_args only: the class stays
            logger = value
    value = _last_override(overrides, ("--trainer.logger", "--trainer.logger.class_path"))
    if value is not None:
        logger = yaml.safe_load(value) if value else None
    if isinstance(logger, dict):
        logger = logger.get("class_path")
    if isinstance(logger, list):  # several loggers: leave their folders alone
        return None
    if logger is True:
        return "lightning.pytorch.loggers.TensorBoardLogger"
    return logger if isinstance(logger, str) and logger.lower() not in ("false", "null", "none", "") else None


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


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
    and writes ``outcome.json``. Never raises for a failing run; :class:`~..common.lock.FolderBusy`
    when another process is running the point."""
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
            _write_json(os.path.join(folder, OUTCOME_FILE), {
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
    _write_json(os.path.join(folder, OUTCOME_FILE), {
        "returncode": code, "error": error, "resumed_from": resumed, "seconds": time.time() - start,
        "ended": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": argv})
    return code


@contextlib.contextmanager
def _logging_to(stream: TextIO):
    """Lightning's and jsonargparse's log handlers (bound to the console when they were made)
    write to ``stream`` for a while."""
    import logging

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
    from ..cli import main as cli_main

    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), _logging_to(log):
        try:
            return int(cli_main(list(argv)) or 0)
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # noqa: BLE001 - a failing point is a result, not a crash
            if isinstance(err, SystemExit):
                return err.code if isinstance(err.code, int) else 1
            traceback.print_exc(file=log)
            print(f"error: {type(err).__name__}: {err}", file=log)
            return 1


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
             say: Callable[[str], None] = print) -> dict[str, int]:
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
    with open(path, "w") as f:
        f.write("\n".join(lines))
    os.chmod(path, 0o755)
    return path


def write_sweep(grid: Grid, project: Optional[str] = None) -> str:
    """``<study_dir>/sweep.yaml``: a W&B grid sweep over the point index. ``wandb agent`` runs
    ``rescale study run-point <study_dir> --point=<i>`` (``${args}`` expands to ``--point=<i>``),
    and the run joins the sweep through the agent's ``WANDB_RUN_ID``."""
    import yaml

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
    with open(path, "w") as f:
        f.write(f"# wandb sweep {shlex.quote(path)}; then wandb agent <entity>/<project>/<sweep id>\n")
        yaml.safe_dump(sweep, f, sort_keys=False)
    return path


def wandb_project(grid: Grid) -> Optional[str]:
    """The W&B project the points log to (from their configs), for the sweep."""
    if not grid.points:
        return None
    point = grid.points[0]
    project = None
    for data in _config_layers(point.configs):
        init = (data.get("trainer") or {}).get("logger") or {}
        init = init.get("init_args") if isinstance(init, dict) else None
        if isinstance(init, dict) and init.get("project"):
            project = init["project"]
    overridden = _last_override([*grid.overrides, *point.overrides], ("--trainer.logger.init_args.project",))
    return overridden or project or "rescale"
