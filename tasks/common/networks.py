"""Building ``rescale_core`` networks from a task config, with one-line errors for bad names.

Every task module builds its network through :func:`create_network`; the CLI calls
:func:`check_network` before instantiation, because jsonargparse would wrap an error raised
while instantiating in a multi-line report of its own.
"""
from __future__ import annotations

from typing import Any, Optional

import rescale_core
from rescale_core.registry import model_entry
from torch import nn

from .errors import ConfigError

__all__ = ["create_network", "check_network", "default_scheme", "resolved_architecture"]

_WHERE = "model.init_args.network / scheme / scheme_options / network_options"


def _config_error(network: str, err: Exception, options: Optional[dict[str, Any]] = None) -> ConfigError:
    message = err.args[0] if err.args else str(err)
    # `{base_width: 8, depth:3}` reads as {base_width: 8, 'depth:3': null}: YAML needs `key: value`
    glued = [k for k, v in (options or {}).items() if isinstance(k, str) and ":" in k and v is None]
    if glued:
        key, _, value = glued[0].partition(":")
        message += f"; a YAML mapping needs a space after each colon: '{key}: {value}', not '{glued[0]}'"
    return ConfigError(f"cannot build network {network!r} ({_WHERE}): {message}")


def check_network(network: str, scheme: Optional[str] = None,
                  scheme_options: Optional[dict[str, Any]] = None) -> None:
    """Raise :class:`ConfigError` for an unknown network, scheme or scheme option, building nothing."""
    try:
        entry = model_entry(network)  # always: an explicit scheme must not skip this check
        name = scheme or entry.defaults.get("scheme")
        if name is not None:
            rescale_core.get_scheme(name, **dict(scheme_options or {}))
    except (KeyError, ValueError) as err:
        raise _config_error(network, err, scheme_options) from None


def create_network(network: str, **kwargs: Any) -> nn.Module:
    """``rescale_core.create_model`` with bad names and options turned into one-line errors."""
    try:
        return rescale_core.create_model(network, **kwargs)
    except (KeyError, ValueError, TypeError) as err:
        options = {**kwargs, **{k: v for o in ("network_options", "scheme_options")
                                if isinstance(kwargs.get(o), dict) for k, v in kwargs[o].items()}}
        raise _config_error(network, err, options) from None


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
