"""``python -m benchmarks.gpu`` (``make bench-gpu``): the GPU checks and measurements in one short run.

Made for a GPU machine lent for a few minutes, with its own Python and torch and no package
registry: it runs with the Python it is started with (no virtual environment), imports this
checkout's ``rescale_core``, ``benchmarks`` and ``tasks/`` (as ``rescale_tasks``, where the project
is not installed), and needs the project's other dependencies on that machine: a package missing
there is named in one line before anything runs (``make gpu-wheels`` downloads them, on a machine
with a registry, for one without; docs/speed.md, "On a GPU machine"), and so is a ``--markdown``
file that step 2 could not write (no such folder, its section's markers broken). In order:

1. the tests that depend on the device or on torch's version (``pytest -m "cuda or
   compile_check"``, over :data:`CUDA_TESTS`; in parallel where pytest-xdist is installed): the
   CUDA-only tests, ``rescale fit`` of every task under bf16 and fp16 (gradient scaling)
   autocast, eager and compiled, and compiled training against eager on the machine's torch.
   They fail the run when they could not run (pytest missing, a file that does not import),
   when no CUDA test was collected, when every one skipped (no CUDA device for pytest) and when
   one failed: a GPU run that executed no CUDA test proves nothing;
2. ``python -m benchmarks --device cuda`` over :data:`GPU_SECTIONS` (bf16 autocast,
   channels_last, batch 128), most wanted first, starting no section once ``--budget`` seconds
   have passed since the start (those left are reported as not run), written into the GPU
   section of ``benchmarks/RESULTS.md`` with the device, torch and commit in its header.

``--device cpu --quick`` runs step 2 on the CPU in a few minutes, to check the command itself (the
CUDA tests need a GPU: :func:`run_device_tests` is checked on the CPU by the suite); such a check
(any CPU or ``--quick`` run) writes its smoke figures into a results section of its own, ``check``
(``cuda-bf16-check`` on a GPU), and leaves the CPU and GPU runs' figures as they are.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

import torch

__all__ = ["CHECK_TAG", "CUDA_TESTS", "GPU_SECTIONS", "NEEDED", "bench_arguments", "main", "missing_packages",
           "run_device_tests"]

#: the sections, most wanted first: the deadline may leave the last ones out
GPU_SECTIONS = ["train", "eval", "plans", "measuring", "resnet3d", "transformer", "inference", "ops"]

REPO = Path(__file__).resolve().parents[1]

# pytest's exit status when it ran no test (every one deselected by ``-m``)
NO_TESTS_RAN = 5

#: the tests this run selects: those that need a CUDA device, and those whose outcome depends on
#: torch's version (the machine's own torch is not the one the suite pins)
TEST_MARKS = "cuda or compile_check"

# every test file holding tests marked ``cuda`` or ``compile_check``, or asking for
# ``fit_at_precision`` (tests/benchmarks/test_bench_gpu.py keeps the list whole)
CUDA_TESTS = ["tests/core/test_core_plans.py", "tests/core/test_core_layers.py",
              "tests/tasks/common/data/test_sampling.py",
              "tests/tasks/common/training/test_divergence_monitor.py",
              "tests/tasks/classification/test_classification_acceleration.py",
              "tests/tasks/detection/test_detection_cli.py", "tests/tasks/video/test_video_cli.py",
              "tests/tasks/translation/test_translation_module.py"]

#: module -> the distribution that brings it: what the tests and sections import beyond torch
NEEDED = {"pytest": "pytest", "pytest_timeout": "pytest-timeout", "lightning": "lightning",
          "torchmetrics": "torchmetrics", "jsonargparse": "jsonargparse", "docstring_parser": "docstring-parser",
          "typeshed_client": "typeshed-client", "torchvision": "torchvision", "yaml": "pyyaml",
          "sklearn": "scikit-learn", "PIL": "pillow", "matplotlib": "matplotlib", "av": "av",
          "pycocotools": "pycocotools", "sentencepiece": "sentencepiece", "sacrebleu": "sacrebleu",
          "skvideo": "scikit-video"}


def missing_packages(needed: dict[str, str] = NEEDED) -> list[str]:
    """The distributions of ``needed`` whose module this Python cannot find."""
    return [dist for module, dist in needed.items() if importlib.util.find_spec(module) is None]


#: the results section a check of the command writes (a CPU run, or ``--quick``): ``check`` on the CPU,
#: ``cuda-bf16-check`` on a GPU, never the device's own section with the full runs' figures
CHECK_TAG = "check"


def bench_arguments(device: str, quick: bool, markdown: str | None, deadline: float | None = None) -> list[str]:
    """The harness's command line: the GPU sections in order; a check of the command (``--device
    cpu`` or ``--quick``) writes its smoke figures into a results section of its own
    (:data:`CHECK_TAG`)."""
    args = ["--device", device, "--only", *GPU_SECTIONS]
    if quick:
        args += ["--quick", "--compile"]
    elif device == "cuda":
        args += ["--repeats", "8", "--warmup", "12"]  # paired medians of 8: the lease's budget
    if deadline is not None:
        args += ["--deadline", f"{max(deadline, 0.0):.0f}"]
    if markdown:
        args += ["--markdown", markdown]
        if quick or device != "cuda":
            args += ["--markdown-tag", CHECK_TAG]
    return args


def _importable_tasks(folder: str) -> dict[str, str]:
    """The environment of a child Python that imports this checkout (``rescale_core``,
    ``benchmarks``) and, where the project is not installed, ``rescale_tasks`` as its ``tasks/``
    folder (a link in ``folder``); this process can import them too from then on."""
    env = dict(os.environ)
    paths = [str(REPO), str(REPO / "tests")]  # tests/: the suite's pytest plugins (skip_policy)
    if importlib.util.find_spec("rescale_tasks") is None:
        os.symlink(REPO / "tasks", Path(folder) / "rescale_tasks")
        paths.insert(0, folder)
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*paths, env.get("PYTHONPATH")) if p)
    return env


def _parallel_workers() -> list[str]:
    """pytest-xdist's ``-n`` where it is installed (the compiled fits are bound by one core each)."""
    from rescale_tasks.common.system import usable_cores  # importable once _importable_tasks ran

    if importlib.util.find_spec("xdist") is None:
        return []
    cores = usable_cores()
    return ["-n", str(max(1, min(8, cores // 2)))] if cores >= 4 else []


def run_device_tests(files: Sequence[str] = CUDA_TESTS, python: Sequence[str] = (sys.executable,),
                     marks: str = TEST_MARKS, workers: Sequence[str] = (),
                     env: dict[str, str] | None = None) -> tuple[int, str]:
    """``pytest -m marks`` over ``files`` (paths relative to the repository) with ``python``, under
    the project's pytest settings and ``env`` (None: :func:`_importable_tasks`'s, made here):
    ``(0, pytest's summary)`` when at least one ``cuda`` test ran and none failed, else ``(1, what
    went wrong)``: pytest missing or stopped, no CUDA test collected, every CUDA test skipped, or
    one failed."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "device-tests.xml"
        done = subprocess.run([*python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml"),
                               "--rootdir", str(REPO), "-p", "skip_policy", "-m", marks, f"--junit-xml={report}",
                               *workers, *files],
                              cwd=REPO, env=env or _importable_tasks(tmp), text=True, capture_output=True)
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        last = lines[-1].strip("= ") if lines else "no output"
        first_error = next((line[1:].strip() for line in lines if line.startswith("E ")), None)
        if "No module named pytest" in done.stderr:
            return 1, f"failed: pytest is not installed for {python[0]}: install it (the CUDA tests must run)"
        if not report.is_file():
            return 1, f"failed: pytest stopped before running any test (exit {done.returncode}): {last}"
        cases = list(ET.parse(report).getroot().iter("testcase"))
    failed = sum(1 for case in cases if case.find("failure") is not None or case.find("error") is not None)
    on_gpu = [case for case in cases if _needs_cuda(case)]
    skipped = sum(1 for case in on_gpu if case.find("skipped") is not None)
    if failed or done.returncode not in (0, NO_TESTS_RAN):
        return 1, f"failed (exit {done.returncode}): {last}" + (f"; first error: {first_error}" if first_error else "")
    if not on_gpu:
        return 1, f"failed: pytest collected no CUDA test in {', '.join(files)}"
    if skipped == len(on_gpu):
        return 1, (f"failed: all {len(on_gpu)} CUDA tests skipped ({last}): does the torch of {python[0]} "
                   "see a CUDA device?")
    return 0, last


def _needs_cuda(case: ET.Element) -> bool:
    """A test marked ``cuda``, by the property the suite's skip policy gives it in the report."""
    return any(prop.get("name") == "needs" and prop.get("value") == "cuda" for prop in case.iter("property"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a check of the command)")
    p.add_argument("--markdown", default="benchmarks/RESULTS.md",
                   help="results file ('' to print only); a check (--device cpu, --quick) writes its own "
                        f"section there, {CHECK_TAG!r}, never the CPU or GPU figures")
    p.add_argument("--budget", type=float, default=420.0, metavar="SECONDS",
                   help="start no benchmark section after this many seconds from the start (default 420: "
                        "with the section in flight, the run ends within about 8 minutes)")
    p.add_argument("--no-tests", action="store_true", help="leave out the tests (step 1)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device is visible to this torch "
              f"({torch.__version__}); run it on the GPU machine, or --device cpu --quick to check the command",
              file=sys.stderr)
        return 2
    missing = missing_packages()
    if missing:
        print(f"error: {sys.executable} lacks {', '.join(missing)}: install them, or where the machine has no "
              "package registry bring them as wheels (`make gpu-wheels` on a machine with one; docs/speed.md, "
              "'On a GPU machine')", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        # the harness imports rescale_tasks too; from here on this process finds it, so the tests'
        # process is given this environment rather than one made again (which would leave it out)
        env = _importable_tasks(tmp)
        # the harness's command line imports every section's module: only once a GPU is known to be there
        from . import __main__ as bench

        # its options and its --markdown file (writable, its section's markers whole): one error
        # line now, not after the device tests
        bench.checked_run(bench_arguments(args.device, args.quick, args.markdown or None, args.budget))
        tests_status, tests = 0, "not run"
        if not args.no_tests and args.device == "cuda":
            tests_status, line = run_device_tests(workers=_parallel_workers(), env=env)
            tests = "FAILED" if tests_status else "passed"
            print(f"device tests ({time.perf_counter() - start:.0f} s): {line}", flush=True)
        left = args.budget - (time.perf_counter() - start)
        status = bench.main(bench_arguments(args.device, args.quick, args.markdown or None, left))
    print(f"make bench-gpu: {time.perf_counter() - start:.0f} s in all; device tests {tests}; benchmarks "
          f"{'complete' if not status else 'INCOMPLETE'}", flush=True)
    return status or tests_status


if __name__ == "__main__":
    sys.exit(main())
