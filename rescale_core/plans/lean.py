"""The lean plan: the reference function with the fewest ops per step, for an eager accelerator
step, which is host-bound (each launched op costs ~9 us of host time whatever its size:
``docs/design.md``, "Host cost per launched op on a GPU", and "What the lean plan does instead").

Every additive term (RescaleNet's ``bias - mu0``, Shao et al. 2020; Fixup's scalar biases, Zhang
et al. 2019) and every branch multiplier (``gain * branch_scale``) of the whole network is computed in one pass at the start of
the forward (:class:`LeanTerms`: one concatenation of the parameters, one subtraction of the
measured means, one multiplication by constants, one cast to the activations' dtype, whatever
the depth), then used as views: an offset is one per-channel add (or the conv's own bias slot
where the conv follows it directly), a merge is one ``addcmul(skip, branch, multiplier)``
(:func:`gain_merge`), RescaleNet's skip multipliers are carried along the stages as in the
folded plan (:func:`~rescale_core.plans.shared.carried_scales`). Nothing weight-sized is
computed per step. While a mean-shift layer measures, the folded plan runs instead.

One function per module type, each under the reference ``forward`` it must equal:
:func:`lean_block` (``ResidualBlock``), :func:`lean_sublayer` (``ResidualSublayer``),
:func:`lean_resnet` (``ResNet``) and :func:`lean_vgg` (``VGG``).
"""
from __future__ import annotations

import torch
from torch import nn

from ..blocks import ResidualBlock, ResidualSublayer
from ..layers import (Gain, MeanShiftBias, ScalarBias, StridedAvgPool, apply_function, with_combined_form,
                      writes_into_buffers)
from ..models.resnet import ResNet
from ..models.vgg import VGG
from .cache import LEAN_SLOT, kept
from .conditions import has_hooks_below, has_hooks_in, is_updating, measuring_step
from .dispatch import register
from .folds import scaled
from .shared import activation_dtype, add_scaled_skip, add_skip, carried_scales, network_part, offset_stem, run_stages

__all__ = ["LeanTerms", "is_term_module", "gain_merge", "block_entries", "block_terms",
           "lean_block", "lean_sublayer", "lean_resnet", "lean_vgg"]


# --------------------------------------------------------------- the terms, in one pass
def _term_parameter(mod: nn.Module) -> torch.Tensor:
    return mod.weight if isinstance(mod, Gain) else mod.bias


