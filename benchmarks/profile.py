"""``python -m benchmarks.profile``: where a train step's time goes, kernel by kernel.

The harness says *how much* slower a contender is; this says *why*. Each named contender of a
suite is built exactly as the harness times it (:func:`benchmarks.steps.prepare`, the same
device, autocast dtype, memory format and optimizer), warmed up past RescaleNet's measuring
steps, then a few train steps run under :mod:`torch.profiler`. Printed per contender: the total
device (or CPU) time per step, the time per kernel category (convolution / matmul, elementwise,
reduction, copies and casts, optimizer, other) and the top kernels by self time, so two
contenders can be read side by side (e.g. ``rescale50`` against the no-normalization floor).

Example (GPU, the harness's settings)::

    python -m benchmarks.profile --suite resnet50 --contenders "resnet50 BN" "floor (no norm)" rescale50
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from .models import resnet3d_suite, resnet50_suite, transformer_suite
from .steps import RunConfig, prepare, warm_up
from .toolkit import positive

__all__ = ["CATEGORIES", "categorize", "kernel_table", "main"]

# first match wins; matched against lower-cased kernel / op names
CATEGORIES = [
    ("optimizer", r"multi_tensor|foreach|sgd|_fused_sgd|adam"),
    ("conv/matmul", r"conv|gemm|cutlass|xmma|sm\d+_|wgmma|implicit|cudnn|winograd|dgrad|wgrad|fprop|mm_|addmm|\bmm\b|matmul|nchwtonhwc|nhwctonchw"),
    ("copy/cast", r"copy|cast|convert|to_copy|memcpy|memset|fill|contiguous|permute|transpose"),
    ("reduction", r"reduce|sum|mean|norm_|batch_norm|bn_|welford|softmax|nll|cross_entropy|max_pool|avg_pool|pool"),
    ("elementwise", r"elementwise|vectorized|unrolled|add|mul|relu|threshold|maximum|where|clamp|triton_"),
]


def categorize(name: str) -> str:
    low = name.lower()
    for cat, pattern in CATEGORIES:
        if re.search(pattern, low):
            return cat
    return "other"


def _suite(name: str, args: argparse.Namespace):
    if name == "resnet50":
        return resnet50_suite(args.image_size), args.batch
    if name == "resnet3d":
        return resnet3d_suite(frames=args.frames, image_size=args.image_size_3d), args.batch_3d
    return transformer_suite(src_len=64, tgt_len=64, vocab_size=32000), args.batch_transformer


def kernel_table(events, steps: int, device_type: str, top: int) -> tuple[float, float, dict, list]:
    """(ms per step, calls per step, {category: ms per step}, [(ms per step, calls per step,
    name)] top kernels) from a profiler's ``key_averages()``: device self time and kernel
    launches on CUDA, CPU self time and op calls on CPU."""
    rows = []
    for e in events:
        if device_type == "cuda":
            # kernels only: an op's own "self device time" is the same kernels counted again
            if e.device_type != torch.autograd.DeviceType.CUDA:
                continue
            t = e.self_device_time_total
        else:
            t = e.self_cpu_time_total
            if e.key.startswith("ProfilerStep") or "Optimizer." in e.key:
                continue
        if t > 0:
            rows.append((t / 1e3 / steps, e.count / steps, e.key))
    total = sum(r[0] for r in rows)
    calls = sum(r[1] for r in rows)
    cats: dict[str, float] = defaultdict(float)
    for ms, _, name in rows:
        cats[categorize(name)] += ms
    rows.sort(reverse=True)
    return total, calls, dict(cats), rows[:top]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=["resnet50", "resnet3d", "transformer"], default="resnet50")
    p.add_argument("--contenders", nargs="+", default=None, help="contender names (default: all)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default=None,
                   help="autocast dtype (default: bf16 on cuda, fp32 on cpu; bf16 on cpu counts the casts)")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--batch", type=positive(int), default=None, help="ResNet-50 batch (cpu 16, cuda 128)")
    p.add_argument("--image-size", type=positive(int), default=224)
    p.add_argument("--batch-3d", type=positive(int), default=16)
    p.add_argument("--frames", type=positive(int), default=16)
    p.add_argument("--image-size-3d", type=positive(int), default=112)
    p.add_argument("--batch-transformer", type=positive(int), default=64)
    p.add_argument("--steps", type=positive(int), default=5, help="profiled train steps")
    p.add_argument("--warmup", type=int, default=12)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--trace-dir", default=None, help="also write a Chrome trace per contender here")
    args = p.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = device.type == "cuda"
    if gpu:
        torch.backends.cudnn.benchmark = True
    args.batch = args.batch or (128 if gpu else 16)
    amp = torch.bfloat16 if (args.dtype or ("bf16" if gpu else "fp32")) == "bf16" else None
    config = RunConfig(device, amp, gpu if args.channels_last is None else args.channels_last, args.compile)
    suite, batch = _suite(args.suite, args)
    names = args.contenders or [c.name for c in suite.contenders]
    unknown = [n for n in names if n not in {c.name for c in suite.contenders}]
    if unknown:  # before the first contender is built and profiled, not after
        p.error(f"--contenders: no {', '.join(map(repr, unknown))} in the {args.suite} suite; one of "
                + ", ".join(repr(c.name) for c in suite.contenders))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    summary = []
    for name in names:
        prepared = warm_up(prepare(suite, name, batch, replace(config)), args.warmup)
        start = time.perf_counter()
        for _ in range(args.steps):
            prepared.train_step()  # ends with a device synchronize on CUDA
        wall = (time.perf_counter() - start) / args.steps * 1e3
        with profile(activities=activities) as prof:
            for _ in range(args.steps):
                prepared.train_step()
        if args.trace_dir:
            prof.export_chrome_trace(f"{args.trace_dir}/{re.sub(r'[^A-Za-z0-9]+', '_', name)}.json")
        total, calls, cats, top = kernel_table(prof.key_averages(), args.steps, device.type, args.top)
        summary.append((name, wall, total, calls, cats))
        print(f"\n== {name}: {wall:.2f} ms wall, {total:.2f} ms {'kernel' if gpu else 'CPU self'} time, "
              f"{calls:.0f} {'kernel launches' if gpu else 'op calls'} per train step (batch {batch}, {config.label()})")
        print("   " + ", ".join(f"{c} {ms:.2f}" for c, ms in sorted(cats.items(), key=lambda kv: -kv[1])))
        for ms, calls, kname in top:
            print(f"  {ms:8.3f} ms {calls:6.1f}x  [{categorize(kname)}] {kname[:110]}")
        del prepared
        if gpu:
            torch.cuda.empty_cache()
    cats_all = sorted({c for *_, cats in summary for c in cats})
    print("\nper train step: wall ms (unprofiled), summed kernel ms, calls, and ms by category")
    print(f"{'contender':<22}{'wall':>9}{'kernels':>9}{'calls':>7}" + "".join(f"{c:>14}" for c in cats_all))
    for name, wall, total, calls, cats in summary:
        print(f"{name:<22}{wall:9.2f}{total:9.2f}{calls:7.0f}" + "".join(f"{cats.get(c, 0.0):14.2f}" for c in cats_all))
    return 0


if __name__ == "__main__":
    sys.exit(main())
