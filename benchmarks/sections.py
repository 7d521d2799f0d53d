"""The harness's sections: what each one builds, times and reports.

Every section returns a :class:`SectionResult`: tables for printing and ``metrics`` (the medians
of paired ratios, and memory ratios) under stable keys that :mod:`benchmarks.report` checks the
goals against. Ratios are always formed inside a repeat (:mod:`benchmarks.timing`) and are
reported as ``median [q1, q3]`` over the repeats.

- ``train``: ResNet-50 train step (forward, loss, backward, SGD update) of every contender;
  time ratios to BN ResNet-50 and to the floor; peak training memory (:mod:`benchmarks.memory`).
- ``eval``: ResNet-50 eval-mode forward under ``torch.inference_mode``; images/s and ratios.
- ``measuring``: rescale50's train step during its measuring phase (mean-shift statistics reset
  before each timed step) against its ordinary step, paired.
- ``channels_last``: BN, floor and rescale50 train steps in channels_last (BN also contiguous).
- ``compile``: BN, floor and rescale50 train steps under ``torch.compile`` and rescale50 eager;
  compile time and the number of compiled graphs reported separately (``--no-compile`` skips
  the section).
- ``resnet3d`` / ``transformer``: train (+ memory), eval and, for schemes with mean-shift biases,
  measuring steps of the 3D ResNet and the Transformer against their normalized baselines.
- ``data``: DataLoader throughput of the classification pipeline (:mod:`benchmarks.data`).
- ``translation``: the translation task (issue #12) on real English-German pairs (the gettext
  catalogues, :mod:`benchmarks.data`): its training loader's target tokens/s (num_workers
  paired) and the padding efficiency of its token-budget batches; target tokens/s of the task
  network's train step (label-smoothed loss, Adam) under post-LN, pre-LN and rescale on real
  batches; and greedy decoding with the key/value cache against full recomputation at fixed
  output lengths, beam search beside them (:mod:`benchmarks.decoding`).
- ``detection``: Mask R-CNN R50-FPN (issue #10) train step and inference images/s with FrozenBN,
  GN and rescale50 backbones, as ratios to FrozenBN (:mod:`benchmarks.detection`).
- ``video_loader``: the video pipeline's clips/s (decode + transform; issue #11) per backend, GOP
  and num_workers, against the clips/s of the 3D ResNet's train step on clips of the same shape
  (:mod:`benchmarks.video_loader`).
"""
from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

import rescale_core

from . import decoding
from .memory import MemoryResult, peak_step_memory
from .models import TRANSLATION_SCHEMES, Suite, resnet3d_suite, resnet50_suite, transformer_suite, translation_suite
from .steps import Prepared, RunConfig, finish_measuring, prepare, reset_measuring, warm_up
from .timing import PairedTimes, Summary, paired_repeats, timer_measure

__all__ = ["Table", "SectionResult", "Settings", "SECTIONS", "run_section", "train_suite",
           "eval_suite", "measuring_suite", "variant_suite", "compile_suite"]

MiB = 2 ** 20


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


@dataclass
class SectionResult:
    name: str
    tables: list[Table] = field(default_factory=list)
    metrics: dict[str, "Summary | float"] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None


@dataclass
class Settings:
    """Everything a section needs, resolved from the command line (see ``__main__``)."""

    device: torch.device
    amp_dtype: torch.dtype | None
    channels_last: bool
    batch: int
    image_size: int
    warmup: int
    eval_warmup: int
    repeats: dict[str, int]
    min_run_time: float
    resnet3d: dict = field(default_factory=dict)      # arch, frames, image_size, batch
    transformer: dict = field(default_factory=dict)   # arch, src_len, tgt_len, vocab_size, batch
    data: dict = field(default_factory=dict)          # num_images, batch, image_size, source_size
    translation: dict = field(default_factory=dict)   # see section_translation
    detection: dict = field(default_factory=dict)     # see benchmarks.detection.DETECTION_DEFAULTS
    video_loader: dict = field(default_factory=dict)  # see benchmarks.video_loader.VIDEO_LOADER_DEFAULTS
    base_width: int | None = None                     # shrink our models (tests only)
    verbose: bool = True

    @property
    def run_config(self) -> RunConfig:
        return RunConfig(self.device, self.amp_dtype, self.channels_last, compile=False)

    def progress(self, section: str) -> Callable[[int, str, float], None] | None:
        if not self.verbose:
            return None

        def report(r: int, name: str, seconds: float) -> None:
            print(f"  [{section}] repeat {r + 1}: {name:<28} {seconds * 1e3:9.1f} ms",
                  file=sys.stderr, flush=True)
        return report

    def log(self, message: str) -> None:
        if self.verbose:
            print(message, file=sys.stderr, flush=True)


