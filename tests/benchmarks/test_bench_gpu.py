"""``make bench-gpu``'s CUDA test step (benchmarks/gpu.py), checked on the CPU on small generated
test files: it succeeds only when a CUDA test ran and none failed, and fails when pytest is
missing, collects no CUDA test, or every CUDA test skipped; its file list holds every test file
with a ``cuda`` test."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from benchmarks.gpu import CUDA_TESTS, REPO, run_cuda_tests

RUNS = "import pytest\n\n@pytest.mark.cuda\ndef test_on_gpu():\n    assert 1 + 1 == 2\n"
SKIPS = ("import pytest\n\n@pytest.mark.cuda\n@pytest.mark.skipif(True, reason='needs a CUDA device')\n"
         "def test_on_gpu():\n    pass\n")
NO_CUDA_TEST = "def test_on_cpu():\n    pass\n"


def write(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "test_generated.py"
    path.write_text(text)
    return [str(path)]


def test_a_cuda_test_that_ran_and_passed_succeeds(tmp_path):
    status, line = run_cuda_tests(write(tmp_path, RUNS))
    assert status == 0 and "1 passed" in line


def test_every_cuda_test_skipped_fails(tmp_path):
    status, line = run_cuda_tests(write(tmp_path, SKIPS))
    assert status == 1 and line.startswith("failed: all 1 CUDA tests skipped")


def test_no_cuda_test_collected_fails(tmp_path):
    status, line = run_cuda_tests(write(tmp_path, NO_CUDA_TEST))
    assert status == 1 and line.startswith("failed: pytest collected no CUDA test")


def test_pytest_missing_fails(tmp_path):
    # -S: this interpreter without its site-packages, where pytest lives
    status, line = run_cuda_tests(write(tmp_path, RUNS), python=(sys.executable, "-S"))
    assert status == 1 and line.startswith("failed: pytest is not installed")


def test_the_list_holds_every_file_with_a_cuda_test():
    marked = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
                    if re.search(r"^\s*@pytest\.mark\.cuda\b|pytestmark\s*=.*mark\.cuda", p.read_text(), re.M))
    assert sorted(CUDA_TESTS) == marked
