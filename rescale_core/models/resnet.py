"""ResNets under every residual scheme: ImageNet ResNets/ResNeXts, CIFAR ResNets, Wide-ResNets
and 3D ResNets, all built from :class:`rescale_core.blocks.ResidualBlock`.

Papers: He et al. 2016 (ResNet, v1.5 stride on the 3x3 conv as torchvision); Xie et al. 2017
(ResNeXt); Zagoruyko & Komodakis 2016 (Wide-ResNet); Hara et al. 2018 (3D ResNets); Tran et al.
2018 (R3D) and Feichtenhofer et al. 2019 (SlowOnly, I3D of the SlowFast zoo) for the video
networks (:data:`VIDEO_RESNETS`); the schemes'
papers are cited in :mod:`rescale_core.schemes`. RescaleNet's network-level pieces (Shao et al.
2020, official ``models/rescale.py``): mean-shift bias after the stem conv and before global
pooling, He-gain-1 classifier, Dropout2d in stages 3-4 and dropout before the classifier.

The attribute names are torchvision's (``conv1``, ``bn1``, ``relu``, ``maxpool``,
``layer1``..``layer4``, ``fc``; ``bn1`` holds whatever the scheme puts after the stem conv), the
stem and stages are direct children in forward order, and ``out_channels_per_stage`` /
``stage_names`` are exposed, so ``torchvision.models.detection.backbone_utils.BackboneWithFPN``
wraps these networks unchanged.

:class:`ResNet` holds the reference definition (stem, stages, head) and one dispatch to its
execution plan (:mod:`rescale_core.plans`): the folded and lean plans carry RescaleNet's skip
multipliers along the stages and fold the stem's and the head's offsets
(:func:`rescale_core.plans.folded.folded_resnet`, :func:`rescale_core.plans.lean.lean_resnet`); the
frozen plan evaluates it as a plain network (:func:`rescale_core.plans.frozen.frozen_resnet`).

NF-ResNets (``Scheme.layout="preact"``, Brock et al. 2021; timm's ``NormFreeNet`` for
``nf_resnet50``): the stem is its conv (Scaled WS) and max-pool, no activation; each block receives
the analytic variance of the stream (:attr:`ResidualBlock.output_var` of the block before, 1 at the
first); the head applies ReLU (``final_act``) before global pooling. Every family builds them
(docs/nf_resnets.md).

Deviations: Wide-ResNets and CIFAR ResNets use the v1 (post-activation) block with a projection
shortcut, except under ``layout="preact"``; Wide-ResNet depth counts 6n+4 layers as in the WRN
paper, CIFAR ResNet 6n+2.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from ..blocks import ResidualBlock, check_buildable, conv_norm, scheme_conv
from ..init import init_classifier, init_stem
from ..layers import MeanShiftBias, ScalarBias, pool_nd
from ..plans.conditions import eager_while_measuring
from ..plans.dispatch import Planned, implementation
from ..registry import register_model
from ..schemes import Scheme, SchemeOptionError, get_scheme

__all__ = ["ResNetConfig", "ResNet", "resnet", "cifar_resnet", "wide_resnet", "VIDEO_RESNETS"]


@dataclass(frozen=True)
class ResNetConfig:
    block: str                             # "basic" | "bottleneck"
    layers: tuple[int, ...]                # blocks per stage
    widths: tuple[int, ...] = (64, 128, 256, 512)
    stem: str = "imagenet"                 # "imagenet": 7x7/2 + maxpool; "cifar": 3x3/1
    stem_width: int = 64
    groups: int = 1
    width_per_group: int = 64
    spatial_dims: int = 2
    # --- video networks (the defaults build the networks above unchanged) ---------------------
    stem_kernel: tuple[int, ...] | None = None  # "imagenet" stem conv (None: 7, 3D 3x7x7); padded k // 2
    stem_stride: tuple[int, ...] | None = None  # None: 2, 3D (1, 2, 2)
    stem_pool: str = "max"                      # "imagenet" stem: "max" 3/2 in every dim,
    #                                             "max_spatial" 1x3x3/(1,2,2) (SlowFast), "none" (torchvision r3d)
    temporal_stride: int = 2                    # 3D: time stride of the downsampling stages (1: space only)
    conv1_temporal: tuple[tuple[int, ...], ...] | None = None  # 3D, per stage, cycled over its blocks:
    #                                             time kernel of each block's first conv (None: its own)
    conv2_temporal: int | None = None           # 3D: time kernel of each block's second conv (None: 3)
    temporal_pool_stages: tuple[int, ...] = ()  # 3D: stages (1-based) whose input is max-pooled 2x1x1
    #                                             over time first (SlowFast's I3D pool after res2)

    def __post_init__(self) -> None:
        if self.stem_pool not in ("max", "max_spatial", "none"):
            raise ValueError(f"stem_pool={self.stem_pool!r}: expected max, max_spatial or none")
        video = (self.conv1_temporal, self.conv2_temporal, self.temporal_pool_stages,
                 self.stem_pool == "max_spatial", self.temporal_stride != 2)
        if self.spatial_dims != 3 and any(video):
            raise ValueError("temporal options (conv1_temporal, conv2_temporal, temporal_pool_stages, "
                             "stem_pool='max_spatial', temporal_stride) need spatial_dims=3")
        if self.conv1_temporal is not None and len(self.conv1_temporal) != len(self.layers):
            raise ValueError(f"conv1_temporal needs one tuple per stage ({len(self.layers)}), "
                             f"got {self.conv1_temporal!r}")

    def block_temporal_kernels(self, stage: int, j: int) -> tuple[int | None, ...] | None:
        """Time kernels of block ``j`` (0-based) of stage ``stage`` (1-based), one per conv, for
        :class:`ResidualBlock` (None: every conv its own)."""
        if self.conv1_temporal is None and self.conv2_temporal is None:
            return None
        cycle = None if self.conv1_temporal is None else self.conv1_temporal[stage - 1]
        kt1 = None if cycle is None else cycle[j % len(cycle)]  # cycled, as SlowFast's [3, 1]
        kernels = (kt1, self.conv2_temporal)
        return kernels + (None,) if self.block == "bottleneck" else kernels

    def stage_stride(self, stage: int) -> "int | tuple[int, ...]":
        if stage == 1:
            return 1
        if self.spatial_dims == 3 and self.temporal_stride != 2:
            return (self.temporal_stride, 2, 2)
        return 2


def _stem_post(scheme: Scheme, channels: int, spatial_dims: int) -> nn.Module:
    norm = conv_norm(scheme, channels, spatial_dims)
    if norm is not None:
        return norm
    if scheme.mean_shift:
        return MeanShiftBias(channels, spatial_dims, scheme.measure_batches)
    if scheme.scalar_biases:
        return ScalarBias()
    return nn.Identity()


class ResNet(Planned):
    """A ResNet whose residual blocks follow ``scheme``.

    Args:
        config: the architecture (:class:`ResNetConfig`).
        scheme: a scheme name or instance; ``scheme_options`` override its fields.
        num_classes: classifier outputs (0: no classifier, ``forward`` returns pooled features).
        in_channels: input channels (3 for RGB, 1 for digits/MNIST).
    """

    preact = False  # NF layout: the head activates the stream (final_act); what a pickled v1 model holds

    def __init__(self, config: ResNetConfig, scheme: "str | Scheme" = "bn",
                 scheme_options: dict | None = None, num_classes: int = 1000,
                 in_channels: int = 3) -> None:
        super().__init__()
        self.config = config
        self.scheme = scheme = get_scheme(scheme, **(scheme_options or {}))
        if not scheme.supports("conv"):
            raise ValueError(f"scheme {scheme.name!r} is for Transformers, not ResNets")
        check_buildable(scheme, "conv", given=scheme_options or {})
        stages = range(1, len(config.layers) + 1)
        if "conv_dropout_stages" in scheme.overrides() and not set(scheme.conv_dropout_stages) <= set(stages):
            raise SchemeOptionError("conv_dropout_stages", list(scheme.conv_dropout_stages),
                                    f"a list of this network's stages ({', '.join(map(str, stages))})", scheme.name)
        if num_classes == 0:
            given = set(scheme_options or {}) | set(scheme.overrides())
            unread = sorted({"classifier_gain", "zero_classifier"} & given)
            if unread:
                raise SchemeOptionError(unread[0], getattr(scheme, unread[0]), "an option of a network without a "
                                        "classifier (num_classes=0: it initialises the classifier only; remove it)",
                                        scheme.name)
        d = config.spatial_dims
        self.num_blocks = L = sum(config.layers)
        self._build_stem(config, scheme, in_channels)
        inplanes, k, stream_var = config.stem_width, 1, 1.0
        expansion = ResidualBlock.expansions[config.block]
        self.stage_names, self.out_channels_per_stage = [], []
        for s, (planes, n) in enumerate(zip(config.widths, config.layers), start=1):
            stride = config.stage_stride(s)
            drop = scheme.conv_dropout if s in scheme.conv_dropout_stages else 0.0
            if s in config.temporal_pool_stages:
                # SlowFast's I3D max-pools time between res2 and res3: a child of its own, registered
                # before the stage (IntermediateLayerGetter runs the children in that order), so the
                # blocks keep the 2D network's names (layer2.0 ...) for inflation
                setattr(self, f"tpool{s}", pool_nd("max", d, (2, 1, 1), (2, 1, 1)))
            blocks = []
            for j in range(n):
                blocks.append(ResidualBlock(scheme, inplanes, planes, stride if j == 0 else 1,
                                            config.block, k, L, d, config.groups,
                                            config.width_per_group, drop,
                                            config.block_temporal_kernels(s, j), stream_var))
                inplanes, k, stream_var = planes * expansion, k + 1, blocks[-1].output_var
            setattr(self, f"layer{s}", nn.Sequential(*blocks))
            self.stage_names.append(f"layer{s}")
            self.out_channels_per_stage.append(inplanes)
        self.num_features = inplanes
        # NF-ResNets: the stream is pre-activation, so the head activates it (timm's final_act)
        self.preact = scheme.layout == "preact"
        if self.preact:
            self.final_act = nn.ReLU()
        self.pool_shift = MeanShiftBias(inplanes, d, scheme.measure_batches) if scheme.mean_shift else nn.Identity()
        self.avgpool = _global_pool(d)
        self.head_norm = nn.BatchNorm1d(inplanes) if scheme.head_norm else nn.Identity()
        self.dropout = nn.Dropout(scheme.classifier_dropout) if scheme.classifier_dropout > 0 else nn.Identity()
        self.fc_bias = ScalarBias() if scheme.scalar_biases else nn.Identity()
        self.fc = nn.Linear(inplanes, num_classes) if num_classes > 0 else nn.Identity()
        if num_classes > 0:
            init_classifier(scheme, self.fc)
        self.check_scheme(scheme)

    def _build_stem(self, config: ResNetConfig, scheme: Scheme, in_channels: int) -> None:
        d, w = config.spatial_dims, config.stem_width
        bias = scheme.conv_bias and scheme.scaled_ws  # timm's NF stem conv has a bias; torchvision's none
        if config.stem == "imagenet":
            kernel = config.stem_kernel or ((3, 7, 7) if d == 3 else 7)
            stride = config.stem_stride or ((1, 2, 2) if d == 3 else 2)
            padding = kernel // 2 if isinstance(kernel, int) else tuple(k // 2 for k in kernel)
            self.conv1 = scheme_conv(scheme, d, in_channels, w, kernel, stride=stride, padding=padding, bias=bias)
        elif config.stem == "cifar":
            self.conv1 = scheme_conv(scheme, d, in_channels, w, 3, stride=1, padding=1, bias=bias)
        else:
            raise ValueError(f"unknown stem {config.stem!r}; expected imagenet or cifar")
        self.bn1 = _stem_post(scheme, w, d)
        # the NF stem ends at its conv (and pool): the first block activates its input
        self.relu = nn.Identity() if scheme.layout == "preact" else nn.ReLU(inplace=True)
        if config.stem != "imagenet" or config.stem_pool == "none":
            self.maxpool = nn.Identity()
        elif config.stem_pool == "max_spatial":  # SlowFast: pool1 1x3x3, stride (1, 2, 2)
            self.maxpool = pool_nd("max", d, (1, 3, 3), (1, 2, 2), (0, 1, 1))
        else:
            self.maxpool = pool_nd("max", d, 3, 2, 1)
        init_stem(scheme, self.conv1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return eager_while_measuring(self, self._run, x, "logits")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, "features")

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, "head")

    def stage_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The output of every stage (``layer1``..), as ``forward`` computes them (on any plan):
        what a detection backbone's FPN must see (``tasks/detection``)."""
        stages: list[torch.Tensor] = []
        eager_while_measuring(self, self._run, x, "features", stages)
        return stages

    def _run(self, x: torch.Tensor, part: str, stages: list | None = None) -> torch.Tensor:
        """``part`` of the network on ``x``: ``"logits"`` (all of it), ``"features"`` (up to
        global pooling; each stage's output appended to ``stages``) or ``"head"`` (pooling and
        classifier on features), on the model's plan."""
        if (impl := implementation(self, x)) is not None:
            return impl(self, x, part, stages)
        if part != "head":
            x = self.stem(x)
            for tpool, stage in self.stage_modules():
                x = stage(x if tpool is None else tpool(x))
                if stages is not None:
                    stages.append(x)
            if part == "features":
                return x
        return self.classify(self.pooled(x))

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))

    def stage_modules(self) -> list[tuple[nn.Module | None, nn.Sequential]]:
        """(the temporal pool in front of it or None, the stage) for ``layer1``.. in order."""
        return [(self._modules.get(f"tpool{s}"), getattr(self, name))
                for s, name in enumerate(self.stage_names, start=1)]

    def pooled(self, x: torch.Tensor) -> torch.Tensor:
        if self.preact:
            x = self.final_act(x)
        return torch.flatten(self.avgpool(self.pool_shift(x)), 1)

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        """The classifier on pooled features."""
        return self.fc(self.fc_bias(self.dropout(self.head_norm(x))))

    @property
    def out_channels(self) -> int:
        return self.num_features


