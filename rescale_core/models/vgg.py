"""VGG-11/16/19 (Simonyan & Zisserman 2015) with BatchNorm, without normalisation, and as
RescaleNet's normalisation-free VGG (Shao et al. 2020, Sec. 5.1: mean-shift biases before every
conv and linear layer; 25.0% top-1 error for VGG-19).

Attribute names follow torchvision (``features``, ``avgpool``, ``classifier``), so a ``bn`` VGG
loads torchvision's ``vgg*_bn`` state dicts. VGG has no residual blocks: only the schemes
``bn``, ``none`` and ``rescale`` (its mean-shift biases and He init) apply, and of their options
only ``norm`` (``bn`` or none), ``mean_shift`` and ``measure_batches``; VGG refuses the others, and
a scheme of another name whose fields outside these three are not those of one of the three
(a data-only variant of ``rescale`` with other ``measure_batches`` builds; ``skipinit`` does not).
Deviation: the classifier width (4096) and stage-1 width (64) are arguments, for small tests.
Deviations of ``rescale`` from the official code (hukkai/rescaling ``models/vgg.py``): the convs are
He-initialised fan-in (there fan-out, as every linear layer, the last one too, at gain sqrt(2));
the classifier's hidden layers He fan-in at gain sqrt(2) and its last at gain 1; a mean-shift bias
also before the first conv (on the image), and before the first linear layer one per flattened
feature where the official code has one per channel.

:class:`VGG` holds the reference definition and one dispatch to its execution plan
(:mod:`rescale_core.plans`): the folded plan moves each mean-shift bias of the conv stack across
the ReLU (and max-pool) before it into the previous conv's bias (:func:`rescale_core.plans.folded.folded_vgg`),
the lean plan computes every offset in one pass (:func:`rescale_core.plans.lean.lean_vgg`), the
frozen plan evaluates a plain network (:func:`rescale_core.plans.frozen.frozen_vgg`).
"""
from __future__ import annotations

import torch
from torch import nn

from ..init import he_normal_
from ..layers import MeanShiftBias
from ..plans.conditions import eager_while_measuring
from ..plans.dispatch import Planned, implementation
from ..registry import register_model
from ..schemes import Scheme, SchemeOptionError, get_scheme, list_schemes, shown

__all__ = ["VGG", "vgg"]

VGG_CONFIGS: dict[str, list] = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "vgg19": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
              512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}
#: the schemes VGG was written for: VGG builds a scheme whose every field outside
#: :data:`VGG_OPTIONS` is as one of their definitions sets it, whatever its name (a data-only variant
#: of ``rescale`` registered under another name included)
VGG_SCHEMES = ("bn", "none", "rescale")
#: the scheme options VGG builds: a BatchNorm after each conv or none, the mean-shift biases and the
#: batches they average; the others shape residual blocks, which VGG has not
VGG_OPTIONS = ("norm", "mean_shift", "measure_batches")
_READS = 'it reads only norm: "bn" or null, mean_shift and measure_batches'


def _unbuilt_field(scheme: Scheme) -> "tuple[str, Scheme] | None":
    """The first field of ``scheme`` that VGG cannot build and the scheme of :data:`VGG_SCHEMES`
    it is closest to (the fewest fields outside :data:`VGG_OPTIONS` unlike its definition; a field
    of a ``Scheme`` subclass unlike its default); None where VGG builds it."""
    unlike = {name: [key for key in scheme.unlike(get_scheme(name)) if key not in VGG_OPTIONS]
              for name in VGG_SCHEMES}
    nearest = min(VGG_SCHEMES, key=lambda name: len(unlike[name]))
    return (unlike[nearest][0], get_scheme(nearest)) if unlike[nearest] else None


class VGG(Planned):
    def __init__(self, arch: str = "vgg16", scheme: "str | Scheme" = "bn",
                 scheme_options: dict | None = None, num_classes: int = 1000,
                 in_channels: int = 3, base_width: int = 64, hidden_dim: int = 4096,
                 dropout: float = 0.5) -> None:
        super().__init__()
        self.scheme = scheme = get_scheme(scheme, **(scheme_options or {}))
        if not scheme.supports("conv"):
            raise ValueError(f"scheme {scheme.name!r} is for Transformers, not VGG")
        # the options set off a registered scheme's definition (an unregistered one is its fields)
        unread = sorted(set(scheme.overrides()) - set(VGG_OPTIONS)) if scheme.name in list_schemes() else []
        if unread:
            raise SchemeOptionError(unread[0], getattr(scheme, unread[0]), f"an option VGG builds ({_READS})",
                                    scheme.name)
        if (unbuilt := _unbuilt_field(scheme)) is not None:
            field, nearest = unbuilt
            # a field of a Scheme subclass that the nearest lacks: the subclass's default, as Scheme.unlike reads it
            built = getattr(nearest, field) if hasattr(nearest, field) else getattr(type(scheme)(nearest.name), field)
            raise ValueError(f"VGG cannot build scheme {scheme.name!r}: its {field} {shown(getattr(scheme, field))} "
                             f"is not the {shown(built)} of {nearest.name}, the closest of "
                             f"the schemes VGG builds ({', '.join(VGG_SCHEMES)}; VGG has no residual blocks: {_READS}, "
                             "and every other field as one of those schemes sets it)")
        if scheme.norm not in (None, "bn"):
            raise SchemeOptionError("norm", scheme.norm, 'a norm VGG builds ("bn" or null)', scheme.name)
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
        self.check_scheme(scheme)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return eager_while_measuring(self, self._run, x)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        if (impl := implementation(self, x)) is not None:
            return impl(self, x)
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def vgg(arch: str = "vgg16", scheme: "str | Scheme" = "bn", **kwargs) -> VGG:
    return VGG(arch, scheme, **kwargs)


for _arch in VGG_CONFIGS:
    register_model(_arch, vgg, "vgg", arch=_arch)
    register_model(f"{_arch}_bn", vgg, "vgg", arch=_arch, scheme="bn")
    register_model(f"{_arch}_rescale", vgg, "vgg", arch=_arch, scheme="rescale")
