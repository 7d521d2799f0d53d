"""The one line every ``rescale fit|validate|test|predict`` ends with: the run's folder, the
checkpoint or result files it wrote, and the command to run next, e.g.::

    fit finished at step 10: run folder runs/wandb/offline-run-20260101_120000-k3x9a0qz/files;
    checkpoint runs/rescale-digits/k3x9a0qz/checkpoints/last.ckpt; next: rescale test --config
    experiments/digits/rescale56.yaml --ckpt_path runs/rescale-digits/k3x9a0qz/checkpoints/last.ckpt

(one line on the terminal), and for ``test`` and ``predict`` the result files they wrote, e.g.::

    predict finished: run folder runs/wandb/offline-run-20260101_120500-p2m7c1xa/files; 270
    predictions in runs/rescale-digits/k3x9a0qz/results/last/predictions.test.csv; next: ...

The run folder is the one holding ``rescale_config.yaml`` and ``run_summary.json``
(:func:`~.outputs.run_directory`).
"""
from __future__ import annotations

import shlex
from typing import Optional

import lightning.pytorch as L

from ..checkpoints import LastCheckpoint, checkpoint_exists, peek_checkpoint
from ..training import DivergenceMonitor
from .folder import run_folder, shown_path
from .outputs import ResultFile, result_files, run_directory
from .summary import find_summaries

__all__ = ["fit_report", "evaluation_report", "next_command", "written_files"]


def next_command(command: str, argv: list[str], ckpt_path: str) -> str:
    """``rescale <command>`` with this command's arguments (its configs, data and model
    arguments: a network changed on the command line must be built again to load the weights)
    and ``--ckpt_path <ckpt_path>`` in place of its own."""
    kept: list[str] = []
    args = argv[1:] if argv and not argv[0].startswith("-") else argv  # the subcommand
    i = 0
    while i < len(args):
        if args[i] == "--ckpt_path":
            i += 2
            continue
        if not args[i].startswith("--ckpt_path="):
            kept.append(args[i])
        i += 1
    return shlex.join(["rescale", command, *kept, "--ckpt_path", shown_path(ckpt_path)])


def _run_dir(trainer: L.Trainer) -> Optional[str]:
    for logger in trainer.loggers:
        directory = run_directory(logger, start=False)
        if directory:
            return directory
    return run_folder(trainer) or trainer.default_root_dir


def fit_report(trainer: L.Trainer, argv: list[str]) -> str:
    """How a ``fit`` that returned ended: finished (or stopped by its divergence monitor), where
    its files are, and the ``rescale test`` of its ``last.ckpt``."""
    monitor = next((c for c in trainer.callbacks if isinstance(c, DivergenceMonitor)), None)
    diverged = getattr(monitor, "diverged_at", None)
    last = next((c for c in trainer.callbacks if isinstance(c, LastCheckpoint)), None)
    checkpoint = (last.saved_path or last.path(trainer)) if last is not None else None
    if checkpoint is not None and not checkpoint_exists(checkpoint):
        checkpoint = None
    how = "finished" if diverged is None else f"stopped (diverged at step {diverged})"
    step = trainer.global_step
    if not step and checkpoint is not None:  # trained in processes it started (ddp_spawn): their checkpoint's
        step = peek_checkpoint(checkpoint).global_step
    line = f"fit {how} at step {step}: run folder {shown_path(_run_dir(trainer))}"
    if checkpoint is None:
        return line + "; no checkpoint written"
    if diverged is not None:
        return line + f"; last good checkpoint {shown_path(checkpoint)}"
    return line + f"; checkpoint {shown_path(checkpoint)}; next: {next_command('test', argv, checkpoint)}"


def written_files(files: list[ResultFile]) -> str:
    """``270 predictions in <path>, BLEU score in <path>``: what each file holds and where it is."""
    return ", ".join(f"{'' if f.count is None else f'{f.count:,} '}{f.unit} in {shown_path(f.path)}"
                     for f in files)


def evaluation_report(command: str, trainer: L.Trainer, argv: list[str], ckpt_path: Optional[str]) -> str:
    """How ``validate``, ``test`` or ``predict`` ended: the run folder (the metrics are in its
    W&B run), the result files the task wrote, and what to run next."""
    run_dir = _run_dir(trainer)
    line = f"{command} finished: run folder {shown_path(run_dir)}"
    files = result_files(trainer)
    if files:
        line += f"; {written_files(files)}"
    if command == "validate" and ckpt_path:
        return line + f"; next: {next_command('test', argv, ckpt_path)}"
    save_dir = trainer.loggers[0].save_dir if trainer.loggers else None
    if save_dir and find_summaries(save_dir):  # the trained runs there, this one's beside its baselines
        return (line + f"; next: rescale compare {shlex.quote(shown_path(save_dir))} (the trained runs there, "
                "by what their fits validated)")
    return line