def _global_pool(spatial_dims: int) -> nn.Module:
    return {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d, 3: nn.AdaptiveAvgPool3d}[spatial_dims](1)


# --- named architectures (timm style: a table of configs, thin builders) -------------------
IMAGENET_RESNETS: dict[str, ResNetConfig] = {
    "resnet18": ResNetConfig("basic", (2, 2, 2, 2)),
    "resnet34": ResNetConfig("basic", (3, 4, 6, 3)),
    "resnet50": ResNetConfig("bottleneck", (3, 4, 6, 3)),
    "resnet101": ResNetConfig("bottleneck", (3, 4, 23, 3)),
    "resnet152": ResNetConfig("bottleneck", (3, 8, 36, 3)),
    "resnet200": ResNetConfig("bottleneck", (3, 24, 36, 3)),
    "resnext50_32x4d": ResNetConfig("bottleneck", (3, 4, 6, 3), groups=32, width_per_group=4),
    "resnext101_32x8d": ResNetConfig("bottleneck", (3, 4, 23, 3), groups=32, width_per_group=8),
}

RESNETS_3D: dict[str, ResNetConfig] = {
    "resnet3d_18": ResNetConfig("basic", (2, 2, 2, 2), spatial_dims=3),
    "resnet3d_34": ResNetConfig("basic", (3, 4, 6, 3), spatial_dims=3),
    "resnet3d_50": ResNetConfig("bottleneck", (3, 4, 6, 3), spatial_dims=3),
    "resnet3d_101": ResNetConfig("bottleneck", (3, 4, 23, 3), spatial_dims=3),
}

