"""When a fast plan may run: the schemes it implements, hooks, torch.fx tracing and RescaleNet's
measuring steps (``docs/design.md``, "When a module runs the reference").

- **Schemes.** Each module built from a scheme (``ResidualBlock``, ``ResidualSublayer``,
  ``ResNet``, ``VGG``) runs a fast plan only if :func:`implements` its scheme: every field of
  the scheme (``dataclasses.fields``: those of a ``Scheme`` subclass too) is listed in
  :data:`IMPLEMENTED_FIELDS` with its value among the listed ones. Anything else (a new switch,
  a new merge rule) computes the reference function, never a fast one that silently ignores the
  switch. A field is listed once both fast plans and the frozen plan handle it (block, shortcut,
  stem, head, the scale carried along a ResNet and the offsets riding in its stream). A plan
  that implements more than that lists the difference in :data:`PLAN_FIELDS` (the frozen plan:
  NF-ResNet's Scaled WS and pre-activation layout); ``implements(scheme, plan)`` reads both.
- **Hooks.** The fast plans do not call the modules they fold, so a hook on one of them (the
  analysis probes hook the merge, the mean-shift layers and the ReLUs), a global module hook or
  ``torch.fx`` symbolic tracing (which records module calls and cannot branch on shapes)
  selects the reference where it would not fire.
- **Measuring.** The first ``measure_batches`` training steps of a RescaleNet (Shao et al.
  2020) measure its mean-shift statistics: they run eagerly under ``torch.compile`` (:func:`eager_while_measuring`)
  and on the folded plan (an offset being measured exists only once its layer's input is seen).
"""
from __future__ import annotations

import dataclasses
import logging

import torch
from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing
from torch.nn.modules import module as _module_mod

from ..layers import MEASURING_RUNS_EAGERLY, MeanShiftBias
from ..schemes import Scheme
from .cache import MEAN_SHIFT_SLOT, kept

__all__ = ["IMPLEMENTED_FIELDS", "PLAN_FIELDS", "implements", "unimplemented", "global_hooks", "has_hooks",
           "has_hooks_in", "has_hooks_below", "is_updating", "measuring_step",
           "eager_while_measuring"]

_logger = logging.getLogger(__name__)

_BOOL = (False, True)

# Every ``Scheme`` field the fast plans were written for, with the values they implement (None:
# any value). Checked field by field against the plans' code: a field is listed when the plans
# read it, or call the modules it builds, as the reference does, or when it acts only at
# construction or in the optimizer (never in ``forward``). Categorical fields list their values:
# a new value (a new merge rule) is as unknown as a new field.
IMPLEMENTED_FIELDS: dict[str, tuple | None] = {
    "name": None,                 # a label
    "families": None,             # checked at construction
    # --- the branch
    "norm": (None, "bn", "gn", "ln", "dyt", "derf"),  # norm layers (DyT's and Derf's pointwise
    #                               ones too) run as modules; nothing folds across them, no scale is
    #                               carried through them (shared.carries_scale)
    "norm_alpha": None,           # init of a pointwise norm's alpha: construction only
    "norm_alpha_attention": None,
    "norm_alpha_ffn": None,
    "norm_alpha_final": None,
    "zero_gamma": _BOOL,          # init only
    "norm_position": ("post", "pre"),  # the sublayer's plans call pre_norm and post_norm
    "mean_shift": _BOOL,          # MeanShiftBias folded (1, 2, 4): blocks, shortcut, stem, head, VGG
    "measure_batches": None,      # inside MeanShiftBias: offset() measures as the reference does
    "scalar_biases": _BOOL,       # Fixup's ScalarBias folded (1, 3); a sublayer's runs the reference
    "conv_bias": _BOOL,           # conv.bias enters every folded bias (scaled when carrying)
    "conv_dropout": None,         # self.drop applied; the folds dropout would change are skipped
    "conv_dropout_stages": None,  # which blocks get dropout: construction
    "scaled_ws": (False,),        # plain convs only: the plans fold and run conv.weight as it is
    # --- the merge
    "merge": ("add", "rescale"),  # ResidualMerge.skip_scale / branch_scale
    "c": None,                    # a number inside skip_scale / branch_scale
    "fixed_beta": _BOOL,          # branch_scale and init
    "gain": (None, "scalar", "vector"),  # the branch multiplier: none, one or per-channel values
    "gain_init": None,            # init value of the gain
    "layer_gain": _BOOL,          # one Gain module shared by a Transformer layer's sublayers: each
    #                               sublayer's plan reads its merge.gain as the reference does
    "block_scale": None,          # inside skip_scale / branch_scale (a Scheme refuses it beside Fixup's bias)
    "skip_alpha": None,           # inside skip_scale (DeepNorm's alpha), which the plans read
    "merge_norm": _BOOL,          # merge_norm runs as a module; no scale is carried through it
    "layout": ("v1",),            # ReLU after the merge; NF's pre-activation blocks train on the reference
    "nf_alpha": None,             # read only under layout "preact" (the branch_scale it gives)
    # --- the network
    "head_norm": _BOOL,           # runs as a module in the ResNet head on every plan
    "classifier_dropout": None,   # runs as a module in the head on every plan
    "stochdepth_rate": (0.0,),    # the fast training plans never drop a branch: a rate runs the reference
    "stochdepth_scale": _BOOL,    # read only where a branch is dropped (the reference)
    "init": ("he_fan_out", "he_fan_in", "rescale", "fixup", "deepnorm", "tfixup"),  # construction only; by value, as
    #                               a new rule may build something forward has to know about
    "zero_classifier": _BOOL,     # init only
    "shortcut_gain": None,        # init only
    "classifier_gain": None,      # init only
    "scalar_lr_factor": None,     # optimizer only (param_groups)
}

