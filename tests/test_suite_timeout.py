"""The suite's test timeout (pyproject.toml, pytest-timeout): a test stuck where a multi-process
test gets stuck, inside a C call waiting for a rank that never comes, fails the run instead of
hanging it. Run as pytest runs the suite, with the project's settings and a short timeout."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WAITS_FOR_A_MISSING_RANK = '''
from datetime import timedelta

import torch.distributed as dist


def test_waits_for_rank_1():
    # rank 0 of 2 holds the store and waits (in C++, for up to an hour) for rank 1 to join
    dist.TCPStore("127.0.0.1", 0, world_size=2, is_master=True, timeout=timedelta(hours=1),
                  wait_for_workers=True)
'''


def test_the_suite_has_a_timeout(pytestconfig):
    assert float(pytestconfig.getini("timeout")) > 0


def test_a_test_blocked_in_a_process_group_wait_fails_the_run(tmp_path):
    """The project's timeout method, with a 1 s timeout: the run ends, failed, naming the test (a
    signal would wait for the C call to return: an hour)."""
    (tmp_path / "test_hangs.py").write_text(WAITS_FOR_A_MISSING_RANK)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-c", str(REPO / "pyproject.toml"), "-o", "timeout=1", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "+ Timeout +" in out and "in test_waits_for_rank_1" in out, out[-2000:]
