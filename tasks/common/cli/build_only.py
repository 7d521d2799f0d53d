"""A task's module and data module built from run configs as ``rescale fit`` builds them, but not
trained: for the commands that look at a model (``rescale analyze``, ``rescale export``)."""
from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Iterator, Sequence

from .lightning_commands import RescaleCLI, run_lightning

__all__ = ["BUILD_ONLY", "build_run"]

#: Overrides that make building a model from a cluster config work on any machine: the Trainer is
#: built by the CLI but never runs here (no logger, one process, full precision).
BUILD_ONLY = ["--trainer.logger", "false", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
              "--trainer.num_nodes", "1", "--trainer.strategy", "auto", "--trainer.precision", "32-true"]


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Building prints Lightning's start-up lines (seed, accelerators, tips): not the command's output."""
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric", "lightning")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def build_run(argv: Sequence[str]) -> RescaleCLI:
    """``rescale fit <argv>`` parsed and its module, data module and Trainer built (seeded as
    ``rescale fit`` seeds, ``_defaults.yaml`` files applied), with :data:`BUILD_ONLY` last; nothing
    runs. ``argv``: ``--config`` files and overrides."""
    with _quiet_lightning(), warnings.catch_warnings():
        # run from a suite command, whose own sys.argv LightningCLI would warn about
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        return run_lightning(["fit", *argv, *BUILD_ONLY], run=False)
