"""Printing: the machine/versions header, the section tables, the goals with pass/fail marks
computed from the measured ratios, and the results section of ``benchmarks/RESULTS.md``.

The speed goals of the normalization-free networks, as ratios measured in the same run:

- the target's train step at most 0.90x its normalized baseline on CPU (0.85x on GPU, where the
  harness runs bf16 autocast with channels_last), i.e. within 5% of the no-normalization floor;
  the same under ``torch.compile``: compiled against the compiled baseline and floor, and no
  slower than the target's own eager step;
- its measuring steps no slower than its ordinary steps (a 5% allowance for noise);
- its peak training memory at most the baseline's;
- its eval-mode forward within 5% of the floor; in the ``inference`` section (the frozen plan,
  ResNet-50 and R3D-18), eager and compiled.

ResNet-50 (``rescale50`` vs torchvision's BN ResNet-50), the 3D ResNet (rescale vs BN) and the
Transformer (rescale vs post-LN) get the same goals where the section ran. Thresholds live in
:data:`THRESHOLDS`; nothing in a mark is hard-coded but the threshold.

The translation section adds its own goals: the training loader's token-budget batches
at ``max_tokens`` 4096 more than 0.90 real tokens per padded position (a higher-is-better goal),
and greedy decoding with the key/value cache faster than full recomputation at every forced
output length measured (20 tokens and longer; time ratio below 1).

The detection section adds its own: the rescale50 Mask R-CNN R50-FPN train step no slower
than the FrozenBN one and faster than the GN one, its inference no slower than FrozenBN's. The
video_loader section adds its own: the video loader with N workers on GOP-16 clips delivers
more clips/s than the 3D ResNet's train step consumes (a higher-is-better goal).

A ratio to the baseline cannot beat the floor's own ratio: no scheme adds less than nothing. Where
the floor itself misses a ratio-to-baseline threshold in the same run (a Transformer spends under
1% of its step in LayerNorm; inductor fuses BatchNorm into neighbouring kernels), the mark says
so, and the goal that is left to the scheme is the one against the floor.
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from rescale_tasks.common.system import describe_code, host_allocator, usable_cores

from .models import resnet3d_suite, resnet50_suite, transformer_suite
from .toolkit import SectionResult, Settings, Table
from .timing import Summary

__all__ = ["THRESHOLDS", "Goal", "GoalResult", "goals", "evaluate_goals", "environment",
           "format_table", "markdown_table", "goals_table", "header_text", "section_text",
           "footer_text", "render_text", "render_markdown", "markers_problem", "write_results",
           "BEGIN", "END", "markers", "results_tag"]

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def markers(tag: str = "") -> tuple[str, str]:
    """The begin/end markers of one results section of RESULTS.md. The CPU run owns the plain
    markers; a GPU run writes its own section (``tag`` e.g. ``cuda-bf16``) next to it, so a GPU
    run never replaces the CPU figures and vice versa."""
    if not tag:
        return BEGIN, END
    return f"<!-- bench:begin {tag} -->", f"<!-- bench:end {tag} -->"


def results_tag(settings: Settings, extra: str = "") -> str:
    """'' on CPU; ``cuda-bf16`` / ``cuda-fp32`` on a GPU (one section per autocast setting);
    ``extra`` (``--markdown-tag``) appended: ``translation`` on CPU, ``cuda-bf16-translation``."""
    device = "" if settings.device.type == "cpu" else \
        f"{settings.device.type}-{'bf16' if settings.amp_dtype == torch.bfloat16 else 'fp32'}"
    extra = re.sub(r"[^A-Za-z0-9_.-]+", "-", extra.strip()).strip("-")
    return "-".join(t for t in (device, extra) if t)

# (cpu, cuda) thresholds on medians of paired ratios
THRESHOLDS = {
    "train_vs_baseline": (0.90, 0.85),
    "train_vs_floor": (1.05, 1.05),
    "compile_vs_baseline": (0.90, 0.85),
    "compile_vs_floor": (1.05, 1.05),
    "compile_vs_eager": (1.00, 1.00),
    "measuring_vs_ordinary": (1.05, 1.05),
    "memory_vs_baseline": (1.00, 1.00),
    "eval_vs_floor": (1.05, 1.05),
    "padding_efficiency": (0.90, 0.90),          # higher is better: real tokens / padded positions
    "decode_cached_vs_recomputed": (1.00, 1.00),  # time with the cache / time recomputing
    "detection_vs_frozen_bn": (1.00, 1.00),      # rescale50 Mask R-CNN time / FrozenBN's
    "detection_vs_gn": (1.00, 1.00),             # rescale50 Mask R-CNN time / GN's
    "loader_keeps_up": (1.00, 1.00),             # higher is better: loader clips/s / train-step clips/s
}

# The forced output lengths the translation section decodes at by default (each gets a goal;
# other lengths found in a run's metrics get theirs too).
DECODE_LENGTHS = (20, 50, 100)


@dataclass(frozen=True)
class Goal:
    model: str       # e.g. "ResNet-50"
    text: str
    key: str         # metric key of a SectionResult
    kind: str        # key of THRESHOLDS
    section: str     # the --only section that measures it
    floor_key: str | None = None  # the floor's ratio to the same baseline, where one applies
    higher: bool = False  # the value must exceed the threshold (else stay at or below it)
    area: str = "speed"  # what the goal is about: speed, translation, detection, video

    def passes(self, value: float, threshold: float) -> bool:
        return value > threshold if self.higher else value <= threshold

    def threshold_text(self, threshold: float) -> str:
        return f"{'>' if self.higher else '<='} {threshold:.2f}"


@dataclass(frozen=True)
class GoalResult:
    goal: Goal
    threshold: float
    value: "Summary | float | None"
    floor: "Summary | float | None" = None  # the floor's value of the same ratio

    @property
    def status(self) -> str:
        if self.value is None:
            return "not measured"
        mark = "PASS" if self.goal.passes(_median(self.value), self.threshold) else "FAIL"
        if isinstance(self.value, Summary) and self.value.q1 <= self.threshold < self.value.q3:
            mark += " (IQR spans the threshold)"
        if self.floor is not None:
            floor = _median(self.floor)
            mark += (f" (out of reach: the floor itself is {floor:.3f})" if floor > self.threshold
                     else f" (floor {floor:.3f})")
        return mark

    @property
    def measured(self) -> str:
        if self.value is None:
            return "-"
        if isinstance(self.value, Summary):
            return f"{self.value.median:.3f} [{self.value.q1:.3f}, {self.value.q3:.3f}]"
        return f"{float(self.value):.3f}"


def _median(value: "Summary | float") -> float:
    return value.median if isinstance(value, Summary) else float(value)


def translation_goals(metrics: dict | None = None) -> list[Goal]:
    """The translation goals: padding efficiency, and the cache against recomputation per length
    (:data:`DECODE_LENGTHS` and any other length measured in ``metrics``)."""
    prefix = "translation.decode.cached_vs_recomputed."
    lengths = set(DECODE_LENGTHS) | {int(k[len(prefix):]) for k in (metrics or {})
                                     if k.startswith(prefix) and k[len(prefix):].isdigit()}
    out = [Goal("Translation", "padding efficiency of the training batches (real tokens / padded "
                "positions)", "translation.padding_efficiency", "padding_efficiency", "translation",
                higher=True, area="translation")]
    out += [Goal("Translation", f"greedy decoding with the cache / recomputed, {n} tokens",
                 f"{prefix}{n}", "decode_cached_vs_recomputed", "translation", area="translation")
            for n in sorted(lengths)]
    return out


def detection_goals() -> list[Goal]:
    """Detection: the rescale50 Mask R-CNN no slower than FrozenBN's and faster than GN's."""
    t = "rescale50"
    return [Goal("Mask R-CNN", f"{t} train step / FrozenBN", f"detection.train.vs_baseline.{t}",
                 "detection_vs_frozen_bn", "detection", area="detection"),
            Goal("Mask R-CNN", f"{t} train step / GN", f"detection.train.vs_gn.{t}", "detection_vs_gn",
                 "detection", area="detection"),
            Goal("Mask R-CNN", f"{t} inference / FrozenBN", f"detection.eval.vs_baseline.{t}",
                 "detection_vs_frozen_bn", "detection", area="detection")]


def inference_goals() -> list[Goal]:
    """RescaleNet's eval forward on the frozen plan within 5% of the floor, eager and compiled
    (the ``inference`` section: ResNet-50 and R3D-18)."""
    return [Goal(title, f"rescale eval forward / floor, {mode} (frozen plan)",
                 f"{name}.inference.{mode}.vs_floor.rescale", "eval_vs_floor", "inference")
            for name, title in (("resnet50", "ResNet-50"), ("r3d_18", "R3D-18")) for mode in ("eager", "compiled")]


def video_goals(metrics: dict | None = None) -> list[Goal]:
    """Video: the video loader with N workers keeps up with the 3D train step on GOP-16 clips
    (what ``rescale prepare-video`` writes): PyAV always, every other backend measured."""
    prefix, suffix = "video_loader.keeps_up.", ".gop16"
    backends = ["pyav"] + sorted({k[len(prefix):-len(suffix)] for k in (metrics or {})
                                  if k.startswith(prefix) and k.endswith(suffix)} - {"pyav"})
    return [Goal("Video loader", f"{b} clips/s with N workers / 3D train step clips/s, GOP 16",
                 f"{prefix}{b}{suffix}", "loader_keeps_up", "video_loader", higher=True, area="video")
            for b in backends]


def goals(metrics: dict | None = None) -> list[Goal]:
    out = []
    # (suite, title, the --only section measuring each kind of goal)
    for suite, title, section in (
        (resnet50_suite(), "ResNet-50", {"train": "train", "eval": "eval", "measuring": "measuring",
                                         "compile": "plans"}),
        (resnet3d_suite(), "3D ResNet", dict.fromkeys(("train", "eval", "measuring"), "resnet3d")),
        (transformer_suite(), "Transformer", dict.fromkeys(("train", "eval"), "transformer")),
    ):
        t, b, f, n = suite.target, suite.baseline, suite.floor, suite.name
        out += [
            Goal(title, f"{t} train step / {b}", f"{n}.train.vs_baseline.{t}", "train_vs_baseline",
                 section["train"], floor_key=f"{n}.train.vs_baseline.{f}"),
            Goal(title, f"{t} train step / {f}", f"{n}.train.vs_floor.{t}", "train_vs_floor", section["train"]),
        ]
        if "compile" in section:
            c = section["compile"]
            out += [
                Goal(title, f"{t} train step / {b}, both torch.compile'd", f"{n}.compile.vs_baseline.{t}",
                     "compile_vs_baseline", c, floor_key=f"{n}.compile.vs_baseline.{f}"),
                Goal(title, f"{t} train step / {f}, both torch.compile'd", f"{n}.compile.vs_floor.{t}",
                     "compile_vs_floor", c),
                Goal(title, f"{t} train step compiled / eager", f"{n}.compile.vs_reference.{t}",
                     "compile_vs_eager", c),
            ]
        if "measuring" in section:
            out.append(Goal(title, f"{t} measuring step / its ordinary step",
                            f"{n}.measuring.vs_ordinary", "measuring_vs_ordinary", section["measuring"]))
        out += [
            Goal(title, f"{t} peak train memory / {b}", f"{n}.train.mem_vs_baseline.{t}",
                 "memory_vs_baseline", section["train"]),
            Goal(title, f"{t} eval forward / {f}", f"{n}.eval.vs_floor.{t}", "eval_vs_floor", section["eval"]),
        ]
    return out + inference_goals() + translation_goals(metrics) + detection_goals() + video_goals(metrics)


def evaluate_goals(metrics: dict, device: str | torch.device) -> list[GoalResult]:
    on_gpu = torch.device(device).type == "cuda"
    return [GoalResult(g, THRESHOLDS[g.kind][1 if on_gpu else 0], metrics.get(g.key),
                       metrics.get(g.floor_key) if g.floor_key else None) for g in goals(metrics)]


# --- environment --------------------------------------------------------------------------------
def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(settings: Settings, argv: list[str] | None = None) -> list[tuple[str, str]]:
    """(key, value) rows: date, command, machine, versions and run settings."""
    usable = usable_cores()
    gpu = "none"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = (f"{props.name}, {props.total_memory / 2**30:.0f} GiB, capability "
               f"{props.major}.{props.minor}, CUDA {torch.version.cuda}")
    rows = [
        ("date", _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("command", " ".join(["python -m benchmarks", *(argv if argv is not None else sys.argv[1:])])),
        ("cpu", f"{_cpu_model()}, {os.cpu_count()} logical cores ({usable} usable), "
                f"torch threads {torch.get_num_threads()}"),
        ("gpu", gpu),
        ("os", f"{platform.system()} {platform.release()}; load average at the start: {load_average()}"),
        ("host memory", host_allocator()),
        ("versions", f"python {platform.python_version()}, torch {torch.__version__}, torchvision "
                     f"{_version('torchvision')}, timm {_version('timm')}, lightning {_version('lightning')}, "
                     f"numpy {_version('numpy')}, pillow {_version('pillow')}"),
        ("code", f"rescale-suite {describe_code()}"),
        ("settings", f"{settings.run_config.label()}; ResNet-50 batch {settings.batch} at "
                     f"{settings.image_size} px; >= {settings.warmup} warm-up train steps per contender; "
                     f"repeats " + ", ".join(f"{k} {v}" for k, v in settings.repeats.items())
                     + ("; cudnn.benchmark on" if torch.backends.cudnn.benchmark else "")),
    ]
    return rows


# --- rendering ----------------------------------------------------------------------------------
def format_table(table: Table) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(table.columns, *table.rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [table.title, line(table.columns), line("-" * w for w in widths)]
    out += [line(r) for r in table.rows]
    out += [f"  * {n}" for n in table.notes]
    return "\n".join(out)


def _md_cell(x) -> str:
    return str(x).replace("|", "\\|")


def markdown_table(table: Table, level: str = "###") -> str:
    out = [f"{level} {table.title}", "", "| " + " | ".join(map(_md_cell, table.columns)) + " |",
           "|" + "|".join("---" for _ in table.columns) + "|"]
    out += ["| " + " | ".join(map(_md_cell, r)) + " |" for r in table.rows]
    if table.notes:
        out += [""] + [f"- {n}" for n in table.notes]
    return "\n".join(out)


def goals_table(results: list[GoalResult], device: str | torch.device, ran: set[str]) -> Table:
    rows, areas = [], set()
    for r in results:
        if r.value is None and r.goal.section not in ran:
            continue  # section not selected in this run (--only / --no-compile)
        rows.append([r.goal.model, r.goal.text, r.measured, r.goal.threshold_text(r.threshold), r.status])
        areas.add(r.goal.area)
    if not rows:
        rows = [["-", "no goal is measured by the selected sections", "-", "-", "-"]]
    on_gpu = torch.device(device).type == "cuda"
    notes = ["measured: median [q1, q3] of paired per-repeat ratios (memory: one deterministic probe); "
             "the mark compares the median with the threshold; where the inter-quartile range spans "
             "the threshold the run was too noisy to decide (rerun on a quieter machine or with more "
             "--repeats)",
             "thresholds: benchmarks/report.py THRESHOLDS (speed: train <= "
             f"{THRESHOLDS['train_vs_baseline'][1 if on_gpu else 0]:.2f}x the normalized baseline "
             + ("on GPU in bf16 + channels_last)" if on_gpu else "on CPU, eager)")]
    if "translation" in areas:
        notes.append("translation: padding efficiency above 0.90 at max_tokens 4096; greedy "
                     "decoding with the key/value cache faster than recomputing the decoder over the "
                     "prefix at every forced output length (time ratio below 1)")
    if "detection" in areas:
        notes.append("detection: the rescale50 Mask R-CNN R50-FPN no slower than the FrozenBN "
                     "one (train step and inference) and faster than the GN one (train step)")
    if "video" in areas:
        notes.append("video: the video loader with N workers delivers more clips/s than the 3D "
                     "ResNet's train step consumes (GOP-16 clips, as prepare-video writes them)")
    order = ("speed", "translation", "detection", "video")
    title = f"Goals ({', '.join(sorted(areas or {'speed'}, key=order.index))})"
    return Table(title, ["model", "goal", "measured", "threshold", "status"], rows, notes)


def header_text(env: list[tuple[str, str]]) -> str:
    out = ["=" * 78, "rescale benchmark harness"]
    out += [f"{k:<9} {v}" for k, v in env]
    return "\n".join(out + ["=" * 78])


def section_text(res: SectionResult) -> str:
    out = []
    if res.error:
        out += ["", f"[{res.name}] FAILED: {res.error}"]
    for t in res.tables:
        out += ["", format_table(t)]
    return "\n".join(out)


def load_average() -> str:
    """The 1-minute load average against the usable cores: other work on the machine slows
    contenders unevenly, the one thing paired repeats cannot fully cancel."""
    try:
        return f"{os.getloadavg()[0]:.1f} on {usable_cores()} cores"
    except OSError:
        return "unknown"


def times_line(results: list[SectionResult]) -> str:
    return ("section times: " + ", ".join(f"{r.name} {r.seconds:.0f} s" for r in results)
            + f"; load average at the end: {load_average()}")


def footer_text(results: list[SectionResult], goal_table: Table) -> str:
    return "\n".join(["", format_table(goal_table), "", times_line(results)])


def render_text(env: list[tuple[str, str]], results: list[SectionResult], goal_table: Table) -> str:
    return "\n".join([header_text(env), *(section_text(r) for r in results),
                      footer_text(results, goal_table)])


def render_markdown(env: list[tuple[str, str]], results: list[SectionResult], goal_table: Table,
                    tag: str = "") -> str:
    begin, end = markers(tag)
    title = f"{tag} results" if tag else "Results"
    out = [begin, f"## {title} of {dict(env)['date']}", "", "| | |", "|---|---|"]
    out += [f"| {k} | {_md_cell(v)} |" for k, v in env]
    out += ["", markdown_table(goal_table)]
    for res in results:
        if res.error:
            out += ["", f"**{res.name} failed:** {res.error}"]
        for t in res.tables:
            out += ["", markdown_table(t)]
    out += ["", times_line(results).capitalize(), end]
    return "\n".join(out) + "\n"


_INTRO = """# Benchmark results

