"""I3D inflation: start a video network from a 2D classification checkpoint of this suite.

Carreira & Zisserman 2017 (I3D, Sec. 2.2): a 2D filter ``W`` of shape (O, I, kh, kw) becomes a
3D filter of time length ``kt`` by repeating it ``kt`` times along time and dividing by ``kt``,
so that on a "boring" video (one frame repeated) every 3D conv computes the 2D conv's output
and the network its 2D function. Everything that is not a conv weight carries over unchanged,
one singleton dim longer where it broadcasts over space: BatchNorm weights and statistics,
RescaleNet's mean-shift ``bias``/``mu0`` ((1, C, 1, 1) -> (1, C, 1, 1, 1)) and its ``count``
(a finished measurement stays finished, Shao et al. 2020 Sec. 4.4), gains and Fixup scalars.
A Scaled WS convolution (NF-ResNets, Brock et al. 2021) computes with its standardized weight,
``gain * gamma * (W - mean) / (std * sqrt(fan_in))``: its raw weight is repeated ``kt`` times
undivided (same mean and variance, so the same standardization, ``eps`` included) and its gain
divided by ``sqrt(kt)``, which with ``fan_in`` grown ``kt``-fold makes the 3D standardized
weight the 2D one repeated and divided by ``kt``, as above (docs/nf_resnets.md).
The classifier (``fc.*``) is kept when its shape fits (same classes; ``keep_classifier``) and
otherwise left as the 3D network built it (its scheme's classifier init).

The pairs this suite builds from the same block code with the same parameter names:
``resnet18`` -> ``r3d_18``/``resnet3d_18``, ``resnet50`` -> ``r3d_50``/``slow_r50``/``i3d_r50``/
``resnet3d_50`` (same scheme, width and ``in_channels``). The repeated-frame identity is exact
for frames farther from the clip's ends than the network's temporal receptive radius: the
zero padding of a ``kt > 1`` conv at the clip's borders sees fewer than ``kt`` frames (as in
I3D); r3d's temporal strides mix the borders into every frame.

Deviation from I3D: no 2D -> 3D pooling-kernel changes are made (the 3D network defines its
pools); the checkpoint's scheme must be the network's (a ``bn`` checkpoint does not inflate
into a ``rescale`` network: their parameters differ).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Optional, Union

import torch
from torch import nn

from rescale_tasks.common.checkpoints import network_weights, safe_load, state_dict_differences
from rescale_tasks.common.errors import ConfigError
from rescale_tasks.common.training import resolved_architecture

__all__ = ["inflate_checkpoint", "inflate_state_dict", "inflate_tensor", "Inflated",
           "CLASSIFIER_PREFIX"]

CLASSIFIER_PREFIX = "fc."    # rescale_core ResNets' classifier
_FIX = ("inflate a 2D checkpoint of the same depth, width, scheme and in_channels (resnet18 for "
        "r3d_18, resnet50 for r3d_50/slow_r50/i3d_r50), or drop inflate_from")

Checkpoint = Union[str, "os.PathLike[str]", Mapping[str, Any]]


@dataclass
class Inflated:
    """What :func:`inflate_checkpoint` did: the entries loaded (inflated or copied) and the
    classifier entries left as the 3D network built them."""

    loaded: list[str] = field(default_factory=list)
    reinitialised: list[str] = field(default_factory=list)


def inflate_tensor(t2: torch.Tensor, shape3: torch.Size | tuple[int, ...]) -> Optional[torch.Tensor]:
    """``t2`` as a tensor of ``shape3``, or None when it cannot be: the same shape (copied), or
    ``shape3 = t2.shape[:2] + (kt,) + t2.shape[2:]``: repeated ``kt`` times along the new time
    dim and divided by ``kt`` (conv weights; per-channel (1, C, 1, 1) tensors with ``kt = 1``)."""
    shape3 = tuple(shape3)
    if tuple(t2.shape) == shape3:
        return t2
    if not _inflates(tuple(t2.shape), shape3):
        return None
    kt = shape3[2]
    out = t2.unsqueeze(2).expand(shape3)
    return out / kt if kt > 1 else out.clone()


def _inflates(shape2: tuple[int, ...], shape3: tuple[int, ...]) -> bool:
    """Whether a tensor of ``shape2`` becomes one of ``shape3`` (:func:`inflate_tensor`)."""
    return shape2 == shape3 or (len(shape2) >= 3 and len(shape3) == len(shape2) + 1
                                and shape3[:2] + shape3[3:] == shape2)


def _flat_2d_shape(shape3: tuple[int, ...], t2: Optional[torch.Tensor]) -> tuple[int, ...]:
    """The 2D shape a 3D entry inflates from (for the error message): time dim removed."""
    if t2 is not None and len(shape3) == t2.dim() + 1 and len(shape3) >= 4:
        return shape3[:2] + shape3[3:]
    return shape3


def _standardized_time_kernel(key: str, target: Mapping[str, torch.Tensor],
                              standardized: Collection[str]) -> Optional[int]:
    """For the ``weight`` or ``gain`` of a Scaled WS convolution (one of ``standardized``, module
    names) of ``target``: its time kernel ``kt``; else None."""
    name, _, leaf = key.rpartition(".")
    if name not in standardized or leaf not in ("weight", "gain"):
        return None
    weight = target[f"{name}.weight"]
    return weight.shape[2] if weight.dim() == 5 else 1


def _inflate_entry(key: str, t2: torch.Tensor, target: Mapping[str, torch.Tensor],
                   standardized: Collection[str]) -> torch.Tensor:
    kt = _standardized_time_kernel(key, target, standardized)
    shape3 = tuple(target[key].shape)
    if kt is None or tuple(t2.shape) == shape3 and key.endswith(".weight"):
        return inflate_tensor(t2, shape3)
    if key.endswith(".gain"):
        return t2 / kt ** 0.5
    return t2.unsqueeze(2).expand(shape3).clone()  # a Scaled WS weight: repeated, undivided


def inflate_state_dict(state_2d: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor], *,
                       keep_classifier: bool = True, source: str = "the checkpoint",
                       network: str = "this network",
                       standardized: Collection[str] = ()) -> tuple[dict[str, torch.Tensor], Inflated]:
    """The entries of ``target`` (a 3D network's state dict) computed from ``state_2d``;
    ``standardized``: the names of the 3D network's Scaled WS convolutions (their weight repeated
    undivided, their gain divided by ``sqrt(kt)``).

    Returns the inflated entries (dtype and device of ``target``) and what was done. Raises
    :class:`ConfigError` (one line) on any key without a counterpart (classifier aside) or a
    shape that does not inflate, naming the first mismatches."""
    # check every key and shape first: a mismatch loads nothing
    body = {k: v for k, v in target.items() if not k.startswith(CLASSIFIER_PREFIX)}
    saved = {k: v for k, v in state_2d.items() if not k.startswith(CLASSIFIER_PREFIX)}
    bad_shapes = {k: saved[k] for k, v in body.items()
                  if k in saved and not _inflates(tuple(saved[k].shape), tuple(v.shape))}
    if bad_shapes or body.keys() != saved.keys():
        # compare in 2D terms: the shape each 3D entry would inflate from
        wanted = {k: torch.empty(_flat_2d_shape(tuple(v.shape), saved.get(k)), device="meta")
                  for k, v in body.items()}
        problems = state_dict_differences(saved, wanted, strict=True, limit=2) or [
            f"{k} of shape {tuple(v.shape)} does not inflate to {tuple(target[k].shape)}"
            for k, v in list(bad_shapes.items())[:2]]
        raise ConfigError(f"cannot inflate {source} into {network} (inflate_from): "
                          f"{'; '.join(problems)}. To fix: {_FIX}")
    out: dict[str, torch.Tensor] = {}
    report = Inflated()
    for key, t3 in target.items():
        t2 = state_2d.get(key)
        if key.startswith(CLASSIFIER_PREFIX) and not (
                keep_classifier and t2 is not None and tuple(t2.shape) == tuple(t3.shape)):
            report.reinitialised.append(key)
            continue
        out[key] = _inflate_entry(key, t2, target, standardized).to(dtype=t3.dtype, device=t3.device)
        report.loaded.append(key)
    return out, report


def _check_scheme(checkpoint: Mapping[str, Any], model: nn.Module, source: str, network: str) -> None:
    """A Lightning checkpoint names its scheme: refuse another one than the network's (schemes
    with the same parameter names, e.g. ``skipinit`` and ``rezero``, differ in function)."""
    hparams = checkpoint.get("hyper_parameters")
    ours = getattr(getattr(model, "scheme", None), "name", None)
    if not isinstance(hparams, Mapping) or ours is None:
        return
    theirs = resolved_architecture(dict(hparams)).get("scheme")
    if theirs is not None and theirs != ours:
        raise ConfigError(f"cannot inflate {source} into {network} (inflate_from): it was trained with "
                          f"scheme={theirs} but this network uses scheme={ours}. To fix: {_FIX}")


def inflate_checkpoint(model_3d: nn.Module, checkpoint: Checkpoint, *, keep_classifier: bool = True,
                       network: Optional[str] = None) -> Inflated:
    """Load a 2D checkpoint into the 3D network ``model_3d`` by I3D inflation (in place).

    Args:
        model_3d: the video network (e.g. ``create_model("slow_r50", scheme="rescale", ...)``),
            not the LightningModule around it (pass ``module.net``).
        checkpoint: a path (or fsspec URL) of a checkpoint written by ``rescale fit`` (its
            ``state_dict`` holds ``net.*`` entries; read with ``safe_load``), a loaded checkpoint,
            or a bare state dict of the 2D network.
        keep_classifier: keep the checkpoint's classifier when it has the network's shape (same
            number of classes); False: always leave the 3D network's own classifier.
        network: the network's name for messages (default: its class name).

    Raises :class:`ConfigError` (one line) for a checkpoint of another depth, width or scheme.
    """
    if isinstance(checkpoint, (str, os.PathLike)):
        source = f"checkpoint {os.fspath(checkpoint)}"
        checkpoint = safe_load(checkpoint)
    else:
        source = "the checkpoint"
    name = network or type(model_3d).__name__
    _check_scheme(checkpoint, model_3d, source, name)
    state_2d = network_weights(checkpoint, source, "model.inflate_from", bare=True)
    target = model_3d.state_dict()
    standardized = {n for n, m in model_3d.named_modules() if hasattr(m, "standardized_weight")}
    inflated, report = inflate_state_dict(state_2d, target, keep_classifier=keep_classifier,
                                          source=source, network=name, standardized=standardized)
    # every entry: inflated, or the network's own (the re-initialised classifier)
    model_3d.load_state_dict({**target, **inflated}, strict=True)
    return report
