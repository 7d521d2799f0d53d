"""A run's own folder, settled before ``rescale fit`` starts its work.

``<save_dir>/<logger name>/<version>``, for the suite's W&B logger ``runs/<project>/<run id>/``,
holds the run's ``checkpoints/`` and ``results/``:

- :func:`claim_run_folder`: one process trains a run id at a time; a second ``rescale fit``
  with the same id (two jobs given one ``--trainer.logger.init_args.id``, or a resume of a run
  that is still training) is refused in one line naming the first, before it writes a
  checkpoint or opens a second W&B run of that id (:mod:`..system.lock`; the system lets go of the lock
  however its holder ends, so a killed run never blocks its own resume). A run without a logger
  locks its checkpoint folder instead.
- :func:`resume_point`: what ``--ckpt_path last`` resumes. It means "this run's ``last.ckpt``",
  which exists only for a run id that stays the same from one start to the next (the
  requeue-safe command). Without one every start is a new run with a new folder, and "the
  newest run under the project" may be another config's or another person's: the command is
  refused with the newest candidate's path to pass instead, never resumed from a guess.
  A start without ``--ckpt_path`` whose folder already holds a ``last.ckpt`` (the same id or CSV
  version given again) is refused: it would write over that run's checkpoint; so is one whose
  ``run_summary.json`` (no logger, a CSV version) would replace the summary of an earlier run that
  trained and left no ``last.ckpt`` (it diverged or crashed before its first save). On SLURM, a
  command left without a checkpoint while ``trainer.default_root_dir`` holds an
  ``hpc_ckpt_<N>.ckpt`` (what Lightning's SLURM requeue saves on SIGUSR1) is refused too:
  Lightning would resume from that file (evaluate its weights), whichever run wrote it.
- :func:`keep_csv_history`: a resumed run's ``metrics.csv`` keeps the rows logged up to its
  checkpoint (Lightning's CSV logger deletes the file when it opens a folder that holds one).
- :func:`check_run_outputs`: every local folder the run will write, checked first.
"""
from __future__ import annotations

import contextlib
import csv
import glob
import logging
import os
import time
import warnings
from typing import Iterator, Optional

import lightning.pytorch as L
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.logger import DummyLogger
from lightning.pytorch.utilities import rank_zero_only

from ..checkpoints import (LAST_NAME, checkpoint_exists, checkpoint_folder, is_remote, logger_folder, peek_checkpoint,
                           require_restorable, safe_load)
from ..errors import UserError
from ..system import LOCK_FILE, folder_lock, require_writable
from .summary import RunSummary, read_summary

__all__ = ["run_folder", "claim_run_folder", "resume_point", "refuse_starting_over", "evaluation_checkpoint",
           "keep_csv_history",
           "check_run_outputs", "shown_path"]

log = logging.getLogger(__name__)