# Video networks of the literature (family "video_resnet"; the ``resnet3d_*`` above are Hara et
# al. 2018's 3D ResNets with a 3x7x7 stem and a 3x3x3/2 max-pool, kept as they are):
# - r3d_18 / r3d_50: torchvision's ``video.r3d_18`` (Tran et al. 2018; stem 3x7x7/(1,2,2), no
#   max-pool, stages 2-4 halve T, H and W) and the same stem and strides with bottleneck blocks;
# - slow_r50: SlowOnly 8x8 R50 of the SlowFast model zoo (Feichtenhofer et al. 2019,
#   configs/Kinetics/SLOW_8x8_R50.yaml): stem 1x7x7/(1,2,2) + max-pool 1x3x3/(1,2,2), first conv
#   of every bottleneck 1x1x1 in res2/res3 and 3x1x1 in res4/res5, 1x3x3 middle conv, no
#   temporal downsampling;
# - i3d_r50: I3D 8x8 R50 of the same zoo (configs/Kinetics/I3D_8x8_R50.yaml): stem 5x7x7, first
#   conv's time kernel cycling 3 / 3,1 / 3,1 / 1,3 over each stage's blocks, 1x3x3 middle conv,
#   a 2x1x1 max-pool over time after res2 (SlowFast's ``_POOL1["i3d"]``).
# Deviation from SlowFast (all schemes): the stride sits on the 3x3 conv (ResNet v1.5, as
# SlowFast's default STRIDE_1X1: False) and the projection shortcut downsamples with a 1x1x1
# conv of stride (1, 2, 2), as there; RescaleNet's shortcut pools (1, 2, 2) first, as in 2D.
_SLOW = dict(spatial_dims=3, stem_kernel=(1, 7, 7), stem_pool="max_spatial", temporal_stride=1,
             conv2_temporal=1)
