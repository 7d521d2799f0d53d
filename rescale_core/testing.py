"""Helpers for checking that two code paths compute the same function (the fast path against the
reference path, a new scheme's fold against its layers): a model moved away from its init, where
gains, biases and mean-shift statistics are often exactly zero or one and would hide a wrong fold
(SkipInit's zero gains, De & Smith 2020; Fixup's zero-initialised last layers, Zhang et al. 2019;
RescaleNet's measured mean shift, Shao et al. 2020); and the name mapping that loads a timm
``NormFreeNet``'s weights (NF-ResNet, Brock et al. 2021) into our ``nf`` ResNet of the same shape
(docs/nf_resnets.md, the fidelity check)."""
from __future__ import annotations

import torch
from torch import nn

from .layers import MeanShiftBias

__all__ = ["randomise_", "timm_normfree_names", "load_timm_normfree_"]


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


def timm_normfree_names(model: nn.Module) -> dict[str, str]:
    """timm ``NormFreeNet`` parameter name -> ours, for our ResNet built with an NF scheme
    (``layout="preact"``) and the same depths, widths and stem. timm's stem conv is ``stem.conv``,
    block ``j`` of stage ``s`` is ``stages.{s}.{j}`` (ours ``layer{s+1}.{j}``), its projection
    ``downsample.conv`` (ours: ``downsample.1`` after a pool, ``downsample.0`` without), its
    ``skipinit_gain`` our ``merge.gain.weight``, the classifier ``head.fc``. Only the names of
    ``model``'s parameters are produced (the shapes are checked by :func:`load_timm_normfree_`)."""
    names = {}
    for ours in dict(model.named_parameters()):
        if ours.startswith("conv1."):
            names["stem.conv." + ours.split(".", 1)[1]] = ours
        elif ours.startswith("fc."):
            names["head." + ours] = ours
        else:
            stage, rest = ours.split(".", 1)
            index, rest = rest.split(".", 1)
            prefix = f"stages.{int(stage.removeprefix('layer')) - 1}.{index}."
            if rest.startswith("downsample."):
                names[prefix + "downsample.conv." + rest.rsplit(".", 1)[1]] = ours
            elif rest == "merge.gain.weight":
                names[prefix + "skipinit_gain"] = ours
            else:
                names[prefix + rest] = ours
    return names


@torch.no_grad()
def load_timm_normfree_(model: nn.Module, timm_state: dict[str, torch.Tensor]) -> nn.Module:
    """In place: ``model``'s parameters from a timm ``NormFreeNet`` state dict
    (:func:`timm_normfree_names`), each reshaped to ours (timm's conv gain is ``(C, 1, 1, 1)``, its
    SkipInit gain a 0-d tensor); every parameter of either side must be matched. Returns ``model``."""
    names = timm_normfree_names(model)
    params = dict(model.named_parameters())
    missing = sorted(set(names) - set(timm_state))
    extra = sorted(set(timm_state) - set(names))
    if missing or extra:
        raise KeyError(f"timm NormFreeNet state does not match the model: missing {missing}, unexpected {extra}")
    for theirs, ours in names.items():
        value = timm_state[theirs]
        if value.numel() != params[ours].numel():
            raise ValueError(f"{theirs} {tuple(value.shape)} does not fit {ours} {tuple(params[ours].shape)}")
        params[ours].copy_(value.reshape(params[ours].shape))
    return model