def shown_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it (shorter to read and to
    paste), else as it is."""
    if is_remote(path):
        return path
    relative = os.path.relpath(os.path.abspath(path))
    return path if relative.startswith("..") else relative


def run_folder(trainer: L.Trainer) -> Optional[str]:
    """The run's local folder (:func:`~..checkpoints.callbacks.logger_folder`); None for a run without a
    logger or whose logger writes to a remote store."""
    folder = logger_folder(trainer)
    return None if folder is None or is_remote(folder) else folder


@contextlib.contextmanager
def claim_run_folder(trainer: L.Trainer) -> Iterator[Optional[str]]:
    """Hold the run folder's lock for the ``with`` block (rank 0 holds it for every process of
    the run); :class:`~..system.lock.FolderBusy` when another process trains the same run. A run
    without a logger has no run id: its checkpoint folder (``<default_root_dir>/checkpoints``)
    is what two runs must not share, and is locked instead."""
    folder = run_folder(trainer)
    if rank_zero_only.rank != 0:
        yield folder
        return
    if folder is not None:
        with folder_lock(folder, "run folder", "one process at a time trains a run id: wait until that one ends, "
                                               "or give this run another id (--trainer.logger.init_args.id)",
                         "give trainer.logger.init_args.save_dir a folder you can write"):
            yield folder
        return
    checkpoints = checkpoint_folder(trainer)
    if trainer.loggers or is_remote(checkpoints):
        yield folder
        return
    fresh = not os.path.isdir(checkpoints) or set(os.listdir(checkpoints)) <= {LOCK_FILE}
    with folder_lock(checkpoints, "checkpoint folder", "one process at a time trains into a checkpoint folder: "
                                                       "wait until that one ends, or give this run another "
                                                       "--trainer.default_root_dir (or a logger with a run id of "
                                                       "its own)",
                     "give trainer.default_root_dir a folder you can write"), warnings.catch_warnings():
        if fresh:  # it holds the lock alone: no other run's checkpoints for Lightning to warn about
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty",
                                    category=UserWarning)
        yield folder


def _last_of(trainer: L.Trainer) -> str:
    """This run's ``last.ckpt`` (whether or not it exists)."""
    return os.path.join(checkpoint_folder(trainer), LAST_NAME)


def _version(trainer: L.Trainer) -> Optional[str]:
    """This run's id (its first logger's version); None without a logger."""
    return str(trainer.loggers[0].version) if trainer.loggers else None


def resume_point(trainer: L.Trainer, ckpt_path: Optional[str], id_given: bool) -> Optional[str]:
    """The ``ckpt_path`` to hand Lightning for ``fit --ckpt_path <ckpt_path>`` (see the module
    docstring): ``last`` with a ``last.ckpt`` to resume, None (with a line saying so) for a run of
    a fixed id that has none yet, a :class:`UserError` for a new run id or ``best``; anything else
    unchanged."""
    point = _resume_point(trainer, ckpt_path, id_given)
    if point is None:
        _refuse_requeue_checkpoint(trainer, "fit")
    return point


def _resume_point(trainer: L.Trainer, ckpt_path: Optional[str], id_given: bool) -> Optional[str]:
    _refuse_best("fit", ckpt_path)
    _require_file(ckpt_path)
    if ckpt_path != "last":
        _require_restorable(ckpt_path, "fit")
        return ckpt_path
    folder, version = checkpoint_folder(trainer), _version(trainer)
    _refuse_dangling(_last_of(trainer))
    if checkpoint_exists(_last_of(trainer)):
        return ckpt_path
    if id_given or not version:
        if rank_zero_only.rank == 0:
            log.info(f"--ckpt_path last: no {LAST_NAME} in {shown_path(folder)} yet; starting this run afresh "
                     "(the same command resumes it)")
        return None
    what = (f"--ckpt_path last resumes the {LAST_NAME} of this run's id, and this run has a new id ({version}), "
            "so there is nothing to resume")
    earlier = _earlier_run(folder, version)
    if earlier is None:
        beside = shown_path(_other_runs(folder, version)[0])
        raise UserError(f"{what}, and no earlier run beside it ({beside}) has a {LAST_NAME}; drop --ckpt_path last "
                        "to start a new run, or give it an id that the same command resumes later "
                        "(--trainer.logger.init_args.id ID --ckpt_path last)")
    raise UserError(f"{what}; {earlier[1]}: resume it with --ckpt_path {earlier[0]}, or give runs an id that the same "
                    "command resumes (--trainer.logger.init_args.id ID --ckpt_path last)")