Written by `make bench` (`python -m benchmarks --markdown benchmarks/RESULTS.md`); everything
between the `bench:begin` / `bench:end` markers is replaced on every run, text outside them is
kept. See `benchmarks/__init__.py` and `python -m benchmarks --help` for what is measured.

"""


def markers_problem(path: str | Path, tag: str = "") -> str | None:
    """Why the results section ``tag`` of ``path`` cannot be replaced safely, or None: its
    markers must be absent or make exactly one begin ... end pair (a begin whose end was lost
    would make the replacement run on to the next end marker, over the other sections)."""
    path = Path(path)
    if not path.is_file():
        return None
    text = path.read_text()
    begin, end = markers(tag)
    starts, ends = text.count(begin), text.count(end)
    if (starts, ends) in ((0, 0), (1, 1)) and (not starts or text.index(begin) < text.index(end)):
        return None
    return (f"its results section {tag or '(the main one)'} has {starts} {begin!r} and {ends} {end!r} "
            "markers, not one pair in order: mend them by hand (nothing was written)")


def write_results(path: str | Path, markdown: str, tag: str = "") -> None:
    """Replace the results section ``tag`` of ``path`` (between its markers), keeping the rest
    (the other devices' sections included); append it when it is not there yet. Markers that do
    not pair up (:func:`markers_problem`) raise ``ValueError`` before anything is written."""
    path = Path(path)
    problem = markers_problem(path, tag)
    if problem:
        raise ValueError(f"{path}: {problem}")
    text = path.read_text() if path.exists() else _INTRO
    begin, end = markers(tag)
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: markdown, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + markdown
    path.write_text(text)