class LeanTerms:
    """Every additive term and branch multiplier of a network, computed in one pass.

    ``entries``: (module, multiplier) pairs, each module a :class:`MeanShiftBias` (term
    ``bias - mu0``, or ``bias * measure_bias_scale - mu0`` before it has measured), a
    :class:`ScalarBias` (``bias``) or a :class:`Gain` (``weight``); the multiplier (a float) is
    applied to the whole term: ``1 / c`` for a term added to activations carried in units of
    ``c``, ``branch_scale * c_in / c_out`` for a gain. :meth:`values` returns, per module, its
    term in the activations' dtype with its parameter's shape: views of one vector computed by
    a fixed number of ops (concatenation, subtraction of the means, multiplication, cast), so
    that the network launches the same few ops for these terms whatever its depth, and their
    backward is one multiplication and one cast."""

    def __init__(self, entries: list[tuple]) -> None:
        self.modules = [e[0] for e in entries]
        self.multipliers = [float(e[1]) for e in entries]
        # a third element n: a scalar term wanted as n equal values (a conv's bias slot)
        self.expand = [e[2] if len(e) > 2 else None for e in entries]
        self.sizes = [_term_parameter(m).numel() for m in self.modules]
        self.shapes = [tuple(_term_parameter(m).shape) if n is None else (n,)
                       for m, n in zip(self.modules, self.expand)]
        self.out_sizes = [s if n is None else n for s, n in zip(self.sizes, self.expand)]
        self._constants: dict = {}

    def __len__(self) -> int:
        return len(self.modules)

    def _constant(self, kind: str, like: torch.Tensor, premultiplied: tuple[bool, ...]):
        """Cached per device and dtype: the per-element multiplier vectors and a zero vector
        (None where every multiplier is 1)."""
        key = (kind, like.device, like.dtype, premultiplied)
        if key not in self._constants:
            if kind == "zeros":
                value = torch.zeros(max(self.sizes), device=like.device, dtype=like.dtype)
            elif kind == "index":  # source element of every output element
                starts = [0]
                for n in self.sizes:
                    starts.append(starts[-1] + n)
                index = [j for start, n, e in zip(starts, self.sizes, self.expand)
                         for j in ([start] * e if e is not None else range(start, start + n))]
                value = torch.tensor(index, device=like.device, dtype=torch.long)
            else:
                if kind == "pre":
                    per = [m.measure_bias_scale if p else 1.0 for m, p in zip(self.modules, premultiplied)]
                    sizes = self.sizes
                else:
                    per, sizes = self.multipliers, self.out_sizes
                if all(s == 1.0 for s in per):
                    value = None
                else:
                    value = torch.cat([torch.full((n,), s, dtype=torch.float64) for n, s in zip(sizes, per)])
                    value = value.to(device=like.device, dtype=like.dtype)
            self._constants[key] = value
        return self._constants[key]

    def values(self, dtype: torch.dtype) -> dict[nn.Module, torch.Tensor]:
        if not self.modules:
            return {}
        params = [_term_parameter(m) for m in self.modules]
        flat = torch.cat([p.reshape(-1) for p in params])
        # a mean-shift layer that has not measured yet (evaluated before training) scales its bias
        pre = tuple(isinstance(m, MeanShiftBias) and m.measuring for m in self.modules)
        if any(pre):
            flat = flat * self._constant("pre", flat, pre)
        means = [m.mu0 if isinstance(m, MeanShiftBias) else None for m in self.modules]
        if any(mu is not None for mu in means):
            zeros = self._constant("zeros", flat, ())
            flat = flat - torch.cat([zeros[:n] if mu is None else mu.reshape(-1).to(flat.dtype)
                                     for mu, n in zip(means, self.sizes)])
        if any(n is not None for n in self.expand):  # one gather for every expanded term
            flat = flat.index_select(0, self._constant("index", flat, ()))
        mult = self._constant("post", flat, ())
        if mult is not None:
            flat = flat * mult
        flat = flat.to(dtype)
        parts = torch.split(flat, self.out_sizes)
        return {m: part.view(shape) for m, part, shape in zip(self.modules, parts, self.shapes)}


def is_term_module(mod: nn.Module) -> bool:
    """A module whose term :class:`LeanTerms` computes."""
    return isinstance(mod, (MeanShiftBias, ScalarBias, Gain))


# --------------------------------------------------------------- the merge, one addcmul
@with_combined_form
class _GainMerge(torch.autograd.Function):
    """``alpha * skip + s * f`` (``s`` a gain times constants, one value or one per channel;
    ``alpha`` a float): one ``addcmul`` forward (and a multiplication where ``alpha != 1``);
    backward ``df = s g`` (in ``f``'s dtype), ``ds = sum(g f)`` (a dot product for one value)
    and ``dskip = alpha g``: three ops where autograd's addcmul formula launches five."""

    generate_vmap_rule = True

    @staticmethod
    def forward(skip, f, s, alpha):
        return _addcmul(skip, f, s, alpha)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, f, s, alpha = inputs
        ctx.save_for_backward(f, s)
        ctx.alpha = alpha

    @staticmethod
    def backward(ctx, g):
        f, s = ctx.saved_tensors
        gskip = gf = gs = None
        if ctx.needs_input_grad[0]:
            gskip = g if ctx.alpha == 1.0 else g * ctx.alpha
        if g.dtype != f.dtype and (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):
            g = g.to(f.dtype)  # what autograd would cast df to anyway (a float32 stream, bf16 branch)
        if ctx.needs_input_grad[1]:
            gf = g * s
        if ctx.needs_input_grad[2]:
            gs = _dot(g, f) if s.numel() == 1 else (g * f).sum_to_size(s.shape)
            gs = gs.reshape(s.shape).to(s.dtype)
        return gskip, gf, gs, None