def evaluation_checkpoint(trainer: L.Trainer, command: str, ckpt_path: Optional[str], id_given: bool) -> Optional[str]:
    """The checkpoint ``validate|test|predict --ckpt_path <ckpt_path>`` evaluates: for ``last`` this
    run's ``last.ckpt`` (its file), refused in one line when the run has none (Lightning would
    evaluate the untrained network) with the newest earlier run's to pass instead; ``best``
    refused (Lightning's is the best checkpoint of a fit in the same process); anything else
    unchanged."""
    _refuse_best(command, ckpt_path)
    _require_file(ckpt_path)
    if ckpt_path is None:
        _refuse_requeue_checkpoint(trainer, command)
    if ckpt_path is None and rank_zero_only.rank == 0:
        log.warning(f"warning: rescale {command} without --ckpt_path evaluates the network as the config builds it "
                    "(untrained, unless the config loads weights); pass the checkpoint to evaluate with --ckpt_path")
    if ckpt_path != "last":
        _require_restorable(ckpt_path, command)
        return ckpt_path
    folder, path, version = checkpoint_folder(trainer), _last_of(trainer), _version(trainer)
    _refuse_dangling(path)
    if checkpoint_exists(path):
        return path
    what = f"--ckpt_path last: no {LAST_NAME} in {shown_path(folder)}, so there is no network to {command}"
    if id_given or not version:
        raise UserError(f"{what}; pass a checkpoint file with --ckpt_path")
    earlier = _earlier_run(folder, version)
    if earlier is None:
        raise UserError(f"{what} (this run has a new id, {version}, and no earlier run beside it has one); pass a "
                        "checkpoint file with --ckpt_path")
    raise UserError(f"{what} (this run has a new id, {version}); {earlier[1]}: pass it with --ckpt_path {earlier[0]}, "
                    "or give the id of the run to evaluate (--trainer.logger.init_args.id ID)")


def _refuse_requeue_checkpoint(trainer: L.Trainer, command: str) -> None:
    """On SLURM, Lightning gives a command that has no checkpoint the newest ``hpc_ckpt_<N>.ckpt`` of
    ``trainer.default_root_dir`` (the working folder unless set): what its SLURM requeue handler saves
    there on SIGUSR1, for whichever run got the signal. A new run (a fresh id, another seed, another
    config that fits the file) would silently continue another run's weights, an evaluation
    report them: refused in one line naming the file."""
    if not SLURMEnvironment.detect():
        return
    root = str(trainer.default_root_dir)
    fs = get_filesystem(root)
    numbers = {}
    for path in fs.glob(root.rstrip("/") + "/hpc_ckpt_*.ckpt"):
        number = os.path.basename(path)[len("hpc_ckpt_"):-len(".ckpt")]
        if number.isdigit():
            numbers[int(number)] = path
    if not numbers:
        return
    newest = shown_path(os.path.join(root, os.path.basename(numbers[max(numbers)])))
    done = "resume this run from it" if command == "fit" else f"{command} its weights"
    where = "the working folder" if os.path.abspath(root) == os.getcwd() else shown_path(root)
    raise UserError(f"{newest} is a checkpoint Lightning's SLURM requeue saved (on SIGUSR1), and on SLURM Lightning would "
                    f"{done} in place of starting from none, whichever run wrote it: pass it with --ckpt_path {newest} "
                    f"if it is this run's, or move it out of {where} (trainer.default_root_dir)")


def _refuse_best(command: str, ckpt_path: Optional[str]) -> None:
    """``best`` is Lightning's name for the best checkpoint of a fit in the same process, which no
    ``rescale`` command has before it starts."""
    if ckpt_path == "best":
        raise UserError(f"--ckpt_path best is the best checkpoint of a fit in the same process, which rescale "
                        f"{command} has not run: pass the file (the one a ModelCheckpoint monitoring a metric wrote "
                        "in the run's checkpoints folder)")


def _require_file(ckpt_path: Optional[str]) -> None:
    """A local ``ckpt_path`` that is no file (missing, a folder) is one line here, before Lightning
    says it restores from it (names such as ``last`` and remote URLs are resolved elsewhere)."""
    if (ckpt_path and ckpt_path not in ("last", "best", "hpc") and not ckpt_path.startswith("registry")
            and not is_remote(ckpt_path) and not os.path.isfile(ckpt_path)):
        safe_load(ckpt_path)  # raises the CheckpointError saying what the path is


