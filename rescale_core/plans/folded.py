"""The folded plan: the reference function with biases, offsets and multipliers (RescaleNet's
mean-shift biases and gains, Shao et al. 2020; Fixup's scalar biases and multipliers, Zhang et
al. 2019; SkipInit's and ReZero's gains, De & Smith 2020, Bachlechner et al. 2020) folded into the
convolutions' weights and biases every step (the identities of :mod:`rescale_core.plans.folds`,
``docs/design.md``, "Why each fold is exact"). On a CPU a pass over the activations is what a
step costs (``docs/design.md``, "A pass over the activations on a CPU"), and each fold removes
passes for a few weight-sized ops: the CPU default.

One function per module type, each under the reference ``forward`` it must equal:
:func:`folded_block` (``ResidualBlock``), :func:`folded_sublayer` (``ResidualSublayer``),
:func:`folded_resnet` (``ResNet``: the stem's offset in the stem conv's bias, RescaleNet's skip
multipliers carried along the stages, the offset before global pooling added after it) and
:func:`folded_vgg` (``VGG``: each mean-shift offset across the ReLU and max-pool before it).
"""
from __future__ import annotations

import torch
from torch import nn

from ..blocks import ResidualBlock, ResidualSublayer
from ..layers import MeanShiftBias, ScalarBias
from ..models.resnet import ResNet
from ..models.vgg import VGG
from .conditions import has_hooks, has_hooks_below, has_hooks_in, is_updating
from .dispatch import register
from .folds import (add_bias, branch_multiplier, conv_bias, conv_out_numel, fold_input_offset, fold_output_scale,
                    folds_input_offset, folds_output_scale, is_offset_module, merge_bias, offset_of, scaled,
                    scaled_module, shifted_relu)
from .shared import (add_scaled_skip, add_skip, carried_scales, network_part, offset_stem, run_stages,
                     scaled_sublayer, takes_out_scale)

__all__ = ["folded_shortcut", "folded_block", "folded_sublayer", "folded_stem", "folded_resnet", "folded_vgg"]


