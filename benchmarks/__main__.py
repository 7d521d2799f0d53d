"""``python -m benchmarks``: run the harness's sections and print one report (see ``--help``).

Run from the repository root (``make bench`` does). Progress goes to stderr, the tables to stdout,
and with ``--markdown PATH`` the results section of that file is rewritten after every section
(a run stopped midway keeps what it measured; the sections left read "not run").
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import torch

import rescale_core
from rescale_tasks.common.system import ENV as MALLOC_ENV, keep_freed_memory, usable_cores

from . import report
from .sections import SECTIONS, run_section
from .toolkit import SectionResult, Settings, positive
from .video_loader import VIDEO_LOADER_SIZES

try:
    from .detection import DETECTION_SIZES
except ImportError:  # no torchvision (a GPU machine with only its own torch): no detection section
    DETECTION_SIZES = {"quick": {}, "cpu": {}, "cuda": {}}

DEFAULT_REPEATS = {
    "cpu": {"train": 10, "eval": 10, "measuring": 6, "channels_last": 6, "plans": 5, "inference": 6,
            "resnet3d": 8, "transformer": 8, "data": 3, "translation": 4,
            "detection": 3, "video_loader": 3},
    "cuda": {"train": 20, "eval": 20, "measuring": 12, "channels_last": 12, "plans": 12, "inference": 12,
             "resnet3d": 15, "transformer": 15, "data": 3, "translation": 15,
             "detection": 10, "video_loader": 5},
}

# The translation section's sizes (the rest: translation.TRANSLATION_DEFAULTS). The GPU runs the
# task's own network (transformer_base, 8000 pieces, 4096-token batches); the CPU a narrower,
# shallower one on 1024-token batches (about a minute); --quick a tiny one on 3000 pairs.
TRANSLATION_SIZES = {
    "quick": {"num_pairs": 3000, "valid": 200, "test": 200, "vocab_size": 500,
              "overrides": {"d_model": 32, "nhead": 2, "num_encoder_layers": 1, "num_decoder_layers": 1,
                            "dim_feedforward": 64},
              "train_max_tokens": 512, "train_batches": 2, "decode_batch": 2},
    "cpu": {"overrides": {"d_model": 256, "nhead": 4, "num_encoder_layers": 3, "num_decoder_layers": 3,
                          "dim_feedforward": 1024},
            "train_max_tokens": 1024, "train_batches": 2, "decode_batch": 4},
    "cuda": {"train_max_tokens": 4096, "train_batches": 8, "decode_batch": 32},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Train-step time and peak memory, eval throughput, measuring steps, channels_last "
                    "and torch.compile variants of normalization-free ResNets and Transformers "
                    "against their normalized baselines and no-normalization floors, DataLoader "
                    "throughput, and the translation task (loader tokens/s, padding efficiency, "
                    "train tokens/s, cached vs recomputed decoding), Mask R-CNN R50-FPN with FrozenBN, "
                    "GN and rescale50 backbones (train step, inference images/s) and the video "
                    "loader's clips/s against the 3D train step: medians of paired ratios over "
                    "interleaved repeats, in one run.")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cuda when available, else cpu")
    p.add_argument("--batch", type=positive(int), default=None, help="ResNet-50 batch (default: cpu 16, cuda 128)")
    p.add_argument("--image-size", type=positive(int), default=None, help="ResNet-50 image size (default 224)")
    p.add_argument("--repeats", type=positive(int), default=None,
                   help="paired repeats of every section (default: per section, see the header)")
    p.add_argument("--warmup", type=int, default=10,
                   help="warm-up train steps per contender; never fewer than measure_batches + 2 (10)")
    p.add_argument("--only", nargs="+", choices=list(SECTIONS), metavar="SECTION",
                   help=f"run only these sections, in this order: {', '.join(SECTIONS)}")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="channels_last models and inputs in every section (default: on for cuda, off for cpu; "
                        "the channels_last section always compares both)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="time the plans and inference sections under torch.compile too, beside eager "
                        "(default: on, off with --quick; slow on CPU)")
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend of the plans section (default inductor; aot_eager or eager "
                        "check graph capture without generating code)")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default=None,
                   help="cuda autocast dtype (default bf16); cpu always runs float32")
    p.add_argument("--threads", type=positive(int), default=None,
                   help="torch.set_num_threads (default: torch's own; 1 with --quick)")
    p.add_argument("--min-run-time", type=positive(float), default=None,
                   help="seconds per measurement block of fast statements (default 0.2, quick 0.05)")
    p.add_argument("--resnet3d-arch", default="resnet3d_50", help="3D ResNet of the resnet3d section")
    p.add_argument("--transformer-arch", default="transformer_small",
                   help="registered Transformer of the transformer section")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny inputs, 2 repeats, no compile (about 2 minutes on 2 CPU cores)")
    p.add_argument("--translation-root", metavar="DIR",
                   help="folder of the translation section's corpus and caches (default: under the "
                        "temp directory, kept between runs)")
    p.add_argument("--detection-batch", type=positive(int), default=None,
                   help="images per Mask R-CNN step in the detection section (default: cpu 2 at 320 px, "
                        "cuda 4 at 800 px, quick 1)")
    p.add_argument("--video-workers", type=positive(int), default=None,
                   help="the N of the video_loader section's 'N workers' DataLoader (default: cpu 2, cuda "
                        "the usable cores up to 8)")
    p.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="start no section after this many seconds (the sections left are reported as not run, "
                        "and the run fails): make bench-gpu fits a lease this way")
    p.add_argument("--markdown", metavar="PATH", help="write the results section of this markdown file")
    p.add_argument("--host-malloc", choices=["kept", "system"], default="kept",
                   help="kept (the default, what the rescale command does): glibc keeps freed host memory for the "
                        "next step instead of returning it and faulting it in again; system: glibc's defaults "
                        "(rescale_tasks.common.system.allocator; docs/speed.md, 'Host memory on a CPU')")
    p.add_argument("--markdown-tag", metavar="TAG", default="",
                   help="write a results section of its own, <!-- bench:begin [DEVICE-]TAG -->, instead "
                        "of the device's main one (e.g. --only translation --markdown-tag translation: "
                        "adds this run's tables without replacing the full run's figures; likewise "
                        "--only detection --markdown-tag detection, --only video_loader --markdown-tag "
                        "video_loader)")
    args = p.parse_args(argv)
    for option, arch, families in (("--resnet3d-arch", args.resnet3d_arch, ("resnet3d", "video_resnet")),
                                   ("--transformer-arch", args.transformer_arch, ("transformer",))):
        known = [name for family in families for name in rescale_core.list_models(family=family)]
        if arch not in known:  # found now, not when its section (or video_loader) builds it
            p.error(f"{option} {arch}: not a registered {' or '.join(families)} model; one of {', '.join(sorted(known))}")
    if args.markdown:
        problem = _unwritable(Path(args.markdown))
        if problem:  # found now, not after an hour of measurements
            p.error(f"--markdown {args.markdown}: {problem}")
    return args


def _unwritable(path: Path) -> str | None:
    """Why the results file ``path`` could not be written, or None."""
    folder = path.parent
    if path.is_dir():
        return "is a folder; give the markdown file to write (e.g. benchmarks/RESULTS.md)"
    if not folder.is_dir():
        return f"no folder {folder}; create it, or give a file in an existing folder"
    if not os.access(path if path.exists() else folder, os.W_OK):
        return f"{'the file' if path.exists() else f'the folder {folder}'} is not writable"
    return None


def build_settings(args: argparse.Namespace) -> Settings:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    gpu = device.type == "cuda"
    if gpu:
        torch.backends.cudnn.benchmark = True  # autotuned during the warm-up, for every contender
    if args.threads:
        torch.set_num_threads(args.threads)
    elif args.quick:
        # a smoke run: one thread keeps tiny models fast on a shared, loaded machine
        torch.set_num_threads(1)
    repeats = dict(DEFAULT_REPEATS[device.type])
    if args.quick:
        repeats = dict.fromkeys(repeats, 2)
    if args.repeats is not None:
        repeats = dict.fromkeys(repeats, args.repeats)
    dtype = args.dtype or ("bf16" if gpu else "fp32")
    amp = torch.bfloat16 if (gpu and dtype == "bf16") else None
    q = args.quick
    return Settings(
        device=device, amp_dtype=amp,
        channels_last=gpu if args.channels_last is None else args.channels_last,
        batch=args.batch or (2 if q else (128 if gpu else 16)),
        image_size=args.image_size or (64 if q else 224),
        warmup=args.warmup, eval_warmup=1 if q else 3, repeats=repeats,
        min_run_time=args.min_run_time or (0.05 if q else 0.2),
        resnet3d={"arch": args.resnet3d_arch, "frames": 4 if q else 16,
                  "image_size": 32 if q else 112, "batch": 2 if q else (16 if gpu else 2)},
        transformer={"arch": args.transformer_arch, "src_len": 8 if q else (64 if gpu else 32),
                     "tgt_len": 8 if q else (64 if gpu else 32),
                     "vocab_size": 1000 if q else (32000 if gpu else 8000),
                     "batch": 2 if q else (64 if gpu else 16)},
        data={"num_images": 32 if q else 256, "batch": 8 if q else 32, "image_size": 64 if q else 224,
              "source_size": (160, 120) if q else (500, 375)},
        translation={**TRANSLATION_SIZES["quick" if q else device.type],
                     **({"root": args.translation_root} if args.translation_root else {})},
        detection=_sizes(DETECTION_SIZES, q, device.type,
                         {"batch": args.detection_batch} if args.detection_batch else {}),
        video_loader=_sizes(VIDEO_LOADER_SIZES, q, device.type,
                            {"workers": args.video_workers or (_video_workers() if gpu else 2)}),
        compile=(not q) if args.compile is None else args.compile, compile_backend=args.compile_backend,
    )


def _sizes(sizes: dict, quick: bool, device: str, extra: dict) -> dict:
    """A section's sizes: the device's, --quick's over them, then the command line's."""
    return {**sizes[device], **(sizes["quick"] if quick else {}), **extra}


def _video_workers() -> int:
    return max(2, min(8, usable_cores()))


def selected_sections(args: argparse.Namespace) -> list[str]:
    """``--only``'s sections in the order given (make bench-gpu: most wanted first), else all."""
    return list(dict.fromkeys(args.only)) if args.only else list(SECTIONS)


