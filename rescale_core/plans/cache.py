"""What the plans keep on a module between calls, and when it is stale: one mechanism for the
lean plan's schedules, the frozen plan's folded programs and a model's list of mean-shift layers
(RescaleNet's, Shao et al. 2020).

:func:`kept` returns ``build()`` kept on the module in a slot of its own (:data:`LEAN_SLOT`,
:data:`FROZEN_SLOT`, :data:`MEAN_SHIFT_SLOT`) as a :class:`Kept`: one program per key, and the
:class:`Stamp` of what they were derived from. Eagerly a program is used while its stamp is
current and rebuilt (with every program of the slot) otherwise:

- :class:`Stamp`: the module tree (:func:`module_tree_version` moves whenever a submodule, a
  parameter or a buffer is registered anywhere: a wrapper, a new classifier, a weight assigned a
  new tensor) and the call's ``context`` (the frozen plan's: the autocast dtype);
- :class:`WeightStamp`: that, and the version counter and storage of every parameter and buffer
  of the module, and that each is the tensor its module holds (an optimizer step,
  ``load_state_dict``, an in-place edit, a move, ``torch.func.functional_call``). An edit through
  ``.data`` has a version counter of its own, which nothing sees (autograd neither):
  :func:`drop_kept` after one.

Compiled code reads no version counter, and compiling registers fx modules of its own (which
moves the tree version: a guard on it would recompile every step): under ``torch.compile`` a kept
program is used as it is, and a missing one is built in the graph and kept (dynamo replays the
assignment) without a stamp, so that eager code rebuilds it. The frozen plan's programs hold
tensors its folds computed: their slot is read as a guarded attribute, so that the graph that
folded is followed by one that reads the folds (evaluation compiles to two graphs, the second
launching no fold); the lean plan's schedules and the mean-shift list are Python bookkeeping,
read without a guard (training compiles to one graph). Under ``torch.export`` and
``torch.jit.trace`` the parameters are the tracer's: a kept program is used as it is (its tensors
become the graph's constants), a missing one is built and not kept.
:class:`~rescale_core.plans.dispatch.Planned` drops the frozen slot at every event that may change
the weights without a version counter telling compiled code; :func:`drop_kept` drops every slot.
"""
from __future__ import annotations

import operator
from typing import Callable

import torch
from torch import nn
from torch.nn.modules import module as _module_mod

__all__ = ["LEAN_SLOT", "FROZEN_SLOT", "MEAN_SHIFT_SLOT", "SLOTS", "module_tree_version", "Stamp", "WeightStamp",
           "Kept", "kept", "drop_kept"]

# the attributes holding what each plan keeps (a guarded one has a class default None on
# Planned, so that compiled code reads it with a guard whether or not it is set)
LEAN_SLOT = "_lean_state"
FROZEN_SLOT = "_frozen_state"
MEAN_SHIFT_SLOT = "_mean_shift_layers"
SLOTS = (LEAN_SLOT, FROZEN_SLOT, MEAN_SHIFT_SLOT)

# Bumped whenever any module anywhere registers a submodule, a parameter or a buffer (assignment,
# ``add_module``, ``register_parameter``, ``register_buffer``).
_tree_version = 0


def _on_registration(module, name, value):
    global _tree_version
    _tree_version += 1


_module_mod.register_module_module_registration_hook(_on_registration)
_module_mod.register_module_parameter_registration_hook(_on_registration)
_module_mod.register_module_buffer_registration_hook(_on_registration)


def module_tree_version() -> int:
    """A number that changes whenever a submodule, a parameter or a buffer is registered
    anywhere."""
    return _tree_version


class Stamp:
    """What kept programs were derived from: the module tree and the call's ``context``."""

    def __init__(self, module: nn.Module, context=None) -> None:
        self.tree, self.context = module_tree_version(), context

    def current(self, context=None) -> bool:
        return self.tree == module_tree_version() and self.context == context


_VERSION = operator.attrgetter("_version")


def _versions(tensors: tuple) -> tuple:
    return tuple(map(_VERSION, tensors)), tuple(map(torch.Tensor.data_ptr, tensors))


class WeightStamp(Stamp):
    """A :class:`Stamp` and every parameter and buffer of the module (version counter, storage, and
    that each is still the tensor its module holds): for programs holding tensors computed from
    them. A new tensor registered is a registration, which the tree version tells; one swapped
    in without a registration (``torch.func.functional_call``, ``torch.nn.utils.stateless``)
    is not the tensor held in its module's ``_parameters``/``_buffers`` any more."""

    def __init__(self, module: nn.Module, context=None) -> None:
        super().__init__(module, context)
        self.held = tuple((table, name, tensor) for m in module.modules()
                          for table in (m._parameters, m._buffers) for name, tensor in table.items()
                          if tensor is not None)
        self.tensors = tuple(tensor for _, _, tensor in self.held)
        self.versions = _versions(self.tensors)

    def current(self, context=None) -> bool:
        return (super().current(context) and all(table.get(name) is tensor for table, name, tensor in self.held)
                and _versions(self.tensors) == self.versions)


class Kept:
    """A slot's programs by key, and their stamp (None: built in compiled code, never current
    eagerly)."""

    def __init__(self, stamp: Stamp | None) -> None:
        self.stamp = stamp
        self.programs: dict = {}


def kept(module: nn.Module, slot: str, key, build: Callable, stamp: type[Stamp] = Stamp, context=None,
         guarded: bool = False):
    """``build()`` kept on ``module`` in ``slot`` under ``key`` (and ``context``, where it is not
    None: compiled and traced code, which check no stamp, tell programs of two contexts apart by
    it), rebuilt when ``stamp`` (built with ``context``) is no longer current (the module
    docstring says how, eager and compiled). ``guarded``: compiled code reads the slot as an
    attribute, which dynamo guards, so that the graph that built a program is followed by one
    that reads it (a program of tensors computed by ops, which must not run at every call: two
    graphs); else from the module's ``__dict__`` without a guard (Python bookkeeping, which a
    graph may rebuild at no cost: one graph)."""
    if context is not None:
        key = (key, context)
    state = getattr(module, slot, None) if guarded else module.__dict__.get(slot)
    if torch.compiler.is_exporting() or torch.jit.is_tracing() or (
            torch.compiler.is_compiling() and not torch.compiler.is_dynamo_compiling()):
        if state is not None and key in state.programs:
            return state.programs[key]
        return build()
    if torch.compiler.is_dynamo_compiling():
        if state is None:
            state = _keep(module, slot, Kept(None), guarded)
    elif state is None or state.stamp is None or not state.stamp.current(context):
        state = _keep(module, slot, Kept(stamp(module, context)), guarded)
    if key not in state.programs:
        state.programs[key] = build()
    return state.programs[key]


def _keep(module: nn.Module, slot: str, state: Kept, guarded: bool) -> Kept:
    if guarded:
        setattr(module, slot, state)
    else:
        module.__dict__[slot] = state
    return state


def drop_kept(model: nn.Module, slots: tuple[str, ...] = SLOTS) -> None:
    """Forget what the plans kept in ``model``'s modules (every slot, or ``slots``)."""
    for m in model.modules():
        for slot in slots:
            m.__dict__.pop(slot, None)
