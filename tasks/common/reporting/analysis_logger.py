"""Plots of ``rescale analyze`` logged to W&B while a run trains.

    rescale fit --config RUN.yaml --trainer.callbacks+=rescale_tasks.common.reporting.AnalysisPlotsLogger \
        --trainer.callbacks.init_args.every_n_steps 500

Not enabled by default.
"""
from __future__ import annotations

import time

import lightning.pytorch as L
from lightning.pytorch.loggers import WandbLogger

from rescale_core.analysis import signal_propagation

from ..data import is_skipped
from ..errors import ConfigError
from ..training import network_inputs, optimizer_step_due, take_samples
from .probe_plots import gain_rows, scalars_figure, signal_figure, signal_rows

__all__ = ["AnalysisPlotsLogger"]


class AnalysisPlotsLogger(L.Callback):
    """Every ``every_n_steps`` optimizer steps (the first step, then every n), the signal
    propagation of the network on the first ``samples`` samples of the current training batch
    (:func:`rescale_core.analysis.signal_propagation`: per-block variances and ``eta_k``) and its
    learned branch multipliers, as the figures of ``rescale analyze signal`` and ``scalars``,
    logged as images (``analysis/signal_propagation``, ``analysis/learned_scalars``) to every W&B
    logger of the run, with the seconds the call took (``analysis/seconds``).

    Does nothing without a W&B logger. Leaves training exactly as it was: the probe restores
    every parameter, buffer (BN statistics, mean-shift measuring state: a probe during the
    measuring steps consumes none of them) and mode, and runs under a fork of the random streams
    (dropout in training mode draws nothing from the run's own). Every rank runs the probe (a
    mean-shift layer still measuring, or a SyncBatchNorm, averages over ranks), rank 0 plots.

    Args:
        every_n_steps: optimizer steps between two probes.
        samples: samples of the current batch the probe runs on.
        train: probe in training mode (BN batch statistics, as the training step), else eval mode.
    """

    def __init__(self, every_n_steps: int = 500, samples: int = 32, train: bool = True) -> None:
        if every_n_steps < 1 or samples < 1:
            raise ConfigError(f"AnalysisPlotsLogger every_n_steps ({every_n_steps}) and samples ({samples}) "
                              "must be at least 1")
        self.every_n_steps = every_n_steps
        self.samples = samples
        self.train = train
        self.seconds: list[float] = []  # time of every call (what the probe costs the run)
        self._started_at: int | None = None  # trainer.global_step at the current batch's start
        self._pending = False  # a probe due at a skipped batch waits for the next one

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._started_at = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        # the first step, then every n; once per step with gradient accumulation, and after a resume
        if not (optimizer_step_due(trainer, self.every_n_steps, self._started_at) or self._pending):
            return
        loggers = [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]
        if not loggers:
            return
        # a batch of bad files has no sample to probe (common.data.empty_batches): the next one is used;
        # the same on every rank (all ranks skip such a batch together)
        self._pending = is_skipped(outputs)
        if self._pending:
            return
        start = time.perf_counter()
        net = getattr(pl_module, "net", pl_module)
        inputs = take_samples(network_inputs(pl_module, batch), 0, self.samples)
        records = signal_propagation(net, inputs, train=self.train)  # on a fork of the random streams
        gains = gain_rows(net, run="net", step=step)
        if not trainer.is_global_zero:
            return
        import matplotlib.pyplot as plt

        figures = {}
        if records:
            figures["analysis/signal_propagation"] = signal_figure(
                signal_rows(records, f"step {step}"), title=f"signal propagation, step {step}")
        if gains:
            figures["analysis/learned_scalars"] = scalars_figure(gains, title=f"learned multipliers, step {step}")
        payload = {key: _image(fig) for key, fig in figures.items()}
        for fig in figures.values():
            plt.close(fig)
        self.seconds.append(time.perf_counter() - start)
        payload["analysis/seconds"] = self.seconds[-1]
        for logger in loggers:
            logger.log_metrics(payload, step=step - 1)  # Lightning logs optimizer step k's values at k - 1


def _image(fig):
    """A ``wandb.Image`` of a figure drawn once to pixels: ``wandb.Image(fig)`` would encode a PNG,
    decode it and encode it again (measured: ~80 instead of ~135 ms a figure on a CPU)."""
    import numpy as np
    import wandb

    fig.canvas.draw()
    return wandb.Image(np.asarray(fig.canvas.buffer_rgba())[..., :3].copy())
