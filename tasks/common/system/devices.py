"""The device a command's ``--device`` names, checked before the command starts its work: a device
this machine lacks is one line then, not a driver's traceback once the model is built."""
from __future__ import annotations

import torch

from ..errors import UserError

__all__ = ["resolve_device"]

KINDS = "auto, cpu, cuda, cuda:N or mps"


def resolve_device(device: str = "auto") -> torch.device:
    """``--device`` as a :class:`torch.device` (``auto``: a CUDA GPU when there is one, else the CPU);
    a name torch does not know, or a device this machine does not have, is one :class:`UserError`."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"bad --device {device!r}: expected {KINDS}")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"--device {device}: no MPS device on this machine; use --device cpu (or auto)")
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise UserError(f"--device {device}: no CUDA GPU on this machine; use --device cpu (or auto)")
        if resolved.index is not None and resolved.index >= count:
            raise UserError(f"--device {device}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}; "
                            "give one of them (or auto)")
    return resolved