VIDEO_RESNETS: dict[str, ResNetConfig] = {
    "r3d_18": ResNetConfig("basic", (2, 2, 2, 2), spatial_dims=3, stem_pool="none"),
    "r3d_50": ResNetConfig("bottleneck", (3, 4, 6, 3), spatial_dims=3, stem_pool="none"),
    "slow_r50": ResNetConfig("bottleneck", (3, 4, 6, 3), conv1_temporal=((1,), (1,), (3,), (3,)), **_SLOW),
    "i3d_r50": ResNetConfig("bottleneck", (3, 4, 6, 3), **{**_SLOW, "stem_kernel": (5, 7, 7)},
                            conv1_temporal=((3,), (3, 1), (3, 1), (1, 3)), temporal_pool_stages=(2,)),
}

# The papers' names: (model name, architecture, scheme)
PAPER_MODELS = [
    ("rescale18", "resnet18", "rescale"), ("rescale34", "resnet34", "rescale"),
    ("rescale50", "resnet50", "rescale"), ("rescale101", "resnet101", "rescale"),
    ("rescale152", "resnet152", "rescale"), ("rescale200", "resnet200", "rescale"),
    ("rescalex50_32x4d", "resnext50_32x4d", "rescale"),
    ("rescalex101_32x8d", "resnext101_32x8d", "rescale"),
    ("fixup50", "resnet50", "fixup"), ("fixup101", "resnet101", "fixup"),
    ("skipinit50", "resnet50", "skipinit"), ("skipinit101", "resnet101", "skipinit"),
    ("rezero50", "resnet50", "rezero"),
    ("rescale3d_50", "resnet3d_50", "rescale"),
    ("rescale_r3d_18", "r3d_18", "rescale"), ("rescale_r3d_50", "r3d_50", "rescale"),
    ("rescale_slow_r50", "slow_r50", "rescale"), ("rescale_i3d_r50", "i3d_r50", "rescale"),
]


