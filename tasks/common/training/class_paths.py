"""The class a config's ``class_path`` names, for the checks that run before jsonargparse builds it
(the task module's argument checks, the optimizer and schedule checks, a checkpoint's arguments),
and the arguments its constructor takes (:func:`init_parameters`)."""
from __future__ import annotations

import importlib
import inspect
from typing import Optional

__all__ = ["class_of", "init_parameters"]


def class_of(class_path: Optional[str]) -> Optional[type]:
    """The class a ``class_path`` names (None when it names none or cannot be imported)."""
    module, _, name = str(class_path or "").rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, None) if module else None
    except ImportError:
        return None


def init_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The named arguments ``cls(...)`` takes: its constructor's, and, where that hands
    ``**options`` on to its base class (as every task module does with the arguments all tasks
    share), the base's, as jsonargparse reads them; an argument a subclass names itself keeps the
    subclass's default. Names a class lists in ``internal_init_arguments`` (what a subclass hands
    its base itself, never a configuration key; a mapping gives, for each, how to set it instead,
    which the one-line error of a config that names it says) are left out."""
    found: dict[str, inspect.Parameter] = {}
    internal = set(getattr(cls, "internal_init_arguments", ()))
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        try:
            params = inspect.signature(vars(klass)["__init__"]).parameters.values()
        except (TypeError, ValueError):
            break
        for param in params:
            if (param.name != "self" and param.name not in internal
                    and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)):
                found.setdefault(param.name, param)
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return found