def measured_sections(results: list[SectionResult], settings: Settings) -> set[str]:
    """The sections whose goals this run reports: every section it ran, a failed one and one the
    deadline left out included (their goals read "not measured"); the plans section's (compiled)
    goals only where it compiled."""
    return {r.name for r in results if r.name != "plans" or settings.compile}


def checked_run(argv: list[str] | None = None) -> tuple[argparse.Namespace, Settings, str]:
    """The run's options, settings and results section tag, or one error line (``SystemExit``)
    before anything is measured: a bad option, a ``--markdown`` file that cannot be written or
    whose section's markers are broken (``make bench-gpu`` checks its run with it before the
    device tests)."""
    args = parse_args(argv)
    keep_freed_memory(dict(os.environ, **({MALLOC_ENV: "system"} if args.host_malloc == "system" else {})))
    settings = build_settings(args)
    tag = report.results_tag(settings, args.markdown_tag)
    problem = report.markers_problem(args.markdown, tag) if args.markdown else None
    if problem:  # found now, before the run, rather than when its figures are written
        raise SystemExit(f"python -m benchmarks: error: --markdown {args.markdown}: {problem}")
    return args, settings, tag


def main(argv: list[str] | None = None) -> int:
    args, settings, tag = checked_run(argv)
    env = report.environment(settings, sys.argv[1:] if argv is None else argv)
    print(report.header_text(env), flush=True)
    results: list[SectionResult] = []
    sections = selected_sections(args)
    start = time.perf_counter()
    for done, name in enumerate(sections, 1):
        if args.deadline is not None and time.perf_counter() - start > args.deadline:
            results.append(SectionResult(name, error=f"not run: the {args.deadline:.0f} s deadline had passed "
                                                     f"(time it alone with --only {name})"))
            print(report.section_text(results[-1]), flush=True)
            continue
        try:
            res = run_section(name, settings)
        except Exception as exc:  # one broken section must not lose the others' measurements
            traceback.print_exc()
            res = SectionResult(name, error=f"{type(exc).__name__}: {exc}")
        results.append(res)
        print(report.section_text(res), flush=True)
        if args.markdown and done < len(sections):
            # written after every section: a run stopped later (killed at the end of a lease,
            # interrupted) keeps the figures it measured; the sections left say so
            left = [SectionResult(n, error=f"not run: the run stopped before this section ended "
                                            f"(killed or interrupted; time it with --only {n})")
                    for n in sections[done:]]
            _write_results(args, settings, env, results + left, tag)
    goal_table = _goal_table(args, settings, results)
    print(report.footer_text(results, goal_table), flush=True)
    if args.markdown:
        _write_results(args, settings, env, results, tag)
        print(f"\nresults written to {args.markdown}", flush=True)
    return 1 if any(r.error for r in results) else 0


def _goal_table(args: argparse.Namespace, settings: Settings, results: list[SectionResult]):
    metrics = {k: v for r in results for k, v in r.metrics.items()}
    goal_table = report.goals_table(report.evaluate_goals(metrics, settings.device), settings.device,
                                    measured_sections(results, settings))
    if args.quick:
        goal_table.notes.insert(0, "--quick smoke run (tiny inputs, 2 repeats): the marks mean nothing here")
    return goal_table


def _write_results(args: argparse.Namespace, settings: Settings, env: list[tuple[str, str]],
                   results: list[SectionResult], tag: str) -> None:
    markdown = report.render_markdown(env, results, _goal_table(args, settings, results), tag)
    report.write_results(args.markdown, markdown, tag)


if __name__ == "__main__":
    sys.exit(main())
