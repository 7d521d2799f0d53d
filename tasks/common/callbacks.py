"""Callbacks every task uses: divergence detection and learned-scalar logging."""
from __future__ import annotations

import math

import lightning.pytorch as L
import torch

from rescale_core.analysis import learned_scalars

__all__ = ["DivergenceMonitor", "LearnedScalarsLogger", "TrainingDiverged"]


class TrainingDiverged(RuntimeError):
    """Raised (and reported on one line) when the loss or the gradients stop being finite."""


class DivergenceMonitor(L.Callback):
    """Stops the run at the first non-finite loss (or gradient norm), with one clear line naming
    the step, the scheme and the likely cause, and records ``diverged`` in the logger summary.

    ``raise_error=False`` (the demo and the depth/batch-size studies) stops the run gracefully
    instead of failing it, so a sweep carries on and the diverged run is reported as such.
    """

    def __init__(self, check_gradients: bool = True, raise_error: bool = True) -> None:
        self.check_gradients = check_gradients
        self.raise_error = raise_error
        self.diverged_at: int | None = None
        self.message: str | None = None

    def _stop(self, trainer: L.Trainer, pl_module: L.LightningModule, what: str) -> None:
        scheme = getattr(pl_module, "scheme_name", "?")
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else float("nan")
        self.diverged_at = trainer.global_step
        self.message = (f"training diverged at step {trainer.global_step} (epoch {trainer.current_epoch}): "
                        f"{what} is not finite; scheme={scheme}, lr={lr:.4g}. Likely cause: learning rate too "
                        f"high for this scheme/depth, or a scheme without normalisation at a depth it cannot train "
                        f"(see the scheme's init); lower --model.optimizer.init_args.lr or add warm-up.")
        for logger in trainer.loggers:
            experiment = getattr(logger, "experiment", None)
            summary = getattr(experiment, "summary", None)
            if summary is not None:
                summary["diverged"] = True
                summary["diverged_step"] = trainer.global_step
            logger.log_metrics({"diverged": 1.0}, step=trainer.global_step)
        trainer.should_stop = True
        if self.raise_error:
            raise TrainingDiverged(self.message)
        print(self.message)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None and not math.isfinite(float(loss.detach())):
            self._stop(trainer, pl_module, "the loss")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not self.check_gradients or self.diverged_at is not None:
            return
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        # one fused norm pass and a single host read per step, not one per parameter
        if grads and not torch.isfinite(torch.stack(torch._foreach_norm(grads)).sum()).item():
            self._stop(trainer, pl_module, "the gradient norm")

    def state_dict(self) -> dict:
        return {"diverged_at": self.diverged_at}

    def load_state_dict(self, state_dict: dict) -> None:
        self.diverged_at = state_dict.get("diverged_at")


class LearnedScalarsLogger(L.Callback):
    """Logs every residual block's learned branch multiplier (``scalars/<block>``) every
    ``every_n_steps`` steps: the RescaleNet rebuttal's per-block scalars, as they train."""

    def __init__(self, every_n_steps: int = 50) -> None:
        self.every_n_steps = every_n_steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (trainer.global_step - 1) % self.every_n_steps:  # the first step, then every n
            return
        net = getattr(pl_module, "net", pl_module)
        values = learned_scalars(net)
        if values:
            pl_module.log_dict({f"scalars/{k}": v for k, v in values.items()}, on_step=True, on_epoch=False)
