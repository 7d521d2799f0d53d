"""The measurements every suite gets, side by side in paired repeats: the train step (with peak
memory), the eval forward, RescaleNet's measuring step against its ordinary one, and a variant
run config (channels_last, torch.compile) against a reference config.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

import rescale_core

from .memory import MemoryResult, peak_step_memory
from .models import Suite
from .steps import Prepared, RunConfig, finish_measuring, reset_measuring
from .timing import PairedTimes, paired_repeats, timer_measure
from .toolkit import MiB, SectionResult, Settings, Table, ms_text, prepare_all, ratio_text, release, time_paired

__all__ = ["train_suite", "eval_suite", "measuring_suite", "variant_suite"]


def train_suite(suite: Suite, settings: Settings, batch: int, repeats: int, section: str,
                memory: bool = True) -> SectionResult:
    """Train-step time ratios (to the baseline and to the floor) and peak memory of a suite."""
    names = [c.name for c in suite.contenders]
    prepared = prepare_all(suite, names, settings, batch)
    paired = time_paired(prepared, suite.baseline, repeats, settings, section)
    mem: dict[str, MemoryResult] = {}
    if memory:
        for name, p in prepared.items():
            mem[name] = peak_step_memory(p.train_step, p.model, p.optimizer, p.tensors, settings.device)
    result = SectionResult(section)
    rows = []
    base_mem = mem.get(suite.baseline)
    for c in suite.contenders:
        name = c.name
        vs_base, vs_floor = paired.ratio(name), paired.ratio(name, suite.floor)
        result.metrics[f"{suite.name}.train.vs_baseline.{name}"] = vs_base
        result.metrics[f"{suite.name}.train.vs_floor.{name}"] = vs_floor
        row = [name, ms_text(paired.seconds(name).median), ratio_text(vs_base), ratio_text(vs_floor)]
        if memory:
            m = mem[name]
            mem_ratio = m.peak / base_mem.peak
            result.metrics[f"{suite.name}.train.mem_vs_baseline.{name}"] = mem_ratio
            row += [f"{m.peak / MiB:.0f}", f"{m.step_peak / MiB:.0f}", f"{mem_ratio:.3f}"]
        rows.append(row + [c.note])
    columns = ["model", "ms/step", f"vs {suite.baseline}", f"vs {suite.floor}"]
    if memory:
        columns += ["peak MiB", "step MiB", "mem vs base"]
    notes = [f"{suite.title} train step, batch {batch} x {suite.shape}, {settings.run_config.label()}; "
             f"{paired.repeats} paired repeats after >= {settings.warmup} warm-up steps each; "
             "vs X: time / time of X (below 1: faster), median [q1, q3] of per-repeat ratios; SGD momentum 0.9, weight decay 1e-4, "
             "lr 0 (the whole update is computed, the weights stay finite)"]
    if memory:
        notes.append("peak MiB: resting bytes (parameters, buffers, optimizer state, batch; gradients "
                     "are None when a step starts) + the most bytes the step adds; step MiB: that rise ("
                     + ("torch.cuda.max_memory_allocated" if settings.device.type == "cuda"
                        else "torch.profiler memory events, tensor bytes") + ")")
        odd = [n for n, m in mem.items() if m.unaccounted]
        if odd:
            notes.append(f"memory probe saw frees it could not attribute for {odd} (figures are upper bounds)")
    bad = [n for n, p in prepared.items() if not all(bool(torch.isfinite(q).all()) for q in p.model.parameters())]
    if bad:
        notes.append(f"non-finite parameters after timing: {bad} (inf/NaN arithmetic may time differently)")
    result.tables.append(Table(f"{suite.title}: train step", columns + ["note"], rows, notes))
    release(prepared)
    return result


def eval_suite(suite: Suite, settings: Settings, batch: int, repeats: int, section: str) -> SectionResult:
    """Eval-mode forward (inference_mode) throughput and ratios of a suite."""
    names = [c.name for c in suite.contenders]
    prepared = prepare_all(suite, names, settings, batch, train=False)
    paired = time_paired(prepared, suite.baseline, repeats, settings, section, train=False)
    result = SectionResult(section)
    rows = []
    for c in suite.contenders:
        name = c.name
        sec = paired.seconds(name).median
        vs_base, vs_floor = paired.ratio(name), paired.ratio(name, suite.floor)
        result.metrics[f"{suite.name}.eval.vs_baseline.{name}"] = vs_base
        result.metrics[f"{suite.name}.eval.vs_floor.{name}"] = vs_floor
        result.metrics[f"{suite.name}.eval.per_second.{name}"] = batch * suite.items / sec
        rows.append([name, ms_text(sec), f"{batch * suite.items / sec:.1f}", ratio_text(vs_base),
                     ratio_text(vs_floor)])
    notes = [f"{suite.title} eval forward (model.eval(), torch.inference_mode), batch {batch} x "
             f"{suite.shape}, {settings.run_config.label()}; {paired.repeats} paired repeats; "
             "vs X: time / time of X, median [q1, q3] of per-repeat ratios"]
    result.tables.append(Table(f"{suite.title}: eval throughput",
                               ["model", "ms/batch", f"{suite.unit}/s", f"vs {suite.baseline}",
                                f"vs {suite.floor}"], rows, notes))
    release(prepared)
    return result


def measuring_suite(suite: Suite, settings: Settings, batch: int, repeats: int,
                    section: str) -> SectionResult:
    """The target's train step during its measuring phase against its ordinary step, paired.

    One model: before each timed measuring step every mean-shift bias is reset to the start of
    its measuring phase (``Timer.timeit(1)`` setup); before each ordinary step measuring is
    finished. Both go through the same ``Timer.timeit(1)`` (two untimed calls, then one timed).
    """
    result = SectionResult(section)
    p = prepare_all(suite, [suite.target], settings, batch)[suite.target]
    layers = rescale_core.mean_shift_layers(p.model)
    if not layers:
        result.tables.append(Table(f"{suite.title}: measuring steps", ["model", "note"],
                                   [[suite.target, "no mean-shift biases: no measuring phase"]]))
        return result
    ordinary, measuring = f"{suite.target} ordinary step", f"{suite.target} measuring step"
    measures = {
        ordinary: timer_measure(p.train_step, setup=lambda: finish_measuring(p.model), number=1,
                                label=section, description=ordinary),
        measuring: timer_measure(p.train_step, setup=lambda: reset_measuring(p.model), number=1,
                                 label=section, description=measuring),
    }
    paired = paired_repeats(measures, ordinary, repeats, progress=settings.progress(section))
    finish_measuring(p.model)
    ratio = paired.ratio(measuring)
    result.metrics[f"{suite.name}.measuring.vs_ordinary"] = ratio
    rows = [[ordinary, ms_text(paired.seconds(ordinary).median), ratio_text(paired.ratio(ordinary))],
            [measuring, ms_text(paired.seconds(measuring).median), ratio_text(ratio)]]
    notes = [f"batch {batch} x {suite.shape}, {settings.run_config.label()}; {len(layers)} mean-shift "
             f"biases, measure_batches={layers[0].measure_batches}; measuring statistics reset before "
             f"each timed step; {paired.repeats} paired repeats"]
    result.tables.append(Table(f"{suite.title}: measuring steps",
                               ["step", "ms/step", "vs ordinary step"], rows, notes))
    return result


def variant_suite(suite: Suite, settings: Settings, section: str,
                  variant: Callable[[RunConfig], RunConfig], variant_tag: str,
                  reference: Callable[[RunConfig], RunConfig] | None = None,
                  reference_tag: str = "", reference_model: str | None = None,
                  extra: tuple[str, ...] = (),
                  ) -> tuple[SectionResult, dict[str, Prepared], PairedTimes]:
    """Baseline, floor and target of ``suite`` in the variant config (and ``reference_model``,
    by default the baseline, in the reference config when given), paired; ratios to the
    baseline in the variant config, to the floor in it and to the reference."""
    base = settings.run_config
    var_cfg = variant(base)
    labels = {suite.baseline: f"{suite.baseline} {variant_tag}", suite.floor: f"{suite.floor} {variant_tag}",
              suite.target: f"{suite.target} {variant_tag}"}
    labels.update({name: f"{name} {variant_tag}" for name in extra
                   if name in {c.name for c in suite.contenders}})
    prepared: dict[str, Prepared] = {}
    ref_name = None
    if reference is not None:
        ref_model = reference_model or suite.baseline
        ref_name = f"{ref_model} {reference_tag}"
        prepared.update(prepare_all(suite, [ref_model], settings, settings.batch,
                                     configs={ref_model: reference(base)},
                                     labels={ref_model: ref_name}))
    prepared.update(prepare_all(suite, list(labels), settings,
                                 settings.batch, configs=dict.fromkeys(labels, var_cfg), labels=labels))
    baseline = labels[suite.baseline]
    paired = time_paired(prepared, baseline, settings.repeats[section], settings, section)
    result = SectionResult(section)
    rows = []
    for name in prepared:
        row = [name, ms_text(paired.seconds(name).median), ratio_text(paired.ratio(name)),
               ratio_text(paired.ratio(name, labels[suite.floor]))]
        rows.append(row + ([ratio_text(paired.ratio(name, ref_name))] if ref_name else []))
    for role in (suite.target, suite.floor):
        result.metrics[f"{suite.name}.{section}.vs_baseline.{role}"] = paired.ratio(labels[role])
    result.metrics[f"{suite.name}.{section}.vs_floor.{suite.target}"] = paired.ratio(
        labels[suite.target], labels[suite.floor])
    if ref_name:
        result.metrics[f"{suite.name}.{section}.vs_reference.{suite.target}"] = paired.ratio(
            labels[suite.target], ref_name)
    note = (f"batch {settings.batch} x {suite.shape}; {var_cfg.label()}"
            + (f"; reference: {reference(base).label()}" if ref_name else "")
            + f"; {paired.repeats} paired repeats after >= {settings.warmup} warm-up steps each")
    result.tables.append(Table(f"{suite.title} train step {variant_tag}",
                               ["model", "ms/step", f"vs {baseline}", f"vs {labels[suite.floor]}"]
                               + ([f"vs {ref_name}"] if ref_name else []), rows, [note]))
    return result, prepared, paired
