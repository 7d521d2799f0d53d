"""Adaptive gradient clipping (AGC, :mod:`rescale_core.agc`) as a training option of every task:
its values checked in one line, the layers it leaves alone, and the parameters it clips.

The paper (Brock et al., ICML 2021, Sec. 4.1) does not clip the final linear layer. Here that is
the network's *output layers*, found by :func:`output_layers` (a task module may name its own:
``RescaleTaskModule.output_layers``):

- by default, the network's last ``nn.Linear`` in module order: a ResNet's, ResNeXt's,
  Wide-ResNet's or 3D ResNet's ``fc``, VGG's ``classifier[-1]``, the Transformer's
  ``output_projection`` (tied by default to the decoder's embedding, which shares its matrix:
  that matrix is then left unclipped too);
- a detector (:meth:`rescale_tasks.detection.module.DetectionModule.output_layers`): the layers
  whose outputs are its predictions (class scores, box deltas and mask logits, the RPN's
  included).

``agc_clip_classifier: true`` clips them too.

Under fp16 AMP the gradients AGC reads must be the unscaled ones. Lightning unscales them before
the clipping hook, except for an optimizer that unscales inside its own step (``fused=True``):
those keep the GradScaler's scale S until the step divides it out, so AGC clips them at
``lambda * S`` (:func:`pending_gradient_scale`), which is AGC of the unscaled gradients, times S.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

import torch
from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling
from torch import nn

from rescale_core.agc import DEFAULT_EPS, check_agc

from ..errors import ConfigError

__all__ = ["check_agc_options", "check_agc_is_on", "output_layers", "clipped_parameters", "pending_gradient_scale"]


def check_agc_options(clip: Any, eps: Any = 1e-3) -> None:
    """One :class:`~..errors.ConfigError` line for an ``agc_clip`` (None: off) or an ``agc_eps``
    that is not a positive finite number."""
    for key, value, what in (("agc_clip", clip, "AGC's clipping threshold lambda, e.g. 0.01; null turns AGC off"),
                             ("agc_eps", eps, "the floor of a unit's weight norm, 1e-3 in the paper")):
        if key == "agc_clip" and value is None:
            continue
        try:
            check_agc(value)
        except ValueError:
            raise ConfigError(f"bad value for model.init_args.{key}: {value!r} (a positive number: {what}); "
                              f"set it with --model.init_args.{key}") from None


def check_agc_is_on(clip: Any, eps: Any = DEFAULT_EPS, clip_classifier: Any = False) -> None:
    """One :class:`~..errors.ConfigError` line for an ``agc_eps`` or ``agc_clip_classifier`` set
    off its default while ``agc_clip`` is null: AGC is off, so the run would silently clip
    nothing (and its summary record neither). Checked when a run starts (``rescale fit``), not
    when a saved module is rebuilt."""
    if clip is not None:
        return
    for key, value, default in (("agc_clip_classifier", clip_classifier, False), ("agc_eps", eps, DEFAULT_EPS)):
        if value is not None and value != default:
            raise ConfigError(f"model.init_args.{key}={value!r} does nothing while model.init_args.agc_clip is null "
                              f"(adaptive gradient clipping off): set --model.init_args.agc_clip (e.g. 0.01) to "
                              f"clip, or remove {key}")


def output_layers(net: nn.Module) -> list[nn.Module]:
    """The network's last ``nn.Linear`` (module docstring), or none."""
    linear = [m for m in net.modules() if isinstance(m, nn.Linear)]
    return linear[-1:]


def clipped_parameters(optimizer: torch.optim.Optimizer, excluded: Optional[Iterable[nn.Module]]) -> list:
    """The parameters of ``optimizer`` that AGC clips: all but those of the ``excluded`` layers
    (None: all)."""
    skip = {id(p) for m in excluded or () for p in m.parameters()}
    return [p for group in optimizer.param_groups for p in group["params"] if id(p) not in skip]


def pending_gradient_scale(precision_plugin: Any, optimizer: torch.optim.Optimizer) -> float:
    """The factor the gradients still carry when the clipping hook runs: 1, but under fp16 AMP with
    an optimizer that unscales inside its step (a ``fused=True`` one: Lightning then leaves
    ``scaler.unscale_`` to that step, as its ``MixedPrecision.optimizer_step`` does), the
    GradScaler's current scale, which that step divides out (read from the device: one host sync
    a step, in that case only)."""
    scaler = getattr(precision_plugin, "scaler", None)
    if scaler is None or not scaler.is_enabled() or not _optimizer_handles_unscaling(optimizer):
        return 1.0
    return float(scaler.get_scale())