# --- formatting helpers -------------------------------------------------------------------------
def _ratio(s: Summary) -> str:
    return f"{s.median:.3f} [{s.q1:.3f}, {s.q3:.3f}]"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def _release(prepared: dict) -> None:
    """Drop a section's models (the caller's dict is emptied) before the next section builds."""
    prepared.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- generic pieces -----------------------------------------------------------------------------
def _prepare_all(suite: Suite, names: list[str], settings: Settings, batch: int,
                 configs: dict[str, RunConfig] | None = None, train: bool = True,
                 labels: dict[str, str] | None = None) -> dict[str, Prepared]:
    """Build and warm up each contender; ``labels`` renames them for display."""
    out = {}
    for name in names:
        cfg = (configs or {}).get(name, settings.run_config)
        label = (labels or {}).get(name, name)
        settings.log(f"  building {label} ({cfg.label()})")
        p = prepare(suite, name, batch, cfg, train=train)
        p.name = label
        if train:
            warm_up(p, settings.warmup)
        else:
            warm_up(p, settings.eval_warmup, train=False)
        out[label] = p
    return out


def _time(prepared: dict[str, Prepared], baseline: str, repeats: int, settings: Settings,
          section: str, train: bool = True) -> PairedTimes:
    measures = {name: timer_measure(p.train_step if train else p.eval_step,
                                    min_run_time=settings.min_run_time, label=section,
                                    description=name)
                for name, p in prepared.items()}
    return paired_repeats(measures, baseline, repeats, progress=settings.progress(section))


def train_suite(suite: Suite, settings: Settings, batch: int, repeats: int, section: str,
                memory: bool = True) -> SectionResult:
    """Train-step time ratios (to the baseline and to the floor) and peak memory of a suite."""
    names = [c.name for c in suite.contenders]
    prepared = _prepare_all(suite, names, settings, batch)
    paired = _time(prepared, suite.baseline, repeats, settings, section)
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
        row = [name, _ms(paired.seconds(name).median), _ratio(vs_base), _ratio(vs_floor)]
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
    _release(prepared)
    return result


def eval_suite(suite: Suite, settings: Settings, batch: int, repeats: int, section: str) -> SectionResult:
    """Eval-mode forward (inference_mode) throughput and ratios of a suite."""
    names = [c.name for c in suite.contenders]
    prepared = _prepare_all(suite, names, settings, batch, train=False)
    paired = _time(prepared, suite.baseline, repeats, settings, section, train=False)
    result = SectionResult(section)
    rows = []
    for c in suite.contenders:
        name = c.name
        sec = paired.seconds(name).median
        vs_base, vs_floor = paired.ratio(name), paired.ratio(name, suite.floor)
        result.metrics[f"{suite.name}.eval.vs_baseline.{name}"] = vs_base
        result.metrics[f"{suite.name}.eval.vs_floor.{name}"] = vs_floor
        result.metrics[f"{suite.name}.eval.per_second.{name}"] = batch * suite.items / sec
        rows.append([name, _ms(sec), f"{batch * suite.items / sec:.1f}", _ratio(vs_base), _ratio(vs_floor)])
    notes = [f"{suite.title} eval forward (model.eval(), torch.inference_mode), batch {batch} x "
             f"{suite.shape}, {settings.run_config.label()}; {paired.repeats} paired repeats; "
             "vs X: time / time of X, median [q1, q3] of per-repeat ratios"]
    result.tables.append(Table(f"{suite.title}: eval throughput",
                               ["model", "ms/batch", f"{suite.unit}/s", f"vs {suite.baseline}",
                                f"vs {suite.floor}"], rows, notes))
    _release(prepared)
    return result


