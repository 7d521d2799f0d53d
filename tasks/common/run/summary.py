"""``run_summary.json``: what a run ended with, in one small file next to its resolved config.

Every ``rescale fit`` writes it into the run's own directory (the W&B run's ``files`` folder,
beside ``rescale_config.yaml``; :func:`~.outputs.run_directory`), or where ``run_summary.path``
says (the studies put it in each grid point's folder). ``rescale compare`` and the study
aggregations read these files wherever the runs ran (this machine, a SLURM array, a sweep
agent), so they need neither W&B's servers nor its file format.

Contents: the run's identity (project, group, name, network, scheme, ``scheme_options``,
``scheme_fields`` (every field of the scheme the network was built with, after its options, but
its name and families: the definition it ran, which the scheme's name does not say once the code
defines the scheme otherwise; read back, a field added to ``Scheme`` since counts at its default;
absent from a summary written before it was kept), ``seed_everything`` (the
weights' and random streams' seed) and ``data_seed`` (the data order's, ``data.init_args.seed``;
both named as in the W&B config; a summary written before had ``seed``, read as
``seed_everything``), lr, the adaptive
gradient clipping threshold ``agc_clip`` (null: off) with its ``agc_eps`` and
``agc_clip_classifier``, ``precision``, batch size, ``accumulate_grad_batches``, global batch),
``status`` (``finished``, ``diverged``, ``interrupted``), the final value of every logged scalar,
the best validation values, curves (``[step, value]`` pairs: ``train/loss`` once per logged
optimizer step, with the ``train/loss_step`` the loggers received at it (with gradient
accumulation, the window's last batch's loss, undivided, as Lightning logs it; translation's is
the whole update's per target token), every validation
metric once per validation with the value the loggers received, also mid-epoch with
``val_check_interval`` and across resumes), ``val_epoch_ends`` (the steps of the validations that
ran at an epoch's last batch, once each: a run's per-epoch history, read by ``--last_k``), steps, epochs, training seconds and the
throughput: ``samples`` and ``samples_per_second`` counted in the task's unit, named by ``throughput_unit``
(images, clips, target tokens; :mod:`..data.throughput`). The loggers (W&B) receive the rate over the
last ``log_every_n_steps`` steps while training as ``throughput/<unit>_per_s``, and the whole run's
(the summary's value) when training ends as ``throughput/run_<unit>_per_s``. A step is the number of optimizer steps
done (``trainer.global_step``); Lightning's
loggers record the same points counting from 0 (W&B's ``trainer/global_step`` is one less).
``code``: the code that wrote it (``version``, and ``commit`` and ``dirty`` run from a git checkout;
:func:`~..system.provenance.code_version`), as every checkpoint of the run records it. ``data``: which data it read (:meth:`~..data.TaskDataModule.data_fingerprint`:
the data module, its root, and each split's sample count and short hash).
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any, Optional

import lightning.pytorch as L
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from rescale_core.registry import model_entry
from rescale_core.schemes import Scheme, definition, definition_changes, get_scheme

from ..checkpoints import LastCheckpoint, preempted_message
from ..data import DATA_KEY, data_fingerprint, is_skipped, items_in, metric_key, run_metric_key, unit_of
from ..errors import DataError, UserError
from ..reporting import current_run, started
from ..system import CODE_KEY, code_version, write_atomically
from ..training import DivergenceMonitor, inside_accumulation_window
from .outputs import run_directory

__all__ = ["RunSummary", "SUMMARY_FILE", "MalformedSummary", "read_summary", "find_summaries", "higher_is_better",
           "scheme_changes", "shown_changes"]

SUMMARY_FILE = "run_summary.json"
STEP_LOSS = "train/loss_step"  # the training loss every task logs at each step: the curve's values

log = logging.getLogger(__name__)


def higher_is_better(metric: str) -> bool:
    """Accuracy, mAP, BLEU: higher; losses, perplexities, error rates: lower."""
    last = metric.rsplit("/", 1)[-1]
    return not any(word in last for word in ("loss", "ppl", "perplexity", "err"))  # "err": error too


def _scalar(value: Any) -> Optional[float]:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return None
        value = value.detach().float().item()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _json_safe(value: Any) -> Any:
    """NaN and infinities as strings: strict JSON readers refuse the bare tokens."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _from_json(value: Any) -> Any:
    if value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


