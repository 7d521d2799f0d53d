"""Probes for the questions the papers (Shao et al. 2020; De & Smith 2020) raise. Hooks only:
no model changes, state restored.

- :func:`signal_propagation`: per residual block, the variances of the scaled skip term, the
  scaled branch term, their sum and the block output, and the relative error of the RescaleNet
  rebuttal's Eq. 1, ``eta_k = |Var[a x] + Var[b F] - Var[x_k]| / Var[x_k]``; and the block
  output's average channel squared mean and average channel variance, what Brock et al.'s
  signal propagation plots show (NF-ResNets, 2021, Sec. 3).
- :func:`learned_scalars`: the learned branch multipliers per block (rebuttal [R2]).
- :func:`dead_relu_fraction`: fraction of ReLU units that never fire on a batch (Sec. 4.4).

The probes hook the merge and the ReLUs, so they run the model on its reference path
(:func:`rescale_core.plans.reference_path`; the fast plans compute the same function but
call neither), and eagerly (:func:`eager`): a model compiled with ``torch.compile`` (a run's
``compile: true``) runs its compiled code without the hooks the probes add after it compiled, or
with some of them.
"""
from __future__ import annotations

import copy
import os
import re
from contextlib import contextmanager

import torch
from torch import nn

from .blocks import ResidualMerge, ResidualSublayer
from .plans import reference_path
from .layers import MeanShiftBias
from .models.transformer import MultiheadAttention, TransformerEmbedding

__all__ = ["signal_propagation", "residual_blocks", "stage_of", "learned_scalars", "dead_relu_fraction", "eager",
           "full_parameters"]

# the attribute through which an FSDP unit holds the module it wraps (it forwards every other
# attribute to it, ``merge`` too): a qualified name passes through it
try:
    from torch.distributed.fsdp._common_utils import FSDP_WRAPPED_MODULE as _FSDP_WRAPPED
except ImportError:  # a torch built without torch.distributed
    _FSDP_WRAPPED = "_fsdp_wrapped_module"