def measuring_suite(suite: Suite, settings: Settings, batch: int, repeats: int,
                    section: str) -> SectionResult:
    """The target's train step during its measuring phase against its ordinary step, paired.

    One model: before each timed measuring step every mean-shift bias is reset to the start of
    its measuring phase (``Timer.timeit(1)`` setup); before each ordinary step measuring is
    finished. Both go through the same ``Timer.timeit(1)`` (two untimed calls, then one timed).
    """
    result = SectionResult(section)
    p = _prepare_all(suite, [suite.target], settings, batch)[suite.target]
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
    rows = [[ordinary, _ms(paired.seconds(ordinary).median), _ratio(paired.ratio(ordinary))],
            [measuring, _ms(paired.seconds(measuring).median), _ratio(ratio)]]
    notes = [f"batch {batch} x {suite.shape}, {settings.run_config.label()}; {len(layers)} mean-shift "
             f"biases, measure_batches={layers[0].measure_batches}; measuring statistics reset before "
             f"each timed step; {paired.repeats} paired repeats"]
    result.tables.append(Table(f"{suite.title}: measuring steps",
                               ["step", "ms/step", "vs ordinary step"], rows, notes))
    return result


def _merge(name: str, parts: list[SectionResult]) -> SectionResult:
    out = SectionResult(name)
    for part in parts:
        out.tables += part.tables
        out.metrics.update(part.metrics)
    return out


# --- the sections -------------------------------------------------------------------------------
def _resnet50(settings: Settings) -> Suite:
    return resnet50_suite(settings.image_size, base_width=settings.base_width)


def section_train(settings: Settings) -> SectionResult:
    return train_suite(_resnet50(settings), settings, settings.batch, settings.repeats["train"], "train")


def section_eval(settings: Settings) -> SectionResult:
    return eval_suite(_resnet50(settings), settings, settings.batch, settings.repeats["eval"], "eval")


def section_measuring(settings: Settings) -> SectionResult:
    return measuring_suite(_resnet50(settings), settings, settings.batch,
                           settings.repeats["measuring"], "measuring")


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
        prepared.update(_prepare_all(suite, [ref_model], settings, settings.batch,
                                     configs={ref_model: reference(base)},
                                     labels={ref_model: ref_name}))
    prepared.update(_prepare_all(suite, list(labels), settings,
                                 settings.batch, configs=dict.fromkeys(labels, var_cfg), labels=labels))
    baseline = labels[suite.baseline]
    paired = _time(prepared, baseline, settings.repeats[section], settings, section)
    result = SectionResult(section)
    rows = []
    for name in prepared:
        row = [name, _ms(paired.seconds(name).median), _ratio(paired.ratio(name)),
               _ratio(paired.ratio(name, labels[suite.floor]))]
        rows.append(row + ([_ratio(paired.ratio(name, ref_name))] if ref_name else []))
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


def section_channels_last(settings: Settings) -> SectionResult:
    result, prepared, _ = variant_suite(
        _resnet50(settings), settings, "channels_last", lambda c: replace(c, channels_last=True),
        "(channels_last)", reference=lambda c: replace(c, channels_last=False),
        reference_tag="(contiguous)")
    _release(prepared)
    return result


def section_compile(settings: Settings) -> SectionResult:
    return compile_suite(_resnet50(settings), settings, "compile", extra=("rescale50 lean",))


def compile_suite(suite: Suite, settings: Settings, section: str, extra: tuple[str, ...] = ()) -> SectionResult:
    """Baseline, floor and target under torch.compile (and the ``extra`` contenders, e.g. the
    target on the lean plan), and the target eager, paired, with compile time and graph count:
    compiled against compiled, and the target against itself."""
    result, prepared, paired = variant_suite(
        suite, settings, section, lambda c: replace(c, compile=True), "(compiled)",
        reference=lambda c: replace(c, compile=False), reference_tag="(eager)",
        reference_model=suite.target, extra=extra)
    table = result.tables[0]
    table.columns += ["compile s", "graphs"]
    for row in table.rows:
        p = prepared[row[0]]
        if p.compiled:
            overhead = p.warmup_seconds - p.warmup_steps * paired.seconds(row[0]).median
            row += [f"{max(overhead, 0.0):.1f}", str(p.graphs)]
        else:
            row += ["-", "-"]
    table.notes.append("compile s: wall time of the warm-up minus its steps at the measured speed "
                       "(compilation and recompilations; near 0 when inductor's on-disk cache already "
                       "holds the kernels); graphs: graphs compiled during warm-up")
    recompiled = [n for n, p in prepared.items() if p.compiled and p.graphs > 1]
    if recompiled:
        table.notes.append(f"recompiled during warm-up: {recompiled}; past torch._dynamo's "
                           "recompile_limit a frame runs eagerly from then on (warnings on stderr)")
    _release(prepared)
    torch._dynamo.reset()
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
    return _merge("resnet3d", [train_suite(suite, settings, batch, r, "resnet3d"),
                               eval_suite(suite, settings, batch, r, "resnet3d"),
                               measuring_suite(suite, settings, batch, r, "resnet3d")])


