"""Speed switches a task module exposes to its config: channels_last memory format and
``torch.compile`` of the network (the core's execution plans are tested under both).

Both leave the checkpoint format alone: ``channels_last`` only changes strides (state dicts load
into either layout), and the network is compiled in place (:meth:`torch.nn.Module.compile`), so
its state-dict keys keep their names (``torch.compile(net)`` would prefix them ``_orig_mod.``).
RescaleNet's measuring steps run eagerly under compile (``rescale_core``); the model compiles to
one graph once they are over.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["memory_format_of", "use_channels_last", "as_memory_format", "compile_in_place"]

_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


def memory_format_of(net: nn.Module) -> torch.memory_format:
    """channels_last for a 2D network, channels_last_3d for a 3D one (from its first conv)."""
    for m in net.modules():
        if isinstance(m, nn.modules.conv._ConvNd) and m.weight.dim() in _FORMATS:
            return _FORMATS[m.weight.dim()]
    raise ValueError(f"{type(net).__name__} has no 2D or 3D convolution: channels_last does not "
                     "apply to it; set channels_last: false")


def use_channels_last(net: nn.Module) -> torch.memory_format:
    """Put ``net``'s weights in its channels_last format (in place); returns that format."""
    fmt = memory_format_of(net)
    net.to(memory_format=fmt)
    return fmt


def as_memory_format(x: torch.Tensor, fmt: torch.memory_format | None) -> torch.Tensor:
    """``x`` in ``fmt`` when it has that format's rank (a batch of images or clips), else ``x``."""
    if fmt is None or _FORMATS.get(x.dim()) != fmt:
        return x
    return x.contiguous(memory_format=fmt)


def compile_in_place(net: nn.Module, **options) -> None:
    """``torch.compile`` the module's calls without wrapping it (state-dict keys unchanged)."""
    net.compile(**options)
