"""Building ``rescale_core`` networks from a task config, with one-line errors for bad names.

Every task module builds its network through :func:`create_network`; the CLI calls
:func:`check_network` before instantiation, because jsonargparse would wrap an error raised
while instantiating in a multi-line report of its own. A scheme option of the wrong type, or
outside its field's choices or range, is named by its full key:
``model.init_args.scheme_options.mean_shift: "flase" is not a boolean (true or false) for scheme rescale``.
"""
from __future__ import annotations

from typing import Any, Optional

import rescale_core
from rescale_core.registry import model_entry
from rescale_core.schemes import SchemeOptionError
from torch import nn

from ..errors import ConfigError

__all__ = ["create_network", "check_network", "default_scheme", "resolved_architecture"]

_WHERE = "model.init_args.network / scheme / scheme_options / network_options"
_OPTIONS_KEY = "model.init_args"  # where scheme_options sit in a run config


def _config_error(network: str, err: Exception, options: Optional[dict[str, Any]] = None,
                  where: str = _WHERE) -> ConfigError:
    if isinstance(err, SchemeOptionError):  # names its option: scheme_options.<field>: ...
        return ConfigError(f"{_OPTIONS_KEY}.{err}" if where == _WHERE else f"{err} ({where})")
    message = err.args[0] if err.args else str(err)
    # `{base_width: 8, depth:3}` reads as {base_width: 8, 'depth:3': null}: YAML needs `key: value`
    glued = [k for k, v in (options or {}).items() if isinstance(k, str) and ":" in k and v is None]
    if glued:
        key, _, value = glued[0].partition(":")
        message += f"; a YAML mapping needs a space after each colon: '{key}: {value}', not '{glued[0]}'"
    return ConfigError(f"cannot build network {network!r} ({where}): {message}")


def check_network(network: str, scheme: Optional[str] = None,
                  scheme_options: Optional[dict[str, Any]] = None) -> None:
    """Raise :class:`ConfigError` for an unknown network or scheme, an unknown scheme option or one
    whose value does not fit its field, building nothing. Without a scheme, the options are
    checked against the one the network builds by default."""
    try:
        model_entry(network)  # always: an explicit scheme must not skip this check
        name = scheme or default_scheme(network)
        if name is not None:
            rescale_core.get_scheme(name, **dict(scheme_options or {}))
    except (KeyError, ValueError, TypeError) as err:
        raise _config_error(network, err, scheme_options) from None


def create_network(network: str, *, where: str = _WHERE, **kwargs: Any) -> nn.Module:
    """``rescale_core.create_model`` with bad names and options turned into one-line errors;
    ``where``: the settings that chose them (by default, a run config's model keys)."""
    try:
        return rescale_core.create_model(network, **kwargs)
    except (KeyError, ValueError, TypeError) as err:
        options = {**kwargs, **{k: v for o in ("network_options", "scheme_options")
                                if isinstance(kwargs.get(o), dict) for k, v in kwargs[o].items()}}
        raise _config_error(network, err, options, where) from None


def default_scheme(network: str) -> Optional[str]:
    """The scheme ``network`` builds when none is given (None for an unknown name).

    Lets a checkpoint saved with ``scheme: null`` compare equal to one naming that scheme.
    """
    import inspect

    try:
        entry = model_entry(network)
    except KeyError:
        return None
    if entry.defaults.get("scheme") is not None:
        return entry.defaults["scheme"]
    parameter = inspect.signature(entry.builder).parameters.get("scheme")
    default = None if parameter is None else parameter.default
    return default if isinstance(default, str) else None


def resolved_architecture(hparams: dict[str, Any]) -> dict[str, Any]:
    """``hparams`` with the network's default scheme filled in where none was given."""
    if hparams.get("scheme") is None and isinstance(hparams.get("network"), str):
        hparams = dict(hparams, scheme=default_scheme(hparams["network"]))
    return hparams
