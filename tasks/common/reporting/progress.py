"""Progress that reads well where the run's output goes.

In an interactive terminal Lightning's bar (:class:`~lightning.pytorch.callbacks.TQDMProgressBar`)
redraws itself in place. Where the output is a file (SLURM, CI, ``> log.txt``) each redraw is a
carriage return in the file: thousands per epoch, one unreadable line. There
:class:`LineProgress` takes the bar's place and prints one line every ``every_n_steps`` optimizer
steps (and at the end of each epoch) and one per validation::

    epoch 1/3  step 150/300  train/loss 0.8123  412.5 images/s  elapsed 0:00:37  ETA 0:00:37
    validation at step 150: val/acc1 0.9132  val/loss 0.3051

:func:`use_line_progress` makes the choice for a trainer (``rescale fit``'s and the demo's). The lines
go through the ``logging`` logger of this module (the ``rescale`` command writes them on stdout).

:class:`CountProgress` is the same for counted work outside a Trainer (``prepare-translation``
reading and encoding a corpus): a live line on stderr in a terminal, else one log line per interval::

    encoding train.de: 1200000/4500000 sentences (27%)  61234 sentences/s  elapsed 0:00:19  ETA 0:00:53
"""
from __future__ import annotations

import datetime
import logging
import math
import os
import sys
import time
from typing import Any, Optional, TextIO

import lightning.pytorch as L
from lightning.pytorch.callbacks import RichModelSummary, RichProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar

from ..data import items_in, metric_key, unit_of

__all__ = ["LineProgress", "CountProgress", "interactive", "use_line_progress"]

log = logging.getLogger(__name__)


def interactive() -> bool:
    """Whether both stdout and stderr are terminals (``RESCALE_PROGRESS=bar|lines`` decides instead)."""
    forced = os.environ.get("RESCALE_PROGRESS", "").lower()
    if forced in ("bar", "lines"):
        return forced == "bar"
    return all(getattr(stream, "isatty", lambda: False)() for stream in (sys.stdout, sys.stderr))


def _duration(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(round(seconds)))) if math.isfinite(seconds) else "?"


def _number(value: Any) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"


