"""The one residual block every scheme and family uses, and the merge it asks its scheme for
(ResNet v1 blocks of He et al. 2016; merge rules of Shao et al. 2020, De & Smith 2020 and
Zhang et al. 2019).

- :class:`ResidualMerge`: ``block_scale * (skip_scale * s + branch_scale * gain * f + bias)``.
  The analysis probe hooks this module: its two inputs are the skip and branch terms.
- :class:`ResidualBlock`: basic (2 convs) or bottleneck (3 convs) branch, 1D/2D/3D, projection
  shortcut, in the ResNet v1 layout or NF-ResNet's pre-activation one (``Scheme.layout``,
  Brock et al. 2021); attribute names follow torchvision (``conv1``, ``bn1``, ..., ``downsample``) so a
  ``bn`` ResNet loads torchvision's state dicts and torchvision's FPN/detectors wrap it.
  Pre-conv biases (mean-shift or Fixup scalars) are ``shift1``..``shiftm``. Those names are the
  state dict's; code reads the branch through :meth:`ResidualBlock.branch_layers` (one
  :class:`BranchLayer` per convolution, in forward order), the contract every plan unpacks.
- :class:`ResidualSublayer`: the Transformer sublayer (attention or feed-forward branch)
  under post-LN, pre-LN, ``rescale``, ``rezero`` or ``skipinit``; :func:`share_layer_gain` gives
  the sublayers of one Transformer layer one gain (``Scheme.layer_gain``, ReZero's).

Each holds its reference definition (``_forward_reference``: the plain layer-by-layer code)
and one dispatch to its execution plan (:mod:`rescale_core.plans`): the folded, lean and frozen
plans compute the same function with fewer ops, in :mod:`rescale_core.plans.folded`,
:mod:`rescale_core.plans.lean` and :mod:`rescale_core.plans.frozen`.

Deviations from the official code: RescaleNet's official init multiplier uses ``k - 1 + L`` where
the formula it implements (rebuttal [R4]) has ``k + L``; we follow the formula, so that
``alpha_k^2 + beta_k^2 = 1`` holds exactly at init. Fixup's official downsample shares the branch's
first scalar bias; ours has its own. CIFAR ResNets use projection (option B) shortcuts.
"""
from __future__ import annotations

import functools
from typing import Iterable, NamedTuple

import torch
from torch import nn

from .init import TransformerStack, init_branch, init_shortcut, init_transformer_branch, rescale_conv_multiplier
from .layers import (RELU_GAMMA, Gain, MeanShiftBias, ScalarBias, StridedAvgPool, channel_shape, conv_nd,
                     drop_path, dropout_nd, make_norm, scaled_std_conv_nd)
from .plans.dispatch import Planned, implementation
from .schemes import FIELD_READERS, GAIN_INIT_WITHOUT_GAIN, Scheme, SchemeOptionError, get_scheme, list_schemes

__all__ = ["ResidualMerge", "BranchLayer", "ResidualBlock", "ResidualSublayer", "pre_conv_bias", "scheme_conv",
           "conv_norm", "check_buildable", "share_layer_gain", "CONV_NORMS"]

#: the norm layers a conv network can put after its convolutions (``Scheme.norm``)
CONV_NORMS = ("bn", "gn", "dyt", "derf")
#: what each kind of network builds of ``Scheme.norm`` and applies of ``Scheme.init``
_BUILDS = {"conv": ("a conv network", CONV_NORMS, ("he_fan_out", "he_fan_in", "rescale", "fixup", "nf")),
           "transformer": ("a Transformer", ("ln", "dyt", "derf"),
                           ("he_fan_out", "he_fan_in", "rescale", "deepnorm", "tfixup"))}
#: the networks of each family, as the refusal of a field they alone read names them
_NETWORKS = {"conv": "conv networks", "transformer": "Transformers"}
#: the conv networks' He inits: a Transformer reads neither (its sublayers keep fairseq's Xavier init)
_HE_INITS = ("he_fan_out", "he_fan_in")


