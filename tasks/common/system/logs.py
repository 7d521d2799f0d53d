"""The suite's messages: one :mod:`logging` hierarchy, configured by the ``rescale`` command only.

Every module logs to ``logging.getLogger(__name__)``, a child of the ``rescale_tasks`` logger
(:data:`ROOT`). Importing the package installs no handler (a library leaves logging to its user):
``logging.getLogger("rescale_tasks").setLevel(logging.WARNING)``, a handler of one's own or
:mod:`logging.config` decide what a notebook sees. The ``rescale`` command wraps its run in
:func:`command_logging`, which writes each message as the suite's lines always read
(``%(message)s``): INFO and DEBUG on stdout, warnings and errors on stderr, at the level
``--quiet`` (WARNING, and Lightning's INFO lines too), ``--verbose`` (DEBUG) or ``RESCALE_LOG_LEVEL``
sets (default INFO, or the level a configuration gave the ``rescale_tasks`` logger).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from typing import Iterator, Optional

from ..errors import ConfigError

__all__ = ["ROOT", "LEVEL_ENV", "LIBRARY_LOGGERS", "StdStreams", "command_logging", "log_level", "library_levels",
           "rank_zero_log", "write_output", "output_closed", "quiet_dependency_warnings"]

ROOT = "rescale_tasks"
LEVEL_ENV = "RESCALE_LOG_LEVEL"
# Lightning's own loggers (their INFO lines: accelerator, model summary ...), quieted by --quiet
LIBRARY_LOGGERS = ("lightning.pytorch", "lightning.fabric")
_library_level: Optional[int] = None  # what command_logging sets them to (None: left as they are)
# the suite's own files: a warning raised there (Lightning's rank_zero_warn from a callback of the
# suite) is one line, as the suite's logged warnings are, not Python's location and source line
_SUITE_FILES = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def _one_line_warnings(previous):
    def format_warning(message, category, filename, lineno, line=None) -> str:
        if str(filename).startswith(_SUITE_FILES):
            return f"warning: {message}\n"
        return previous(message, category, filename, lineno, line)
    return format_warning


def quiet_dependency_warnings() -> None:
    """Drop the deprecation warnings Lightning 2.6 raises from inside itself, on every run,
    which nothing a user of the suite can change: it still builds torch's deprecated ``LeafSpec``
    and gathers across ranks with the deprecated ``torch.distributed.nn.functional.all_gather``.
    Called by the command and again in each process a run starts (``ddp_spawn``'s ranks start
    fresh interpreters, without the command's filters)."""
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning, module=r"lightning\.pytorch\.utilities\._pytree")
    warnings.filterwarnings("ignore", message=r"torch\.distributed\.nn\.functional\.all_gather is deprecated",
                            module=r"lightning\.fabric\.utilities\.distributed")


class StdStreams(logging.Handler):
    """Records below WARNING to ``sys.stdout``, the others to ``sys.stderr``, each looked up when
    the record is written (so a redirection made after the command started, pytest's ``capsys``
    or :func:`contextlib.redirect_stdout` receive the lines)."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stdout if record.levelno < logging.WARNING else sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except BrokenPipeError:  # whoever read the messages stopped reading: the work goes on, unlogged
            if stream is sys.stdout:
                output_closed()
        except Exception:  # noqa: BLE001 - logging's own policy: report, never raise
            self.handleError(record)


def log_level(quiet: bool = False, verbose: bool = False) -> Optional[int]:
    """The level the command runs at: ``--quiet`` WARNING, ``--verbose`` DEBUG, else
    ``RESCALE_LOG_LEVEL`` (a name such as ``WARNING`` or a number); None: none of them is set."""
    if quiet:
        return logging.WARNING
    if verbose:
        return logging.DEBUG
    value = os.environ.get(LEVEL_ENV, "").strip()
    if not value:
        return None
    if value.isdigit():
        return int(value)
    level = logging.getLevelName(value.upper())
    if not isinstance(level, int):
        raise ConfigError(f"{LEVEL_ENV}={value!r} is not a logging level; use DEBUG, INFO, WARNING or ERROR.")
    return level


@contextlib.contextmanager
def command_logging(level: Optional[int] = None) -> Iterator[None]:
    """The ``rescale`` command's logging for the ``with`` block: the ``rescale_tasks`` logger at
    ``level`` (None: as configured, INFO when not) writing through :class:`StdStreams` (unless a
    handler of one's own is on it), and Lightning's loggers at WARNING when ``level`` is above
    INFO; a warning the suite's own code raises (``rank_zero_warn``) is written as one
    ``warning: ...`` line. Everything is put back afterwards."""
    suite = logging.getLogger(ROOT)
    before = suite.level
    if level is not None:
        suite.setLevel(level)
    elif suite.level == logging.NOTSET:
        suite.setLevel(logging.INFO)
    handler = None if suite.handlers else StdStreams()
    if handler is not None:
        suite.addHandler(handler)
    global _library_level
    libraries = {name: logging.getLogger(name).level for name in LIBRARY_LOGGERS}
    library_level_before = _library_level
    _library_level = level if level is not None and level > logging.INFO else None
    library_levels()
    format_warning = warnings.formatwarning
    warnings.formatwarning = _one_line_warnings(format_warning)
    try:
        yield
    finally:
        warnings.formatwarning = format_warning
        if handler is not None:
            suite.removeHandler(handler)
        suite.setLevel(before)
        _library_level = library_level_before
        for name, old in libraries.items():
            logging.getLogger(name).setLevel(old)


def library_levels() -> None:
    """Lightning's loggers at the level :func:`command_logging` gives them (above INFO: ``--quiet``),
    set again once the command has imported Lightning: its import sets them to INFO."""
    if _library_level is not None:
        for name in LIBRARY_LOGGERS:
            logging.getLogger(name).setLevel(_library_level)


def rank_zero_log(logger: logging.Logger, level: int, message: str) -> None:
    """``message`` from the first process of a distributed run only (one line per run)."""
    # Lightning only when a run logs: `rescale --version` and `--help` never load it
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    if rank_zero_only.rank == 0:
        logger.log(level, message, stacklevel=2)


def write_output(text: str, stream=None) -> None:
    """A command's result, as a line of its own on stdout (``stream``: another), whatever the log
    level: what the command was asked for (a listing, its help, the version, a table, a config),
    which a pipe or a file keeps, as opposed to the messages about its work, which go through
    :mod:`logging` and which ``--quiet`` silences."""
    stream = sys.stdout if stream is None else stream
    stream.write(text + "\n")
    stream.flush()


def output_closed() -> int:
    """What a command does when the reader of its output went away (``rescale schemes | head -1``:
    a ``BrokenPipeError``): no traceback, stdout pointed at the null device so that the
    interpreter's last flush of what is left does not fail again, and exit status 1 (Python's own
    on a broken pipe; the signal module's documentation, "Note on SIGPIPE")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file: nothing flushes it at exit
        return 1
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return 1
