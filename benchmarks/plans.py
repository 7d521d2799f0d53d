"""The ``plans`` section: does each execution plan earn its keep?

ResNet-50's train step with ``rescale50`` under each execution plan (:mod:`rescale_core.plans`:
``reference``, the layer-by-layer definition; ``folded``, the CPU default; ``lean``, the
accelerator default) next to BN ResNet-50 and the no-normalization floor, eager and under
``torch.compile`` (inductor), every one of them timed in the same paired repeats. Within a mode
each row reads ``x floor`` and ``x BN`` (eager against eager, compiled against compiled); each
plan also reads against the reference plan in the same mode, and its compiled step against its
own eager step. A fast plan earns its keep where it beats the reference plan; where the compiled
reference is as fast as the fastest compiled fast plan, compiling gains nothing from a fast plan.

The compiled half also gives the compile goals of :mod:`benchmarks.report`, for the plan that
``auto`` runs on the device (:func:`default_plan`), under the goals' name ``rescale50``.
``--no-compile`` (the default of ``--quick``) times the eager half alone.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from .models import RESNET50_PLANS, Suite, resnet50_plans_suite
from .steps import Prepared
from .timing import PairedTimes, Summary
from .toolkit import SectionResult, Settings, Table, prepare_all, ratio_text, ms_text, release, time_paired

__all__ = ["default_plan", "plans_suite", "section_plans"]

GOAL_TARGET = "rescale50"  # the name the compile goals give the target (benchmarks.report)


def default_plan(device: torch.device) -> str:
    """The plan ``auto`` runs on ``device``: folded on the CPU, lean on an accelerator."""
    return "folded" if device.type == "cpu" else "lean"


def section_plans(settings: Settings) -> SectionResult:
    suite = resnet50_plans_suite(settings.image_size, base_width=settings.base_width,
                                 target_plan=default_plan(settings.device))
    return plans_suite(suite, settings, "plans", {p: f"rescale50 {p}" for p in RESNET50_PLANS})


def plans_suite(suite: Suite, settings: Settings, section: str, plans: dict[str, str],
                goal_target: str = GOAL_TARGET) -> SectionResult:
    """The baseline, the floor and each plan's contender (``plans``: plan -> contender name, the
    reference plan among them) of ``suite``, eager and (with ``settings.compile``) compiled, in
    one set of paired repeats. ``suite.target`` is the device's default plan: its compiled
    ratios go to the compile goals' keys under ``goal_target``."""
    names = [suite.baseline, suite.floor, *plans.values()]
    modes = {"eager": settings.run_config}
    if settings.compile:
        modes["compiled"] = replace(settings.run_config, compile=True)
    label = {mode: {n: f"{n} ({mode})" for n in names} for mode in modes}
    prepared: dict[str, Prepared] = {}
    for mode, cfg in modes.items():
        prepared.update(prepare_all(suite, names, settings, settings.batch,
                                    configs=dict.fromkeys(names, cfg), labels=label[mode]))
    paired = time_paired(prepared, label["eager"][suite.baseline], settings.repeats[section], settings, section)
    result = SectionResult(section)
    result.tables.append(_side_by_side(suite, settings, modes, label, prepared, paired, plans, result.metrics))
    if "reference" in plans:
        result.tables.append(_against_reference(suite, modes, label, paired, plans, result.metrics))
    if "compiled" in modes:
        _goal_metrics(suite, label, paired, goal_target, result.metrics)
    release(prepared)
    if "compiled" in modes:
        torch._dynamo.reset()
    return result


