"""Config files read before jsonargparse sees them, so that a file that cannot be a config is one
line naming it: a missing file or a folder, a binary file or text that is not UTF-8, a YAML syntax
error (file, line and column), or YAML that is not a mapping of sections. jsonargparse would
report these as a traceback (``UnicodeDecodeError``), as "not found" for a folder, or as
``Unexpected config: <the file's text>`` without the file's name."""
from __future__ import annotations

import os

import yaml

from .errors import UserError

__all__ = ["check_config_file"]

_EXAMPLE = "Run configs live in experiments/<task>/, e.g. experiments/imagenet/rescale50.yaml"


def _text(path: str, where: str) -> str:
    if not os.path.exists(path):
        raise UserError(f"config file not found: {path} ({where}). {_EXAMPLE}")
    if os.path.isdir(path):
        raise UserError(f"{path} is a folder, not a config file ({where}); give one of its YAML files. {_EXAMPLE}")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise UserError(f"cannot read config file {path} ({where}): {err.strerror}") from None
    if b"\0" in data:
        raise UserError(f"{path} is a binary file, not a YAML config ({where}). {_EXAMPLE}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise UserError(f"config file {path} is not UTF-8 text: byte 0x{data[err.start]:02x} at line {line}, "
                        f"column {column} ({where}); save it as UTF-8 (or write that character another "
                        "way)") from None


def check_config_file(path: str, where: str = "--config") -> None:
    """Refuse, in one :class:`UserError` line naming ``path``, a file that is no YAML mapping.
    ``where``: how the file was given (``--config``, or the config it is the defaults of)."""
    text = _text(path, where)
    try:
        content = yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        at = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        what = " ".join(str(x) for x in (err.context, err.problem) if x)
        raise UserError(f"YAML syntax error in {at}: {what}; fix the file (the line shown, or the one above "
                        "it)") from None
    except yaml.YAMLError as err:
        raise UserError(f"YAML error in {path}: {' '.join(str(err).split())}") from None
    if isinstance(content, dict):
        return
    if content is None:
        held = "no settings (it is empty or only comments)"
    elif isinstance(content, list):
        held = "a YAML list"
    else:
        held = f"a single {type(content).__name__} value ({' '.join(str(content).split())[:40]!r})"
    raise UserError(f"config file {path} holds {held}, not a mapping of sections (model:, data:, trainer: "
                    f"...) ({where}). {_EXAMPLE}")