def _refuse_dangling(last: str) -> None:
    """A ``last.ckpt`` that is a symbolic link to a missing file (checkpoints kept on a file system
    not mounted on this node, or cleaned up) is this run's checkpoint out of reach, not "no
    checkpoint yet": one line, never a start from scratch that writes over the link."""
    if not is_remote(last) and os.path.islink(last) and not os.path.exists(last):
        raise UserError(f"{shown_path(last)} is a symbolic link to {os.readlink(last)}, which does not exist (a file "
                        "system not mounted here, or cleaned up): make it reachable and run the same command again, "
                        "pass another checkpoint with --ckpt_path, or remove the link to start this run afresh")


def _require_restorable(ckpt_path: Optional[str], command: str) -> None:
    """A checkpoint file (not a name Lightning resolves) without what ``command`` restores: one line."""
    if ckpt_path and ckpt_path not in ("last", "best", "hpc") and not ckpt_path.startswith("registry"):
        require_restorable(ckpt_path, command)


def _earlier_run(folder: str, version: str) -> Optional[tuple[str, str]]:
    """The newest ``last.ckpt`` of the runs beside this one (:func:`_other_runs`), shown, and a
    sentence naming it (``the newest of 3 earlier runs beside it is <path> (written <time>)``)."""
    _, earlier = _other_runs(folder, version)
    if not earlier:
        return None
    newest = shown_path(earlier[0])
    written = time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(earlier[0])))
    which = "the only earlier run" if len(earlier) == 1 else f"the newest of {len(earlier)} earlier runs"
    return newest, f"{which} beside it is {newest} (written {written})"


def refuse_starting_over(trainer: L.Trainer, ckpt_path: Optional[str]) -> None:
    """A :class:`UserError` for a ``fit`` without ``ckpt_path`` (after :func:`resume_point`) whose
    checkpoint folder holds a ``last.ckpt``: it would train from scratch over that run's checkpoint
    (without one, whose run summary would replace an earlier run's: :func:`_refuse_earlier_summary`).
    Checked holding the run's lock, so that a run still training is named as such first."""
    last = _last_of(trainer)
    if ckpt_path is None:
        _refuse_dangling(last)
    if ckpt_path is not None:
        return
    if not checkpoint_exists(last):
        _refuse_earlier_summary(trainer)
        return
    try:
        step = f" at step {peek_checkpoint(last).global_step}"
    except Exception:  # an unreadable file is still a run's: refused all the same
        step = ""
    raise UserError(f"{shown_path(last)} holds this run's checkpoint{step}, and a start without --ckpt_path would "
                    "write over it: resume it with --ckpt_path last, or start a new run in another folder (another "
                    "--trainer.logger.init_args.id, a CSV or TensorBoard logger's version, or without a logger another "
                    "--trainer.default_root_dir), or move that folder away")


def _refuse_earlier_summary(trainer: L.Trainer) -> None:
    """A :class:`UserError` for a new run whose ``run_summary.json`` would replace an earlier run's
    that trained (a diverged or crashed run leaves no ``last.ckpt`` to refuse on, only its summary
    and config): runs without a logger in one ``default_root_dir``, or of one CSV version. A given
    ``--run_summary.path`` is the caller's to reuse (a study runs a failed point again there)."""
    callback = next((c for c in trainer.callbacks if isinstance(c, RunSummary)), None)
    path = callback.default_path(trainer) if callback is not None else None
    if path is None or is_remote(path) or not os.path.isfile(path):
        return
    try:
        earlier = read_summary(path)
    except (OSError, ValueError):  # unreadable: still another run's file
        earlier = {}
    if earlier.get("steps") == 0:  # stopped before its first step: nothing of it to lose
        return
    what = f"{earlier.get('status')} at step {earlier.get('steps')}" if earlier else "unreadable"
    raise UserError(f"{shown_path(path)} holds an earlier run's summary ({what}), and this new run would write over it "
                    "and its rescale_config.yaml: start it in another folder (another --trainer.default_root_dir, a CSV "
                    "logger's version, or the suite's W&B logger, which gives every run a folder of its own), or move "
                    "that run's files away")


