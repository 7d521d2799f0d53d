"""Modules pickled whole (``torch.save(model)``) under an earlier attribute layout, restored to
the current one: every translation of an old pickled state lives here, called from the
``__setstate__`` of the class it restores. State dicts need none (their keys never changed), and
a module pickled under the current layout passes through unchanged (the schemes' blocks and
RescaleNet's mean-shift layers, Shao et al. 2020).

- :func:`planned_state`: a planned module (:class:`~rescale_core.plans.dispatch.Planned`)
  pickled with a ``fused`` flag of its own (False selected the reference path, now ``plan =
  "reference"``), or before ``_fast_ok`` existed (the fast plans ran: the class default True).
- :func:`mean_shift_state`: a :class:`~rescale_core.layers.MeanShiftBias` pickled before
  ``_count`` and ``measure_batches`` became properties (kept as ``_n`` and
  ``_measure_batches``, with the ``_measuring`` flag beside them).
"""
from __future__ import annotations

__all__ = ["planned_state", "mean_shift_state"]


def planned_state(state: dict) -> dict:
    """``state`` of a pickled planned module in the current layout."""
    if state.pop("fused", True) is False:
        state["plan"] = "reference"
    return state


def mean_shift_state(state: dict) -> tuple[dict, int | None, int | None]:
    """``(state, count, measure_batches)`` of a pickled mean-shift layer: ``state`` without the
    earlier layout's plain attributes, and their values (None where the pickle is current), to be
    set through the properties once the state is restored."""
    count, batches = state.pop("_count", None), state.pop("measure_batches", None)
    return state, count, batches