def check_buildable(scheme: Scheme, family: str, given: Iterable[str] = ()) -> None:
    """Refuse, in one :class:`~.schemes.SchemeOptionError`, a ``norm`` that a network of ``family``
    (``conv`` or ``transformer``) cannot build, an ``init`` it cannot apply, or an option only the
    other family reads, set off the scheme's definition or named in ``given`` (the options the
    caller was given), or one :data:`~.schemes.FIELD_READERS` does not classify."""
    network, norms, inits = _BUILDS[family]
    given = set(given) | set(scheme.overrides())
    unclassified = sorted(given - set(FIELD_READERS))
    if unclassified:
        raise SchemeOptionError(unclassified[0], getattr(scheme, unclassified[0]), "a field "
                                "rescale_core.schemes.FIELD_READERS classifies (add it there with the networks that "
                                'read it: "conv", "transformer" or both)', scheme.name)
    unread = sorted(key for key in given if family not in FIELD_READERS[key])
    if unread:
        reader = " and ".join(_NETWORKS[f] for f in sorted(FIELD_READERS[unread[0]]))
        raise SchemeOptionError(unread[0], getattr(scheme, unread[0]), f"an option of {network} (it shapes "
                                f"{reader} only: remove it)", scheme.name)
    if scheme.norm is not None and scheme.norm not in norms:
        raise SchemeOptionError("norm", scheme.norm, f"a norm {network} builds (one of {_listed(norms)} or null)",
                                scheme.name)
    if "gain_init" in given and scheme.gain is None:
        raise SchemeOptionError("gain_init", scheme.gain_init, GAIN_INIT_WITHOUT_GAIN, scheme.name)
    if family == "transformer" and scheme.layout != "v1":
        raise SchemeOptionError("layout", scheme.layout, 'a layout a Transformer builds ("v1": norm_position places '
                                "its norms)", scheme.name)
    if scheme.init not in inits:
        raise SchemeOptionError("init", scheme.init, f"an init {network} applies (one of {_listed(inits)})",
                                scheme.name)
    if family == "transformer" and scheme.init in _HE_INITS:
        base_init = (get_scheme(scheme.name) if scheme.name in list_schemes() else Scheme(scheme.name)).init
        if base_init in _HE_INITS and base_init != scheme.init:
            raise SchemeOptionError("init", scheme.init, f"an init that changes a Transformer of scheme {scheme.name} "
                                    f'(its own "{base_init}" and "{scheme.init}" both keep fairseq\'s Xavier '
                                    "init: remove it)", scheme.name)


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(f'"{v}"' for v in values)