def _flat_view(t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s elements as a 1-D view in memory order (contiguous or channels_last), else None."""
    if t.is_contiguous():
        return t.view(-1)
    if t.dim() in (4, 5):
        perm = (0,) + tuple(range(2, t.dim())) + (1,)
        p = t.permute(perm)
        if p.is_contiguous():
            return p.view(-1)
    return None


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum(a * b)`` in one op where both lie in memory in the same order."""
    if a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype:
        fa, fb = _flat_view(a), _flat_view(b)
        if fa is not None and fb is not None:
            return torch.dot(fa, fb)
    return (a * b).sum()


def _addcmul(skip: torch.Tensor, f: torch.Tensor, s: torch.Tensor, alpha: float) -> torch.Tensor:
    """``alpha * skip + s * f`` laid out as the branch ``f`` (channels_last stays channels_last
    where a shortcut's pooling returned another layout), in the promoted dtype of ``skip`` and
    ``f``; out of place under ``torch.compile`` and ``torch.func``
    (:func:`~rescale_core.layers.writes_into_buffers`)."""
    dtype = torch.promote_types(skip.dtype, f.dtype)
    skip = skip if alpha == 1.0 else skip * alpha
    if writes_into_buffers():
        return torch.addcmul(skip, f, s, out=torch.empty_like(f, dtype=dtype))
    y = torch.addcmul(skip, f, s)
    return y if y.dtype == dtype else y.to(dtype)  # no .to() that changes nothing: torch 2.11 zeroes that too


def gain_merge(skip: torch.Tensor, f: torch.Tensor, s: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """``alpha * skip + s * f`` with the fewest ops in forward and backward (:class:`_GainMerge`)."""
    if torch.is_grad_enabled() and (f.requires_grad or s.requires_grad or skip.requires_grad):
        return apply_function(_GainMerge, skip, f, s, float(alpha))
    return _addcmul(skip, f, s, alpha)


# --------------------------------------------------------------- ResidualBlock
# reference: relu(merge_norm(merge(downsample(x), branch(x)))), where the branch runs
# post(drop(conv(shift(h)))) per layer with a ReLU between layers, and the merge is
# skip_scale * skip + branch_scale * gain * f (+ Fixup's bias)
def block_entries(block: ResidualBlock, c_in: float, c_out: float) -> list[tuple]:
    """The (module, multiplier) pairs whose terms :func:`lean_block` reads, for activations
    taken in units of ``c_in`` and returned in units of ``c_out``."""
    entries = []
    if block.downsample is not None:
        entries += [(m, 1.0 / c_in) for m in block.downsample if is_term_module(m)]
    for shift, conv, post in block.branch_layers():
        if is_term_module(shift):
            entries.append((shift, 1.0 / c_in))
        if isinstance(post, ScalarBias):  # Fixup's pre-activation bias: the conv's bias slot
            entries.append((post, 1.0 / c_in, conv.out_channels))
    if block.merge.gain is not None:
        entries.append((block.merge.gain, block.merge.branch_scale * c_in / c_out))
    if block.merge.bias is not None:
        entries.append((block.merge.bias, 1.0 / c_out))
    return entries


def block_terms(block: ResidualBlock) -> LeanTerms:
    """A block's own :class:`LeanTerms` (a block called on its own, e.g. by a detection
    backbone's layer getter; a ResNet computes one for all its blocks)."""
    return kept(block, LEAN_SLOT, "terms", lambda: LeanTerms(block_entries(block, 1.0, 1.0)))


def _lean_shortcut(seq: nn.Sequential, x: torch.Tensor, c_in: float, terms: dict) -> torch.Tensor:
    for mod in seq:
        if is_term_module(mod):
            x = x + terms[mod]
        elif isinstance(mod, StridedAvgPool):
            x = mod.pool(x)
        elif c_in != 1.0 and isinstance(mod, nn.modules.conv._ConvNd) and mod.bias is not None:
            x = mod._conv_forward(x, mod.weight, mod.bias / c_in)
        else:
            x = mod(x)
    return x


def _block_applies(block: ResidualBlock, x: torch.Tensor) -> bool:
    """No hook below, and no mean-shift layer of the block measuring (a measured offset exists
    only once the layer's input has been seen: the folded plan runs)."""
    return not has_hooks_below(block) and not any(is_updating(m) for m in block.modules())


def lean_block(block: ResidualBlock, x: torch.Tensor, c_in: float, c_out: float, terms: dict) -> torch.Tensor:
    """The block's reference function with the fewest ops: each pre-conv offset one add, Fixup's
    pre-activation bias in the conv's bias slot, the merge one ``addcmul(skip, f, gain *
    branch_scale)`` (or an ``add`` with ``alpha``), the ReLUs in place. ``terms``: the
    :func:`block_entries` values for the same ``c_in``, ``c_out`` (units as in the folded plan's
    :func:`~rescale_core.plans.folded.folded_block`)."""
    skip = x if block.downsample is None else _lean_shortcut(block.downsample, x, c_in, terms)
    drop_active = block.training and not isinstance(block.drop, nn.Identity)
    h = x
    layers = block.branch_layers()
    for i, (shift, conv, post) in enumerate(layers, start=1):
        if is_term_module(shift):
            h = h + terms[shift]
        elif not isinstance(shift, nn.Identity):
            h = shift(h)
        bias = scaled(conv.bias, c_in)
        fold_post = isinstance(post, ScalarBias) and not drop_active
        if fold_post:  # conv(h) + b: the conv's bias slot (b comes as out_channels values)
            b = terms[post]
            bias = b if bias is None else bias.to(b.dtype) + b
        h = block.drop(conv._conv_forward(h, conv.weight, bias))
        if isinstance(post, ScalarBias):
            if not fold_post:
                h = h + terms[post][:1]
        elif not isinstance(post, nn.Identity):
            h = post(h)
        if i < len(layers):
            h = torch.relu_(h)
    merge = block.merge
    alpha = merge.skip_scale * c_in / c_out
    if merge.gain is not None:
        out = gain_merge(skip, h, terms[merge.gain], alpha)
    else:
        scale = merge.branch_scale * c_in / c_out
        if scale == 1.0:
            out = add_skip(h, skip, alpha)
        else:  # in the branch's layout, as add_skip
            out = add_scaled_skip(h, scale, skip, alpha)
    if merge.bias is not None:
        out = out + terms[merge.bias]
    return torch.relu_(block.merge_norm(out))


@register("lean", ResidualBlock, applies=_block_applies)
def _lean_block_alone(block: ResidualBlock, x: torch.Tensor) -> torch.Tensor:
    """A block called as a module, in true units, on its own terms."""
    return lean_block(block, x, 1.0, 1.0, block_terms(block).values(activation_dtype(x)))


# --------------------------------------------------------------- ResidualSublayer
# reference: post_norm(merge(x, dropout(fn(pre_norm(x)))))
@register("lean", ResidualSublayer, applies=lambda sub, x: not has_hooks_below(sub))
def lean_sublayer(sub: ResidualSublayer, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """The branch as it is, then one ``addcmul(alpha * x, f, gain * branch_scale)``
    (:func:`gain_merge`); with a scalar bias after the multiplier (``scalar_biases``), the
    merge as it is."""
    out = sub.dropout(sub.fn(sub.pre_norm(x), *args, **kwargs))
    merge = sub.merge
    if merge.gain is not None and merge.bias is None:
        s = (merge.gain.weight * merge.branch_scale).to(out.dtype)
        out = gain_merge(x, out, s, merge.skip_scale)
    else:
        out = merge(x, out)
    return sub.post_norm(out)


# --------------------------------------------------------------- ResNet
# reference (ResNet._run): maxpool(relu(bn1(conv1(x)))), each stage (after its temporal pool),
# then fc(fc_bias(dropout(head_norm(flatten(avgpool(pool_shift(x)))))))
def _lean_schedule(model: ResNet) -> tuple[LeanTerms, dict]:
    """(LeanTerms of the whole network, {block: (c_in, c_out)}): the scales of
    :func:`~rescale_core.plans.shared.carried_scales`, ``(1, 1)`` for a block on a fast plan
    that does not carry them, ``(None, None)`` for a block on its reference. Kept until a
    module is registered anywhere (``set_plan`` and ``reference_path`` drop it: the blocks'
    plans shape it; no walk over the modules per forward)."""
    def build():
        blocks = []
        for block, c_in, c_out in carried_scales(b for _, stage in model.stage_modules() for b in stage):
            if c_in is None and isinstance(block, ResidualBlock) and block.fused:
                c_in = c_out = 1.0
            blocks.append((block, c_in, c_out))
        entries = [(model.bn1, 1.0)] if is_term_module(model.bn1) else []
        for block, c_in, c_out in blocks:
            if c_in is not None:
                entries += block_entries(block, c_in, c_out)
        entries += [(m, 1.0) for m in (model.pool_shift, model.fc_bias) if is_term_module(m)]
        return LeanTerms(entries), {block: (c_in, c_out) for block, c_in, c_out in blocks}

    return kept(model, LEAN_SLOT, "schedule", build)


def _lean_stage(stage: nn.Sequential, x: torch.Tensor, c: float, scales: dict, terms: dict):
    for block in stage:
        c_in, c_out = scales[block]
        if c_in is None:
            x, c = block(x if c == 1.0 else x * c), 1.0
        else:
            if c != c_in:  # a block that does not carry the scale takes true units
                x, c = x * c, 1.0
            x, c = lean_block(block, x, c_in, c_out, terms), c_out
    return x, c


def _lean_features(model: ResNet, x: torch.Tensor, scales: dict, terms: dict,
                   stages: list | None) -> tuple[torch.Tensor, float]:
    """Features in units of ``c`` (true features = ``c * x``), as the folded plan's."""
    conv, post = model.conv1, model.bn1
    if is_term_module(post):
        x = model.maxpool(offset_stem(conv, x, terms[post]))
    else:
        x = model.maxpool(torch.relu_(post(conv(x))))
    return run_stages(model.stage_modules(), x, lambda stage, x, c: _lean_stage(stage, x, c, scales, terms), stages)


def _lean_head(model: ResNet, x: torch.Tensor, c: float, terms: dict) -> torch.Tensor:
    """The head on features in units of ``c``: ``e + c * avgpool(x)`` in one op (4)."""
    x = torch.flatten(model.avgpool(x), 1)
    if is_term_module(model.pool_shift):
        x = torch.add(terms[model.pool_shift].reshape(1, -1), x, alpha=c)
    elif c != 1.0:
        x = x * c
    x = model.dropout(model.head_norm(x))
    if is_term_module(model.fc_bias):
        x = x + terms[model.fc_bias]
    return model.fc(x)


def _resnet_applies(model: ResNet, x: torch.Tensor) -> bool:
    return not measuring_step(model) and not has_hooks_in(model)


@register("lean", ResNet, applies=_resnet_applies)
def lean_resnet(model: ResNet, x: torch.Tensor, part: str, stages: list | None = None) -> torch.Tensor:
    """``part`` of the network (``ResNet``'s reference ``_run``) on the lean plan."""
    schedule, scales = _lean_schedule(model)
    terms = schedule.values(activation_dtype(x))
    return network_part(lambda x: _lean_features(model, x, scales, terms, stages),
                        lambda x, c: _lean_head(model, x, c, terms), x, part)


# --------------------------------------------------------------- VGG
# reference: classifier(flatten(avgpool(features(x)))), each Sequential module by module
def _lean_vgg_terms(model: VGG) -> LeanTerms:
    return kept(model, LEAN_SLOT, "terms", lambda: LeanTerms(
        [(m, 1.0) for m in model.modules() if isinstance(m, MeanShiftBias)]))


@register("lean", VGG, applies=lambda model, x: not measuring_step(model) and not has_hooks_in(model))
def lean_vgg(model: VGG, x: torch.Tensor) -> torch.Tensor:
    """Every mean-shift offset of the network computed in one pass, each then one add in front
    of its conv or linear layer."""
    terms = _lean_vgg_terms(model).values(activation_dtype(x))
    for seq in (model.features, None, model.classifier):
        if seq is None:
            x = torch.flatten(model.avgpool(x), 1)
            continue
        for m in seq:
            x = x + terms[m] if isinstance(m, MeanShiftBias) else m(x)
    return x