class LineProgress(ProgressBar):
    """Lightning's progress bar as plain lines: step, the progress-bar metrics (the loss), the
    throughput in the task's unit (images/s, clips/s, target tokens/s), elapsed time and ETA.

    Args:
        every_n_steps: a line every this many optimizer steps (None: the trainer's
            ``log_every_n_steps``), and at the end of each epoch.
        stream: where the lines go (default: this module's logger, at INFO).
    """

    def __init__(self, every_n_steps: Optional[int] = None, stream: Optional[TextIO] = None) -> None:
        super().__init__()
        self.every_n_steps = every_n_steps
        self.stream = stream
        self._enabled = True
        self._reset(0)

    def _reset(self, step: int) -> None:
        self._start = time.perf_counter()
        self._first_step = step
        self._items = 0
        self._window = (self._start, 0)
        self._printed = step

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _write(self, line: str) -> None:
        if not (self._enabled and self.trainer.is_global_zero):
            return
        if self.stream is None:
            log.info(line)
        else:
            self.stream.write(line + "\n")  # the stream asked for: a file or a terminal of one's own
            self.stream.flush()

    # --- training ---------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._items += items_in(pl_module, batch) * trainer.world_size
        step = trainer.global_step
        every = self.every_n_steps or max(trainer.log_every_n_steps, 1)
        if step != self._printed and step % every == 0:
            self._line(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step != self._printed:
            self._line(trainer, pl_module)

    def _line(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step, now = trainer.global_step, time.perf_counter()
        then, before = self._window
        rate = (self._items - before) / (now - then) if now > then else float("nan")
        self._window, self._printed = (now, self._items), step
        elapsed = now - self._start
        total = trainer.estimated_stepping_batches
        done = step - self._first_step
        eta = (total - step) * elapsed / done if done > 0 and math.isfinite(total) else float("nan")
        epochs = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        steps = f"/{int(total)}" if math.isfinite(total) else ""
        skip = {metric_key(pl_module), "v_num"}
        metrics = "  ".join(f"{k.removesuffix('_step')} {_number(v)}"  # the step's values, not the epoch's so far
                            for k, v in self.get_metrics(trainer, pl_module).items()
                            if k not in skip and not k.startswith("val/") and not k.endswith("_epoch"))
        self._write(f"epoch {trainer.current_epoch + 1}{epochs}  step {step}{steps}  {metrics}  "
                    f"{_number(rate)} {unit_of(pl_module)}/s  elapsed {_duration(elapsed)}  ETA {_duration(eta)}"
                    .replace("    ", "  "))

    # --- validation ---------------------------------------------------------------------------
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the training line of the step validated comes first (the epoch's end runs validation
        # before on_train_epoch_end)
        if not trainer.sanity_checking and trainer.state.fn == "fit" and trainer.global_step != self._printed:
            self._line(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        metrics = {k: v for k, v in trainer.progress_bar_metrics.items() if k.startswith("val/")}
        metrics.update({k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/")})
        shown = "  ".join(f"{k} {_number(v)}" for k, v in sorted(metrics.items()))
        self._write(f"validation at step {trainer.global_step}: {shown}")


def use_line_progress(trainer: L.Trainer, every_n_steps: Optional[int] = None) -> L.Trainer:
    """Where the output is not a terminal (:func:`interactive`), put :class:`LineProgress` in
    place of Lightning's default bar (TQDM's, or Rich's where ``rich`` is installed); a run without a bar, or with a bar of the user's own kind,
    keeps what it has. Where Lightning's INFO lines are silenced (``rescale --quiet``), its Rich model
    summary goes too: it prints its table straight to stdout, not through Lightning's logger as the
    plain summary does."""
    bar = trainer.progress_bar_callback
    callbacks = trainer.callbacks
    if type(bar) in (TQDMProgressBar, RichProgressBar) and not interactive():  # Lightning's default: Rich if installed
        callbacks[callbacks.index(bar)] = LineProgress(every_n_steps)
    if not logging.getLogger("lightning.pytorch").isEnabledFor(logging.INFO):
        callbacks[:] = [c for c in callbacks if not isinstance(c, RichModelSummary)]
    return trainer


class CountProgress:
    """Progress of counted work outside a Trainer: ``what`` done so far out of ``total`` (None:
    unknown) ``unit``, its rate, elapsed time and ETA. Where :func:`interactive`, one line on
    stderr redrawn in place (at most every 0.2 s); elsewhere one ``logger`` INFO line every
    ``every`` seconds. On leaving the ``with`` block the live line is cleared and one closing
    line logged (the count, the time, the rate)::

        with CountProgress("encoding train.en", total, "sentences", log) as progress:
            for chunk in chunks:
                ...
                progress.advance(len(chunk))
    """

    def __init__(self, what: str, total: Optional[int], unit: str, logger: logging.Logger = log,
                 every: float = 30.0) -> None:
        self.what, self.total, self.unit, self.logger, self.every = what, total, unit, logger, every
        self.done = 0
        self._live = interactive() and logger.isEnabledFor(logging.INFO)
        self._start = self._last = time.perf_counter()
        self._width = 0

    def __enter__(self) -> "CountProgress":
        self._start = self._last = time.perf_counter()
        return self

    def advance(self, count: int) -> None:
        self.done += count
        now = time.perf_counter()
        if now - self._last < (0.2 if self._live else self.every):
            return
        self._last = now
        line = self.line(now)
        if self._live:
            self._draw(line)
        else:
            self.logger.info(line)

    def line(self, now: Optional[float] = None) -> str:
        """``what: done/total unit (percent)  rate unit/s  elapsed  ETA``."""
        elapsed = (now or time.perf_counter()) - self._start
        rate = self.done / elapsed if elapsed > 0 else float("nan")
        if self.total:
            eta = (self.total - self.done) / rate if rate > 0 else float("nan")
            count = f"{self.done}/{self.total} {self.unit} ({100 * self.done / self.total:.0f}%)"
            return (f"{self.what}: {count}  {_number(rate)} {self.unit}/s  elapsed {_duration(elapsed)}  "
                    f"ETA {_duration(eta)}")
        return f"{self.what}: {self.done} {self.unit}  {_number(rate)} {self.unit}/s  elapsed {_duration(elapsed)}"

    def _draw(self, line: str) -> None:
        sys.stderr.write("\r" + line.ljust(self._width))
        sys.stderr.flush()
        self._width = len(line)

    def __exit__(self, *exc) -> None:
        if self._live and self._width:
            self._draw("")
            sys.stderr.write("\r")
            sys.stderr.flush()
        if exc[0] is None:
            elapsed = time.perf_counter() - self._start
            rate = f", {_number(self.done / elapsed)} {self.unit}/s" if elapsed > 0 and self.done else ""
            self.logger.info(f"{self.what}: {self.done} {self.unit} in {elapsed:.1f} s{rate}")
