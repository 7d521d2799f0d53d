"""User-facing errors: one clear line (what, where, how to fix), no traceback.

Anything raised as :class:`UserError` (or a subclass) is caught by the ``rescale`` command,
printed as ``error: <message>`` on one line, and turned into a non-zero exit status.
"""
from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input (paths, data layout, config), not a bug in the suite."""

    exit_code = 2


class DataError(UserError):
    """Missing, malformed or unreadable data."""


class ConfigError(UserError):
    """A config key or value that cannot be used."""
