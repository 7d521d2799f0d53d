"""The one residual block every scheme and family uses, and the merge it asks its scheme for
(ResNet v1 blocks of He et al. 2016; merge rules of Shao et al. 2020, De & Smith 2020 and
Zhang et al. 2019).

- :class:`ResidualMerge`: ``block_scale * (skip_scale * s + branch_scale * gain * f + bias)``.
  The analysis probe hooks this module: its two inputs are the skip and branch terms.
- :class:`ResidualBlock`: basic (2 convs) or bottleneck (3 convs) branch, 1D/2D/3D, projection
  shortcut; attribute names follow torchvision (``conv1``, ``bn1``, ..., ``downsample``) so a
  ``bn`` ResNet loads torchvision's state dicts and torchvision's FPN/detectors wrap it.
  Pre-conv biases (mean-shift or Fixup scalars) are ``shift1``..``shiftm``.
- :class:`ResidualSublayer`: the Transformer sublayer (attention or feed-forward branch)
  under post-LN, pre-LN, ``rescale``, ``rezero`` or ``skipinit``.

Both compute ``forward`` on a fast path (``_forward_fused``: biases, gains and the merge folded
into the convolutions / the branch's last linear layer, see :mod:`rescale_core.fastpath`) unless
``fused`` is False, a bypassed submodule has hooks or the fast path does not implement their
scheme (:func:`rescale_core.fastpath.implements`); ``_forward_reference`` is the plain
layer-by-layer code, the definition the fast path is tested against.

Deviations from the official code: RescaleNet's official init multiplier uses ``k - 1 + L`` where
the formula it implements (rebuttal [R4]) has ``k + L``; we follow the formula, so that
``alpha_k^2 + beta_k^2 = 1`` holds exactly at init. Fixup's official downsample shares the branch's
first scalar bias; ours has its own. CIFAR ResNets use projection (option B) shortcuts.
"""
from __future__ import annotations

import torch
from torch import nn

from . import fastpath as fp
from . import plans
from .init import init_branch, init_shortcut, rescale_conv_multiplier
from .layers import (Gain, MeanShiftBias, ScalarBias, StridedAvgPool, channel_shape, conv_nd,
                     dropout_nd, make_norm)
from .schemes import Scheme

__all__ = ["ResidualMerge", "ResidualBlock", "ResidualSublayer", "pre_conv_bias"]


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
        # Fixup's scalar bias after the multiplier (not scaled by block_scale: no scheme uses both)
        self.bias = ScalarBias() if scheme.scalar_biases else None

    def skip_term(self, skip: torch.Tensor) -> torch.Tensor:
        return skip if self.skip_scale == 1.0 else skip * self.skip_scale

    def branch_term(self, branch: torch.Tensor) -> torch.Tensor:
        if self.gain is not None:
            out = branch * (self.gain.weight * self.branch_scale).to(branch.dtype)
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

    def fused_add(self, branch: torch.Tensor, skip: torch.Tensor, skip_scale: float) -> torch.Tensor:
        """``branch + skip_scale * skip`` in :meth:`result_dtype`: in place on ``branch`` (a fresh
        tensor nothing else holds) when it has that dtype already, else in a new tensor."""
        dtype = self.result_dtype(branch, skip)
        if branch.dtype == dtype:
            return branch.add_(skip, alpha=skip_scale)
        if skip.dtype != dtype:
            branch = branch.to(dtype)
        return torch.add(branch, skip, alpha=skip_scale)  # promotes: computed in ``dtype``

    def scaled_add(self, branch: torch.Tensor, scale, skip: torch.Tensor, skip_scale: float) -> torch.Tensor:
        """``scale * branch + skip_scale * skip`` (``scale`` a float or a tensor broadcasting
        over channels) in :meth:`result_dtype`, laid out as the branch: for a branch whose last
        weight is larger than its output (two passes over the output beat three over the weight)."""
        out = branch * (scale.to(branch.dtype) if isinstance(scale, torch.Tensor) else scale)
        dtype = self.result_dtype(branch, skip)
        if out.dtype != dtype:
            out = out.to(dtype)
        return out.add_(skip, alpha=skip_scale)

    def branch_multiplier(self, factor: float = 1.0):
        """``gain * branch_scale * factor`` (a tensor, one kernel), ``branch_scale * factor`` (a
        float) or None when it is 1: what the fast path folds into the branch's last layer."""
        scale = self.branch_scale * factor
        if self.gain is not None:
            return self.gain.weight * scale
        return scale if scale != 1.0 else None

    def extra_repr(self) -> str:
        return f"k={self.k}, L={self.L}, skip_scale={self.skip_scale:.4f}, branch_scale={self.branch_scale:.4f}"


