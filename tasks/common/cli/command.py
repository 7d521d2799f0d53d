"""How every command of the suite ends: its errors as one line, an exit status, W&B flushed.

:func:`run_command` runs one command (``rescale fit``, ``rescale study`` ... or a study's point run
in-process) so that a :class:`~..errors.UserError` or a diverged run logs ``error: <line>`` (an
ERROR record of this module's logger: on stderr under the command's logging) (``RESCALE_TRACEBACK=1``: with the traceback behind it), a stop by SIGTERM, Ctrl-C or
another stop signal while training says where it saved (once, from the first process) and exits
``128 + signal``, and the W&B run the command opened is
closed so its history and summary reach the disk.
"""
from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable

from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..checkpoints import preempted_message, stop_signal
from ..errors import UserError
from ..system import rank_zero_log
from ..training import TrainingDiverged

__all__ = ["run_command"]

log = logging.getLogger(__name__)


def run_command(command: Callable[[], int | None]) -> int:
    """``command()``'s exit status (None: 0), or the status of the error it raised, printed as one
    line."""
    try:
        return command() or 0
    except (UserError, TrainingDiverged) as err:
        if os.environ.get("RESCALE_TRACEBACK", "") not in ("", "0"):  # the error behind the line
            traceback.print_exception(getattr(err, "original", None) or err, file=sys.stderr)
        if isinstance(err, TrainingDiverged):  # every process read it at the same step: one line for the run
            rank_zero_log(log, logging.ERROR, f"error: {err}")
        else:
            log.error("error: %s", err)
        return getattr(err, "exit_code", 1)
    except SIGTERMException as err:  # a stop signal while training (checkpoints.callbacks.LastCheckpoint)
        # every process stopped at the same step: one line for the run
        rank_zero_log(log, logging.ERROR, f"error: {preempted_message(err)}")
        return 128 + stop_signal(err)
    finally:
        _finish_wandb()


def _finish_wandb() -> None:
    """Close the W&B run this command opened, so its history and summary are flushed to disk."""
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.finish()
