"""``python -m benchmarks.gpu`` (``make bench-gpu``): the GPU measurements in one short run.

Made for a fresh GPU machine that has its own torch and no package registry: it runs with the
Python it is started with (no virtual environment, nothing installed), imports only
``rescale_core`` and ``benchmarks`` from this checkout (torchvision and timm when present: without
them the baseline and floor are the suite's own ``resnet50`` under ``bn`` and ``none``, the same
network, and ``nf_resnet50`` is left out), and fits in about 8 minutes on an H100:

1. ``python -m benchmarks --device cuda`` with the sections ``ops train eval measuring plans
   resnet3d transformer`` (bf16 autocast, channels_last, batch 128; rescale50 on every plan,
   eager and compiled; peak memory; measuring steps; 3D ResNet; Transformer), written into the
   GPU section of ``benchmarks/RESULTS.md`` with the device and commit in its header;
2. the CUDA-only tests (``pytest -m cuda``: the suite's tests that need a GPU and skip without
   one), their summary line printed at the end. The run fails when they could not run (pytest
   missing, a file that does not import), when pytest collected no CUDA test, when every one
   skipped (no CUDA device for pytest) and when one failed: a GPU run that executed no CUDA test
   proves nothing. ``rescale_tasks`` is this checkout's ``tasks/`` folder even where the project
   is not installed; the task tests also need the project's dependencies (lightning,
   jsonargparse, ...) on that machine.

``--device cpu --quick`` runs the benchmarks on the CPU in a minute, to check the command itself
(the CUDA tests need a GPU: :func:`run_cuda_tests` is checked on the CPU by the suite).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

import torch

__all__ = ["CUDA_TESTS", "GPU_SECTIONS", "bench_arguments", "main", "run_cuda_tests"]

GPU_SECTIONS = ["ops", "train", "eval", "measuring", "plans", "resnet3d", "transformer"]

REPO = Path(__file__).resolve().parents[1]

# pytest's exit status when it ran no test (every one deselected by ``-m cuda``)
NO_TESTS_RAN = 5

# every test file holding tests marked ``cuda`` (tests/benchmarks/test_bench_gpu.py keeps the list whole)
CUDA_TESTS = ["tests/core/test_core_plans.py", "tests/core/test_core_layers.py",
              "tests/tasks/common/test_sampling.py", "tests/tasks/common/test_divergence_monitor.py"]


def bench_arguments(device: str, quick: bool, markdown: str | None) -> list[str]:
    args = ["--device", device, "--only", *GPU_SECTIONS]
    if quick:
        args += ["--quick", "--compile"]
    elif device == "cuda":
        args += ["--repeats", "8", "--warmup", "12"]  # paired medians of 8: the 8-minute budget
    if markdown:
        args += ["--markdown", markdown]
    return args


def _importable_tasks(folder: str) -> dict[str, str]:
    """The environment for pytest, with ``rescale_tasks`` importable as this checkout's ``tasks/``
    (a link in ``folder``) where the project is not installed."""
    env = dict(os.environ)
    if importlib.util.find_spec("rescale_tasks") is None:
        os.symlink(REPO / "tasks", Path(folder) / "rescale_tasks")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, env.get("PYTHONPATH")) if p)
    return env


def run_cuda_tests(files: Sequence[str] = CUDA_TESTS, python: Sequence[str] = (sys.executable,)) -> tuple[int, str]:
    """``pytest -m cuda`` over ``files`` (paths relative to the repository) with ``python``, under the
    project's pytest settings: ``(0, pytest's summary)`` when at least one CUDA test ran and none
    failed, else ``(1, what went wrong)``: pytest missing or stopped, no CUDA test collected,
    every one skipped, or one failed."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "cuda-tests.xml"
        done = subprocess.run([*python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml"),
                               "--rootdir", str(REPO), "-m", "cuda", f"--junit-xml={report}", *files],
                              cwd=REPO, env=_importable_tasks(tmp), text=True, capture_output=True)
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        last = lines[-1].strip("= ") if lines else "no output"
        first_error = next((line[1:].strip() for line in lines if line.startswith("E ")), None)
        if "No module named pytest" in done.stderr:
            return 1, f"failed: pytest is not installed for {python[0]}: install it (the CUDA tests must run)"
        if not report.is_file():
            return 1, f"failed: pytest stopped before running any test (exit {done.returncode}): {last}"
        counts = {key: sum(int(suite.get(key, 0)) for suite in ET.parse(report).getroot().iter("testsuite"))
                  for key in ("tests", "skipped", "failures", "errors")}
    if counts["failures"] or counts["errors"] or done.returncode not in (0, NO_TESTS_RAN):
        return 1, f"failed (exit {done.returncode}): {last}" + (f"; first error: {first_error}" if first_error else "")
    if counts["tests"] == 0:
        return 1, f"failed: pytest collected no CUDA test in {', '.join(files)}"
    if counts["skipped"] == counts["tests"]:
        return 1, (f"failed: all {counts['tests']} CUDA tests skipped ({last}): does the torch of {python[0]} "
                   "see a CUDA device?")
    return 0, last


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
    # the harness's command line imports every section's module: only once a GPU is known to be there
    from . import __main__ as bench

    status = bench.main(bench_arguments(args.device, args.quick, args.markdown or None))
    if args.no_tests or args.device != "cuda":
        return status
    tests_status, line = run_cuda_tests()
    print("CUDA-only tests:", line)
    return status or tests_status


if __name__ == "__main__":
    sys.exit(main())
