"""User-facing errors: one clear line (what, where, how to fix), no traceback.

Anything raised as :class:`UserError` (or a subclass) is caught by the ``rescale`` command,
printed as ``error: <message>`` on one line, and turned into a non-zero exit status.
"""
from __future__ import annotations

import argparse


class UserError(Exception):
    """A problem with the user's input (paths, data layout, config), not a bug in the suite."""

    exit_code = 2


class DataError(UserError):
    """Missing, malformed or unreadable data."""


class ConfigError(UserError):
    """A config key or value that cannot be used."""


class WorkerDataError(DataError):
    """A data error that may be raised inside a DataLoader worker (a corrupt image, a bad video).

    torch re-raises a worker's exception in the main process as ``cls("Caught ... Original
    Traceback ...")``; the constructor keeps only the original line, so the user still sees one.
    """

    def __init__(self, message: str):
        if message.startswith("Caught ") and "Original Traceback" in message:
            last = message.rstrip().splitlines()[-1]
            prefix = f"{type(self).__qualname__}: "
            message = last.split(prefix, 1)[1] if prefix in last else last
        super().__init__(message)


class UserArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one :class:`UserError` line (the ``rescale`` command prints it),
    not a usage dump; an option is spelled in full (no abbreviation taken for another option),
    and a description taken from a docstring loses its reST quotes in ``--help``."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        if kwargs.get("description"):
            kwargs["description"] = kwargs["description"].replace("``", "")
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UserError(f"{self.prog}: {message} (see {self.prog} --help)")