def residual_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of every module owning a :class:`ResidualMerge`, in model order.
    Under FSDP a block wrapped in a unit of its own is listed once, by its name in the plain
    network (the unit, which forwards ``merge`` to it, is not a block)."""
    return [(".".join(part for part in name.split(".") if part != _FSDP_WRAPPED), m)
            for name, m in model.named_modules() if isinstance(dict(m.named_children()).get("merge"), ResidualMerge)]


@contextmanager
def full_parameters(model: nn.Module):
    """Inside it, every parameter of ``model`` is whole on this rank: under FSDP (a run's
    ``experiments/cluster/fsdp.yaml``) each rank holds a shard of every unit's parameters, a
    block's gain only on one rank (elsewhere empty: its mean NaN), so they are gathered (a
    collective: every rank enters it) and dropped again afterwards, unchanged. Without FSDP units
    it does nothing."""
    if torch.distributed.is_available():
        from torch.distributed.fsdp import FullyShardedDataParallel

        if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            with FullyShardedDataParallel.summon_full_params(model, writeback=False):
                yield
            return
    yield


def stage_of(name: str) -> str:
    """``layer3.5`` -> ``layer3``; ``encoder.layers.2.ffn`` -> ``encoder.layers``."""
    match = re.match(r"^(.*?)(?:\.\d+)(?:\.|$)", name)
    return match.group(1) if match else name.rsplit(".", 1)[0]


def eager():
    """Inside it, a compiled model (or part) runs its Python code eagerly, every hook called: the
    probes' forward passes run so (``torch.compile``'s cached code would skip hooks added later)."""
    return torch.compiler.set_stance("force_eager")


@contextmanager
def _preserved_modes(model: nn.Module, train: bool | None):
    """Run with the given mode and put every module's own mode back afterwards (a part kept in
    eval mode inside a model in training stays so)."""
    modes = {m: m.training for m in model.modules()}
    if train is not None:
        model.train(train)
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode


#: the modules whose training mode does nothing but drop (dropout, the attention weights' dropout)
_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout,
             MultiheadAttention)


@contextmanager
def _without_drops(model: nn.Module):
    """Run with dropout and stochastic depth as at evaluation (the dropout modules in eval mode,
    every residual block's ``drop_rate`` 0), the rest of the model in its mode; put back after."""
    modes = {m: m.training for m in model.modules() if isinstance(m, _DROPOUTS)}
    rates = {m: m.drop_rate for m in model.modules() if getattr(m, "drop_rate", 0.0)}
    try:
        for m in modes:
            m.training = False
        for m in rates:
            m.drop_rate = 0.0
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode
        for m, rate in rates.items():
            m.drop_rate = rate


@contextmanager
def _preserved_state(model: nn.Module, train: bool | None):
    """Run with the given mode and put every parameter, buffer and mode back afterwards."""
    state = copy.deepcopy(model.state_dict())
    with _preserved_modes(model, train):
        try:
            yield
        finally:
            model.load_state_dict(state)


def _var(t: torch.Tensor) -> float:
    return float(t.detach().double().var(unbiased=False))


def _channel_stats(t: torch.Tensor, dim: int) -> tuple[float, float]:
    """(average channel squared mean, average channel variance) of ``t``, channel dimension ``dim``:
    each channel's mean and biased variance over every other dimension (samples, positions)."""
    x = t.detach().double().movedim(dim, 0).flatten(1)
    return float(x.mean(dim=1).square().mean()), float(x.var(dim=1, unbiased=False).mean())


def signal_propagation(model: nn.Module, inputs, train: bool | None = True) -> list[dict]:
    """One forward pass with hooks; one dict per residual block in forward order.

    Keys: ``name``, ``stage``, ``block`` (index inside its stage), ``k`` and ``L``,
    ``skip_scale``/``branch_scale`` (fixed multipliers), ``gain`` (mean learned multiplier or
    None), ``var_skip``, ``var_branch``, ``var_sum``, ``var_out`` (what the next block receives)
    and ``eta``: each ``var_*`` the variance over every element of the tensor (samples, channels
    and positions pooled). ``chan_mean_sq_out`` and ``chan_var_out``: the block output's average
    channel squared mean and average channel variance (each channel's mean and variance over
    samples and positions, averaged over channels: Brock et al.'s signal propagation plots; a
    channel is dimension 1 of a conv network's output, a feature of a Transformer's).
    ``var_out = chan_var_out`` + the variance of the channel means. ``inputs`` is a tensor or a
    tuple of positional arguments.

    ``train=True`` (default) measures as at the start of training (BatchNorm uses batch
    statistics; mean-shift layers still measuring subtract this batch's means, as they would on
    the first training batch); ``False`` uses eval mode; ``None`` keeps the model's mode and
    measures as that mode's forward pass would (a model in training mode: as ``True``). The
    model's parameters, buffers (BN running stats, mean-shift state) and modes are restored, and
    the random streams (CPU, and the model's GPUs) are where they were. In either mode dropout and
    stochastic depth are off, as at evaluation (the NF-ResNet paper's plots are of the network
    without them): a network trained with a ``stochdepth_rate`` or dropout is probed as the same
    network without one. Models without residual blocks (VGG) give an empty list.
    """
    blocks = residual_blocks(model)
    records: list[dict] = []
    pending: dict[int, dict] = {}
    handles = []

    def merge_hook(merge: ResidualMerge, args, output):
        skip, branch = args[0], args[1]
        rec = {"var_skip": _var(merge.skip_term(skip)), "var_branch": _var(merge.branch_term(branch)),
               "var_sum": _var(output)}
        pending[id(merge)] = rec

    def block_hook(name: str):
        def hook(block: nn.Module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            rec = pending.pop(id(block.merge))
            merge = block.merge
            gain = None if merge.gain is None else float(merge.gain.weight.detach().mean())
            stage = stage_of(name)
            index = sum(1 for r in records if r["stage"] == stage)
            mean_sq, chan_var = _channel_stats(out, -1 if isinstance(block, ResidualSublayer) else 1)
            rec.update(name=name, stage=stage, block=index, k=merge.k, L=merge.L,
                       skip_scale=merge.skip_scale, branch_scale=merge.branch_scale, gain=gain,
                       var_out=_var(out), chan_mean_sq_out=mean_sq, chan_var_out=chan_var)
            rec["eta"] = abs(rec["var_skip"] + rec["var_branch"] - rec["var_sum"]) / max(rec["var_sum"], 1e-30)
            records.append(rec)
        return hook

    # any randomness of the forward pass draws from a fork of the random streams: the caller's run on unchanged
    devices = sorted({p.device.index for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices), _preserved_state(model, train), _without_drops(model), \
            reference_path(model), eager():
        # in the mode probed (the model's own with train=None), a mean-shift layer in training mode
        # and still measuring measures this batch, as on a training batch: it needs gradients enabled
        measuring = any(isinstance(m, MeanShiftBias) and m.measuring and m.training for m in model.modules())
        try:
            for name, block in blocks:
                handles.append(block.merge.register_forward_hook(merge_hook))
                handles.append(block.register_forward_hook(block_hook(name)))
            args = inputs if isinstance(inputs, tuple) else (inputs,)
            with torch.set_grad_enabled(measuring):
                model(*args)
        finally:
            for h in handles:
                h.remove()
    return records


def learned_scalars(model: nn.Module) -> dict[str, float]:
    """Mean learned branch multiplier of every residual block (name -> value), a multiplier shared
    by several blocks once, under their common name (``Scheme.layer_gain``: a Transformer layer's
    sublayers share one, named by the layer); under FSDP every rank must call it
    (:func:`full_parameters`)."""
    with full_parameters(model):
        sharing: dict[int, tuple[list[str], nn.Module]] = {}
        for name, block in residual_blocks(model):
            if block.merge.gain is not None:
                sharing.setdefault(id(block.merge.gain), ([], block.merge.gain))[0].append(name)
        return {_common_name(names): float(gain.weight.detach().mean()) for names, gain in sharing.values()}


def _common_name(names: list[str]) -> str:
    """The dotted prefix ``names`` share (``encoder.layers.0`` of its ``.self_attn`` and ``.ffn``); one name: itself."""
    common = os.path.commonprefix([n.split(".") for n in names])
    return ".".join(common) or names[0]


def _linear_only(parent: nn.Module) -> bool:
    """Whether ``parent``'s layers are linear ones: a linear child and no convolution."""
    children = list(parent.children())
    return (any(isinstance(c, nn.Linear) for c in children)
            and not any(isinstance(c, nn.modules.conv._ConvNd) for c in children))


@torch.no_grad()
def dead_relu_fraction(model: nn.Module, inputs, per_sample: bool = False) -> float:
    """Fraction of post-ReLU units (over channels of every ReLU call) that are zero for every
    sample and position of ``inputs``: the dead neurons the mean-shift biases are meant to avoid.
    A unit is a channel of a convolution's output (dimension 1) or a feature of a linear layer's
    (the last dimension: a Transformer's feed-forward units, ``[batch, positions, features]``): a
    ReLU counts features when its module's siblings are linear layers and no convolution (a
    ResNet's stem ReLU sits beside its classifier, yet acts on the stem convolution's channels).
    A Transformer's units count at its real tokens only: a padding position (of the source in the
    encoder, of the target in the decoder) neither keeps a unit alive nor is a position of it.

    ``per_sample=True``: the fraction of (sample, channel) pairs that are zero at every position
    of that sample, i.e. the mean over samples of the channels silent on each: finer than "dead
    on the whole batch", which a network at initialisation rarely has.

    Raises ValueError when no ``nn.ReLU`` module runs (a fraction of no units is not 0)."""
    dead, total = 0, 0
    features_last = {relu for parent in model.modules() if _linear_only(parent)
                     for relu in parent.children() if isinstance(relu, nn.ReLU)}
    real: list[torch.Tensor] = []  # [B, S] True at real tokens, of the sequence embedded last

    def tokens_hook(embedding: TransformerEmbedding, args):
        real[:] = [args[0].ne(embedding.pad_index)]  # an encoder's or decoder's layers follow its embedding

    def hook(module, args, output):
        nonlocal dead, total
        out = output.detach()
        if module in features_last:
            if real and out.shape[:-1] == real[0].shape:  # [B, S, F] at the tokens embedded last
                fires = out.gt(0) & real[0].unsqueeze(-1)
                alive = fires.any(dim=1)[real[0].any(dim=1)] if per_sample else fires.flatten(0, 1).any(dim=0)
                dead += int((~alive).sum())
                total += alive.numel()
                return
            out = out.movedim(-1, 1)
        if per_sample:
            alive = out.reshape(out.shape[0], out.shape[1], -1).gt(0).any(dim=2)
        else:
            alive = out.transpose(0, 1).reshape(out.shape[1], -1).gt(0).any(dim=1)
        dead += int((~alive).sum())
        total += alive.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.ReLU)]
    handles += [m.register_forward_pre_hook(tokens_hook) for m in model.modules()
                if isinstance(m, TransformerEmbedding)]
    try:
        with _preserved_modes(model, False), reference_path(model), eager():
            model(*(inputs if isinstance(inputs, tuple) else (inputs,)))
    finally:
        for h in handles:
            h.remove()
    if not total:  # 0 dead of 0 units would read as "no dead ReLUs"
        raise ValueError(f"{type(model).__name__}: no nn.ReLU module ran on the inputs, so there are no ReLU units "
                         "to count; dead_relu_fraction counts the outputs of nn.ReLU modules")
    return dead / total
