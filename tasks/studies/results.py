"""What each point of a study ended with, one row per point: its coordinates, its status
(trained, diverged at step s, failed to learn, failed, running, interrupted, not run) and its final and best
values, read from the points' ``run_summary.json`` files.
"""
from __future__ import annotations

import logging
import math
import os
from typing import Any, Optional

from ..common.checkpoints import CheckpointError, peek_checkpoint
from ..common.errors import UserError
from ..common.run import higher_is_better
from .compare import last_k_column, last_k_mean, pick_metric
from .grid import Grid, GridPoint
from .seeded import steps_to_fraction

__all__ = ["point_rows", "as_float"]

log = logging.getLogger(__name__)


def as_float(value: Any) -> Optional[float]:
    """A logged value as a float (inf and nan kept: the callers tell them apart), else None."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value


def _train_loss(summary: dict) -> Optional[float]:
    final = summary.get("final") or {}
    for key in ("train/loss_epoch", "train/loss", "train/loss_step"):
        if key in final:
            return as_float(final[key])
    curve = (summary.get("curves") or {}).get("train/loss") or []
    return as_float(curve[-1][1]) if curve else None


def _num_classes(grid: Grid, point: GridPoint, summary: dict) -> Optional[int]:
    """The run's class count: from its summary if recorded there, else its checkpoint's
    hyper-parameters (metadata only; the tensors are memory-mapped, not read)."""
    if summary.get("num_classes"):
        return int(summary["num_classes"])
    checkpoint = grid.last_checkpoint(point) or summary.get("checkpoint")
    if not checkpoint or not os.path.isfile(checkpoint):
        return None
    try:
        value = peek_checkpoint(checkpoint).hyper_parameters.get("num_classes")
    except (CheckpointError, OSError, ValueError):
        return None
    return int(value) if value else None


def point_rows(grid: Grid, metric: Optional[str] = None, margin: float = 0.05,
               last_k: Optional[int] = None) -> tuple[list[dict], str]:
    """One row per grid point: its params, status and final/best values; and the metric used.

    ``throughput``: the run's training samples (or target tokens: ``throughput_unit``) per second.
    status: ``trained``; ``diverged at step s``; ``failed to learn`` (finished, but an accuracy
    metric not above chance (1/classes, k/classes for top-k ``acc<k>``) + ``margin``, or, where the chance level is unknown, the
    mean training loss of the last fifth of its logged curve not below that of the first fifth); ``failed`` (the run stopped with an error,
    ``error`` says which); ``running`` (a process holds the point's folder now, a SLURM task or a
    study in another shell; ``error``: which); ``interrupted`` (a ``last.ckpt`` to resume from;
    ``error``: why its last attempt ended, where it said, and the checkpoint); ``not run``.
    Validation values of a diverged run are left empty (a non-finite model was validated).
    ``last_k``: also ``last<k> <metric>``, the mean of the run's last ``last_k`` epoch-end
    validations (:func:`~.compare.last_k_mean`; a finished run with fewer is named in one warning line).
    """
    states = [(point, grid.state(point)) for point in grid.points]
    if metric:
        _check_metric(metric, [s.summary for _, s in states if s.state == "done"])
    metric = pick_metric([s.summary for _, s in states if s.summary], metric, default="val/loss")
    higher = higher_is_better(metric)
    rows = []
    for point, state in states:
        s = state.summary or {}
        final, best = s.get("final") or {}, s.get("best") or {}
        row: dict[str, Any] = dict(point.params)
        row.update({"status": None, "diverged_step": None, "steps": s.get("steps"), "train_loss": None,
                    "val_loss": None, f"final {metric}": None, f"best {metric}": None, "steps_to_90": None,
                    "train_seconds": s.get("train_seconds"), "throughput": as_float(s.get("samples_per_second")),
                    "throughput_unit": s.get("throughput_unit"), "error": None, "point": point.name})
        if last_k:  # every row has the column (a point not run, or diverged: empty)
            row[f"{last_k_column(last_k)} {metric}"] = None
        if state.state == "done":
            diverged = s.get("status") == "diverged"
            row["train_loss"] = _train_loss(s)
            if diverged:
                row["status"] = f"diverged at step {s.get('diverged_step')}"
                row["diverged_step"] = s.get("diverged_step")
            else:
                row["val_loss"] = as_float(final.get("val/loss"))
                row[f"final {metric}"] = as_float(final.get(metric))
                row[f"best {metric}"] = as_float(best.get(metric))
                row["steps_to_90"] = steps_to_fraction((s.get("curves") or {}).get(metric) or [],
                                                       row[f"final {metric}"], 0.9, higher)
                row["status"] = "trained" if _learned(grid, point, s, metric, higher, margin) else "failed to learn"
            if last_k:
                value, why = last_k_mean(s, metric, last_k)
                row[f"{last_k_column(last_k)} {metric}"] = value
                if why:
                    log.warning(f"warning: point {point.name} {why}: left out of {last_k_column(last_k)} {metric}")
        elif (holder := grid.running(point)) is not None:
            row["status"] = "running"
            row["error"] = f"running: {holder}"
        elif state.state == "partial":
            row["status"] = "interrupted"
            # why its last attempt ended (a crash after its first checkpoint, a kill), where it said
            stopped = (state.outcome or {}).get("error") if (state.outcome or {}).get("returncode") else None
            row["error"] = f"{stopped + '; ' if stopped else ''}resumable from {state.checkpoint}"
        elif state.state == "failed":
            row["status"] = "failed"
            row["error"] = (state.outcome or {}).get("error") or s.get("error")
        else:
            row["status"] = "not run"
        rows.append(row)
    return rows, metric


def _check_metric(metric: str, summaries: list[dict]) -> None:
    """Refuse, in one line, a metric no finished point logged where they validated all the same (a
    misspelt ``--metric``: its tables would be empty, as if no run had reached a validation)."""
    logged = {k for s in summaries for use in ("final", "best") for k in (s.get(use) or {})}
    validated = sorted(k for k in logged if k.startswith("val/"))
    if metric not in logged and validated:
        raise UserError(f"--metric {metric}: no point of the study logged it; they logged "
                        f"{', '.join(validated)}")


def _learned(grid: Grid, point: GridPoint, summary: dict, metric: str, higher: bool, margin: float) -> bool:
    value = as_float((summary.get("final") or {}).get(metric))
    if value is not None and not math.isfinite(value):
        return False
    last = metric.rsplit("/", 1)[-1]
    if higher and last.startswith("acc") and value is not None:
        classes = _num_classes(grid, point, summary)
        if classes:
            # top-k accuracy (acc5): a guess is right k times in classes
            k = int(last[3:]) if last[3:].isdigit() else 1
            return value > min(k / classes, 1.0) + margin
    curve = [v for _, v in (summary.get("curves") or {}).get("train/loss", []) if v is not None]
    final = _train_loss(summary)
    if not curve or final is None:
        return value is not None
    if not math.isfinite(final):
        return False
    # the first and the last fifth of the logged losses, not one batch each: a batch's loss varies
    # with its content (token-budget batches: with its lengths) by more than a short run learns
    k = max(1, len(curve) // 5)
    return sum(curve[-k:]) / k < sum(curve[:k]) / k