def section_transformer(settings: Settings) -> SectionResult:
    suite, batch = _transformer(settings)
    r = settings.repeats["transformer"]
    return _merge("transformer", [train_suite(suite, settings, batch, r, "transformer"),
                                  eval_suite(suite, settings, batch, r, "transformer")])


def section_data(settings: Settings) -> SectionResult:
    from . import data as data_bench  # the project's data code: not needed by the model sections

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
                     _ms(res.paired.seconds(name).median), _ratio(res.paired.ratio(name))])
    for pipeline, reason in data_bench.pending_pipelines():
        rows.append([pipeline, "-", "-", "-", reason])
    w, h = res.source_size
    notes = [f"train loader of ImageFolderDataModule over {res.images_per_epoch} generated {w}x{h} "
             f"JPEGs per epoch, RandomResizedCrop {res.image_size}, batch {res.batch_size}; one "
             f"measurement = one epoch with persistent workers; {res.paired.repeats} paired repeats"]
    result.tables.append(Table("DataLoader throughput", ["pipeline", "setting", "img/s", "ms/epoch",
                                                         f"time vs {res.paired.baseline}"], rows, notes))
    return result


# --- translation (issue #12) ----------------------------------------------------------------------
TRANSLATION_DEFAULTS = {
    "root": None,            # corpus folder (None: under the temp directory, kept between runs)
    "num_pairs": None,       # catalogue pairs used (None: all)
    "pairs": None,           # the English-German pairs (None: the system's gettext catalogues)
    "valid": 500, "test": 500,
    "vocab_size": 8000,      # joint SentencePiece vocabulary
    "max_tokens": 4096,      # the loader and padding-efficiency budget
    "workers": (0, 2),       # loader num_workers settings, paired
    "arch": "transformer_base",
    "overrides": {},         # TransformerConfig fields (smaller CPU sizes)
    "schemes": TRANSLATION_SCHEMES,
    "train_max_tokens": 4096,  # the budget of the timed training batches
    "train_batches": 8,      # real batches per timed call, spread over the batch widths
    "decode_batch": 16,      # sentences decoded together
    "lengths": (20, 50, 100),  # forced output lengths of the decoding timings
    "beam": 4,
}


def _spread(batches: list, widths: list[int], k: int) -> list:
    """``k`` batches at evenly spaced quantiles of ``widths`` (the batches' padded lengths)."""
    order = sorted(range(len(batches)), key=lambda i: (widths[i], i))
    k = max(1, min(k, len(order)))
    return [batches[order[int((j + 0.5) * len(order) / k)]] for j in range(k)]


def _translation_loader(o: dict, root, settings: Settings, result: SectionResult, repeats: int) -> None:
    from . import data as data_bench  # the project's data code: not needed by the model sections

    res = data_bench.translation_throughput(root, o["vocab_size"], tuple(o["workers"]), max_tokens=o["max_tokens"],
                                            repeats=repeats, min_run_time=settings.min_run_time,
                                            progress=settings.progress("translation"))
    result.metrics["translation.padding_efficiency"] = res.padding_efficiency
    rows = []
    for name in res.paired.names:
        tps = res.tokens_per_second(name)
        result.metrics[f"translation.loader.per_second.{name}"] = tps
        seconds = res.paired.seconds(name).median
        rows.append([name, f"{tps:.0f}", f"{res.sentences / seconds:.0f}", _ms(seconds),
                     _ratio(res.paired.ratio(name))])
    notes = [f"train loader of TranslationDataModule (token-budget batches, max_tokens {res.max_tokens}) "
             f"over {res.sentences} real En-De pairs (gettext catalogues, {root}), {res.batches} batches "
             f"and {res.target_tokens} target tokens per epoch; tok/s: real target tokens per second; "
             f"one measurement = one epoch with persistent workers; {res.paired.repeats} paired repeats",
             f"padding efficiency (real tokens / padded positions, source + target tensors): "
             f"{res.padding_efficiency:.4f} by rescale_tasks.translation.batching.padding_efficiency "
             f"of the epoch's batches, {res.tensor_efficiency:.4f} counted on the collated tensors"]
    result.tables.append(Table("Translation: training loader",
                               ["setting", "tok/s", "sentences/s", "ms/epoch",
                                f"time vs {res.paired.baseline}"], rows, notes))