class ResidualMerge(nn.Module):
    """Mixes the skip path and the branch of block ``k`` of ``L`` as its scheme says."""

    def __init__(self, scheme: Scheme, k: int, L: int, channel_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.k, self.L = k, L
        self.skip_scale = scheme.block_scale * scheme.skip_scale(k, L)
        self.branch_scale = scheme.block_scale * scheme.branch_scale(k, L)
        self.gain = None
        if scheme.gain is not None:
            self.gain = Gain(scheme.gain_init, channel_shape if scheme.gain == "vector" else (1,))
        # Fixup's scalar bias after the multiplier (a Scheme refuses it beside a block_scale other than 1)
        self.bias = ScalarBias() if scheme.scalar_biases else None

    def skip_term(self, skip: torch.Tensor) -> torch.Tensor:
        return skip if self.skip_scale == 1.0 else skip * self.skip_scale

    def branch_term(self, branch: torch.Tensor) -> torch.Tensor:
        if self.gain is not None:
            out = self.gain(branch, self.branch_scale)
        elif self.branch_scale != 1.0:
            out = branch * self.branch_scale
        else:
            out = branch
        if self.bias is not None:
            out = self.bias(out)
        return out

    def forward(self, skip: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        # alpha * skip folded into the add: one kernel, whatever the scheme
        return torch.add(self.branch_term(branch), skip, alpha=self.skip_scale)

    @staticmethod
    def result_dtype(branch: torch.Tensor, skip: torch.Tensor) -> torch.dtype:
        """The dtype :meth:`forward` returns: the promotion of its two inputs (the gain and bias
        act in the branch's dtype). Under autocast a ResNet's stream stays bf16, as a BN
        ResNet's does; a Transformer's stays float32 (float32 embeddings plus bf16 branches)."""
        return torch.promote_types(branch.dtype, skip.dtype)

    def extra_repr(self) -> str:
        return f"k={self.k}, L={self.L}, skip_scale={self.skip_scale:.4f}, branch_scale={self.branch_scale:.4f}"


def _strided(stride) -> bool:
    """Whether a stride (an int, or one per spatial dim) downsamples at all."""
    return any(s != 1 for s in stride) if isinstance(stride, (tuple, list)) else stride != 1


def scheme_conv(scheme: Scheme, spatial_dims: int, *args, **kwargs) -> nn.Module:
    """A convolution as ``scheme`` builds them: :func:`~.layers.conv_nd`, or under ``scaled_ws`` a
    Scaled Weight Standardized one with ReLU's gamma folded in (Brock et al. 2021, Sec. 4.2; as
    timm's ``NormFreeNet``, every conv of the network gets gamma, the stem's included)."""
    if scheme.scaled_ws:
        return scaled_std_conv_nd(spatial_dims, *args, gamma=RELU_GAMMA, **kwargs)
    return conv_nd(spatial_dims, *args, **kwargs)


def pre_conv_bias(scheme: Scheme, channels: int, spatial_dims: int) -> nn.Module:
    """What a scheme puts in front of a convolution: mean-shift bias, Fixup scalar, or nothing."""
    if scheme.mean_shift:
        return MeanShiftBias(channels, spatial_dims, scheme.measure_batches)
    if scheme.scalar_biases:
        return ScalarBias()
    return nn.Identity()


def conv_norm(scheme: Scheme, channels: int, spatial_dims: int) -> "nn.Module | None":
    """The norm layer a conv network puts after a convolution under ``scheme``: BatchNorm,
    GroupNorm, or DyT's pointwise layer in BatchNorm's place (``norm="dyt"``, alpha's init
    ``norm_alpha``); None without one."""
    if scheme.norm in CONV_NORMS:
        return make_norm(scheme.norm, channels, spatial_dims, alpha_init=scheme.norm_alpha)
    return None


def _post_conv(scheme: Scheme, channels: int, spatial_dims: int, last: bool) -> nn.Module:
    """After a branch conv: its norm layer, or Fixup's pre-activation scalar bias."""
    norm = conv_norm(scheme, channels, spatial_dims)
    if norm is not None:
        return norm
    if scheme.scalar_biases and not last:
        return ScalarBias()
    return nn.Identity()


class BranchLayer(NamedTuple):
    """One layer of a residual block's branch: ``post(drop(conv(shift(x))))``, followed by the
    block's ReLU unless it is the branch's last. Every plan unpacks exactly these fields
    (``for shift, conv, post in block.branch_layers()``), so a field added here fails, loudly,
    in each plan until it computes the new layer."""

    shift: nn.Module  # before the conv: MeanShiftBias, Fixup's ScalarBias or Identity
    conv: nn.Module
    post: nn.Module   # after it: the norm layer, Fixup's pre-activation ScalarBias or Identity


class ResidualBlock(Planned):
    """``relu(merge(shortcut(x), F(x)))`` with F a basic or bottleneck branch (``layout="v1"``), or
    NF-ResNet's pre-activation block ``merge(shortcut, F(h))``, ``h = relu(x) / beta`` with the
    shortcut ``x`` or, on a transition (projection) block, ``downsample(h)`` (``layout="preact"``,
    Brock et al. 2021, Sec. 3 and Fig. 2; timm's ``NormFreeBlock``; docs/nf_resnets.md).

    Args:
        scheme: the residual scheme.
        in_channels, planes: input channels and branch width (output = planes * expansion).
        stride: stride of the block (on the 3x3 conv, as torchvision's ResNet v1.5).
        kind: "basic" (3x3, 3x3; expansion 1) or "bottleneck" (1x1, 3x3, 1x1; expansion 4).
        k, L: this block's 1-based index among the network's L residual blocks (they set the
            stochastic-depth rate, ``scheme.stochdepth_rate * (k - 1) / L``: :attr:`drop_rate`).
        spatial_dims: 2 for images, 3 for video.
        groups, base_width: ResNeXt cardinality and width per group.
        conv_dropout: dropout after every branch conv (RescaleNet's Dropout2d/3d); None: the
            scheme's ``conv_dropout`` (a network passes each stage's: 0 outside
            ``conv_dropout_stages``).
        temporal_kernels: 3D only, one entry per branch conv (None entries, or None: the conv's
            own size, 3 or 1): its kernel along time, padded by ``kt // 2`` (SlowOnly's
            ``kt x 1 x 1`` first conv and ``1 x 3 x 3`` middle conv, Feichtenhofer et al. 2019).
            ``stride`` may be a tuple per dim, e.g. ``(1, 2, 2)``: no temporal downsampling.
            The folded plan folds an input offset only into convs without padding, so a padded
            ``3 x 1 x 1`` conv gets it added to its input, as the reference does.
        input_var: ``layout="preact"``: the analytic variance ``beta^2`` of the stream entering
            the block (the model chains :attr:`output_var`); ignored in the v1 layout.
    """

    expansions = {"basic": 1, "bottleneck": 4}
    # the v1 layout's values: what a block built (or pickled) without the NF layout holds
    preact = False
    input_var = input_scale = output_var = 1.0
    # stochastic depth: the rate this block drops its branch at in training (what a block pickled
    # before the option holds: none)
    drop_rate = 0.0
    drop_scale = True

    def __init__(self, scheme: Scheme, in_channels: int, planes: int, stride: "int | tuple[int, ...]" = 1,
                 kind: str = "basic", k: int = 1, L: int = 1, spatial_dims: int = 2,
                 groups: int = 1, base_width: int = 64, conv_dropout: float | None = None,
                 temporal_kernels: "tuple[int | None, ...] | None" = None,
                 input_var: float = 1.0) -> None:
        super().__init__()
        check_buildable(scheme, "conv")
        conv_dropout = scheme.conv_dropout if conv_dropout is None else conv_dropout
        if kind not in self.expansions:
            raise ValueError(f"unknown block kind {kind!r}; expected basic or bottleneck")
        self.kind, self.k, self.L = kind, k, L
        # the official NF-ResNet rule (deepmind-research nfnets, nf_resnet.py): the overall block
        # index over the number of blocks, 0 for the first block (docs/nf_resnets.md)
        self.drop_rate = scheme.stochdepth_rate * (k - 1) / L
        self.drop_scale = scheme.stochdepth_scale
        self.preact = scheme.layout == "preact"
        out_channels = planes * self.expansions[kind]
        if kind == "basic":
            if groups != 1 or base_width != 64:
                raise ValueError("basic blocks support only groups=1 and base_width=64")
            specs = [(in_channels, planes, 3, stride, 1), (planes, planes, 3, 1, 1)]
        else:
            width = int(planes * (base_width / 64.0)) * groups
            if width < 1:
                raise ValueError(f"bottleneck width int({planes} * {base_width} / 64) * {groups} is 0: "
                                 "planes too small for this width per group (use a larger base_width)")
            specs = [(in_channels, width, 1, 1, 1), (width, width, 3, stride, groups),
                     (width, out_channels, 1, 1, 1)]
        self.num_convs = m = len(specs)
        if temporal_kernels is not None and (spatial_dims != 3 or len(temporal_kernels) != m):
            raise ValueError(f"temporal_kernels needs spatial_dims=3 and one entry per conv ({m}), "
                             f"got {temporal_kernels!r} with spatial_dims={spatial_dims}")
        convs, norms = [], []
        for i, (cin, cout, ks, s, g) in enumerate(specs, start=1):
            setattr(self, f"shift{i}", pre_conv_bias(scheme, cin, spatial_dims))
            kt = None if temporal_kernels is None else temporal_kernels[i - 1]
            # an int kernel where the default applies: the very modules (and init) of before
            ks = ks if kt is None else (kt, ks, ks)
            padding = ks // 2 if isinstance(ks, int) else tuple(k // 2 for k in ks)
            conv = scheme_conv(scheme, spatial_dims, cin, cout, ks, stride=s, padding=padding, groups=g,
                               bias=scheme.conv_bias)
            setattr(self, f"conv{i}", conv)
            norm = _post_conv(scheme, cout, spatial_dims, last=i == m)
            setattr(self, f"bn{i}", norm)
            convs.append(conv)
            norms.append(norm)
        self.drop = dropout_nd(conv_dropout, spatial_dims)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if _strided(stride) or in_channels != out_channels:
            self.downsample = self._shortcut(scheme, in_channels, out_channels, stride, spatial_dims)
        self.merge = ResidualMerge(scheme, k, L, channel_shape(out_channels, spatial_dims))
        self.merge_norm = make_norm("bn", out_channels, spatial_dims) if scheme.merge_norm else nn.Identity()
        # NF-ResNet (Brock et al. 2021, Sec. 3): the input is divided by its expected std beta; a
        # transition's shortcut sees that unit-variance input, so the stream restarts at variance 1,
        # and every block adds alpha^2 (its branch has unit variance at init); a shortcut multiplier
        # (skip_alpha, block_scale: 1 in nf) scales the variance it carries by its square
        self.input_var = float(input_var) if self.preact else 1.0
        self.input_scale = 1.0 / self.input_var ** 0.5
        if self.preact:
            self.preact_relu = nn.ReLU()
            restart = 1.0 if self.downsample is not None else self.input_var
            self.output_var = self.merge.skip_scale ** 2 * restart + self.merge.branch_scale ** 2
        else:
            self.output_var = 1.0
        init_branch(scheme, convs, norms, k, L, dropout=conv_dropout)
        self.check_scheme(scheme)

    @staticmethod
    def _shortcut(scheme: Scheme, cin: int, cout: int, stride: "int | tuple[int, ...]",
                  spatial_dims: int) -> nn.Sequential:
        if scheme.mean_shift:  # RescaleNet: avgpool(stride) -> bias -> conv1x1
            layers = [StridedAvgPool(stride, spatial_dims)] if _strided(stride) else []
            layers += [MeanShiftBias(cin, spatial_dims, scheme.measure_batches),
                       conv_nd(spatial_dims, cin, cout, 1, bias=False)]
        elif scheme.layout == "preact":  # timm's NormFreeBlock (DownsampleAvg): avgpool(stride) -> conv1x1
            layers = [StridedAvgPool(stride, spatial_dims)] if _strided(stride) else []
            layers.append(scheme_conv(scheme, spatial_dims, cin, cout, 1, bias=scheme.conv_bias))
        else:
            layers = [ScalarBias()] if scheme.scalar_biases else []
            layers.append(scheme_conv(scheme, spatial_dims, cin, cout, 1, stride=stride, bias=scheme.conv_bias))
            norm = conv_norm(scheme, cout, spatial_dims)
            if norm is not None:
                layers.append(norm)
        shortcut = nn.Sequential(*layers)
        conv = next(m for m in shortcut if isinstance(m, nn.modules.conv._ConvNd))
        init_shortcut(scheme, conv)
        return shortcut

    def branch_layers(self) -> tuple[BranchLayer, ...]:
        """The branch's layers in forward order (``shift{i}``, ``conv{i}``, ``bn{i}`` for ``i``
        in ``1..num_convs``): what the reference and every plan compute."""
        return tuple(BranchLayer(getattr(self, f"shift{i}"), getattr(self, f"conv{i}"), getattr(self, f"bn{i}"))
                     for i in range(1, self.num_convs + 1))

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        layers = self.branch_layers()
        for i, (shift, conv, post) in enumerate(layers, start=1):
            out = post(self.drop(conv(shift(out))))
            if i < len(layers):
                out = self.relu(out)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (impl := implementation(self, x)) is not None:
            return impl(self, x)
        return self._forward_reference(x)

    def extra_repr(self) -> str:
        return f"drop_rate={self.drop_rate:.4g}" if self.drop_rate else ""

    def _forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        if self.preact:
            h = self.preact_relu(x) * self.input_scale
            shortcut = x if self.downsample is None else self.downsample(h)
            return self.merge(shortcut, drop_path(self.branch(h), self.drop_rate, self.training, self.drop_scale))
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.merge(shortcut, drop_path(self.branch(x), self.drop_rate, self.training, self.drop_scale))
        return self.relu(self.merge_norm(out))


def sublayer_norm(scheme: Scheme, d_model: int, position: str, site: str) -> nn.Module:
    """The norm a Transformer scheme puts at ``position`` (``pre``: on the branch's input,
    ``post``: after the merge, ``final``: on a stack's output under a pre-norm scheme) of a
    sublayer whose branch is ``site`` (``attention`` or ``ffn``): a LayerNorm, a pointwise
    :class:`~.layers.PointwiseNorm` (``dyt``, ``derf``) or Identity."""
    wanted = "pre" if position == "final" else position
    if scheme.norm is None or scheme.norm_position != wanted:
        return nn.Identity()
    alpha = scheme.norm_alpha_at("final" if position == "final" else site)
    return make_norm(scheme.norm, d_model, spatial_dims=None, alpha_init=alpha)


class ResidualSublayer(Planned):
    """A Transformer residual sublayer ``x -> merge(x, dropout(fn(x, ...)))`` under a scheme.

    ``post_ln``: ``LN(x + F(x))`` (Vaswani et al. 2017). ``pre_ln``: ``x + F(LN(x))``
    (Xiong et al. 2020). ``rescale``: ``alpha_k x + beta g_k F(x)`` with the weights listed in
    ``scaled_layers`` multiplied by the RescaleNet init multiplier (m = their number).
    ``rezero`` / ``skipinit``: ``x + a_k F(x)``, ``a_k = 0`` at init. ``dyt`` / ``derf``:
    ``pre_ln`` with the pointwise layer in place of the LayerNorm (its alpha's init per ``site``).
    ``deepnorm``: ``LN(alpha x + F(x))``; ``tfixup``: ``x + F(x)``; both re-initialise ``fn``'s
    layers by the rules of :mod:`~.init`, which read ``stack`` (the sublayer's stack and both
    stacks' depths; the scheme's ``skip_alpha`` already resolved for it: :func:`~.init.stack_scheme`).
    """

    def __init__(self, scheme: Scheme, d_model: int, fn: nn.Module, k: int, L: int,
                 dropout: float = 0.0, scaled_layers: list[nn.Module] | None = None,
                 site: str = "ffn", stack: TransformerStack | None = None) -> None:
        super().__init__()
        if not scheme.supports("transformer"):
            raise ValueError(f"scheme {scheme.name!r} has no Transformer form; use one of "
                             f"{', '.join(list_schemes('transformer'))}")
        check_buildable(scheme, "transformer")
        self.fn = fn
        self.pre_norm = sublayer_norm(scheme, d_model, "pre", site)
        self.post_norm = sublayer_norm(scheme, d_model, "post", site)
        self.dropout = nn.Dropout(dropout)
        self.merge = ResidualMerge(scheme, k, L, (d_model,))  # features last
        init_transformer_branch(scheme, fn, stack)  # DeepNorm's and T-Fixup's rules
        if scheme.init == "rescale" and scaled_layers:
            mult = rescale_conv_multiplier(k, L, len(scaled_layers), scheme.c, 0.0, scheme.fixed_beta)
            with torch.no_grad():
                for layer in scaled_layers:
                    layer.weight.mul_(mult)
        self.check_scheme(scheme)

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if (impl := implementation(self, x)) is not None:
            return impl(self, x, *args, **kwargs)
        return self._forward_reference(x, *args, **kwargs)

    def _forward_reference(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        out = self.dropout(self.fn(self.pre_norm(x), *args, **kwargs))
        return self.post_norm(self.merge(x, out))


def share_layer_gain(scheme: Scheme, layer: nn.Module, names: tuple[str, ...]) -> None:
    """Under ``scheme.layer_gain``, the :class:`ResidualSublayer` children ``names`` of ``layer`` (a
    Transformer layer) share the first one's gain: one parameter, multiplying every sublayer's
    branch, whose gradient is the sum of theirs (ReZero's ``resweight``: majumderb/rezero
    ``rezero/transformer/rztx.py``, ``RZTXEncoderLayer`` and ``RZTXDecoderLayer``). The state dict
    keeps one entry per sublayer, of equal values; a checkpoint whose entries differ (trained with
    a gain per sublayer) is refused, not loaded as the last one's."""
    if not scheme.layer_gain:
        return
    sublayers = [getattr(layer, name) for name in names]
    shared = sublayers[0].merge.gain
    for sub in sublayers[1:]:
        sub.merge.gain = shared
    layer.register_load_state_dict_pre_hook(functools.partial(_refuse_unshared_gains, names=names,
                                                              scheme=scheme.name))


def _refuse_unshared_gains(module: nn.Module, state_dict: dict, prefix: str, *args, names: tuple[str, ...],
                           scheme: str) -> None:
    """Load-state-dict pre-hook of :func:`share_layer_gain`: a ValueError where the entries of the
    shared gain differ (one would silently overwrite the others)."""
    found = {name: state_dict[f"{prefix}{name}.merge.gain.weight"] for name in names
             if f"{prefix}{name}.merge.gain.weight" in state_dict}
    values = list(found.values())
    if any(v.shape != values[0].shape or not bool(torch.eq(v, values[0]).logical_or_(v.isnan() & values[0].isnan()).all())
           for v in values[1:]):  # NaN equal to NaN: a diverged checkpoint is refused for its NaN, not here
        held = ", ".join(f"{name} {v.flatten()[0].item():.4g}" for name, v in found.items())
        raise ValueError(f"{prefix.rstrip('.') or 'layer'}: the checkpoint holds one gain per sublayer ({held}), the "
                         f"skipinit network, where scheme {scheme} shares one per layer (layer_gain, ReZero's "
                         "resweight): load it into a skipinit network (scheme_options {layer_gain: false})")
