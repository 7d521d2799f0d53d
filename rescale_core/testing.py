"""Helpers for checking that two code paths compute the same function (the fast path against the
reference path, a new scheme's fold against its layers): a model moved away from its init, where
gains, biases and mean-shift statistics are often exactly zero or one and would hide a wrong fold
(SkipInit's zero gains, De & Smith 2020; Fixup's zero-initialised last layers, Zhang et al. 2019;
RescaleNet's measured mean shift, Shao et al. 2020)."""
from __future__ import annotations

import torch
from torch import nn

from .layers import MeanShiftBias

__all__ = ["randomise_"]


@torch.no_grad()
def randomise_(model: nn.Module, seed: int = 0, gain: float = 0.5) -> nn.Module:
    """In place: gains to ``gain * (1 + |noise|)``, biases and 1-D parameters plus 0.3 noise, weights
    plus noise at 0.2 of their spread, mean-shift ``mu0`` and BN running statistics random; the same
    for every dtype (noise drawn in float64 from ``seed``). Returns ``model``."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
        if name.endswith("gain.weight"):
            p.copy_(gain * (1 + noise.abs()))
        elif p.dim() <= 1 or name.endswith(".bias"):
            p.add_(0.3 * noise)
        else:
            p.add_(0.2 * p.std().clamp_min(0.05) * noise)
    for m in model.modules():
        if isinstance(m, MeanShiftBias):
            m.mu0.copy_(torch.randn(m.mu0.shape, generator=g, dtype=torch.float64).to(m.mu0.dtype))
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.running_mean is not None:
            m.running_mean.normal_(generator=g)
            m.running_var.uniform_(0.5, 2.0, generator=g)
    return model