def resnet(arch: str = "resnet50", scheme: "str | Scheme" = "bn", width: int = 1,
           base_width: int | None = None, **kwargs) -> ResNet:
    """An ImageNet-style ResNet/ResNeXt, 3D ResNet or video ResNet by name. ``width`` multiplies
    every stage's width; ``base_width`` rescales them so that stage 1 has ``base_width`` planes
    (tiny models). SlowFast's dropout 0.5 before the classifier is a scheme field:
    ``scheme_options={"classifier_dropout": 0.5}`` (in a run config:
    ``model.init_args.scheme_options: {classifier_dropout: 0.5}``)."""
    cfg = {**IMAGENET_RESNETS, **RESNETS_3D, **VIDEO_RESNETS}[arch]
    if base_width is not None:
        f = base_width / cfg.widths[0]
        cfg = replace(cfg, widths=tuple(max(1, int(w * f)) for w in cfg.widths), stem_width=base_width)
    if width != 1:
        cfg = replace(cfg, widths=tuple(w * width for w in cfg.widths))
    return ResNet(cfg, scheme, **kwargs)


def cifar_resnet(depth: int = 20, scheme: "str | Scheme" = "bn", base_width: int = 16, **kwargs) -> ResNet:
    """He et al. 2016's CIFAR ResNet: depth 6n+2, three stages of n basic blocks (16/32/64)."""
    if (depth - 2) % 6 or depth < 8:
        raise ValueError(f"CIFAR ResNet depth must be 6n+2 with n >= 1 (8, 20, 32, 44, 56, 110, ...), got {depth}")
    n = (depth - 2) // 6
    w = base_width
    cfg = ResNetConfig("basic", (n, n, n), (w, 2 * w, 4 * w), stem="cifar", stem_width=w)
    return ResNet(cfg, scheme, **kwargs)


