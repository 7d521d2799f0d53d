"""Test probe for multi-process runs (imported by the `rescale` subprocesses through PYTHONPATH):
every rank writes what it ends with, so a test can compare ranks and runs."""
from __future__ import annotations

import os

import lightning.pytorch as L
import torch


class SaveRankState(L.Callback):
    """Writes ``<folder>/rank<global rank>.pt``: state dict, callback metrics, world size, steps and
    the cluster environment Lightning detected, after fit (on every rank, not only rank 0)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        os.makedirs(self.folder, exist_ok=True)
        environment = type(getattr(trainer.strategy, "cluster_environment", None)).__name__
        torch.save({"state_dict": {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()},
                    "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
                    "world_size": trainer.world_size, "global_step": trainer.global_step,
                    "environment": environment, "strategy": type(trainer.strategy).__name__},
                   os.path.join(self.folder, f"rank{trainer.global_rank}.pt"))
