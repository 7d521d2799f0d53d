"""What other libraries print that concerns no run of the suite, silenced one message at a time
(never a whole category or library: their other warnings may matter)."""
from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Iterator

from ..system import quiet_dependency_warnings

__all__ = ["quiet_libraries", "quiet_evaluation", "quiet_resume"]

# Lightning's notices that say nothing about the run: an advert printed by every Trainer, and its
# "Received SIGTERM: <n>" (the suite's own exit line says which signal stopped the run, and where
# it saved; for Ctrl-C Lightning would name SIGTERM with SIGINT's number)
_NOTICES = {"lightning.pytorch.utilities.rank_zero": "💡 Tip:",
            "lightning.pytorch.trainer.connectors.signal_connector": "Received SIGTERM: "}


class _DropNotice(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


_FILTERS = {name: _DropNotice(text) for name, text in _NOTICES.items()}


def quiet_libraries() -> None:
    """Drop the notices above and the dependencies' deprecation warnings no user of the suite can
    act on (:func:`~rescale_tasks.common.system.logs.quiet_dependency_warnings`)."""
    quiet_dependency_warnings()
    for name, drop in _FILTERS.items():
        logging.getLogger(name).addFilter(drop)  # the same object: added once


@contextlib.contextmanager
def quiet_evaluation() -> Iterator[None]:
    """``validate``/``test``/``predict --ckpt_path``: no warning that the checkpoint's
    ModelCheckpoint folder differs from this command's (one never created) and that its
    best-model bookkeeping is not reloaded, which only a resumed ``fit`` uses."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The dirpath has changed from", category=UserWarning,
                                module=r"lightning\.pytorch\.callbacks\.model_checkpoint")
        yield


@contextlib.contextmanager
def quiet_resume(resuming: bool) -> Iterator[None]:
    """``fit --ckpt_path``: no warning that the run's checkpoint folder is not empty (it holds the
    checkpoint resumed; a new start over a run's ``last.ckpt`` is refused before this)."""
    with warnings.catch_warnings():
        if resuming:
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty",
                                    category=UserWarning, module=r"lightning\.pytorch\.callbacks\.model_checkpoint")
        yield