def wide_resnet(depth: int = 16, width: int = 4, scheme: "str | Scheme" = "bn",
                base_width: int = 16, **kwargs) -> ResNet:
    """Wide-ResNet depth-width (Zagoruyko & Komodakis 2016): depth 6n+4, stages of n basic blocks
    with 16k/32k/64k channels; e.g. 16-4, 28-10, 100-2 and SkipInit's 1000-2."""
    if (depth - 4) % 6 or depth < 10:
        raise ValueError(f"Wide-ResNet depth must be 6n+4 with n >= 1 (10, 16, 28, 40, 100, 1000, ...), got {depth}")
    n = (depth - 4) // 6
    w = base_width
    cfg = ResNetConfig("basic", (n, n, n), (w * width, 2 * w * width, 4 * w * width),
                       stem="cifar", stem_width=w)
    return ResNet(cfg, scheme, **kwargs)


def _register() -> None:
    for arch in IMAGENET_RESNETS:
        register_model(arch, resnet, "resnet", arch=arch)
    for arch in RESNETS_3D:
        register_model(arch, resnet, "resnet3d", arch=arch)
    for arch in VIDEO_RESNETS:
        register_model(arch, resnet, "video_resnet", arch=arch)
    for name, arch, scheme in PAPER_MODELS:
        family = "resnet3d" if arch in RESNETS_3D else "video_resnet" if arch in VIDEO_RESNETS else "resnet"
        register_model(name, resnet, family, arch=arch, scheme=scheme)
    register_model("cifar_resnet", cifar_resnet, "cifar_resnet")
    register_model("wide_resnet", wide_resnet, "wide_resnet")


_register()
