"""Execution plans: how a network's normalisation-free blocks are computed, for one function
(RescaleNet, Shao et al. 2020; SkipInit, De & Smith 2020; Fixup, Zhang et al. 2019; ReZero,
Bachlechner et al. 2020). ``docs/design.md`` ("Execution plans") explains them and the measured
facts behind them.

Every plan computes the reference function (the layer-by-layer ``forward`` of
:mod:`rescale_core.blocks` and the model families) with the same parameters, buffers and state
dict; they differ only in which ops they launch:

- ``"reference"``: the layer-by-layer definition, written in the model files;
- ``"folded"`` (:mod:`.folded`): biases, offsets and multipliers folded into the convolutions
  every step, fewer passes over the activations;
- ``"lean"`` (:mod:`.lean`): every offset and gain of the network computed in one pass, the
  fewest ops per step;
- ``"auto"`` (the default): lean for tensors on an accelerator, folded on the CPU, decided per
  call from the input's device.

In evaluation without autograd (eval mode under ``torch.no_grad`` or ``torch.inference_mode``)
every fast plan hands the call to the frozen plan first (:mod:`.frozen`): weights folded once
and kept on the module in the dtype autocast computes in, a plain conv/ReLU network's ops
(:func:`set_frozen` turns it off). It implements more schemes than the training plans
(:data:`~.conditions.PLAN_FIELDS`: NF-ResNets, whose training runs the reference).

One module per plan, each holding one function per module type (``ResidualBlock``,
``ResidualSublayer``, ``ResNet``, ``VGG``) under the reference it must equal, named after its
plan (``folded_block``, ``lean_block``, ``frozen_block``, ...). What they share: :mod:`.folds`
(each fold identity, one function each, called by every plan that folds), :mod:`.shared` (what
the plans compute the same way: RescaleNet's scale schedule, the stem's offset, the merge's
add, the ResNet stage loop), :mod:`.cache` (the one mechanism keeping a plan's programs on a
module, and when they are stale), :mod:`.conditions` (the schemes the fast plans implement,
hooks, measuring steps) and :mod:`.dispatch` (the plan set on a module, the registry of
implementations per module type, the one dispatch in each ``forward``). A block's branch is read
through ``ResidualBlock.branch_layers()``, whose fields every plan unpacks. A new plan is one more
module registering a function per module type (:func:`~.dispatch.register`) and its name in
:data:`~.dispatch.PLANS`.

Select a plan with :func:`set_plan` (``create_model(..., plan=...)`` calls it) or, for a block
of code, :func:`reference_path`.
"""
from .cache import drop_kept, module_tree_version
from .conditions import (IMPLEMENTED_FIELDS, PLAN_FIELDS, eager_while_measuring, has_hooks, has_hooks_below,
                         has_hooks_in, implements, measuring_step, unimplemented)
from .dispatch import (FROZEN, PLANS, Planned, check_plan, implementation, plan_of, reference_path, register,
                       running_plan, set_frozen, set_plan, wants_lean)

__all__ = ["PLANS", "FROZEN", "check_plan", "set_plan", "plan_of", "running_plan", "reference_path", "set_frozen",
           "wants_lean",
           "Planned", "implementation", "register", "IMPLEMENTED_FIELDS", "PLAN_FIELDS", "implements", "unimplemented",
           "measuring_step", "eager_while_measuring", "has_hooks", "has_hooks_in", "has_hooks_below",
           "module_tree_version", "drop_kept"]
