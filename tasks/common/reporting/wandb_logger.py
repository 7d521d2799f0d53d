"""Weights & Biases logging that never hangs for lack of network.

:class:`SuiteWandbLogger` is Lightning's ``WandbLogger`` whose mode is decided at start-up:
``WANDB_MODE`` when the user sets it, online when an API key is configured (``WANDB_API_KEY``
or ``wandb login``), offline otherwise. Offline runs land in ``<save_dir>/wandb/offline-run-*``
and can be uploaded later with ``wandb sync``.

The W&B run starts at its first real use (the first logged value or hyper-parameter, the run
folder asked for), never while Lightning sets up: a command whose data paths, module or
checkpoint fail their checks leaves no empty run behind. Its id is chosen at
construction, so the checkpoint folder (``<save_dir>/<project>/<run id>/checkpoints``) is known
before the run exists.

The Lightning internals this needs (``WandbLogger._experiment``, ``_wandb_init``, ``_name``; a
CSV or TensorBoard logger's ``_name`` and ``_experiment``, which :func:`label_runs` fills in too)
are listed, with the versions they were checked on, in :mod:`..system.private_apis`.
"""
from __future__ import annotations

import glob
import logging
import os
import secrets
import shutil
import string
import time
from typing import Any, Optional

from lightning.fabric.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from ..errors import ConfigError
from ..system import require_writable

__all__ = ["SuiteWandbLogger", "wandb_mode", "started", "current_run", "discard_run", "label_runs"]

log = logging.getLogger(__name__)


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:  # `wandb login` stores the key in ~/.netrc
        import netrc

        auth = netrc.netrc().authenticators("api.wandb.ai")
        return bool(auth and auth[2])
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_mode() -> str:
    """``WANDB_MODE`` if set, else "online" when logged in, else "offline"."""
    return os.environ.get("WANDB_MODE") or ("online" if _has_api_key() else "offline")


class SuiteWandbLogger(WandbLogger):
    """WandbLogger, offline unless the user is logged in; runs grouped by experiment.

    Args mirror WandbLogger: ``project`` (one per task), ``group`` (one per experiment, holding
    the normalized baseline and its normalization-free counterparts side by side), ``name``
    (the run, e.g. ``rescale50``), ``tags``; ``save_dir`` holds the run directory and its
    checkpoints.
    """

    # what it hands WandbLogger itself, never a configuration key: {name: how to set it instead}
    # (the one-line error of a config that gives one says it)
    internal_init_arguments = dict.fromkeys(
        ("offline", "mode"), "the mode is online when you are logged in to W&B, offline otherwise; the "
        "environment variable WANDB_MODE (offline, online or disabled) sets it: WANDB_MODE=offline rescale ...")

    def __init__(self, name: Optional[str] = None, save_dir: str = "runs", project: str = "rescale",
                 group: Optional[str] = None, tags: Optional[list[str]] = None,
                 job_type: Optional[str] = None, id: Optional[str] = None,
                 log_model: bool = False, **kwargs: Any) -> None:
        # absolute: the W&B service process may outlive a change of working directory
        save_dir = os.path.abspath(save_dir)
        # W&B itself would move the run to a temporary folder, where no one looks for it
        require_writable(save_dir, "the W&B run folder (trainer.logger.init_args.save_dir)",
                         "give --trainer.logger.init_args.save_dir a folder you can write")
        os.makedirs(save_dir, exist_ok=True)
        mode = wandb_mode()
        if id is None and kwargs.get("version") is None:
            # a W&B sweep agent names the run it starts (WANDB_RUN_ID, which wandb.init would take):
            # the checkpoint folder and the run's lock follow the same id
            id = os.environ.get("WANDB_RUN_ID") or (_new_run_id() if rank_zero_only.rank == 0 else None)
        if kwargs.get("settings") is None:
            kwargs["settings"] = _settings()
        super().__init__(name=name, save_dir=save_dir, project=project, group=group, tags=tags,
                         job_type=job_type, id=id, log_model=log_model,
                         offline=mode == "offline", mode=mode, **kwargs)
        if not kwargs.get("anonymous"):
            # Lightning passes anonymous=None explicitly, and W&B warns that the setting has no
            # effect any more at every run: leave it out unless the user asked for it
            self._wandb_init.pop("anonymous", None)

    @property
    def started(self) -> bool:
        """Whether the W&B run exists yet (see the module docstring)."""
        return self._experiment is not None

    @property
    def experiment(self):
        """The W&B run, started now if it was not; before that, on rank 0, a stand-in that starts
        it at its first real use (Lightning touches ``experiment`` while it sets up, before the
        data and checkpoint checks, only to create it early)."""
        if self._experiment is None and rank_zero_only.rank == 0:
            return _PendingRun(self)
        return self._start()

    def _start(self):
        """The W&B run; when resuming right after the previous process was killed, waits (up to
        ``RUN_ID_RELEASE_S``) for that process's W&B service to let go of the run id."""
        deadline = time.monotonic() + self.RUN_ID_RELEASE_S
        while True:
            try:
                return WandbLogger.experiment.fget(self)
            except Exception as err:  # wandb raises ServerResponseError("run ID ... is in use")
                if "is in use" not in str(err) or time.monotonic() > deadline:
                    raise
                log.info("W&B run %s is still held by the previous process's service; waiting", self.version)
                time.sleep(1.0)

    RUN_ID_RELEASE_S = 120.0


