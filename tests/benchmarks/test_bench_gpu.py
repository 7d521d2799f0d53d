"""``make bench-gpu``'s test step (benchmarks/gpu.py), checked on the CPU on small generated test
files: it succeeds only when a CUDA test ran and none failed (the ``compile_check`` tests alone do
not count), and fails when pytest is missing, collects no CUDA test, or every CUDA test skipped;
its file list holds every test file it must run; ``make gpu-wheels`` asks for pyproject's versions."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from benchmarks.gpu import CUDA_TESTS, REPO, run_device_tests

RUNS = "import pytest\n\n@pytest.mark.cuda\ndef test_on_gpu():\n    assert 1 + 1 == 2\n"
SKIPS = ("import pytest\n\n@pytest.mark.cuda\n@pytest.mark.skipif(True, reason='needs a CUDA device')\n"
         "def test_on_gpu():\n    pass\n")
NO_CUDA_TEST = "def test_on_cpu():\n    pass\n"


def write(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "test_generated.py"
    path.write_text(text)
    return [str(path)]


def test_a_cuda_test_that_ran_and_passed_succeeds(tmp_path):
    status, line = run_device_tests(write(tmp_path, RUNS))
    assert status == 0 and "1 passed" in line


def test_every_cuda_test_skipped_fails(tmp_path):
    status, line = run_device_tests(write(tmp_path, SKIPS))
    assert status == 1 and line.startswith("failed: all 1 CUDA tests skipped")


def test_no_cuda_test_collected_fails(tmp_path):
    status, line = run_device_tests(write(tmp_path, NO_CUDA_TEST))
    assert status == 1 and line.startswith("failed: pytest collected no CUDA test")


def test_the_version_checks_alone_do_not_count_as_a_gpu_run(tmp_path):
    """A ``compile_check`` test that ran beside CUDA tests that all skipped: still no GPU run."""
    text = SKIPS + "\n\n@pytest.mark.compile_check\ndef test_on_any_torch():\n    pass\n"
    status, line = run_device_tests(write(tmp_path, text))
    assert status == 1 and line.startswith("failed: all 1 CUDA tests skipped")
    status, line = run_device_tests(write(tmp_path, RUNS + "\n\n@pytest.mark.compile_check\ndef test_on_any_torch():\n"
                                                      "    pass\n"))
    assert status == 0 and "2 passed" in line


def test_a_failed_version_check_fails(tmp_path):
    text = RUNS + "\n\n@pytest.mark.compile_check\ndef test_on_any_torch():\n    assert 1 + 1 == 3\n"
    status, line = run_device_tests(write(tmp_path, text))
    assert status == 1 and line.startswith("failed (exit 1)") and "1 failed" in line


def test_pytest_missing_fails(tmp_path):
    # -S: this interpreter without its site-packages, where pytest lives
    status, line = run_device_tests(write(tmp_path, RUNS), python=(sys.executable, "-S"))
    assert status == 1 and line.startswith("failed: pytest is not installed")


def test_the_list_holds_every_file_with_a_cuda_test():
    selected = r"^\s*@pytest\.mark\.(cuda|compile_check)\b|pytestmark\s*=.*mark\.(cuda|compile_check)|\bfit_at_precision\b"
    marked = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
                    if re.search(selected, p.read_text(), re.M))
    assert sorted(CUDA_TESTS) == marked


def test_the_gpu_wheels_have_the_projects_specifiers():
    """``make gpu-wheels`` asks for each dependency it brings at the specifier pyproject.toml gives
    it, and brings only what ``benchmarks.gpu`` checks for."""
    import shlex
    import tomllib

    from benchmarks.gpu import NEEDED

    make = (REPO / "Makefile").read_text().replace("\\\n", " ")
    wheels = shlex.split(re.search(r"^GPU_WHEELS \?=(.*)$", make, re.M).group(1))
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    for wheel in wheels:
        name = re.match(r"[A-Za-z0-9_.-]+", wheel).group(0)
        assert name in NEEDED.values(), name
        if name != wheel:  # with a specifier: pyproject's, written the same
            assert any(d.replace("[signatures]", "") == wheel for d in declared), wheel


def test_without_the_project_installed_the_tests_import_this_checkouts_tasks(tmp_path, monkeypatch):
    """A GPU machine's Python has no ``rescale_tasks``: the environment made for the tests' process
    imports it from this checkout's ``tasks/`` (before site-packages)."""
    import importlib.util
    import subprocess

    from benchmarks import gpu

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "rescale_tasks" else find_spec(name, *args))
    monkeypatch.setattr(sys, "path", list(sys.path))
    env = gpu._importable_tasks(str(tmp_path))
    done = subprocess.run([sys.executable, "-c", "import rescale_tasks.cli, skip_policy; print(rescale_tasks.__file__)"],
                          env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "rescale_tasks" / "__init__.py")


def test_a_check_of_the_command_writes_its_own_results_section():
    """``python -m benchmarks.gpu --device cpu --quick`` (and ``--quick`` on a GPU) checks the
    command: its smoke figures go into a section of their own, never over the full CPU run's
    section or the GPU run's; the full GPU run writes the GPU section."""
    import torch

    from benchmarks import __main__ as harness, report
    from benchmarks.gpu import bench_arguments
    from benchmarks.toolkit import Settings

    def tag(device: str, quick: bool) -> str:
        args = harness.parse_args(bench_arguments(device, quick, "RESULTS.md", 60))
        assert args.only == ["train", "eval", "plans", "measuring", "resnet3d", "transformer", "inference", "ops"]
        settings = Settings(device=torch.device(device), amp_dtype=torch.bfloat16 if device == "cuda" else None,
                            channels_last=False, batch=2, image_size=8, warmup=2, eval_warmup=1, repeats={},
                            min_run_time=0.001)
        return report.results_tag(settings, args.markdown_tag)

    assert tag("cpu", True) == "check" and tag("cpu", False) == "check"
    assert tag("cuda", True) == "cuda-bf16-check"
    assert tag("cuda", False) == "cuda-bf16"


@pytest.mark.parametrize("problem", ["no folder", "a lost end marker"])
def test_a_results_file_it_cannot_write_is_refused_before_the_device_tests(tmp_path, monkeypatch, capsys, problem):
    """``make bench-gpu`` with a ``--markdown`` path in no folder, or a file whose GPU section lost
    its end marker, is one error line before the device tests (minutes of a lease), not after
    them. (No GPU here: torch is told it has one, which the refusal comes before needing.)"""
    import torch

    from benchmarks import gpu, report

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)
    monkeypatch.setattr(sys, "path", list(sys.path))
    path = tmp_path / "nowhere" / "RESULTS.md"
    if problem == "a lost end marker":
        path = tmp_path / "RESULTS.md"
        path.write_text(f"# R\n\n{report.markers('cuda-bf16')[0]}\nold GPU figures\n")
    text = path.read_text() if path.exists() else None
    with pytest.raises(SystemExit) as exit_:
        gpu.main(["--markdown", str(path)])
    out = capsys.readouterr()
    message = str(exit_.value) if exit_.value.code not in (0, 1, 2) else out.err.strip().splitlines()[-1]
    assert message.startswith(f"python -m benchmarks: error: --markdown {path}: "), message
    assert "device tests" not in out.out
    assert (path.read_text() if path.exists() else None) == text