def _translation_train(o: dict, root, settings: Settings, result: SectionResult, repeats: int) -> None:
    from . import data as data_bench  # the project's data code: not needed by the model sections

    from rescale_tasks.translation.dataset import BatchKey

    dm = data_bench.translation_datamodule(root, o["vocab_size"], o["train_max_tokens"], 0)
    sampler = dm.train_dataloader().sampler
    dataset = dm.datasets["train"]
    width = lambda ids: int(max(dataset.src_sizes[ids].max(), dataset.tgt_sizes[ids].max()))  # noqa: E731
    chosen = _spread(sampler.batches, [width(b) for b in sampler.batches], o["train_batches"])
    batches = [dataset[BatchKey(ids)] for ids in chosen]
    suite = translation_suite(batches, dm.vocab_size, o["arch"], tuple(o["schemes"]),
                              max_tokens=o["train_max_tokens"], **o["overrides"])
    names = [c.name for c in suite.contenders]
    prepared = _prepare_all(suite, names, settings, batch=0)
    paired = _time(prepared, suite.baseline, repeats, settings, "translation")
    base = suite.baseline
    rows = []
    for name in names:
        sec = paired.seconds(name).median
        tokens_vs = paired.ratio(base, name)  # time(base) / time(name) per repeat = tok/s ratio
        result.metrics[f"translation.train.per_second.{name}"] = suite.items / sec
        result.metrics[f"translation.train.tokens_vs_baseline.{name}"] = tokens_vs
        result.metrics[f"translation.train.vs_baseline.{name}"] = paired.ratio(name)
        rows.append([name, _ms(sec / len(batches)), f"{suite.items / sec:.0f}", _ratio(tokens_vs),
                     _ratio(paired.ratio(name)), suite.contender(name).note])
    params = sum(p.numel() for p in next(iter(prepared.values())).model.parameters())
    config = next(iter(prepared.values())).model.config
    notes = [f"{suite.title} train step (TranslationModule's network: shared embeddings, label-smoothed "
             f"loss eps 0.1 / target tokens, Adam (0.9, 0.98) at lr 0), {suite.shape}; d_model "
             f"{config.d_model}, {config.num_encoder_layers}+{config.num_decoder_layers} layers, ffn "
             f"{config.dim_feedforward}, {params / 1e6:.1f}M parameters; {settings.run_config.label()}; "
             f"one timed call = one step per batch; {paired.repeats} paired repeats after >= "
             f"{settings.warmup} warm-up steps each",
             "tok/s: real target tokens per second; tok/s vs X: time(X) / time per repeat (above 1: "
             "more tokens/s), time vs X: time / time(X); median [q1, q3] of per-repeat ratios; the "
             "fixed-shape train step, its memory and the no-LN floor: see the transformer section"]
    result.tables.append(Table(f"{suite.title}: train tokens/s",
                               ["model", "ms/step", "tok/s", f"tok/s vs {base}", f"time vs {base}", "note"],
                               rows, notes))
    _release(prepared)