class _PendingRun:
    """A W&B run not started yet: any attribute starts it (``log``, ``config``, ``dir`` ...)."""

    __slots__ = ("_logger",)

    def __init__(self, logger: SuiteWandbLogger) -> None:
        self._logger = logger

    def __getattr__(self, name: str):
        return getattr(self._logger._start(), name)


def started(logger) -> bool:
    """False for a suite W&B logger whose run has not started; True for any other logger."""
    return bool(getattr(logger, "started", True))


def current_run(logger):
    """The W&B run of a W&B logger when it has started, else None: never starts one (Lightning's
    ``WandbLogger.experiment`` would)."""
    return logger._experiment if isinstance(logger, WandbLogger) else None


def discard_run(logger) -> Optional[str]:
    """Finish the offline W&B run this process started for ``logger`` and remove its folder (a fit
    refused before its first step: the segment holds none of the run's results, only the refused
    command's config, which ``wandb sync`` would make the run's, and a run for readers of the
    folder); ``latest-run`` is pointed at the newest run left. Returns the folder removed; None
    when no run started or it is online (W&B's server has it: it is left as it is)."""
    run = current_run(logger)
    if run is None or not run.offline:
        return None
    folder = os.path.dirname(os.path.abspath(run.dir))
    run.finish(exit_code=1)
    logger._experiment = None
    shutil.rmtree(folder, ignore_errors=True)
    parent = os.path.dirname(folder)
    for name in ("latest-run", "debug.log", "debug-internal.log"):  # W&B's links to the newest run
        link = os.path.join(parent, name)
        if os.path.islink(link) and not os.path.exists(link):
            os.unlink(link)
    left = [p for p in glob.glob(os.path.join(parent, "*run-*")) if os.path.isdir(p) and not os.path.islink(p)]
    latest = os.path.join(parent, "latest-run")
    if left and not os.path.lexists(latest):
        os.symlink(os.path.basename(max(left, key=os.path.getmtime)), latest)
    return folder


def _new_run_id() -> str:
    """A fresh run id as wandb.init draws one (8 base-36 characters)."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def _settings():
    import wandb

    # no console capture thread, and a bounded wait when online
    return wandb.Settings(console="off", init_timeout=60, silent=True)


def _labelled(value: Any, key: str, labels: dict[str, str], data) -> Any:
    """``value`` with its ``{label}`` placeholders filled from ``labels``; a one-line error names
    an unknown label."""
    if not isinstance(value, str) or "{" not in value:
        return value
    try:
        return value.format_map(labels)
    except (KeyError, ValueError, IndexError) as err:
        known = ", ".join("{%s}" % k for k in labels) or "none"
        raise ConfigError(f"trainer.logger.init_args.{key} {value!r} names a label the data module does not "
                          f"give ({err}); labels of {type(data).__name__}: {known}: use one of them, or a "
                          "name without braces") from None


def label_runs(loggers, data) -> None:
    """Fill the ``{label}`` placeholders of a run's name with what the data module says of its
    data (``run_labels()``: a translation corpus gives ``src_lang``, ``tgt_lang`` and ``pair``,
    e.g. ``group: "{pair}-6L"`` is ``en-fr-6L`` on English-French text): a suite W&B logger's run
    name and group before the run starts, a CSV or TensorBoard logger's name (its folder under
    ``save_dir``) before it writes; an unknown label is a one-line error."""
    labels = dict(data.run_labels()) if hasattr(data, "run_labels") else {}
    for logger in loggers or ():
        if isinstance(logger, SuiteWandbLogger) and not logger.started:
            init = logger._wandb_init
            for key in ("name", "group"):
                if key in init:
                    init[key] = _labelled(init[key], key, labels, data)
            logger._name = init.get("name")
        elif isinstance(logger, (CSVLogger, TensorBoardLogger)) and logger._experiment is None:
            logger._name = _labelled(logger._name, "name", labels, data)