# --------------------------------------------------------------- ResidualBlock
# reference: relu(merge_norm(merge(downsample(x), branch(x)))), where the branch runs
# post(drop(conv(shift(h)))) per layer with a ReLU between layers, and the merge is
# skip_scale * skip + branch_scale * gain * f (+ Fixup's bias)
def folded_shortcut(seq: nn.Sequential, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The shortcut (``[avgpool, bias, conv1x1]`` or ``[scalar bias, conv1x1(stride)]``) with
    each bias folded into the conv after it (1) where that is cheaper. ``scale`` != 1
    (activations in units of ``1 / scale``; only for pools, biases and convs): every additive
    term is multiplied by ``scale``."""
    pending = None
    c = 1.0 / scale
    for mod in seq:
        if isinstance(mod, (MeanShiftBias, ScalarBias)):
            if pending is not None:
                x, pending = x + pending.to(x.dtype), None
            pending = scaled(offset_of(mod, x), c)
        elif pending is not None and folds_input_offset(mod, x.numel()):
            x = mod._conv_forward(x, mod.weight, conv_bias(fold_input_offset(mod, scaled(mod.bias, c), pending),
                                                           mod.out_channels))
            pending = None
        else:
            if pending is not None:
                x, pending = x + pending.to(x.dtype), None
            if c != 1.0 and isinstance(mod, nn.modules.conv._ConvNd) and mod.bias is not None:
                x = mod._conv_forward(x, mod.weight, mod.bias / c)
            else:
                x = mod(x)
    return x if pending is None else x + pending.to(x.dtype)


@register("folded", ResidualBlock, applies=lambda block, x: not has_hooks_below(block))
def folded_block(block: ResidualBlock, x: torch.Tensor, c_in: float = 1.0, c_out: float = 1.0) -> torch.Tensor:
    """The block's reference function with its pre-conv offsets folded into 1x1 convs' biases
    (1) or across the ReLU before a 3x3 conv (2), Fixup's scalar biases and ``gain *
    branch_scale`` into the conv biases / last conv's weight (3), then ``relu_(f.add_(skip,
    alpha=skip_scale))`` (``f * gain`` first where the last weight is larger than ``f``).
    Measures the mean-shift statistics on the same tensors as the reference (an offset being
    measured is added, not folded).

    On scaled activations: the true input is ``c_in * x``, the result is the true output divided
    by ``c_out`` (:func:`~rescale_core.plans.shared.carried_scales`). The branch is positively
    homogeneous once every additive term (offsets, biases) is divided by ``c_in``, and its
    multiplier becomes ``gain * branch_scale * c_in / c_out``."""
    skip = x if block.downsample is None else folded_shortcut(block.downsample, x, 1.0 / c_in)
    drop_active = block.training and not isinstance(block.drop, nn.Identity)
    layers = block.branch_layers()
    merge = block.merge
    h, absorbed, f, merge_scale = x, False, x, None
    for i, (shift, conv, post) in enumerate(layers, start=1):
        weight, bias = conv.weight, scaled(conv.bias, c_in)
        if not absorbed:  # this conv's input offset: into its bias (1), or added
            if not is_offset_module(shift):
                h = shift(h)
            else:
                e = scaled(offset_of(shift, h), c_in)
                if e is not None:
                    if folds_input_offset(conv, h.numel()):
                        bias = fold_input_offset(conv, bias, e)
                    else:
                        h = h + e.to(h.dtype)
        absorbed = False
        plain_post = isinstance(post, (nn.Identity, ScalarBias))
        if i < len(layers):
            cross = None
            if not drop_active and plain_post:
                bias = add_bias(bias, scaled(offset_of(post), c_in))  # Fixup's bias before the ReLU (3)
                nshift, nconv = layers[i].shift, layers[i].conv
                if (isinstance(nshift, (MeanShiftBias, ScalarBias)) and not is_updating(nshift)
                        and not folds_input_offset(nconv, conv_out_numel(conv, h))):
                    cross = scaled(offset_of(nshift), c_in)  # the next offset across the ReLU (2)
                    bias = add_bias(bias, cross.detach())
            z = conv._conv_forward(h, weight, conv_bias(bias, conv.out_channels))
            z = block.drop(z)
            if drop_active or not plain_post:
                z = scaled_module(post, z, c_in)
            if cross is not None:
                h, absorbed = shifted_relu(z, cross), True
            else:
                h = torch.relu_(z)
        else:  # the last conv carries the merge's multiplier and Fixup's bias after it (3)
            foldable = isinstance(post, nn.Identity)
            if foldable:
                scale = branch_multiplier(merge, c_in / c_out)
                if scale is not None and merge.bias is None and not folds_output_scale(conv, h):
                    merge_scale = scale  # the weight is larger than the output: scale there
                else:
                    weight, bias = fold_output_scale(weight, bias, scale)
                if not drop_active:
                    bias = add_bias(bias, merge_bias(merge, c_out))
            f = conv._conv_forward(h, weight, conv_bias(bias, conv.out_channels))
            f = block.drop(f)
            if not foldable:  # a norm layer: only with c_in == c_out == 1
                f = merge.branch_term(post(f))
            elif merge.bias is not None and drop_active:
                f = f + merge_bias(merge, c_out).to(f.dtype)
    alpha = merge.skip_scale * c_in / c_out
    if merge_scale is not None:
        out = add_scaled_skip(f, merge_scale, skip, alpha)
    else:
        out = add_skip(f, skip, alpha)
    return torch.relu_(block.merge_norm(out))


# --------------------------------------------------------------- ResidualSublayer
# reference: post_norm(merge(x, dropout(fn(pre_norm(x)))))
@register("folded", ResidualSublayer, applies=takes_out_scale)
def folded_sublayer(sub: ResidualSublayer, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """``gain * branch_scale`` folded into the branch's last linear layer (3; ``fn`` takes
    ``out_scale``), then one in-place add of the skip."""
    return scaled_sublayer(sub, x, branch_multiplier(sub.merge), *args, **kwargs)


# --------------------------------------------------------------- ResNet
# reference (ResNet._run): maxpool(relu(bn1(conv1(x)))), each stage (after its temporal pool),
# then fc(fc_bias(dropout(head_norm(flatten(avgpool(pool_shift(x)))))))
def folded_stem(model: ResNet, x: torch.Tensor) -> torch.Tensor:
    """``relu(bn1(conv1(x)))`` with a mean-shift / scalar ``bn1`` folded into the conv bias
    (while measuring, the statistics need the conv output first: added in place)."""
    conv, post = model.conv1, model.bn1
    if isinstance(post, (MeanShiftBias, ScalarBias)) and not is_updating(post):
        return offset_stem(conv, x, offset_of(post))
    if isinstance(post, MeanShiftBias):
        z = conv(x)
        e = post.offset(z)
        z = z.add_(e.to(z.dtype))
    else:
        z = post(conv(x))
    return torch.relu_(z)


def _folded_stage(stage: nn.Sequential, x: torch.Tensor, c: float) -> tuple[torch.Tensor, float]:
    """A stage on activations in units of ``c``: the skip multipliers carried along the blocks
    that can (:func:`~rescale_core.plans.shared.carried_scales`); a stage with a hook runs as
    modules, in true units."""
    if has_hooks_in(stage):
        return stage(x if c == 1.0 else x * c), 1.0
    for block, c_in, c_out in carried_scales(stage, c):
        if c_in is None:
            x, c = block(x if c == 1.0 else x * c), 1.0
        else:
            x, c = folded_block(block, x, c_in, c_out), c_out
    return x, c


def _folded_features(model: ResNet, x: torch.Tensor, stages: list | None) -> tuple[torch.Tensor, float]:
    """Features in units of ``c`` (true features = ``c * x``), ``c`` the product of the skip
    multipliers carried."""
    if has_hooks(model.conv1, model.bn1, model.relu):
        x = model.stem(x)
    else:
        x = model.maxpool(folded_stem(model, x))
    return run_stages(model.stage_modules(), x, _folded_stage, stages)


def _folded_head(model: ResNet, x: torch.Tensor, c: float) -> torch.Tensor:
    """The head on features in units of ``c``: ``avgpool(c x + e) = c avgpool(x) + e`` (4)."""
    shift = model.pool_shift
    if not isinstance(shift, (MeanShiftBias, nn.Identity)) or has_hooks(shift, model.avgpool):
        return model.classify(model.pooled(x if c == 1.0 else x * c))
    if c != 1.0 and is_updating(shift):
        x, c = x * c, 1.0
    e = offset_of(shift, x)
    x = torch.flatten(model.avgpool(x), 1)
    if c != 1.0:
        x = x * c
    if e is not None:
        x = x + e.reshape(1, -1).to(x.dtype)
    return model.classify(x)


@register("folded", ResNet)
def folded_resnet(model: ResNet, x: torch.Tensor, part: str, stages: list | None = None) -> torch.Tensor:
    """``part`` of the network (``ResNet``'s reference ``_run``) on the folded plan."""
    return network_part(lambda x: _folded_features(model, x, stages), lambda x, c: _folded_head(model, x, c),
                        x, part)


# --------------------------------------------------------------- VGG
# reference: classifier(flatten(avgpool(features(x)))), each Sequential module by module
def _folded_vgg_features(model: VGG, x: torch.Tensor) -> torch.Tensor:
    """Each mean-shift offset of the conv stack across the ReLU (and max-pool) before it into
    the previous conv's bias: ``maxpool(relu(z)) + e = maxpool(max(z + e, e))`` (2)."""
    mods = list(model.features)
    i = 0
    while i < len(mods):
        m = mods[i]
        if isinstance(m, nn.Conv2d) and i + 1 < len(mods) and isinstance(mods[i + 1], nn.ReLU):
            k = i + 2 + (i + 2 < len(mods) and isinstance(mods[i + 2], nn.MaxPool2d))
            nxt = mods[k] if k < len(mods) else None
            if isinstance(nxt, MeanShiftBias) and not nxt.updating:
                e = nxt.offset()
                bias = add_bias(m.bias, e.detach())
                x = shifted_relu(m._conv_forward(x, m.weight, conv_bias(bias, m.out_channels)), e)
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


@register("folded", VGG, applies=lambda model, x: not has_hooks_in(model.features))
def folded_vgg(model: VGG, x: torch.Tensor) -> torch.Tensor:
    return model.classifier(torch.flatten(model.avgpool(_folded_vgg_features(model, x)), 1))