def _resumed_step(trainer: L.Trainer, ckpt_path: Optional[str]) -> Optional[int]:
    """The step ``fit`` resumes at (None: a new run)."""
    if ckpt_path is None:
        return None
    path = _last_of(trainer) if ckpt_path == "last" else ckpt_path
    return peek_checkpoint(path).global_step if checkpoint_exists(path) else None


def keep_csv_history(trainer: L.Trainer, ckpt_path: Optional[str]) -> None:
    """Open the run's CSV loggers before the run writes into their folders, so that a new run is not
    warned about the run's lock there; a resumed run keeps its ``metrics.csv`` rows up to the step
    it resumes at (rows of later steps, logged after that checkpoint, are logged again), where
    Lightning's CSV logger would delete the file and lose the run's history before the resume."""
    loggers = [logger for logger in trainer.loggers if isinstance(logger, CSVLogger)]
    if not loggers or rank_zero_only.rank != 0:
        return
    step = _resumed_step(trainer, ckpt_path)
    for logger in loggers:
        path = os.path.join(logger.log_dir, "metrics.csv")
        header, rows = [], []
        if step is not None and os.path.isfile(path):
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                header = list(reader.fieldnames or [])
                rows = [row for row in reader if row.get("step", "").isdigit() and int(row["step"]) <= step]
        found = set(os.listdir(logger.log_dir)) if os.path.isdir(logger.log_dir) else set()
        ours = step is not None or found <= {LOCK_FILE}
        with warnings.catch_warnings():
            if ours:  # the folder holds this run's files (kept) or the run's lock alone
                warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
            writer = logger.experiment
        if header:
            with open(writer.metrics_file_path, "w", newline="") as f:
                out = csv.DictWriter(f, fieldnames=header)
                out.writeheader()
                out.writerows(rows)
            writer.metrics_keys = header


def _other_runs(folder: str, version: str) -> tuple[str, list[str]]:
    """The folder holding the runs laid out as this one (``runs/<project>``) and the ``last.ckpt``
    of each, newest first: ``folder`` with its run id as a wildcard."""
    parts = folder.rstrip("/").split("/")
    if version not in parts:
        return os.path.dirname(folder), []
    index = len(parts) - 1 - parts[::-1].index(version)
    where = "/".join(parts[:index])
    if is_remote(folder):
        return where, []
    pattern = os.path.join(glob.escape(where), "*", *map(glob.escape, parts[index + 1:]), LAST_NAME)
    return where, sorted(glob.glob(pattern), key=os.path.getmtime, reverse=True)


def check_run_outputs(trainer: L.Trainer, summary_path: Optional[str] = None) -> None:
    """Every local folder ``fit`` will write, refused in one line before any data work when it
    cannot be written: the loggers' folders, the checkpoint folder, ``run_summary.path``'s."""
    targets = [(logger.save_dir, "the logger folder", "give trainer.logger.init_args.save_dir a folder you can write")
               for logger in trainer.loggers if not isinstance(logger, DummyLogger) and logger.save_dir]
    targets.append((checkpoint_folder(trainer), "the checkpoint folder",
                    "give last_checkpoint.dirpath (or the logger's save_dir) a folder you can write"))
    if summary_path:
        targets.append((os.path.dirname(os.path.abspath(summary_path)), "the run summary folder",
                        "give run_summary.path a folder you can write"))
    for folder, what, fix in targets:
        if not is_remote(folder):
            require_writable(folder, what, fix)
