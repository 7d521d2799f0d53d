"""The harness's sections by name (:data:`SECTIONS`): what each one builds, times and reports.

Every section takes the run's :class:`~benchmarks.toolkit.Settings` and returns a
:class:`~benchmarks.toolkit.SectionResult` (:mod:`benchmarks.toolkit`); the measurements shared
by the suites live in :mod:`benchmarks.suites`.

- ``train``: ResNet-50 train step (forward, loss, backward, SGD update) of every contender;
  time ratios to BN ResNet-50 and to the floor; peak training memory (:mod:`benchmarks.memory`).
- ``eval``: ResNet-50 eval-mode forward under ``torch.inference_mode``; images/s and ratios.
- ``measuring``: rescale50's train step during its measuring phase (mean-shift statistics reset
  before each timed step) against its ordinary step, paired.
- ``channels_last``: BN, floor and rescale50 train steps in channels_last (BN also contiguous).
- ``plans``: rescale50's train step under each execution plan (reference, folded, lean) against
  BN and the floor, eager and under ``torch.compile`` (``--no-compile`` times the eager half
  alone; :mod:`benchmarks.plans`).
- ``inference``: the eval forward of ResNet-50 and R3D-18 on the frozen plan (RescaleNet, Fixup,
  SkipInit) against BN and the floor, and RescaleNet with the frozen plan off, eager and under
  ``torch.compile`` (:mod:`benchmarks.inference`).
- ``resnet3d`` / ``transformer``: train (+ memory), eval and, for schemes with mean-shift biases,
  measuring steps of the 3D ResNet and the Transformer against their normalized baselines.
- ``data``: DataLoader throughput of the classification pipeline (:mod:`benchmarks.data`).
- ``translation``: the translation task on real English-German pairs: loader tokens/s, padding
  efficiency, train tokens/s, cached against recomputed decoding (:mod:`benchmarks.translation`).
- ``detection``: Mask R-CNN R50-FPN train step and inference images/s with FrozenBN,
  GN and rescale50 backbones, as ratios to FrozenBN (:mod:`benchmarks.detection`).
- ``video_loader``: the video pipeline's clips/s (decode + transform) per backend, GOP
  and num_workers, against the clips/s of the 3D ResNet's train step on clips of the same shape
  (:mod:`benchmarks.video_loader`).
"""
from __future__ import annotations

import gc
import importlib
import time
from collections.abc import Callable
from dataclasses import replace

from .models import Suite, resnet3d_suite, resnet50_suite, transformer_suite
from .inference import section_inference
from .opcount import section_ops
from .plans import section_plans
from .suites import eval_suite, measuring_suite, train_suite, variant_suite
from .toolkit import SectionResult, Settings, Table, merge, ms_text, ratio_text, release
from .video_loader import section_video_loader

__all__ = ["SECTIONS", "run_section"]


def _resnet50(settings: Settings) -> Suite:
    return resnet50_suite(settings.image_size, base_width=settings.base_width)


def section_train(settings: Settings) -> SectionResult:
    return train_suite(_resnet50(settings), settings, settings.batch, settings.repeats["train"], "train")


def section_eval(settings: Settings) -> SectionResult:
    return eval_suite(_resnet50(settings), settings, settings.batch, settings.repeats["eval"], "eval")


def section_measuring(settings: Settings) -> SectionResult:
    return measuring_suite(_resnet50(settings), settings, settings.batch,
                           settings.repeats["measuring"], "measuring")


def section_channels_last(settings: Settings) -> SectionResult:
    result, prepared, _ = variant_suite(
        _resnet50(settings), settings, "channels_last", lambda c: replace(c, channels_last=True),
        "(channels_last)", reference=lambda c: replace(c, channels_last=False),
        reference_tag="(contiguous)")
    release(prepared)
    return result


def _resnet3d(settings: Settings) -> tuple[Suite, int]:
    o = settings.resnet3d
    return resnet3d_suite(o["arch"], o["frames"], o["image_size"], base_width=settings.base_width), o["batch"]


def _transformer(settings: Settings) -> tuple[Suite, int]:
    o = dict(settings.transformer)
    batch = o.pop("batch")
    return transformer_suite(**o), batch


def section_resnet3d(settings: Settings) -> SectionResult:
    suite, batch = _resnet3d(settings)
    r = settings.repeats["resnet3d"]
    return merge("resnet3d", [train_suite(suite, settings, batch, r, "resnet3d"),
                              eval_suite(suite, settings, batch, r, "resnet3d"),
                              measuring_suite(suite, settings, batch, r, "resnet3d")])


def section_transformer(settings: Settings) -> SectionResult:
    suite, batch = _transformer(settings)
    r = settings.repeats["transformer"]
    return merge("transformer", [train_suite(suite, settings, batch, r, "transformer"),
                                 eval_suite(suite, settings, batch, r, "transformer")])


def section_data(settings: Settings) -> SectionResult:
    # the task package only when used: the harness also runs on a GPU machine's own torch without it
    from . import data as data_bench

    o = settings.data
    res = data_bench.classification_throughput(
        (0, 2), num_images=o["num_images"], batch_size=o["batch"], image_size=o["image_size"],
        source_size=o["source_size"], repeats=settings.repeats["data"],
        min_run_time=settings.min_run_time, progress=settings.progress("data"))
    result = SectionResult("data")
    rows = []
    for name in res.paired.names:
        ips = res.images_per_second(name)
        result.metrics[f"data.classification.per_second.{name}"] = ips
        rows.append(["classification (ImageFolder)", name, f"{ips:.1f}",
                     ms_text(res.paired.seconds(name).median), ratio_text(res.paired.ratio(name))])
    for pipeline, reason in data_bench.pending_pipelines():
        rows.append([pipeline, "-", "-", "-", reason])
    w, h = res.source_size
    notes = [f"train loader of ImageFolderDataModule over {res.images_per_epoch} generated {w}x{h} "
             f"JPEGs per epoch, RandomResizedCrop {res.image_size}, batch {res.batch_size}; one "
             f"measurement = one epoch with persistent workers; {res.paired.repeats} paired repeats"]
    result.tables.append(Table("DataLoader throughput", ["pipeline", "setting", "img/s", "ms/epoch",
                                                         f"time vs {res.paired.baseline}"], rows, notes))
    return result


def _elsewhere(module: str, function: str) -> Callable[[Settings], SectionResult]:
    """A section imported only when it runs: it needs the project's task package
    (``rescale_tasks``) or torchvision, which a GPU machine running the harness on its own torch
    may lack (``benchmarks.gpu``)."""
    def run(settings: Settings) -> SectionResult:
        return getattr(importlib.import_module(f"{__package__}.{module}"), function)(settings)
    run.__name__ = function
    return run


SECTIONS: dict[str, Callable[[Settings], SectionResult]] = {
    "ops": section_ops,
    "train": section_train,
    "eval": section_eval,
    "measuring": section_measuring,
    "channels_last": section_channels_last,
    "plans": section_plans,
    "inference": section_inference,
    "resnet3d": section_resnet3d,
    "transformer": section_transformer,
    "data": section_data,
    "translation": _elsewhere("translation", "section_translation"),
    "detection": _elsewhere("detection", "section_detection"),
    "video_loader": section_video_loader,
}


def run_section(name: str, settings: Settings) -> SectionResult:
    start = time.perf_counter()
    settings.log(f"[{name}] starting")
    result = SECTIONS[name](settings)
    gc.collect()
    result.seconds = time.perf_counter() - start
    settings.log(f"[{name}] done in {result.seconds:.0f} s")
    return result
