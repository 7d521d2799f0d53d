"""Training throughput in each task's own unit: images/s (classification, detection), clips/s
(video), target tokens/s (translation).

A task module names its unit in ``throughput_unit`` and counts a batch with
``throughput_items(batch)``; a module without them counts samples (the first dimension of the
batch's first tensor). :class:`~..run.summary.RunSummary` logs the rate over the last
``log_every_n_steps`` steps as ``throughput/<unit>_per_s`` while training, and the whole run's,
once training ends, as ``throughput/run_<unit>_per_s`` (W&B, the run summary); the line
progress of a non-interactive run prints the former (:mod:`..reporting.progress`).
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["unit_of", "items_in", "metric_key", "run_metric_key", "batch_size"]


def batch_size(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = batch_size(item)
            if n:
                return n
    return 0


def unit_of(pl_module: Any) -> str:
    """``images``, ``clips``, ``target tokens`` ... (``samples`` for a module that names none)."""
    return str(getattr(pl_module, "throughput_unit", None) or "samples")


def items_in(pl_module: Any, batch: Any) -> int:
    """What ``batch`` holds in the module's unit, on this process."""
    count = getattr(pl_module, "throughput_items", None)
    return int(count(batch)) if callable(count) else batch_size(batch)


def metric_key(pl_module: Any) -> str:
    """``throughput/images_per_s``, ``throughput/target_tokens_per_s`` ..."""
    return f"throughput/{unit_of(pl_module).replace(' ', '_')}_per_s"


def run_metric_key(pl_module: Any) -> str:
    """``throughput/run_images_per_s`` ...: the whole run's rate, logged once when training ends
    under its own key, so the per-window curve of :func:`metric_key` has one value per step."""
    return f"throughput/run_{unit_of(pl_module).replace(' ', '_')}_per_s"
