"""VGG-11/16/19 (Simonyan & Zisserman 2015) with BatchNorm, without normalisation, and as
RescaleNet's normalisation-free VGG (Shao et al. 2020, Sec. 5.1: mean-shift biases before every
conv and linear layer; 25.0% top-1 error for VGG-19).

Attribute names follow torchvision (``features``, ``avgpool``, ``classifier``), so a ``bn`` VGG
loads torchvision's ``vgg*_bn`` state dicts. VGG has no residual blocks: only the schemes
``bn``, ``none`` and ``rescale`` (its mean-shift biases and He init) apply.
Deviation: the classifier width (4096) and stage-1 width (64) are arguments, for small tests.

``forward`` runs a fast path (``fused``; :mod:`rescale_core.fastpath`): each mean-shift bias of
the conv stack crosses the ReLU (and max-pool) before it into the previous conv's bias,
``maxpool(relu(z)) + e = maxpool(max(z + e, e))``; ``fused = False`` gives the reference, as
does a scheme the fast path does not implement (:func:`rescale_core.fastpath.implements`).
"""
from __future__ import annotations

import torch
from torch import nn

from .. import fastpath as fp
from .. import plans
from ..init import he_normal_
from ..layers import MeanShiftBias
from ..registry import register_model
from ..schemes import Scheme, get_scheme

__all__ = ["VGG", "vgg"]

VGG_CONFIGS: dict[str, list] = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "vgg19": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
              512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}
VGG_SCHEMES = ("bn", "none", "rescale")


class VGG(nn.Module):
    # Whether the fast path implements this module's scheme (fastpath.IMPLEMENTED_FIELDS), set at
    # construction; ``fused = True`` does not override it. The class default: modules pickled
    # before the check, which ran the fast path.
    _fast_ok = True
    plan = "auto"  # the execution plan (rescale_core.plans): auto | lean | folded

    def __init__(self, arch: str = "vgg16", scheme: "str | Scheme" = "bn",
                 scheme_options: dict | None = None, num_classes: int = 1000,
                 in_channels: int = 3, base_width: int = 64, hidden_dim: int = 4096,
                 dropout: float = 0.5) -> None:
        super().__init__()
        self.scheme = scheme = get_scheme(scheme, **(scheme_options or {}))
        if scheme.name not in VGG_SCHEMES:
            raise ValueError(f"VGG supports the schemes {VGG_SCHEMES}, not {scheme.name!r}")
        f = base_width / 64
        layers: list[nn.Module] = []
        c = in_channels
        for v in VGG_CONFIGS[arch]:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
                continue
            v = max(1, int(v * f))
            if scheme.mean_shift:
                layers.append(MeanShiftBias(c, 2, scheme.measure_batches))
            conv = nn.Conv2d(c, v, 3, padding=1, bias=scheme.norm is None and not scheme.mean_shift)
            he_normal_(conv.weight, "fan_out" if scheme.norm else "fan_in")
            if conv.bias is not None:
                nn.init.zeros_(conv.bias)
            layers.append(conv)
            if scheme.norm == "bn":
                layers.append(nn.BatchNorm2d(v))
            layers.append(nn.ReLU(inplace=True))
            c = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        head: list[nn.Module] = []
        dims = [c * 49, hidden_dim, hidden_dim]
        for i in range(2):
            if scheme.mean_shift:
                head.append(MeanShiftBias(dims[i], 0, scheme.measure_batches))
            head += [nn.Linear(dims[i], dims[i + 1]), nn.ReLU(inplace=True), nn.Dropout(dropout)]
        if scheme.mean_shift:
            head.append(MeanShiftBias(hidden_dim, 0, scheme.measure_batches))
        head.append(nn.Linear(hidden_dim, num_classes))
        self.classifier = nn.Sequential(*head)
        for m in self.classifier:
            if isinstance(m, nn.Linear):
                gain = 1.0 if m.out_features == num_classes else 2 ** 0.5
                if scheme.mean_shift:
                    he_normal_(m.weight, "fan_in", gain=gain)
                else:  # torchvision's VGG init
                    nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)
        # fast path (same function) only for a scheme it implements; False: the reference path
        self.fused = self._fast_ok = fp.implements(scheme)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp.eager_while_measuring(self, self._forward, x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.fused and self._fast_ok and not fp._global_hooks() and plans.wants_lean(self, x)
                and not fp.measuring_step(self) and not fp.has_hooks_in(self)):
            return self._forward_lean(x)
        if self.fused and self._fast_ok and not fp.has_hooks_in(self.features):
            x = self._features_fused(x)
        else:
            x = self.features(x)
        return self.classifier(torch.flatten(self.avgpool(x), 1))

    def _forward_lean(self, x: torch.Tensor) -> torch.Tensor:
        """The lean plan (:mod:`rescale_core.plans`): every mean-shift offset of the network
        computed in one pass, each then one add in front of its conv or linear layer."""
        table = plans.cached_on(self, lambda: fp._module_tree_version, lambda: plans.LeanTerms(
            [(m, 1.0) for m in self.modules() if isinstance(m, MeanShiftBias)]))
        terms = table.values(plans.activation_dtype(x))
        for seq in (self.features, None, self.classifier):
            if seq is None:
                x = torch.flatten(self.avgpool(x), 1)
                continue
            for m in seq:
                x = x + terms[m] if isinstance(m, MeanShiftBias) else m(x)
        return x

    def _features_fused(self, x: torch.Tensor) -> torch.Tensor:
        mods = list(self.features)
        i = 0
        while i < len(mods):
            m = mods[i]
            if isinstance(m, nn.Conv2d) and i + 1 < len(mods) and isinstance(mods[i + 1], nn.ReLU):
                k = i + 2 + (i + 2 < len(mods) and isinstance(mods[i + 2], nn.MaxPool2d))
                nxt = mods[k] if k < len(mods) else None
                if isinstance(nxt, MeanShiftBias) and not nxt.updating:
                    e = nxt.offset()
                    bias = fp.add_bias(m.bias, e.detach())
                    x = fp.shifted_relu(m._conv_forward(x, m.weight, fp.conv_bias(bias, m.out_channels)), e)
                    if k == i + 3:
                        x = mods[i + 2](x)
                    i = k + 1
                    continue
                x = torch.relu_(m(x))
                i += 2
                continue
            x = m(x)
            i += 1
        return x


def vgg(arch: str = "vgg16", scheme: "str | Scheme" = "bn", **kwargs) -> VGG:
    return VGG(arch, scheme, **kwargs)


for _arch in VGG_CONFIGS:
    register_model(_arch, vgg, "vgg", arch=_arch)
    register_model(f"{_arch}_bn", vgg, "vgg", arch=_arch, scheme="bn")
    register_model(f"{_arch}_rescale", vgg, "vgg", arch=_arch, scheme="rescale")
