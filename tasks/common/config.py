"""Saving the full resolved config with every run (run directory and W&B run config)."""
from __future__ import annotations

import os

from lightning.pytorch.cli import SaveConfigCallback

__all__ = ["SaveConfigToRun", "run_directory"]


def run_directory(logger, start: bool = True) -> str | None:
    """The directory that belongs to this run alone: the W&B run's ``files`` folder (synced with
    the run), or a CSV/TensorBoard logger's versioned ``log_dir``. ``start=False``: None rather
    than starting a W&B run that has not started (a command that failed its checks)."""
    from .wandb_logger import started

    if not start and not started(logger):
        return None
    experiment = getattr(logger, "experiment", None)
    directory = getattr(experiment, "dir", None) if hasattr(experiment, "summary") else None
    if not isinstance(directory, str):  # fast_dev_run's DummyLogger answers every name with a no-op
        directory = getattr(logger, "log_dir", None)
    return directory if isinstance(directory, str) else None


class SaveConfigToRun(SaveConfigCallback):
    """Writes the resolved ``config.yaml`` into each run's own directory (never a shared folder,
    so runs cannot collide) and pushes the whole config, not only the module's hyper-parameters,
    to every logger (the W&B run config).

    Saved when the run starts (fit, validate, test or predict), not at ``setup`` as Lightning's
    callback does: by then the data, the module and the checkpoint have passed their checks, so a
    command that fails them creates no W&B run."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["save_to_log_dir"] = False
        # W&B keeps its own run config in files/config.yaml: use a name of our own
        kwargs.setdefault("config_filename", "rescale_config.yaml")
        super().__init__(*args, **kwargs)

    def setup(self, trainer, pl_module, stage: str) -> None:
        pass  # see the class docstring

    def _save_once(self, trainer, pl_module) -> None:
        super().setup(trainer, pl_module, str(trainer.state.fn))  # once; every rank calls it (a broadcast)

    def on_fit_start(self, trainer, pl_module) -> None:
        self._save_once(trainer, pl_module)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._save_once(trainer, pl_module)

    def on_test_start(self, trainer, pl_module) -> None:
        self._save_once(trainer, pl_module)

    def on_predict_start(self, trainer, pl_module) -> None:
        self._save_once(trainer, pl_module)

    def save_config(self, trainer, pl_module, stage: str) -> None:
        config = self.config.as_dict()
        for logger in trainer.loggers:
            logger.log_hyperparams(config)
            directory = run_directory(logger)
            if directory:
                os.makedirs(directory, exist_ok=True)
                self.parser.save(self.config, os.path.join(directory, self.config_filename),
                                 skip_none=False, overwrite=True, multifile=False)
        if not trainer.loggers and trainer.default_root_dir:
            os.makedirs(trainer.default_root_dir, exist_ok=True)
            self.parser.save(self.config, os.path.join(trainer.default_root_dir, self.config_filename),
                             skip_none=False, overwrite=True, multifile=False)
