"""The suite's skip policy (tests/skip_policy.py), run as pytest runs it: a fresh pytest process
on small generated test files: a skip of a test without the ``cuda`` mark (at run time, from a
``skipif`` or at collection) fails the run with one line naming it; a ``cuda`` test may skip."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

PASSES = "def test_passes():\n    assert True\n"
CUDA_SKIP = ("import pytest\n\n@pytest.mark.cuda\n"
             "@pytest.mark.skipif(True, reason='needs a CUDA device')\ndef test_on_gpu():\n    pass\n")


def run_pytest(folder: Path, files: dict[str, str]) -> subprocess.CompletedProcess:
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    cuda: needs a CUDA device\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "skip_policy",
                           "--strict-markers", str(folder)], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=60)


def policy_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if "skipped without the 'cuda' mark" in line]


def test_a_cuda_test_may_skip(tmp_path):
    done = run_pytest(tmp_path, {"test_a.py": PASSES + "\n" + CUDA_SKIP})
    assert done.returncode == 0, done.stdout
    assert "1 passed, 1 skipped" in done.stdout and policy_lines(done) == []


def test_any_other_skip_fails_the_run_in_one_line(tmp_path):
    done = run_pytest(tmp_path, {
        "test_a.py": PASSES + "\n" + CUDA_SKIP,
        "test_b.py": "import pytest\n\ndef test_data():\n    pytest.skip('no sample data here')\n\n"
                     "@pytest.mark.skipif(True, reason='needs fork')\ndef test_fork():\n    pass\n",
        "test_c.py": "import pytest\n\npytest.importorskip('a_module_that_is_not_installed')\n\n"
                     "def test_never():\n    pass\n",
    })
    assert done.returncode == 1, done.stdout
    (line,) = policy_lines(done)
    assert line.startswith("error: 3 test(s) skipped")
    assert "test_b.py::test_data (no sample data here)" in line and "test_b.py::test_fork (needs fork)" in line
    assert "test_c.py (could not import 'a_module_that_is_not_installed'" in line and "test_on_gpu" not in line


def test_a_run_of_only_non_cuda_skips_fails(tmp_path):
    done = run_pytest(tmp_path, {"test_a.py": "import pytest\n\npytestmark = pytest.mark.skip('later')\n\n"
                                              "def test_one():\n    pass\n"})
    assert done.returncode == 1 and "1 skipped" in done.stdout and len(policy_lines(done)) == 1