# What one plan implements beyond :data:`IMPLEMENTED_FIELDS`: {plan: {field: values}}, each entry
# replacing that field's entry for that plan alone (the other plans still run the reference).
PLAN_FIELDS: dict[str, dict[str, tuple | None]] = {
    "frozen": {
        "scaled_ws": _BOOL,       # each conv's standardized weight computed once, when it freezes
        "layout": ("v1", "preact"),  # preact: relu(x) * input_scale before the branch (the scale
        #                           folded into the first conv and the shortcut's), no ReLU after
        #                           the merge, none after the stem, the head's before pooling
        "init": ("he_fan_out", "he_fan_in", "rescale", "fixup", "nf", "deepnorm", "tfixup"),
        "stochdepth_rate": None,  # evaluation only, where stochastic depth is the identity
    },
}

_logged: set = set()


def unimplemented(scheme: Scheme, plan: str | None = None) -> list[str]:
    """The fields of ``scheme`` (a ``Scheme`` or a subclass) the fast plans (or ``plan``, with its
    :data:`PLAN_FIELDS`) were not written for: not listed, or with a value not listed."""
    table = {**IMPLEMENTED_FIELDS, **PLAN_FIELDS.get(plan, {})}
    out = []
    for f in dataclasses.fields(scheme):
        if f.name not in table:
            out.append(f.name)
            continue
        values = table[f.name]
        if values is not None and getattr(scheme, f.name) not in values:
            out.append(f.name)
    return out


def implements(scheme: Scheme, plan: str | None = None, log: bool = True) -> bool:
    """Whether the fast plans (or ``plan``) compute ``scheme``'s function (:func:`unimplemented`
    is empty). ``log``: where they do not, log it once per scheme name, plan and set of
    unimplemented fields (INFO)."""
    missing = unimplemented(scheme, plan)
    if missing and log:
        key = (type(scheme).__qualname__, scheme.name, plan, tuple(missing))
        if key not in _logged:
            _logged.add(key)
            _logger.info("scheme %r: %s not implement %s; its modules run the reference path there",
                         scheme.name, f"the {plan} plan does" if plan else "the fast plans do",
                         ", ".join(f"{n}={getattr(scheme, n)!r}" for n in missing))
    return not missing


# --------------------------------------------------------------- hooks
def global_hooks() -> bool:
    """Global module hooks, or torch.fx symbolic tracing: every module must be called as in the
    reference path."""
    return bool(_module_mod._global_forward_hooks or _module_mod._global_forward_pre_hooks
                or _module_mod._global_backward_hooks or _module_mod._global_backward_pre_hooks
                or is_fx_symbolic_tracing())


def _module_hooks(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or m._backward_pre_hooks)


def has_hooks(*modules: nn.Module | None) -> bool:
    """Whether any of ``modules`` (not their children) has hooks, or global module hooks exist:
    a fast plan does not call the modules it folds, so their hooks would never fire."""
    return global_hooks() or any(m is not None and _module_hooks(m) for m in modules)


def has_hooks_in(module: nn.Module) -> bool:
    """Hooks on ``module`` or any of its submodules (or global hooks)."""
    return global_hooks() or any(_module_hooks(m) for m in module.modules())


def has_hooks_below(module: nn.Module) -> bool:
    """Hooks on any strict submodule of ``module`` (its own hooks fire around its forward)."""
    if global_hooks():
        return True
    it = module.modules()
    next(it)
    return any(_module_hooks(m) for m in it)


# --------------------------------------------------------------- measuring
def is_updating(mod: nn.Module) -> bool:
    """A mean-shift layer that would measure on a call now."""
    return isinstance(mod, MeanShiftBias) and mod.updating


def measuring_step(model: nn.Module) -> bool:
    """Whether a forward of ``model`` now measures some mean-shift statistics (training mode,
    gradients on, a layer still measuring). Reads only the layers' ``measuring`` flags, from a
    list kept until a module is next registered anywhere (:func:`~.cache.kept`)."""
    if not (model.training and torch.is_grad_enabled()):
        return False
    layers = kept(model, MEAN_SHIFT_SLOT, "layers",
                  lambda: tuple(m for m in model.modules() if isinstance(m, MeanShiftBias)))
    return any(m.measuring for m in layers)


@torch.compiler.disable(reason=MEASURING_RUNS_EAGERLY)
def _eagerly(fn, *args):
    return fn(*args)


def eager_while_measuring(model: nn.Module, fn, *args):
    """``fn(*args)``, run eagerly under ``torch.compile`` while ``model`` measures mean-shift
    statistics (the first few steps: compiled code never sees the per-step counters, and the
    graph is built once measuring is over). A graph break: under ``fullgraph=True`` dynamo raises
    ``Unsupported`` with :data:`~rescale_core.layers.MEASURING_RUNS_EAGERLY` as its reason."""
    return _eagerly(fn, *args) if measuring_step(model) else fn(*args)