def _translation_decode(o: dict, root, settings: Settings, result: SectionResult, repeats: int) -> None:
    from . import data as data_bench  # the project's data code: not needed by the model sections

    from rescale_tasks.translation.vocab import BOS, EOS, PAD

    dm = data_bench.translation_datamodule(root, o["vocab_size"], o["max_tokens"], 0)
    sources = dm.sources("valid")[:o["decode_batch"]]
    device, amp = settings.device, settings.amp_dtype
    src = torch.nn.utils.rnn.pad_sequence([dm.encode(s) for s in sources], batch_first=True,
                                          padding_value=PAD).to(device)
    scheme = "rescale" if "rescale" in o["schemes"] else o["schemes"][-1]
    torch.manual_seed(0)
    model = rescale_core.create_model(o["arch"], scheme=scheme, src_vocab_size=dm.vocab_size,
                                      share_embeddings=True, pad_index=PAD, **o["overrides"]).to(device).eval()
    sync = device.type == "cuda"
    measures, same = {}, {}

    def autocast(fn):
        def run():
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                return fn()
        return run

    lengths = [int(n) for n in o["lengths"]]
    for n in lengths:
        calls = decoding.decoders(model, src, bos=BOS, eos=EOS, length=n, beam=o["beam"], sync=sync)
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            cached = calls["greedy, cached"]()
            recomputed = calls["greedy, recomputed"]()
        same[n] = int((cached == recomputed).all(dim=1).sum())
        for name, fn in calls.items():
            measures[f"{name}, {n} tokens"] = timer_measure(autocast(fn), min_run_time=settings.min_run_time,
                                                            label="translation decode", description=name)
    baseline = next(iter(measures))
    paired = paired_repeats(measures, baseline, repeats, progress=settings.progress("translation"))
    batch = src.size(0)
    rows = []
    for n in lengths:
        key_c, key_r = f"greedy, cached, {n} tokens", f"greedy, recomputed, {n} tokens"
        vs = paired.ratio(key_c, key_r)
        result.metrics[f"translation.decode.cached_vs_recomputed.{n}"] = vs
        for name in [k for k in measures if k.endswith(f", {n} tokens")]:
            sec = paired.seconds(name).median
            label = name[:-len(f", {n} tokens")]
            result.metrics[f"translation.decode.sentences_per_second.{label}.{n}"] = batch / sec
            rows.append([str(n), label, f"{batch / sec:.1f}", f"{sec / batch * 1e3:.2f}",
                         _ratio(paired.ratio(name, key_r)),
                         f"{same[n]}/{batch}" if name in (key_c, key_r) else "-"])
    config = model.config
    notes = [f"{o['arch']} scheme={scheme} (d_model {config.d_model}, {config.num_encoder_layers}+"
             f"{config.num_decoder_layers} layers, vocab {dm.vocab_size}, untrained), eval mode, "
             f"{settings.run_config.label().replace(', contiguous', '')}; {batch} real validation sources "
             f"decoded together, every sentence forced to exactly n tokens then EOS (min_len = n, max_len = n)",
             "greedy, cached: rescale_core.generation.greedy_search (new_cache / decode_step); greedy, "
             "recomputed: the decoder over the whole prefix at every step, the output projection of the "
             "last position (benchmarks/decoding.py); beam, cached: rescale_core.generation.beam_search "
             "(no uncached beam search to pair with)",
             "ms/sentence: the batch's time / its sentences; time vs recomputed: time / time(greedy, "
             f"recomputed) at the same n, median [q1, q3] of per-repeat ratios; {paired.repeats} paired "
             "repeats (all lengths interleaved); same tokens: sentences whose cached and recomputed "
             "greedy outputs agree"]
    result.tables.append(Table("Translation: decoding at forced output lengths",
                               ["n", "search", "sentences/s", "ms/sentence", "time vs recomputed",
                                "same tokens"], rows, notes))
    del model
    gc.collect()


def section_translation(settings: Settings) -> SectionResult:
    from . import data as data_bench  # the project's data code: not needed by the model sections

    o = {**TRANSLATION_DEFAULTS, **settings.translation}
    r = settings.repeats["translation"]
    root = data_bench.translation_corpus(o["root"], o["num_pairs"], o["valid"], o["test"], pairs=o["pairs"])
    result = SectionResult("translation")
    _translation_loader(o, root, settings, result, r)
    _translation_train(o, root, settings, result, r)
    _translation_decode(o, root, settings, result, r)
    return result


def _elsewhere(module: str, function: str) -> Callable[[Settings], SectionResult]:
    """A section defined in its own module (which imports this one), imported when it runs."""
    def run(settings: Settings) -> SectionResult:
        import importlib

        return getattr(importlib.import_module(f"{__package__}.{module}"), function)(settings)
    run.__name__ = function
    return run


SECTIONS: dict[str, Callable[[Settings], SectionResult]] = {
    "ops": _elsewhere("opcount", "section_ops"),
    "train": section_train,
    "eval": section_eval,
    "measuring": section_measuring,
    "channels_last": section_channels_last,
    "compile": section_compile,
    "resnet3d": section_resnet3d,
    "transformer": section_transformer,
    "data": section_data,
    "translation": section_translation,
    "detection": _elsewhere("detection", "section_detection"),
    "video_loader": _elsewhere("video_loader", "section_video_loader"),
}


def run_section(name: str, settings: Settings) -> SectionResult:
    start = time.perf_counter()
    settings.log(f"[{name}] starting")
    result = SECTIONS[name](settings)
    gc.collect()
    result.seconds = time.perf_counter() - start
    settings.log(f"[{name}] done in {result.seconds:.0f} s")
    return result