class RunSummary(L.Callback):
    """Writes :data:`SUMMARY_FILE` at the end of fitting (also when it diverged or was
    interrupted), on rank 0.

    Args:
        path: the file to write (None: ``run_summary.json`` in the run's directory).
    """

    def __init__(self, path: Optional[str] = None) -> None:
        self.path = path
        self._reset()

    def _reset(self) -> None:
        self.train_curve: list[list[float]] = []
        self.val_curve: dict[str, list[list[float]]] = {}
        self.epoch_ends: list[int] = []  # the steps of the validations that ran at an epoch's last batch
        self.samples = 0  # in the task's unit (images, clips, target tokens)
        self.rate: Optional[float] = None  # the whole run's, fixed when training ends
        self._window = (0.0, 0)  # (time, samples) at the last logged rate
        self.seconds_before = 0.0  # training time of the run before it was resumed
        self.seconds = 0.0
        self._start: Optional[float] = None
        self._written = False
        self._before: dict[str, Any] = {}  # trainer.logged_metrics as the current validation began
        self.final_before: dict[str, float] = {}  # the last value of every scalar the resumed-from run logged
        self._trainer: Optional[L.Trainer] = None
        self._resumed = False  # the state came from a checkpoint
        self._stepped = False  # this process has trained a batch
        self._window_trained = False  # a batch of the current accumulation window had samples

    # the curves and counters travel in the checkpoint: a resumed run's summary covers all of it
    def _elapsed(self) -> float:
        """Training seconds so far, the resumed-from run's included."""
        return self.seconds_before + (time.perf_counter() - self._start if self._start is not None else 0.0)

    def state_dict(self) -> dict:
        return {"train_curve": self.train_curve, "val_curve": self.val_curve, "epoch_ends": self.epoch_ends,
                "samples": self.samples,
                "seconds": self._elapsed(), "final": self._final()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.train_curve = [list(p) for p in state_dict.get("train_curve", [])]
        self.val_curve = {k: [list(p) for p in v] for k, v in state_dict.get("val_curve", {}).items()}
        self.epoch_ends = [int(step) for step in state_dict.get("epoch_ends", [])]
        self.samples = int(state_dict.get("samples", 0))
        self.seconds_before = float(state_dict.get("seconds", 0.0))
        self.final_before = {k: float(v) for k, v in state_dict.get("final", {}).items()}
        self._resumed = True

    def _final(self, trainer: Optional[L.Trainer] = None) -> dict[str, float]:
        """The last value of every scalar logged so far, the resumed-from run's included (a value
        logged only early on, such as the first step's learned scalars, is not logged again after
        a resume)."""
        trainer = trainer or self._trainer
        metrics = trainer.callback_metrics if trainer is not None else {}
        now = {k: v for k, v in ((k, _scalar(v)) for k, v in metrics.items()) if v is not None}
        return {**self.final_before, **now}

    # --- collecting ---------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()
        self._window = (self._start, self.samples)
        self.rate = None
        self._written = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._stepped = True
        if not is_skipped(outputs):  # a batch of bad files only: no samples, and its zero loss no point
            self.samples += items_in(pl_module, batch) * trainer.world_size
            self._window_trained = True
        if inside_accumulation_window(trainer):
            return  # the optimizer step comes at the accumulation window's last batch
        trained, self._window_trained = self._window_trained, False
        if not trained:
            return
        if trainer.global_step % max(trainer.log_every_n_steps, 1) == 0 or trainer.global_step == 1:
            value = _step_loss(trainer, outputs)  # one read per logged step, as Lightning's own logging does
            if value is not None:
                self.train_curve.append([trainer.global_step, value])
            now, (then, before) = time.perf_counter(), self._window
            if now > then and self.samples > before:
                pl_module.log(metric_key(pl_module), (self.samples - before) / (now - then), on_step=True,
                              on_epoch=False, prog_bar=True, rank_zero_only=True)
            self._window = (now, self.samples)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The whole run's throughput, to the loggers (the W&B summary holds it) and the summary."""
        seconds = self._elapsed()
        self.rate = self.samples / seconds if seconds > 0 and self.samples else None
        if self.rate is not None and trainer.global_rank == 0:
            for logger in trainer.loggers:
                logger.log_metrics({run_metric_key(pl_module): self.rate}, step=max(trainer.global_step - 1, 0))

    # A validation's metrics are read at its very end, once Lightning has handed them to the
    # loggers: at ``on_validation_epoch_end`` a callback runs before the module's own hook (where
    # the COCO, multi-view and BLEU evaluations log) and before the epoch's values are reduced, so
    # it saw the previous validation's values.
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._before = dict(trainer.logged_metrics)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        before = self._before
        # a validation at an epoch's last batch (not one mid-epoch, nor at a max_steps that cut the
        # epoch short); once per step: a resumed run validating its step again is the same one
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch and trainer.global_step not in self.epoch_ends:
            self.epoch_ends.append(trainer.global_step)
        for key, value in trainer.logged_metrics.items():
            # logged_metrics keeps every key ever logged: one this validation did not log still
            # holds its old value, the very same object
            if not key.startswith("val/") or before.get(key) is value:
                continue
            value = _scalar(value)
            if value is None:
                continue
            curve = self.val_curve.setdefault(key, [])
            point = [trainer.global_step, value]
            if curve and curve[-1][0] == trainer.global_step:  # a resumed run validating its step again
                curve[-1] = point
            else:
                curve.append(point)

    # --- writing ------------------------------------------------------------------------------
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.write(trainer, pl_module, "finished")

    @property
    def stepped(self) -> bool:
        """Whether this process has trained a batch (a fit refused before one has nothing to report)."""
        return self._stepped

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not self._stepped and isinstance(exception, UserError):
            # refused before its first step: a resumed run is where its last summary says, a new one
            # trained nothing (a summary would be a run for compare and the studies to count)
            return
        # a signal: which one, and where it saved (LastCheckpoint's on_exception ran first)
        error = preempted_message(exception) if isinstance(exception, SIGTERMException) \
            else f"{type(exception).__name__}: {exception}"
        self.write(trainer, pl_module, "interrupted", error=error)

    def _best(self, key: str) -> Optional[float]:
        values = [v for _, v in self.val_curve.get(key, []) if math.isfinite(v)]
        if not values:
            return None
        return max(values) if higher_is_better(key) else min(values)

    def summary(self, trainer: L.Trainer, pl_module: L.LightningModule, status: str,
                error: Optional[str] = None) -> dict:
        monitor = next((c for c in trainer.callbacks if isinstance(c, DivergenceMonitor)), None)
        diverged_at = getattr(monitor, "diverged_at", None)
        if diverged_at is not None:
            status = "diverged"
        self.seconds = self._elapsed()
        hparams = dict(getattr(pl_module, "hparams", {}) or {})
        data_hparams = dict(getattr(trainer.datamodule, "hparams", {}) or {}) if trainer.datamodule else {}
        batch = data_hparams.get("batch_size")
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        lr = None
        if optimizer is not None:
            group = optimizer.param_groups[0]
            lr = group.get("initial_lr", group.get("lr"))
        logger = trainer.logger
        experiment = current_run(logger)  # never starts a W&B run
        final = self._final(trainer)
        rate = self.rate if self.rate is not None else (self.samples / self.seconds if self.seconds > 0 else None)
        if rate is not None:
            final[run_metric_key(pl_module)] = rate  # the whole run's, as the loggers received it
        return {
            "name": _text(getattr(experiment, "name", None)) or _text(getattr(logger, "name", None)),
            "project": _text(getattr(experiment, "project", None))
            or _text(logger.name if isinstance(logger, WandbLogger) else None),
            "group": _text(getattr(experiment, "group", None)),
            "run_id": _text(getattr(experiment, "id", None)),
            "task": type(pl_module).__name__,
            "network": hparams.get("network"),
            "scheme": getattr(pl_module, "scheme_name", None) or hparams.get("scheme"),
            "scheme_options": hparams.get("scheme_options") or {},
            "scheme_fields": _scheme_fields(pl_module),
            "network_options": hparams.get("network_options") or {},
            "num_classes": hparams.get("num_classes"),
            "seed_everything": int(os.environ["PL_GLOBAL_SEED"]) if os.environ.get("PL_GLOBAL_SEED") else None,
            "data_seed": data_hparams.get("seed"),  # the data order's (data.init_args.seed)
            "lr": lr,
            "agc_clip": hparams.get("agc_clip"),
            "agc_eps": hparams.get("agc_eps") if hparams.get("agc_clip") is not None else None,
            "agc_clip_classifier": hparams.get("agc_clip_classifier") if hparams.get("agc_clip") is not None else None,
            "precision": str(trainer.precision),
            "batch_size": batch,
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "global_batch": batch * trainer.world_size * trainer.accumulate_grad_batches if batch else None,
            "world_size": trainer.world_size,
            "status": status,
            "error": error,
            "diverged_step": diverged_at,
            "steps": trainer.global_step,
            "epochs": _epochs(trainer, status),
            "train_seconds": self.seconds,
            "samples": self.samples,  # trained on, in the task's unit, every process together
            "samples_per_second": rate,
            "throughput_unit": unit_of(pl_module),
            "final": final,
            "best": {k: self._best(k) for k in self.val_curve},
            "curves": {"train/loss": self.train_curve, **self.val_curve},
            "val_epoch_ends": self.epoch_ends,
            "checkpoint": _last_checkpoint(trainer),
            CODE_KEY: code_version(),
            DATA_KEY: data_fingerprint(trainer.datamodule),  # which data it read (None: unknown)
        }

    def default_path(self, trainer: L.Trainer) -> Optional[str]:
        """The file this run writes when no ``path`` is given (None: a path is given, or there is
        no run folder yet): ``run_summary.json`` in the run's folder, which a run without a logger
        (``trainer.default_root_dir``) or with a fixed CSV version shares with every earlier run
        there."""
        return None if self.path else _default_path(trainer)

    def write(self, trainer: L.Trainer, pl_module: L.LightningModule, status: str,
              error: Optional[str] = None) -> Optional[str]:
        if self._written or trainer.global_rank != 0 or trainer.sanity_checking and status == "finished":
            return None
        path = self.path or _default_path(trainer)
        if path is None:
            return None
        text = json.dumps(_json_safe(self.summary(trainer, pl_module, status, error)), indent=1)
        try:
            write_atomically(path, text)  # a reader never sees half a file
        except OSError as err:  # a full disk: say so, and leave the command's own error line in place
            log.warning(f"warning: could not write the run summary {path}: {err.strerror or err}")
            return None
        self._written = True
        return path


def _scheme_fields(pl_module: L.LightningModule) -> Optional[dict]:
    """The fields of the scheme the run's network was built with, after its options
    (:func:`rescale_core.schemes.definition`); None for a network without one."""
    scheme = getattr(getattr(pl_module, "net", None), "scheme", None)
    return definition(scheme) if isinstance(scheme, Scheme) else None


def scheme_changes(summary: dict) -> dict[str, tuple[Any, Any]]:
    """What the definition a run recorded (``scheme_fields``) says otherwise than its scheme's name
    and ``scheme_options`` give in this code: field -> (recorded, now), as
    :func:`rescale_core.schemes.definition_changes`, of the fields its network reads (a registered
    Transformer's or a conv network's; every field for a network this code does not know). Empty for
    a summary without the record (written before it was kept) and for a scheme this code does not
    know or options it refuses."""
    recorded, name = summary.get("scheme_fields"), summary.get("scheme")
    if not isinstance(recorded, dict) or not isinstance(name, str):
        return {}
    try:
        now = get_scheme(name, **(summary.get("scheme_options") or {}))
    except (KeyError, TypeError, ValueError):
        return {}
    return definition_changes(recorded, now, _family(summary.get("network")))


def _family(network: Any) -> Optional[str]:
    """``transformer`` or ``conv``: the scheme fields a registered network reads
    (:data:`rescale_core.schemes.FIELD_READERS`); None for a network this code does not know."""
    try:
        return "transformer" if model_entry(str(network)).family == "transformer" else "conv"
    except KeyError:
        return None


def shown_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    """``layer_gain false (now true)``: the fields :func:`scheme_changes` found, as YAML writes them."""
    return ", ".join(f"{key} {json.dumps(old)} (now {json.dumps(new)})" for key, (old, new) in sorted(changes.items()))


def _epochs(trainer: L.Trainer, status: str) -> int:
    """The epochs the run trained in, as Lightning counts them once fitting ends (an epoch that
    ``max_steps`` cut short counts). A run resumed from a checkpoint saved at its ``max_steps``
    trains nothing: Lightning leaves ``current_epoch`` at the checkpoint's, one short of the epoch
    the checkpoint's steps were trained in (its ``max_epochs`` stop sets it right; ``max_steps``
    does not), so the epoch begun there counts."""
    epochs = trainer.current_epoch
    if status != "interrupted" and trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps:
        epochs = max(epochs, trainer.fit_loop.epoch_progress.current.started)
    return epochs


def _step_loss(trainer: L.Trainer, outputs: Any) -> Optional[float]:
    """An optimizer step's training loss as the loggers receive it: the task's :data:`STEP_LOSS`
    (Lightning logs the value of the accumulation window's last batch that logged it, averaged
    over the processes with ``sync_dist``), else the loss the step returned, undivided (Lightning
    hands the callbacks the loss divided by ``accumulate_grad_batches``)."""
    logged = _scalar(trainer.callback_metrics.get(STEP_LOSS))
    if logged is not None:
        return logged
    loss = _scalar(outputs.get("loss") if isinstance(outputs, dict) else outputs)
    return None if loss is None else loss * trainer.accumulate_grad_batches


def _text(value: Any) -> Optional[str]:
    """A logger's name, project ... when it is one (fast_dev_run's DummyLogger gives no-ops)."""
    return value if isinstance(value, str) and value else None


def _default_path(trainer: L.Trainer) -> Optional[str]:
    if trainer.logger is not None:
        directory = run_directory(trainer.logger, start=False)
        if directory is None and not started(trainer.logger):
            return None  # the command failed its checks before its W&B run began: no run, no summary
    else:
        directory = None
    directory = directory or trainer.default_root_dir
    return os.path.join(directory, SUMMARY_FILE) if directory else None


def _last_checkpoint(trainer: L.Trainer) -> Optional[str]:
    callback = next((c for c in trainer.callbacks if isinstance(c, LastCheckpoint)), None)
    return callback.path(trainer) if callback is not None else None


class MalformedSummary(DataError, ValueError):
    """A file that is not a run summary: truncated or not JSON, not an object, or a field of
    another type than :class:`RunSummary` writes. The message names the file."""


# the fields readers use, by the type RunSummary writes them (each may also be null or absent)
_TEXT = ("name", "project", "group", "run_id", "task", "network", "scheme", "status", "error", "throughput_unit",
         "checkpoint", "precision")
_NUMBER = ("num_classes", "seed", "seed_everything", "data_seed", "lr", "agc_clip", "agc_eps", "batch_size", "accumulate_grad_batches", "global_batch",
           "world_size", "diverged_step", "steps",
           "epochs", "train_seconds", "samples", "samples_per_second")
_MAPPING = ("scheme_options", "scheme_fields", "network_options", CODE_KEY, DATA_KEY)
_METRICS = ("final", "best")  # metric name -> number


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")


def _field_problem(summary: dict) -> Optional[str]:
    """What is wrong with the first malformed field (None: nothing)."""
    for key, value in summary.items():
        if value is None:
            continue
        wanted = ("a string" if key in _TEXT and not isinstance(value, str)
                  else "a number" if key in _NUMBER and not _is_number(value)
                  else "an object" if key in _MAPPING + _METRICS + ("curves",) and not isinstance(value, dict)
                  else None)
        if wanted:
            return f"{key!r} is {_kind(value)} ({json.dumps(value)[:40]}), not {wanted}"
    for key in _METRICS:
        bad = next((k for k, v in (summary.get(key) or {}).items() if v is not None and not _is_number(v)), None)
        if bad is not None:
            return f"{key}[{bad!r}] is {_kind(summary[key][bad])}, not a number"
    ends = summary.get("val_epoch_ends")
    if ends is not None and not (isinstance(ends, list) and all(map(_is_number, ends))):
        return "'val_epoch_ends' is not a list of steps"
    for key, points in (summary.get("curves") or {}).items():
        if not isinstance(points, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(map(_is_number, p)) for p in points):
            return f"curves[{key!r}] is not a list of [step, value] pairs"
    return None


def read_summary(path: str) -> dict:
    """A ``run_summary.json`` (or the folder holding one), NaN restored; ``path`` added; an older
    file's ``seed`` as ``seed_everything``.
    Raises :class:`MalformedSummary` (one line naming the file) for a file that is not one."""
    if os.path.isdir(path):
        path = os.path.join(path, SUMMARY_FILE)
    with open(path, "rb") as f:
        data = f.read()
    try:
        summary = _from_json(json.loads(data.decode("utf-8")))
    except UnicodeDecodeError:
        raise MalformedSummary(f"{path} is not a run summary: not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise MalformedSummary(f"{path} is not a run summary: invalid JSON ({err.msg}: line {err.lineno} column "
                               f"{err.colno}); a truncated file?") from None
    if not isinstance(summary, dict):
        raise MalformedSummary(f"{path} is not a run summary: it holds {_kind(summary)}, not an object")
    problem = _field_problem(summary)
    if problem:
        raise MalformedSummary(f"{path} is not a run summary: {problem}")
    if "seed" in summary:  # written before the seeds had their own names: seed_everything's
        summary.setdefault("seed_everything", summary.pop("seed"))
    summary["path"] = path
    return summary


def find_summaries(*roots: str) -> list[str]:
    """Every ``run_summary.json`` under the given folders (or the files themselves), sorted."""
    found = set()
    for root in roots:
        if os.path.isfile(root):
            found.add(os.path.abspath(root))
            continue
        for folder, _, files in os.walk(root):
            if SUMMARY_FILE in files:
                found.add(os.path.abspath(os.path.join(folder, SUMMARY_FILE)))
    return sorted(found)
