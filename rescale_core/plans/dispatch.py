"""Which plan computes a module: the plan set on it, the registry of plan implementations per
module type, and the one dispatch every planned module's ``forward`` makes (the blocks and
networks of the normalisation-free schemes: Shao et al. 2020, De & Smith 2020, Zhang et al.
2019, Bachlechner et al. 2020).

A module that runs on a plan subclasses :class:`Planned`; its ``forward`` is its reference
definition plus one dispatch::

    if (impl := implementation(self, x)) is not None:
        return impl(self, x)
    return ...  # the reference

A plan implements a module type by registering a function with :func:`register` (see
:mod:`rescale_core.plans.folded` and :mod:`rescale_core.plans.lean`); a plan that declines a call
(:class:`Implementation` ``applies`` False: the lean plan while RescaleNet measures, a hook below)
hands it to its fallback (:data:`FALLBACKS`), and the last one to the reference.

Evaluation without autograd (a module in eval mode under ``torch.no_grad`` or
``torch.inference_mode``) on a fast plan first asks the :data:`FROZEN` plan
(:mod:`rescale_core.plans.frozen`: weights folded once, kept on the module), which declines
where it cannot run; :func:`set_frozen` turns it off. What the frozen plan keeps
(:mod:`rescale_core.plans.cache`) is dropped whenever the weights may have changed without a
version counter telling (:meth:`Planned.train`, ``to``, ``load_state_dict``, an optimizer step),
and everything the plans keep by :func:`set_plan`, :func:`reference_path` and :func:`set_frozen`.
Modules pickled under an earlier layout load through :mod:`rescale_core.compat`.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Callable, NamedTuple

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..compat import planned_state
from ..schemes import Scheme
from .cache import FROZEN_SLOT, SLOTS, drop_kept
from .conditions import global_hooks, implements

__all__ = ["PLANS", "FROZEN", "FALLBACKS", "check_plan", "Planned", "Implementation", "register",
           "implementation", "running_plan", "set_plan", "plan_of", "reference_path", "set_frozen", "wants_lean"]

PLANS = ("auto", "lean", "folded", "reference")
# the inference plan: not set on a module but asked first, on a fast plan, in evaluation without autograd
FROZEN = "frozen"
# the plan that computes a call its plan declines (none: the reference)
FALLBACKS: dict[str, str] = {"lean": "folded"}


def check_plan(plan: str) -> str:
    if plan not in PLANS:
        raise ValueError(f"unknown execution plan {plan!r}; expected one of {', '.join(PLANS)}")
    return plan


class Implementation(NamedTuple):
    """A plan's code for one module type: ``run(module, x, *args)`` computes the module's
    ``forward``; ``applies(module, x)`` says whether it may now (else the plan's fallback runs)."""

    run: Callable
    applies: Callable[[nn.Module, torch.Tensor], bool]


def _always(module: nn.Module, x: torch.Tensor) -> bool:
    return True


# modules in eval mode: an optimizer step drops their frozen weights (compiled code does not
# check version counters, and weights can move in eval mode)
_EVALUATING: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


class Planned(nn.Module):
    """A module computed on an execution plan. ``plan`` is the plan set on it (one of
    :data:`PLANS`); a fast plan runs only for a scheme it implements (:meth:`check_scheme`, once
    at construction): for any other the module computes its reference whatever plan is set.
    ``fused`` reads whether a fast plan is selected; setting it False selects the reference,
    True the default plan where the reference was selected. ``frozen``: whether evaluation
    without autograd asks the :data:`FROZEN` plan first (:func:`set_frozen`); it runs where
    :attr:`frozen_ok` (its own fields, :data:`~.conditions.PLAN_FIELDS`), even for a scheme the
    other fast plans leave to the reference."""

    plan = "auto"
    frozen = True
    # what the frozen plan keeps (rescale_core.plans.cache, a guarded slot); a class default, so
    # that compiled code reads the attribute (with a guard) whether or not it is set
    _frozen_state = None
    # whether the fast plans implement the module's scheme; the class default for modules
    # pickled before the check, which ran the fast plans (rescale_core.compat)
    _fast_ok = True
    # whether the frozen plan implements it (None: as _fast_ok, what a pickle from before holds)
    _frozen_ok = None
    # {plan: Implementation}, filled per module type by :func:`register`
    plan_implementations: dict[str, Implementation] = {}

    def check_scheme(self, scheme: Scheme) -> None:
        """Record whether the fast plans, and the frozen plan, implement ``scheme``
        (:func:`~.conditions.implements`)."""
        self._fast_ok = implements(scheme)
        # what the frozen plan lacks the fast plans lack too (PLAN_FIELDS only adds): logged above
        self._frozen_ok = implements(scheme, FROZEN, log=False)

    @property
    def fused(self) -> bool:
        return self.plan != "reference" and self._fast_ok

    @fused.setter
    def fused(self, value: bool) -> None:
        if not value:
            self.plan = "reference"
        elif self.plan == "reference":
            self.plan = "auto"

    @property
    def frozen_ok(self) -> bool:
        """Whether evaluation without autograd may run the :data:`FROZEN` plan: a fast plan is
        set and the frozen plan implements the module's scheme."""
        return self.plan != "reference" and (self._fast_ok if self._frozen_ok is None else self._frozen_ok)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(planned_state(state))  # an earlier layout's pickle

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for slot in SLOTS:  # what the plans keep: rebuilt on the next call
            state.pop(slot, None)
        return state

    # the frozen plan's weights are dropped at every event that may change the weights without a
    # version counter telling compiled code (which does not check them): a return to training (so
    # that each evaluation folds once, and training holds no folded copy), a move or cast, a load
    def train(self, mode: bool = True):
        if mode:
            self.__dict__.pop(FROZEN_SLOT, None)
            _EVALUATING.discard(self)
        else:
            _EVALUATING.add(self)
        return super().train(mode)

    def _apply(self, fn, recurse: bool = True):
        self.__dict__.pop(FROZEN_SLOT, None)
        return super()._apply(fn, recurse)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self.__dict__.pop(FROZEN_SLOT, None)
        super()._load_from_state_dict(*args, **kwargs)


def _drop_evaluating(optimizer, args, kwargs) -> None:
    for module in list(_EVALUATING):
        module.__dict__.pop(FROZEN_SLOT, None)


register_optimizer_step_post_hook(_drop_evaluating)


def register(plan: str, module_type: type, applies: Callable = _always):
    """Decorator: the function implements ``plan`` (one of :data:`PLANS` or :data:`FROZEN`)
    for ``module_type`` (and its subclasses) where ``applies(module, x)``."""
    if plan != FROZEN:
        check_plan(plan)

    def decorate(run: Callable) -> Callable:
        module_type.plan_implementations = {**module_type.plan_implementations,
                                            plan: Implementation(run, applies)}
        return run

    return decorate


def _concrete(plan: str, x: torch.Tensor) -> str:
    if plan == "auto":
        return "lean" if x.device.type not in ("cpu", "meta") else "folded"
    return plan


def wants_lean(module: Planned, x: torch.Tensor) -> bool:
    """Whether ``module``'s plan is lean on input ``x``: plan ``lean``, or ``auto`` with ``x`` on
    an accelerator."""
    return _concrete(module.plan, x) == "lean"


def _selected(module: Planned, x: torch.Tensor) -> tuple[str, Implementation] | None:
    # global hooks (and fx tracing, whose proxies have no device) first: they are cheap to ask
    if module.plan == "reference" or global_hooks():
        return None
    if module.frozen and not module.training and not torch.is_grad_enabled() and module.frozen_ok:
        impl = module.plan_implementations.get(FROZEN)
        if impl is not None and impl.applies(module, x):
            return FROZEN, impl
    if not module.fused:
        return None
    plan = _concrete(module.plan, x)
    while plan is not None:
        impl = module.plan_implementations.get(plan)
        if impl is not None and impl.applies(module, x):
            return plan, impl
        plan = FALLBACKS.get(plan)
    return None


def implementation(module: Planned, x: torch.Tensor) -> Callable | None:
    """The function that computes ``module`` on input ``x`` now (``run(module, x, *args)``), or
    None: the module's reference. None where the reference is selected, under global hooks and
    fx tracing; else, in evaluation without autograd, the frozen plan where it implements the
    module's scheme (:attr:`Planned.frozen_ok`) and applies; else None where the fast plans do
    not implement the scheme; else the plan set on the module (``auto``: lean for ``x`` on an
    accelerator, folded on the CPU), or its fallback where that plan declines."""
    selected = _selected(module, x)
    return None if selected is None else selected[1].run


def running_plan(module: Planned, x: torch.Tensor) -> str:
    """The plan that computes ``module`` on input ``x`` now: ``frozen``, ``lean``, ``folded`` or
    ``reference``."""
    selected = _selected(module, x)
    return "reference" if selected is None else selected[0]


def _planned(model: nn.Module) -> list[Planned]:
    return [m for m in model.modules() if isinstance(m, Planned)]


def set_plan(model: nn.Module, plan: str) -> nn.Module:
    """Run ``model`` under ``plan`` (one of :data:`PLANS`) from now on; returns ``model``. A
    module whose scheme the fast plans do not implement still runs its reference."""
    check_plan(plan)
    for m in _planned(model):
        m.plan = plan
    drop_kept(model)
    return model


def plan_of(model: nn.Module) -> str:
    """The plan ``model`` was set to (its own module's, or its first planned submodule's)."""
    mods = _planned(model)
    if not mods:
        return "reference"
    return mods[0].plan


@contextmanager
def reference_path(model: nn.Module, enabled: bool = True):
    """Run ``model`` on its reference (layer-by-layer) path: every planned module's plan is
    ``reference`` inside the block and restored afterwards."""
    if not enabled:
        yield model
        return
    saved = [(m, m.plan) for m in _planned(model)]
    try:
        for m, _ in saved:
            m.plan = "reference"
        yield model
    finally:
        for m, plan in saved:
            m.plan = plan
        drop_kept(model)  # kept schedules follow the plans


def set_frozen(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Whether ``model``'s evaluation without autograd runs the frozen plan (the default) or the
    plan set on it, as training does (what evaluation computed before the frozen plan existed);
    returns ``model``."""
    for m in _planned(model):
        m.frozen = bool(enabled)
    drop_kept(model)
    return model
