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

from .plans import check_plan, set_plan
from .schemes import Scheme

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
    family arguments such as ``depth``/``width``. A registered name fixes what it names: its
    architecture (``arch``: ``resnet50`` is a ResNet-50) and, for paper names (``rescale50``,
    ``fixup50`` ...), its scheme; passing a different value is an error, never a silent rebuild
    of another network. ``plan``: the execution plan (:mod:`rescale_core.plans`: ``"auto"``,
    the default, is lean on accelerators and folded on the CPU; ``"lean"``, ``"folded"``,
    ``"reference"``), the same function and state dict under each.
    """
    plan = check_plan(kwargs.pop("plan", "auto"))
    entry = model_entry(name)
    for key, value in entry.defaults.items():
        given = kwargs.get(key, value)
        if key == "scheme" and isinstance(given, Scheme):
            given = given.name  # the scheme the name fixes, with options set on it
        if given != value:
            if key == "scheme":
                arch = entry.defaults.get("arch", entry.family)
                raise ValueError(f"model {name!r} is defined with scheme={value!r}, got scheme={given!r}; for "
                                 f"another scheme use its architecture's name: create_model({arch!r}, scheme=...)")
            raise ValueError(f"model {name!r} is defined with {key}={value!r}, got {key}={kwargs[key]!r}; "
                             f"create the model by that name instead (e.g. create_model({kwargs[key]!r}))")
        kwargs.setdefault(key, value)
    model = entry.builder(**kwargs)
    return model if plan == "auto" else set_plan(model, plan)


def list_models(pattern: str = "*", family: str | None = None) -> list[str]:
    return sorted(n for n, e in _REGISTRY.items()
                  if fnmatch.fnmatch(n, pattern) and (family is None or e.family == family))
