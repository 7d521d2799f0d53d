"""Test probe for compiled multi-process runs (imported by the `rescale` subprocesses through
PYTHONPATH): every rank writes whether its network was compiled, what ``torch.compile`` captured
in that process, and the weights it ends with."""
from __future__ import annotations

import os

import lightning.pytorch as L
import torch


class SaveCompileState(L.Callback):
    """Writes ``<folder>/rank<global rank>.pt`` after fit: the state dict, steps, world size, whether
    the network runs compiled, and Dynamo's count of captured graphs and its graph breaks by reason."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from torch._dynamo.utils import counters

        os.makedirs(self.folder, exist_ok=True)
        torch.save({"state_dict": {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()},
                    "world_size": trainer.world_size, "global_step": trainer.global_step,
                    "compiled": pl_module.net._compiled_call_impl is not None,
                    "graphs": counters["stats"]["unique_graphs"],
                    "graph_breaks": dict(counters["graph_break"])},  # reason -> count
                   os.path.join(self.folder, f"rank{trainer.global_rank}.pt"))
