"""Optimizer parameter groups: no weight decay on scalars and biases, per-scheme lr factors.

RescaleNet (Shao et al. 2020, Sec. 5): weight decay 1e-4 on conv/linear weights, 0 on the learned
scalar multipliers and the (mean-shift) biases. Fixup (Zhang et al. 2019, official ImageNet code):
scalar multipliers and scalar biases trained at lr/10 (``Scheme.scalar_lr_factor``).
"""
from __future__ import annotations

from torch import nn

from .layers import Gain, MeanShiftBias, PointwiseNorm, ScalarBias
from .schemes import Scheme

__all__ = ["param_groups"]

_NORMS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def param_groups(model: nn.Module, weight_decay: float = 1e-4, lr: float = 0.1,
                 norm_weight_decay: float | None = None) -> list[dict]:
    """Split ``model``'s trainable parameters into optimizer groups.

    Groups (empty ones dropped), each with ``name``, ``params``, ``lr``, ``weight_decay`` and
    ``lr_factor``:

    - ``weights``: conv/linear weights (ndim > 1): ``weight_decay``;
    - ``norm``: norm-layer affine weights, and the per-feature ``weight`` of DyT's and Derf's
      pointwise layers, which stand in for a norm's: ``norm_weight_decay`` (default:
      ``weight_decay``, as the torchvision ResNet recipe);
    - ``biases``: every other 1-D parameter (conv/linear/norm biases, mean-shift biases, a
      pointwise layer's ``alpha`` and ``shift``): no decay;
    - ``scalars``: gains and scalar biases: no decay, lr x the scheme's ``scalar_lr_factor`` (the
      scheme of ``model``, or of the networks inside it: a wrapper, a detector's backbone).
    """
    scalar_factor = _scalar_lr_factor(model)
    norm_wd = weight_decay if norm_weight_decay is None else norm_weight_decay
    buckets: dict[str, list] = {"weights": [], "norm": [], "biases": [], "scalars": []}
    seen: set[int] = set()
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            if isinstance(module, (Gain, ScalarBias)):
                buckets["scalars"].append(p)
            elif isinstance(module, PointwiseNorm) and pname == "weight":  # DyT's / Derf's per-feature scale
                buckets["norm"].append(p)
            elif isinstance(module, MeanShiftBias) or pname == "bias" or p.ndim <= 1 and not isinstance(module, _NORMS):
                buckets["biases"].append(p)
            elif isinstance(module, _NORMS):
                buckets["norm"].append(p)
            else:
                buckets["weights"].append(p)
    settings = {"weights": (weight_decay, 1.0), "norm": (norm_wd, 1.0), "biases": (0.0, 1.0),
                "scalars": (0.0, scalar_factor)}
    return [{"name": name, "params": params, "weight_decay": settings[name][0],
             "lr": lr * settings[name][1], "lr_factor": settings[name][1]}
            for name, params in buckets.items() if params]


def _scalar_lr_factor(model: nn.Module) -> float:
    """The ``scalar_lr_factor`` of the schemes of ``model`` and the modules inside it (1 without
    one); a ValueError where two of them ask for other factors (one group cannot hold both)."""
    factors = {getattr(m.scheme, "scalar_lr_factor", 1.0) for m in model.modules()
               if isinstance(getattr(m, "scheme", None), Scheme)}
    if len(factors) > 1:
        raise ValueError(f"the networks in this model ask for scalar learning-rate factors {sorted(factors)}; "
                         "build one optimizer group per network (param_groups of each)")
    return factors.pop() if factors else 1.0

