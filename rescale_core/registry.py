"""Model registry: name -> builder. Refuses duplicates; unknown names get close matches.

The papers' names (``rescale50``: Shao et al. 2020; ``fixup50``: Zhang et al. 2019; ``skipinit50``:
De & Smith 2020) are registered with their scheme fixed.
"""
from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, field
from typing import Callable

from torch import nn

__all__ = ["register_model", "create_model", "list_models", "model_entry", "ModelEntry"]


@dataclass(frozen=True)
class ModelEntry:
    name: str
    builder: Callable[..., nn.Module]
    family: str
    defaults: dict = field(default_factory=dict)  # fixed kwargs, e.g. scheme for "rescale50"


_REGISTRY: dict[str, ModelEntry] = {}


def register_model(name: str, builder: Callable[..., nn.Module], family: str, **defaults) -> None:
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} is already registered")
    _REGISTRY[name] = ModelEntry(name, builder, family, dict(defaults))


def model_entry(name: str) -> ModelEntry:
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=4, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown model {name!r}.{hint} See rescale_core.list_models() "
                       f"({len(_REGISTRY)} models).")
    return _REGISTRY[name]


def create_model(name: str, **kwargs) -> nn.Module:
    """Build the registered model ``name``.

    kwargs go to the family builder: ``scheme`` (a name or :class:`~rescale_core.schemes.Scheme`),
    ``scheme_options`` (overrides of the scheme's fields), ``num_classes``, ``in_channels`` and
    family arguments such as ``depth``/``width``. Paper names (``rescale50``, ``fixup50`` ...) fix
    their scheme; passing a different one is an error.
    """
    entry = model_entry(name)
    for key, value in entry.defaults.items():
        if key in kwargs and kwargs[key] != value and key == "scheme":
            raise ValueError(f"model {name!r} is defined with scheme={value!r}; for another scheme "
                             f"use the family name (e.g. create_model('resnet50', scheme=...))")
        kwargs.setdefault(key, value)
    return entry.builder(**kwargs)


def list_models(pattern: str = "*", family: str | None = None) -> list[str]:
    return sorted(n for n, e in _REGISTRY.items()
                  if fnmatch.fnmatch(n, pattern) and (family is None or e.family == family))