def _side_by_side(suite: Suite, settings: Settings, modes: dict, label: dict, prepared: dict[str, Prepared],
                  paired: PairedTimes, plans: dict[str, str], metrics: dict) -> Table:
    """One row per contender: each mode's time, x floor, x BN; compiled / eager, compile time."""
    plan_of = {name: plan for plan, name in plans.items()}
    columns = ["model"]
    for mode in modes:
        columns += [f"{mode} ms", f"{mode} x floor", f"{mode} x BN"]
    if "compiled" in modes:
        columns += ["compiled / eager", "compile s", "graphs"]
    rows = []
    for c in (suite.contender(n) for n in label["eager"]):
        key = plan_of.get(c.name, c.name)
        row = [c.name]
        for mode in modes:
            me, floor, base = label[mode][c.name], label[mode][suite.floor], label[mode][suite.baseline]
            vs_floor, vs_base = paired.ratio(me, floor), paired.ratio(me, base)
            metrics[f"{suite.name}.plans.{mode}.vs_floor.{key}"] = vs_floor
            metrics[f"{suite.name}.plans.{mode}.vs_baseline.{key}"] = vs_base
            row += [ms_text(paired.seconds(me).median), ratio_text(vs_floor), ratio_text(vs_base)]
        if "compiled" in modes:
            compiled, eager = label["compiled"][c.name], label["eager"][c.name]
            vs_eager = paired.ratio(compiled, eager)
            metrics[f"{suite.name}.plans.compiled_vs_eager.{key}"] = vs_eager
            p = prepared[compiled]
            overhead = p.warmup_seconds - p.warmup_steps * paired.seconds(compiled).median
            row += [ratio_text(vs_eager), f"{max(overhead, 0.0):.1f}", str(p.graphs)]
        note = c.note + ("; auto's plan here" if c.name == suite.target else "")
        rows.append(row + [note])
    notes = [f"{suite.title} train step, batch {settings.batch} x {suite.shape}; "
             + "; ".join(f"{mode}: {cfg.label()}" for mode, cfg in modes.items())
             + f"; all {len(label['eager']) * len(modes)} timed in the same {paired.repeats} paired repeats "
             f"after >= {settings.warmup} warm-up steps each",
             "x floor / x BN: time / time of the floor / of BN in the same mode (eager against eager, compiled "
             "against compiled), median [q1, q3] of per-repeat ratios"]
    if "compiled" in modes:
        notes.append("compiled / eager: the same model's two steps; compile s: wall time of the warm-up minus "
                     "its steps at the measured speed (compilation and recompilations; near 0 when inductor's "
                     "on-disk cache already holds the kernels); graphs: graphs compiled during warm-up")
    else:
        notes.append("eager only (--no-compile, the default of --quick): --compile adds the compiled half")
    return Table(f"{suite.title} train step under each plan"
                 + (", eager and compiled" if "compiled" in modes else ", eager"), columns + ["note"], rows, notes)


def _against_reference(suite: Suite, modes: dict, label: dict, paired: PairedTimes, plans: dict[str, str],
                       metrics: dict) -> Table:
    """Each fast plan against the reference plan in the same mode, and what the medians say."""
    reference = plans["reference"]
    fast = {plan: name for plan, name in plans.items() if plan != "reference"}
    rows, notes = [], []
    for plan, name in fast.items():
        row = [plan]
        for mode in modes:
            r = paired.ratio(label[mode][name], label[mode][reference])
            metrics[f"{suite.name}.plans.{mode}.vs_reference.{plan}"] = r
            row.append(ratio_text(r))
        rows.append(row)
    for mode in modes:
        ratios = {plan: metrics[f"{suite.name}.plans.{mode}.vs_reference.{plan}"] for plan in fast}
        best = min(ratios, key=lambda plan: ratios[plan].median)
        notes.append(f"{mode}: the fastest fast plan is {best}, {_verdict(ratios[best])} the reference plan")
    return Table(f"{suite.title}: each plan against the reference plan",
                 ["plan"] + [f"{mode} x reference" for mode in modes], rows,
                 ["x reference: time / time of the reference plan in the same mode, median [q1, q3] of "
                  "per-repeat ratios; a plan earns its keep where it is below 1"] + notes)


def _verdict(r: Summary) -> str:
    """How a plan's time compares with the reference plan's: faster or slower only where the
    inter-quartile range of the per-repeat ratios excludes 1."""
    if r.q3 < 1.0:
        return f"faster than ({r.median:.3f}x)"
    if r.q1 > 1.0:
        return f"slower than ({r.median:.3f}x)"
    return f"as fast as ({r.median:.3f}x, the IQR spans 1)"


def _goal_metrics(suite: Suite, label: dict, paired: PairedTimes, goal_target: str, metrics: dict) -> None:
    """The compile goals' ratios (``{suite}.compile.*``) of the device's default plan."""
    compiled, eager = label["compiled"], label["eager"]
    target, floor, base = compiled[suite.target], compiled[suite.floor], compiled[suite.baseline]
    metrics[f"{suite.name}.compile.vs_baseline.{goal_target}"] = paired.ratio(target, base)
    metrics[f"{suite.name}.compile.vs_baseline.{suite.floor}"] = paired.ratio(floor, base)
    metrics[f"{suite.name}.compile.vs_floor.{goal_target}"] = paired.ratio(target, floor)
    metrics[f"{suite.name}.compile.vs_reference.{goal_target}"] = paired.ratio(target, eager[suite.target])