def _strided(stride) -> bool:
    """Whether a stride (an int, or one per spatial dim) downsamples at all."""
    return any(s != 1 for s in stride) if isinstance(stride, (tuple, list)) else stride != 1


def pre_conv_bias(scheme: Scheme, channels: int, spatial_dims: int) -> nn.Module:
    """What a scheme puts in front of a convolution: mean-shift bias, Fixup scalar, or nothing."""
    if scheme.mean_shift:
        return MeanShiftBias(channels, spatial_dims, scheme.measure_batches)
    if scheme.scalar_biases:
        return ScalarBias()
    return nn.Identity()


def _post_conv(scheme: Scheme, channels: int, spatial_dims: int, last: bool) -> nn.Module:
    """After a branch conv: its norm layer, or Fixup's pre-activation scalar bias."""
    if scheme.norm in ("bn", "gn"):
        return make_norm(scheme.norm, channels, spatial_dims)
    if scheme.scalar_biases and not last:
        return ScalarBias()
    return nn.Identity()


class ResidualBlock(nn.Module):
    """``relu(merge(shortcut(x), F(x)))`` with F a basic or bottleneck branch.

    Args:
        scheme: the residual scheme.
        in_channels, planes: input channels and branch width (output = planes * expansion).
        stride: stride of the block (on the 3x3 conv, as torchvision's ResNet v1.5).
        kind: "basic" (3x3, 3x3; expansion 1) or "bottleneck" (1x1, 3x3, 1x1; expansion 4).
        k, L: this block's 1-based index among the network's L residual blocks.
        spatial_dims: 2 for images, 3 for video.
        groups, base_width: ResNeXt cardinality and width per group.
        conv_dropout: dropout after every branch conv (RescaleNet's Dropout2d/3d).
        temporal_kernels: 3D only, one entry per branch conv (None entries, or None: the conv's
            own size, 3 or 1): its kernel along time, padded by ``kt // 2`` (SlowOnly's
            ``kt x 1 x 1`` first conv and ``1 x 3 x 3`` middle conv, Feichtenhofer et al. 2019).
            ``stride`` may be a tuple per dim, e.g. ``(1, 2, 2)``: no temporal downsampling.
            The fast path folds an input offset only into convs without padding, so a padded
            ``3 x 1 x 1`` conv gets it added to its input, as the reference does.
    """

    expansions = {"basic": 1, "bottleneck": 4}
    plan = "auto"  # the execution plan (rescale_core.plans): auto | lean | folded
    # Whether the fast path implements this module's scheme (fastpath.IMPLEMENTED_FIELDS), set at
    # construction; ``fused = True`` does not override it. The class default: modules pickled
    # before the check, which ran the fast path.
    _fast_ok = True

    def __init__(self, scheme: Scheme, in_channels: int, planes: int, stride: "int | tuple[int, ...]" = 1,
                 kind: str = "basic", k: int = 1, L: int = 1, spatial_dims: int = 2,
                 groups: int = 1, base_width: int = 64, conv_dropout: float = 0.0,
                 temporal_kernels: "tuple[int | None, ...] | None" = None) -> None:
        super().__init__()
        if kind not in self.expansions:
            raise ValueError(f"unknown block kind {kind!r}; expected basic or bottleneck")
        self.kind, self.k, self.L = kind, k, L
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
            conv = conv_nd(spatial_dims, cin, cout, ks, stride=s, padding=padding, groups=g,
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
        init_branch(scheme, convs, norms, k, L, dropout=conv_dropout)
        # fast path (same function) only for a scheme it implements; False: the reference path
        self.fused = self._fast_ok = fp.implements(scheme)

    @staticmethod
    def _shortcut(scheme: Scheme, cin: int, cout: int, stride: "int | tuple[int, ...]",
                  spatial_dims: int) -> nn.Sequential:
        if scheme.mean_shift:  # RescaleNet: avgpool(stride) -> bias -> conv1x1
            layers = [StridedAvgPool(stride, spatial_dims)] if _strided(stride) else []
            layers += [MeanShiftBias(cin, spatial_dims, scheme.measure_batches),
                       conv_nd(spatial_dims, cin, cout, 1, bias=False)]
        else:
            layers = [ScalarBias()] if scheme.scalar_biases else []
            layers.append(conv_nd(spatial_dims, cin, cout, 1, stride=stride, bias=scheme.conv_bias))
            if scheme.norm in ("bn", "gn"):
                layers.append(make_norm(scheme.norm, cout, spatial_dims))
        shortcut = nn.Sequential(*layers)
        conv = next(m for m in shortcut if isinstance(m, nn.modules.conv._ConvNd))
        init_shortcut(scheme, conv)
        return shortcut

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for i in range(1, self.num_convs + 1):
            out = getattr(self, f"shift{i}")(out)
            out = self.drop(getattr(self, f"conv{i}")(out))
            out = getattr(self, f"bn{i}")(out)
            if i < self.num_convs:
                out = self.relu(out)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and self._fast_ok and not fp.has_hooks_below(self):
            if plans.wants_lean(self, x) and self.leans():
                return self._forward_lean(x, 1.0, 1.0, self.lean_terms(1.0, 1.0).values(plans.activation_dtype(x)))
            return self._forward_fused(x)
        return self._forward_reference(x)

    def _forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.merge(shortcut, self.branch(x))
        return self.relu(self.merge_norm(out))

    def _forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        """The reference function with the folds of :mod:`rescale_core.fastpath`: pre-conv
        offsets into 1x1 convs' biases (1) or across the ReLU before a 3x3 conv (2), Fixup's
        scalar biases and ``gain * branch_scale`` into the conv biases / last conv's weight (3),
        then ``relu_(f.add_(skip, alpha=skip_scale))`` (``f * gain`` first where the last weight is
        larger than ``f``). Measures the mean-shift statistics on the same tensors as the
        reference (an offset being measured is added, not folded)."""
        return self._fused(x, 1.0, 1.0)

    # --- the lean plan (rescale_core.plans) ---------------------------------------------------
    def leans(self) -> bool:
        """Whether the lean plan applies now: no mean-shift layer of the block is measuring (a
        measured offset exists only once the layer's input has been seen: the folded plan runs)."""
        return not any(fp.is_updating(m) for m in self.modules())

    def lean_entries(self, c_in: float, c_out: float) -> list[tuple[nn.Module, float]]:
        """The (module, multiplier) pairs whose terms :meth:`_forward_lean` reads, for
        activations taken in units of ``c_in`` and returned in units of ``c_out``."""
        entries = []
        if self.downsample is not None:
            entries += [(m, 1.0 / c_in) for m in self.downsample if plans.is_term_module(m)]
        for i in range(1, self.num_convs + 1):
            shift, post = getattr(self, f"shift{i}"), getattr(self, f"bn{i}")
            if plans.is_term_module(shift):
                entries.append((shift, 1.0 / c_in))
            if isinstance(post, ScalarBias):  # Fixup's pre-activation bias: the conv's bias slot
                entries.append((post, 1.0 / c_in, getattr(self, f"conv{i}").out_channels))
        if self.merge.gain is not None:
            entries.append((self.merge.gain, self.merge.branch_scale * c_in / c_out))
        if self.merge.bias is not None:
            entries.append((self.merge.bias, 1.0 / c_out))
        return entries

    def lean_terms(self, c_in: float, c_out: float) -> "plans.LeanTerms":
        """This block's own :class:`~rescale_core.plans.LeanTerms` (a block called on its own,
        e.g. by a detection backbone's layer getter; a ResNet computes one for all its blocks)."""
        return plans.cached_on(self, lambda: (fp._module_tree_version, c_in, c_out),
                               lambda: plans.LeanTerms(self.lean_entries(c_in, c_out)))

    def _forward_lean(self, x: torch.Tensor, c_in: float, c_out: float, terms: dict) -> torch.Tensor:
        """The reference function with the fewest ops (:mod:`rescale_core.plans`): each
        pre-conv offset one add, Fixup's pre-activation bias in the conv's bias slot, the merge
        one ``addcmul(skip, f, gain * branch_scale)`` (or an ``add`` with ``alpha``), the ReLUs
        in place. ``terms``: the :meth:`lean_entries` values for the same ``c_in``, ``c_out``
        (:meth:`carries_scale` blocks only where they differ from 1)."""
        skip = x if self.downsample is None else self._shortcut_lean(x, c_in, terms)
        drop_active = self.training and not isinstance(self.drop, nn.Identity)
        h = x
        m = self.num_convs
        for i in range(1, m + 1):
            shift, conv, post = getattr(self, f"shift{i}"), getattr(self, f"conv{i}"), getattr(self, f"bn{i}")
            if plans.is_term_module(shift):
                h = h + terms[shift]
            elif not isinstance(shift, nn.Identity):
                h = shift(h)
            bias = fp.scaled(conv.bias, c_in)
            fold_post = isinstance(post, ScalarBias) and not drop_active
            if fold_post:  # conv(h) + b: the conv's bias slot (b comes as out_channels values)
                b = terms[post]
                bias = b if bias is None else bias.to(b.dtype) + b
            h = self.drop(conv._conv_forward(h, conv.weight, bias))
            if isinstance(post, ScalarBias):
                if not fold_post:
                    h = h + terms[post][:1]
            elif not isinstance(post, nn.Identity):
                h = post(h)
            if i < m:
                h = torch.relu_(h)
        merge = self.merge
        alpha = merge.skip_scale * c_in / c_out
        if merge.gain is not None:
            s = terms[merge.gain]
            out = plans.gain_merge(skip, h, s, alpha)
        else:
            scale = merge.branch_scale * c_in / c_out
            if scale == 1.0:
                out = merge.fused_add(h, skip, alpha)
            else:  # in the branch's layout, as fused_add
                out = merge.scaled_add(h, scale, skip, alpha)
        if merge.bias is not None:
            out = out + terms[merge.bias]
        return torch.relu_(self.merge_norm(out))

    def _shortcut_lean(self, x: torch.Tensor, c_in: float, terms: dict) -> torch.Tensor:
        for mod in self.downsample:
            if plans.is_term_module(mod):
                x = x + terms[mod]
            elif isinstance(mod, StridedAvgPool):
                x = mod.pool(x)
            elif c_in != 1.0 and isinstance(mod, nn.modules.conv._ConvNd) and mod.bias is not None:
                x = mod._conv_forward(x, mod.weight, mod.bias / c_in)
            else:
                x = mod(x)
        return x

    def carries_scale(self) -> bool:
        """Whether :meth:`_fused` may take and return activations in scaled units (``c_in``,
        ``c_out`` != 1): true when the block is positively homogeneous once its additive terms
        are scaled (no norm layer, nothing unknown) and no mean-shift layer measures now."""
        if not all(isinstance(getattr(self, f"bn{i}"), (nn.Identity, ScalarBias))
                   and fp.is_offset_module(getattr(self, f"shift{i}"))
                   and not fp.is_updating(getattr(self, f"shift{i}"))
                   for i in range(1, self.num_convs + 1)):
            return False
        if not isinstance(self.merge_norm, nn.Identity):
            return False
        if self.downsample is not None and not all(
                isinstance(m, (StridedAvgPool, nn.modules.conv._ConvNd)) or
                (fp.is_offset_module(m) and not fp.is_updating(m)) for m in self.downsample):
            return False
        return True

    def _fused(self, x: torch.Tensor, c_in: float, c_out: float) -> torch.Tensor:
        """:meth:`_forward_fused` on scaled activations: the true input is ``c_in * x``, the
        result is the true output divided by ``c_out``. Both are 1 except in
        :meth:`rescale_core.models.resnet.ResNet.forward`, which carries RescaleNet's skip
        multipliers ``a`` along the stages: with ``c_out = a c_in``,
        ``relu(a c_in x + f) = c_out relu(x + f / c_out)``, so no block multiplies its skip path
        and no backward pass multiplies the skip gradient. The branch is positively homogeneous
        once every additive term (offsets, biases) is divided by ``c_in``, and its multiplier
        becomes ``gain * branch_scale * c_in / c_out`` (only :meth:`carries_scale` blocks)."""
        if self.downsample is None:
            skip = x
        else:
            skip = fp.fused_sequential(self.downsample, x, 1.0 / c_in)
        drop_active = self.training and not isinstance(self.drop, nn.Identity)
        m = self.num_convs
        h, absorbed, f, merge_scale = x, False, x, None
        for i in range(1, m + 1):
            conv = getattr(self, f"conv{i}")
            shift = getattr(self, f"shift{i}")
            post = getattr(self, f"bn{i}")
            weight, bias = conv.weight, fp.scaled(conv.bias, c_in)
            if not absorbed:  # this conv's input offset: into its bias, or added
                if not fp.is_offset_module(shift):
                    h = shift(h)
                else:
                    e = fp.scaled(fp.offset_of(shift, h), c_in)
                    if e is not None:
                        if fp.folds_input_offset(conv, h.numel()):
                            bias = fp.add_bias(bias, fp.input_offset_bias(weight, e, conv.groups))
                        else:
                            h = h + e.to(h.dtype)
            absorbed = False
            plain_post = isinstance(post, (nn.Identity, ScalarBias))
            if i < m:
                cross = None
                if not drop_active and plain_post:
                    if isinstance(post, ScalarBias):  # Fixup's bias before the activation
                        bias = fp.add_bias(bias, fp.scaled(post.bias, c_in))
                    nshift, nconv = getattr(self, f"shift{i + 1}"), getattr(self, f"conv{i + 1}")
                    if (isinstance(nshift, (MeanShiftBias, ScalarBias)) and not fp.is_updating(nshift)
                            and not fp.folds_input_offset(nconv, fp.conv_out_numel(conv, h))):
                        cross = fp.scaled(fp.offset_of(nshift), c_in)
                        bias = fp.add_bias(bias, cross.detach())
                z = conv._conv_forward(h, weight, fp.conv_bias(bias, conv.out_channels))
                z = self.drop(z)
                if drop_active or not plain_post:
                    z = fp.scaled_module(post, z, c_in)
                if cross is not None:
                    h, absorbed = fp.shifted_relu(z, cross), True
                else:
                    h = torch.relu_(z)
            else:  # the last conv carries the merge's multiplier (and Fixup's bias after it)
                merge = self.merge
                foldable = isinstance(post, nn.Identity)
                if foldable:
                    scale = merge.branch_multiplier(c_in / c_out)
                    if scale is not None and merge.bias is None and not fp.folds_output_scale(conv, h):
                        merge_scale = scale  # the weight is larger than the output: scale there
                    elif scale is not None:
                        weight, bias = fp.scale_out(weight, scale), fp.scale_bias(bias, scale)
                    if merge.bias is not None and not drop_active:
                        bias = fp.add_bias(bias, fp.scaled(merge.bias.bias, c_out))
                f = conv._conv_forward(h, weight, fp.conv_bias(bias, conv.out_channels))
                f = self.drop(f)
                if not foldable:  # a norm layer: only with c_in == c_out == 1
                    f = merge.branch_term(post(f))
                elif merge.bias is not None and drop_active:
                    f = f + fp.scaled(merge.bias.bias, c_out).to(f.dtype)
        alpha = self.merge.skip_scale * c_in / c_out
        if merge_scale is not None:
            out = self.merge.scaled_add(f, merge_scale, skip, alpha)
        else:
            out = self.merge.fused_add(f, skip, alpha)
        return torch.relu_(self.merge_norm(out))


class ResidualSublayer(nn.Module):
    """A Transformer residual sublayer ``x -> merge(x, dropout(fn(x, ...)))`` under a scheme.

    ``post_ln``: ``LN(x + F(x))`` (Vaswani et al. 2017). ``pre_ln``: ``x + F(LN(x))``
    (Xiong et al. 2020). ``rescale``: ``alpha_k x + beta g_k F(x)`` with the weights listed in
    ``scaled_layers`` multiplied by the RescaleNet init multiplier (m = their number).
    ``rezero`` / ``skipinit``: ``x + a_k F(x)``, ``a_k = 0`` at init.
    """

    # Whether the fast path implements this module's scheme (fastpath.IMPLEMENTED_FIELDS), set at
    # construction; ``fused = True`` does not override it. The class default: modules pickled
    # before the check, which ran the fast path.
    _fast_ok = True
    plan = "auto"  # the execution plan (rescale_core.plans): auto | lean | folded

    def __init__(self, scheme: Scheme, d_model: int, fn: nn.Module, k: int, L: int,
                 dropout: float = 0.0, scaled_layers: list[nn.Module] | None = None) -> None:
        super().__init__()
        if not scheme.supports("transformer"):
            raise ValueError(f"scheme {scheme.name!r} has no Transformer form; use one of "
                             "post_ln, pre_ln, rescale, rezero, skipinit")
        self.fn = fn
        self.pre_norm = make_norm("ln", d_model) if scheme.norm == "ln" and scheme.norm_position == "pre" else nn.Identity()
        self.post_norm = make_norm("ln", d_model) if scheme.norm == "ln" and scheme.norm_position == "post" else nn.Identity()
        self.dropout = nn.Dropout(dropout)
        self.merge = ResidualMerge(scheme, k, L, (d_model,))  # features last
        if scheme.init == "rescale" and scaled_layers:
            mult = rescale_conv_multiplier(k, L, len(scaled_layers), scheme.c, 0.0, scheme.fixed_beta)
            with torch.no_grad():
                for layer in scaled_layers:
                    layer.weight.mul_(mult)
        # fast path (same function) only for a scheme it implements; False: the reference path
        self.fused = self._fast_ok = fp.implements(scheme)

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if self.fused and self._fast_ok and not fp.has_hooks_below(self):
            if plans.wants_lean(self, x):
                return self._forward_lean(x, *args, **kwargs)
            if getattr(self.fn, "supports_out_scale", False) and self.merge.bias is None:
                return self._forward_fused(x, *args, **kwargs)
        return self._forward_reference(x, *args, **kwargs)

    def _forward_lean(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """The lean plan (:mod:`rescale_core.plans`): the branch as it is, then one
        ``addcmul(alpha * x, f, gain * branch_scale)`` (:func:`~rescale_core.plans.gain_merge`)."""
        out = self.dropout(self.fn(self.pre_norm(x), *args, **kwargs))
        merge = self.merge
        if merge.gain is not None:
            s = (merge.gain.weight * merge.branch_scale).to(out.dtype)
            out = plans.gain_merge(x, out, s, merge.skip_scale)
        else:
            out = merge(x, out)
        return self.post_norm(out)

    def _forward_reference(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        out = self.dropout(self.fn(self.pre_norm(x), *args, **kwargs))
        return self.post_norm(self.merge(x, out))

    def _forward_fused(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """``gain * branch_scale`` folded into the branch's last linear layer (``fn`` takes
        ``out_scale``; dropout commutes with the scaling), then one in-place add of the skip."""
        out = self.fn(self.pre_norm(x), *args, out_scale=self.merge.branch_multiplier(), **kwargs)
        out = self.dropout(out)
        return self.post_norm(self.merge.fused_add(out, x, self.merge.skip_scale))
