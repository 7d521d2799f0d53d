"""``python -m benchmarks.gpu`` (``make bench-gpu``): the GPU measurements in one short run.

Made for a fresh GPU machine that has its own torch and no package registry: it runs with the
Python it is started with (no virtual environment, nothing installed), imports only
``rescale_core`` and ``benchmarks`` from this checkout (torchvision and timm when present: without
them the baseline and floor are the suite's own ``resnet50`` under ``bn`` and ``none``, the same
network, and ``nf_resnet50`` is left out), and fits in about 8 minutes on an H100:

1. ``python -m benchmarks --device cuda`` with the sections ``ops train eval measuring compile
   resnet3d transformer`` (bf16 autocast, channels_last, batch 128; rescale50 on both plans,
   eager and compiled; peak memory; measuring steps; 3D ResNet; Transformer), written into the
   GPU section of ``benchmarks/RESULTS.md`` with the device and commit in its header;
2. the CUDA-only tests (``pytest -m cuda`` where pytest is installed; the suite's own tests that
   skip without CUDA), their summary line printed at the end.

``--device cpu --quick`` runs the same on the CPU in a minute, to check the command itself.
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys

import torch

__all__ = ["GPU_SECTIONS", "bench_arguments", "main"]

GPU_SECTIONS = ["ops", "train", "eval", "measuring", "compile", "resnet3d", "transformer"]

# the tests that run only on CUDA (each skips without it); the core ones need no installed project
CUDA_TESTS = ["tests/core/test_core_plans.py", "tests/core/test_core_layers.py"]


def bench_arguments(device: str, quick: bool, markdown: str | None) -> list[str]:
    args = ["--device", device, "--only", *GPU_SECTIONS]
    if quick:
        args += ["--quick", "--compile"]
    elif device == "cuda":
        args += ["--repeats", "8", "--warmup", "12"]  # paired medians of 8: the 8-minute budget
    if markdown:
        args += ["--markdown", markdown]
    return args


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a check of the command)")
    p.add_argument("--markdown", default="benchmarks/RESULTS.md",
                   help="results file ('' to print only)")
    p.add_argument("--no-tests", action="store_true", help="skip the CUDA-only tests")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device is visible to this torch "
              f"({torch.__version__}); run it on the GPU machine, or --device cpu --quick to check the command",
              file=sys.stderr)
        return 2
    from . import __main__ as bench

    status = bench.main(bench_arguments(args.device, args.quick, args.markdown or None))
    if args.no_tests or args.device != "cuda":
        return status
    if importlib.util.find_spec("pytest") is None:
        print("CUDA-only tests: pytest is not installed here; skipped")
        return status
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda",
                           *CUDA_TESTS], text=True, capture_output=True)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    print("CUDA-only tests:", lines[-1] if lines else done.stderr[-500:])
    return status or (done.returncode if done.returncode not in (0, 5) else 0)


if __name__ == "__main__":
    sys.exit(main())
