"""The ``inference`` section: evaluation on the frozen plan against the floor and BN.

The eval forward (eval mode, ``torch.inference_mode``: what ``rescale validate/test/predict``
run) of ResNet-50 (batch ``--batch`` at ``--image-size``) and of the R3D-18 video ResNet (the
resnet3d section's clip size and batch): BN (the baseline), the network without normalization
(the floor), RescaleNet on the frozen plan (:mod:`rescale_core.plans.frozen`, weights folded
once per evaluation) and with the frozen plan off (``set_frozen(model, False)``: the plan ``auto``
evaluating as training computes, what evaluation ran before the frozen plan), Fixup and
SkipInit; eager and, with ``--compile``, under ``torch.compile`` (BN, the floor and RescaleNet
on and off: every compile costs minutes on a CPU). Each family's contenders are timed in one set
of paired repeats; each row reads ``x floor`` and ``x BN`` in its own mode, and RescaleNet's
frozen plan also against its own evaluation before it. The goal (:mod:`benchmarks.report`):
RescaleNet's eval forward within 5% of the floor, eager and compiled.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

import rescale_core

from .models import Contender, Suite, image_batch, resnet50_floor, torchvision_resnet50
from .toolkit import SectionResult, Settings, Table, merge, ms_text, prepare_all, ratio_text, release, time_paired

__all__ = ["FROZEN_OFF", "inference_suite", "section_inference", "inference_table"]

FROZEN_OFF = "(frozen off)"
# the contenders compiled too (the baseline, the floor, the target on and off)
_COMPILED = ("BN", "floor (no norm)", "rescale", f"rescale {FROZEN_OFF}")


def _ours(arch: str, scheme: str, num_classes: int, frozen: bool = True, **kwargs):
    def build():
        model = rescale_core.create_model(arch, scheme=scheme, num_classes=num_classes, **kwargs)
        return rescale_core.plans.set_frozen(model, frozen)
    return build


def inference_suite(family: str, image_size: int = 224, frames: int = 16, num_classes: int = 1000,
                    base_width: int | None = None) -> Suite:
    """``resnet50`` (torchvision's BN ResNet-50 and its floor beside this suite's networks) or
    ``r3d_18`` (this suite's under every scheme), with short contender names: ``BN``, ``floor
    (no norm)``, ``rescale``, ``rescale (frozen off)``, ``fixup``, ``skipinit``. ``base_width``
    shrinks this suite's networks (tests)."""
    ours = {} if base_width is None else {"base_width": base_width}
    if family == "resnet50":
        arch, title, batch = "resnet50", "ResNet-50", image_batch(image_size, num_classes)
        shape = f"3x{image_size}x{image_size}"
        base = (Contender("BN", lambda: torchvision_resnet50(num_classes), "torchvision"),
                Contender("floor (no norm)", lambda: resnet50_floor(num_classes), "torchvision, BN -> Identity"))
    elif family == "r3d_18":
        arch, title, batch = "r3d_18", "R3D-18", image_batch(image_size, num_classes, frames)
        shape = f"3x{frames}x{image_size}x{image_size}"
        base = (Contender("BN", _ours(arch, "bn", num_classes, **ours)),
                Contender("floor (no norm)", _ours(arch, "none", num_classes, **ours)))
    else:
        raise ValueError(f"unknown inference family {family!r}; expected resnet50 or r3d_18")
    contenders = base + (
        Contender("rescale", _ours(arch, "rescale", num_classes, **ours), "the frozen plan"),
        Contender(f"rescale {FROZEN_OFF}", _ours(arch, "rescale", num_classes, False, **ours),
                  "plan auto evaluating as it trains: evaluation before the frozen plan"),
        Contender("fixup", _ours(arch, "fixup", num_classes, **ours), "the frozen plan"),
        Contender("skipinit", _ours(arch, "skipinit", num_classes, **ours), "the frozen plan"))
    return Suite(family, title, contenders, baseline="BN", floor="floor (no norm)", target="rescale",
                 make_batch=batch, loss=F.cross_entropy, shape=shape, unit="clip" if family == "r3d_18" else "img")


def section_inference(settings: Settings) -> SectionResult:
    o = settings.resnet3d
    parts = [
        inference_table(inference_suite("resnet50", settings.image_size, base_width=settings.base_width),
                        settings, settings.batch),
        inference_table(inference_suite("r3d_18", o["image_size"], o["frames"], 400, settings.base_width),
                        settings, o["batch"]),
    ]
    return merge("inference", parts)


def inference_table(suite: Suite, settings: Settings, batch: int, section: str = "inference") -> SectionResult:
    """Every contender's eval forward, eager and (with ``settings.compile``) compiled, in one set
    of paired repeats: time, x floor and x BN per mode, and the frozen plan against its own
    evaluation before it."""
    names = [c.name for c in suite.contenders]
    modes = {"eager": (settings.run_config, names)}
    if settings.compile:
        modes["compiled"] = (replace(settings.run_config, compile=True), [n for n in names if n in _COMPILED])
    label = {mode: {n: f"{n} ({mode})" for n in chosen} for mode, (_, chosen) in modes.items()}
    prepared = {}
    for mode, (cfg, chosen) in modes.items():
        prepared.update(prepare_all(suite, chosen, settings, batch, configs=dict.fromkeys(chosen, cfg),
                                    train=False, labels=label[mode]))
    repeats = settings.repeats.get(section, settings.repeats.get("eval", 2))
    paired = time_paired(prepared, label["eager"][suite.baseline], repeats, settings, section, train=False)
    result = SectionResult(section)
    columns, rows = ["model"], []
    for mode in modes:
        columns += [f"{mode} ms", f"{mode} x floor", f"{mode} x BN"]
    for c in suite.contenders:
        row = [c.name]
        for mode in modes:
            me = label[mode].get(c.name)
            if me is None:
                row += ["-", "-", "-"]
                continue
            vs_floor = paired.ratio(me, label[mode][suite.floor])
            vs_base = paired.ratio(me, label[mode][suite.baseline])
            result.metrics[f"{suite.name}.inference.{mode}.vs_floor.{c.name}"] = vs_floor
            result.metrics[f"{suite.name}.inference.{mode}.vs_baseline.{c.name}"] = vs_base
            row += [ms_text(paired.seconds(me).median), ratio_text(vs_floor), ratio_text(vs_base)]
        rows.append(row + [c.note])
    before = [ratio_text(_before(suite, paired, label, mode, result.metrics)) for mode in modes]
    notes = [f"{suite.title} eval forward (model.eval(), torch.inference_mode), batch {batch} x {suite.shape}; "
             + "; ".join(f"{mode}: {cfg.label()}" for mode, (cfg, _) in modes.items())
             + f"; all timed in the same {paired.repeats} paired repeats after >= {settings.eval_warmup} warm-up "
             "forwards each (the first folds the frozen plan's weights)",
             "x floor / x BN: time / time of the floor / of BN in the same mode, median [q1, q3] of per-repeat ratios",
             "rescale on the frozen plan / rescale with it off (the same mode): " + ", ".join(
                 f"{mode} {text}" for mode, text in zip(modes, before))]
    if not settings.compile:
        notes.append("eager only (--no-compile, the default of --quick): --compile adds the compiled half")
    result.tables.append(Table(f"{suite.title}: eval forward on the frozen plan"
                               + (", eager and compiled" if settings.compile else ", eager"),
                               columns + ["note"], rows, notes))
    release(prepared)
    if settings.compile:
        torch._dynamo.reset()
    return result


def _before(suite: Suite, paired, label: dict, mode: str, metrics: dict):
    ratio = paired.ratio(label[mode][suite.target], label[mode][f"{suite.target} {FROZEN_OFF}"])
    metrics[f"{suite.name}.inference.{mode}.vs_before.{suite.target}"] = ratio
    return ratio

