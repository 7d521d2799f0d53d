"""Where a run's files go: its own folder (the resolved config, the run summary), the folder
``test`` and ``predict`` write their result files to (:func:`results_folder`), and the files they
wrote there (:func:`note_result_file`), which the command's closing line names."""
from __future__ import annotations

import os
from typing import NamedTuple, Optional

import lightning.pytorch as L
from lightning.pytorch.cli import SaveConfigCallback

from ..data import FINGERPRINT_KEY, data_fingerprint
from ..checkpoints import CONFIG_FILE, RUN_CONFIG_KEY, is_remote
from ..reporting import started
from ..system import CODE_KEY, code_version

__all__ = ["SaveConfigToRun", "run_directory", "results_folder", "checkpoint_results_folder", "ResultsFolder",
           "ResultFile", "note_result_file", "result_files"]


def run_directory(logger, start: bool = True) -> str | None:
    """The directory that belongs to this run alone: the W&B run's ``files`` folder (synced with
    the run), or a CSV/TensorBoard logger's versioned ``log_dir``. ``start=False``: None rather
    than starting a W&B run that has not started (a command that failed its checks)."""
    if not start and not started(logger):
        return None
    experiment = getattr(logger, "experiment", None)
    directory = getattr(experiment, "dir", None) if hasattr(experiment, "summary") else None
    if not isinstance(directory, str):  # fast_dev_run's DummyLogger answers every name with a no-op
        directory = getattr(logger, "log_dir", None)
    return directory if isinstance(directory, str) else None


class ResultFile(NamedTuple):
    """A result file a command wrote: where, and what it holds (``count`` ``unit``: 270 predictions)."""

    path: str
    count: Optional[int]
    unit: str


class ResultsFolder(L.Callback):
    """Holds ``--output_dir`` of ``rescale test|predict`` for :func:`results_folder`, and the
    result files the command wrote there (:func:`note_result_file`)."""

    def __init__(self, output_dir: Optional[str] = None) -> None:
        self.output_dir = output_dir
        self.written: list[ResultFile] = []

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.written = []

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.written = []


def _results_callback(trainer: L.Trainer) -> Optional[ResultsFolder]:
    return next((c for c in trainer.callbacks if isinstance(c, ResultsFolder)), None)


def note_result_file(trainer: L.Trainer, path: str, count: Optional[int], unit: str) -> None:
    """Record that this command wrote ``path`` (``count`` ``unit``, e.g. 270 predictions; None: no
    count), for its closing line (:func:`~.report.evaluation_report`). A Trainer without the
    CLI's :class:`ResultsFolder` keeps no record."""
    callback = _results_callback(trainer)
    if callback is not None:
        callback.written.append(ResultFile(path, count, unit))


def result_files(trainer: L.Trainer) -> list[ResultFile]:
    """The result files this command wrote, in order (:func:`note_result_file`)."""
    callback = _results_callback(trainer)
    return list(callback.written) if callback is not None else []


def results_folder(trainer: L.Trainer) -> str:
    """The one place ``test`` and ``predict`` write their result files (predictions, hypotheses,
    BLEU, COCO results, drawings), the same whichever logger the command has:

    - ``--output_dir`` when given;
    - with ``--ckpt_path``: ``results/<checkpoint name>/`` in the folder of the run that wrote the
      checkpoint (the folder holding its ``checkpoints/``; for a checkpoint elsewhere, e.g. an
      averaged one, its own folder): ``runs/<project>/<run id>/results/last/`` for
      ``runs/<project>/<run id>/checkpoints/last.ckpt``, never the folder of the new W&B run the
      command opens, so the results of every checkpoint of a run sit together beside it;
    - otherwise (no checkpoint, or a remote one) this run's own folder (:func:`run_directory`).
    """
    callback = _results_callback(trainer)
    if callback is not None and callback.output_dir:
        return os.path.abspath(os.path.expanduser(callback.output_dir))
    checkpoint = trainer.ckpt_path
    if checkpoint and os.path.isfile(str(checkpoint)):
        return checkpoint_results_folder(str(checkpoint))
    folder = run_directory(trainer.logger) if trainer.logger is not None else None
    return folder or trainer.default_root_dir


def checkpoint_results_folder(checkpoint: str) -> str:
    """``results/<checkpoint name>/`` in the folder of the run that wrote the local file
    ``checkpoint`` (the folder holding its ``checkpoints/``, else the checkpoint's own folder)."""
    folder = os.path.dirname(os.path.abspath(checkpoint))
    if os.path.basename(folder) == "checkpoints":
        folder = os.path.dirname(folder)
    return os.path.join(folder, "results", os.path.splitext(os.path.basename(checkpoint))[0])


class SaveConfigToRun(SaveConfigCallback):
    """Writes the resolved ``config.yaml`` into each run's own directory (never a shared folder,
    so runs cannot collide) and pushes the whole config, not only the module's hyper-parameters,
    to every logger (the W&B run config), with ``code``: the suite's version, commit and dirty flag
    (:func:`~..system.provenance.code_version`), and ``data_fingerprint``: which data it reads
(:meth:`~..data.TaskDataModule.data_fingerprint`).

    Saved when the run starts (fit, validate, test or predict), not at ``setup`` as Lightning's
    callback does: by then the data, the module and the checkpoint have passed their checks, so a
    command that fails them creates no W&B run."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["save_to_log_dir"] = False
        # W&B keeps its own run config in files/config.yaml: use a name of our own
        kwargs.setdefault("config_filename", CONFIG_FILE)
        super().__init__(*args, **kwargs)
        self.saved_to: Optional[str] = None  # where the config was written, recorded in every checkpoint

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
        """Written without jsonargparse checking the config again (``skip_validation``): it was
        checked when it was parsed, and a second check of a whole run config costs about as much."""
        # with the code that runs it (run_summary.json's and every checkpoint's `code`): a W&B run's
        # config is what its runs are filtered by
        # and the data it reads (`data_fingerprint`, run_summary.json's `data`; `data` is its config)
        config = {**self.config.as_dict(), CODE_KEY: code_version(),
                  FINGERPRINT_KEY: data_fingerprint(trainer.datamodule)}
        for logger in trainer.loggers:
            logger.log_hyperparams(config)
            directory = run_directory(logger)
            if directory:
                os.makedirs(directory, exist_ok=True)
                self._save(os.path.join(directory, self.config_filename))
        if not trainer.loggers and trainer.default_root_dir:
            os.makedirs(trainer.default_root_dir, exist_ok=True)
            self._save(os.path.join(trainer.default_root_dir, self.config_filename))

    def _save(self, path: str) -> None:
        self.parser.save(self.config, path, skip_none=False, overwrite=True, multifile=False, skip_validation=True)
        if self.saved_to is None:  # the first logger's
            self.saved_to = path if is_remote(path) else os.path.abspath(path)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        """Record where the config was saved (``run_config``): ``saved_config`` finds it from the
        checkpoint wherever the checkpoint was written (``--last_checkpoint.dirpath``)."""
        if self.saved_to is not None:
            checkpoint[RUN_CONFIG_KEY] = self.saved_to
