"""What every section is made of: its settings, its tables and result, and the steps that build,
warm up and time a suite's contenders.

A section takes the run's :class:`Settings` and returns a :class:`SectionResult`: tables for
printing and ``metrics`` (medians of paired ratios, and memory ratios) under stable keys that
:mod:`benchmarks.report` checks the goals against. Ratios are formed inside a repeat
(:mod:`benchmarks.timing`) and printed as ``median [q1, q3]`` over the repeats
(:func:`ratio_text`).
"""
from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .models import Suite
from .steps import Prepared, RunConfig, prepare, warm_up
from .timing import PairedTimes, Summary, paired_repeats, timer_measure

__all__ = ["MiB", "Table", "SectionResult", "Settings", "ratio_text", "ms_text", "release",
           "prepare_all", "time_paired", "merge", "positive"]

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
    translation: dict = field(default_factory=dict)   # see benchmarks.translation.TRANSLATION_DEFAULTS
    detection: dict = field(default_factory=dict)     # see benchmarks.detection.DETECTION_DEFAULTS
    video_loader: dict = field(default_factory=dict)  # see benchmarks.video_loader.VIDEO_LOADER_DEFAULTS
    base_width: int | None = None                     # shrink our models (tests only)
    compile: bool = True                              # the plans section compiles too
    compile_backend: str = "inductor"                 # torch.compile's backend there
    verbose: bool = True

    @property
    def run_config(self) -> RunConfig:
        return RunConfig(self.device, self.amp_dtype, self.channels_last, compile=False,
                         compile_backend=self.compile_backend)

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


def ratio_text(s: Summary) -> str:
    """``median [q1, q3]`` of a ratio, three decimals."""
    return f"{s.median:.3f} [{s.q1:.3f}, {s.q3:.3f}]"


def ms_text(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def release(prepared: dict) -> None:
    """Drop a section's models (the caller's dict is emptied) before the next section builds."""
    prepared.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def prepare_all(suite: Suite, names: list[str], settings: Settings, batch: int,
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


def time_paired(prepared: dict[str, Prepared], baseline: str, repeats: int, settings: Settings,
                section: str, train: bool = True) -> PairedTimes:
    """Every prepared contender's train step (or eval forward) in ``repeats`` paired repeats."""
    measures = {name: timer_measure(p.train_step if train else p.eval_step,
                                    min_run_time=settings.min_run_time, label=section,
                                    description=name)
                for name, p in prepared.items()}
    return paired_repeats(measures, baseline, repeats, progress=settings.progress(section))


def merge(name: str, parts: list[SectionResult]) -> SectionResult:
    """One section's result out of several (their tables in order, their metrics together)."""
    out = SectionResult(name)
    for part in parts:
        out.tables += part.tables
        out.metrics.update(part.metrics)
    return out


def positive(kind: type) -> Callable[[str], int | float]:
    """An argparse type: a ``kind`` number above 0 (0 and below are refused, not read as the default)."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text} (leave the option out for its default)")
        return value
    parse.__name__ = f"positive {kind.__name__}"
    return parse
