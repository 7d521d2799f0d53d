"""The network's positional inputs taken from a batch, as a tuple, whatever the task.

A task module says how with its ``network_inputs(batch)`` method
(:class:`rescale_tasks.common.module.RescaleTaskModule` defines it; a detection, video or translation
module that takes other inputs overrides it); otherwise a classification-style batch ``(inputs,
labels)`` gives ``batch[0]``. The probes (``rescale analyze``, the analysis callback) read inputs this
way and handle them as tuples throughout.
"""
from __future__ import annotations

from typing import Optional

__all__ = ["network_inputs", "batch_size_of", "take_samples"]


def network_inputs(module, batch) -> tuple:
    """The network's positional inputs taken from ``batch``, as a tuple: the module's
    ``network_inputs(batch)`` when it defines one (:class:`rescale_tasks.common.module.RescaleTaskModule`
    does), else ``batch[0]`` of a tuple/list batch, else the batch itself."""
    method = getattr(module, "network_inputs", None)
    if callable(method):
        inputs = method(batch)
    else:
        inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def batch_size_of(inputs: tuple) -> int:
    """The number of samples in a tuple of network inputs."""
    return int(inputs[0].shape[0])


def take_samples(inputs: tuple, start: int, stop: Optional[int] = None) -> tuple:
    """Samples ``start:stop`` of every tensor of a tuple of network inputs."""
    return tuple(t[start:stop] for t in inputs)
