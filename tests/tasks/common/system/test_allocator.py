"""``rescale_tasks.common.system.allocator``: glibc keeps freed host memory in its heap for the next
step; ``RESCALE_MALLOC=system``, the ``MALLOC_*`` variables and a
preloaded allocator are left alone; the ``rescale`` command and the benchmark report say which."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rescale_tasks.common.system import allocator

# In a fresh process: glibc's own account (mallinfo2) while a 64 MiB tensor lives and after it
# is freed, twice: bytes in mmapped blocks (returned to the system when freed, and faulted in
# afresh by the next allocation) and bytes freed but kept in the heap for the next one.
_PROBE = """
import ctypes, json, sys, torch
from rescale_tasks.common.system.allocator import keep_freed_memory
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
said = keep_freed_memory() if sys.argv[1] == "call" else None
rounds = []
for _ in range(2):
    t = torch.empty(16 * 2**20).fill_(1.0)
    live = libc.mallinfo2()
    del t
    freed = libc.mallinfo2()
    rounds.append({"mmapped while live": live.hblkhd, "kept after free": freed.fordblks})
print(json.dumps({"said": said, "rounds": rounds}))
"""
MIB64 = 64 * 2**20


def _probe(call: bool, **env) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "RESCALE_MALLOC"))}
    out = subprocess.run([sys.executable, "-c", _PROBE, "call" if call else "no"], env={**environ, **env},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out.splitlines()[-1])


def _returned_to_the_system(probe: dict) -> bool:
    return all(r["mmapped while live"] >= MIB64 and r["kept after free"] < MIB64 for r in probe["rounds"])


def test_freed_memory_is_kept_in_the_heap_for_the_next_step():
    """glibc's defaults map a 64 MiB block afresh and unmap it when freed (each step's tensors then
    fault their pages in again); kept, it comes from the heap and stays there when freed."""
    kept, default = _probe(True), _probe(False)
    assert kept["said"].startswith("glibc keeps freed memory")
    assert _returned_to_the_system(default), default
    for r in kept["rounds"]:
        assert r["mmapped while live"] < MIB64 and r["kept after free"] >= MIB64, kept


def test_the_user_s_choice_is_left_alone():
    system = _probe(True, RESCALE_MALLOC="system")
    assert system["said"] == "the C library's defaults (RESCALE_MALLOC=system)"
    assert _returned_to_the_system(system), system
    assert allocator.keep_freed_memory({"MALLOC_ARENA_MAX": "2", "MALLOC_TRIM_THRESHOLD_": "0"}) == (
        "glibc as the environment sets it (MALLOC_TRIM_THRESHOLD_)")
    assert allocator.keep_freed_memory({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}) == (
        "the preloaded allocator (LD_PRELOAD=/usr/lib/libjemalloc.so.2)")
    assert allocator.host_allocator() == "the preloaded allocator (LD_PRELOAD=/usr/lib/libjemalloc.so.2)"
    assert allocator.keep_freed_memory({}).startswith("glibc keeps freed memory")


@pytest.mark.parametrize("flag, phrase", [([], "glibc keeps freed memory"),
                                          (["--host-malloc", "system"], "the C library's defaults")])
def test_the_benchmark_report_names_the_host_allocator(flag, phrase, monkeypatch):
    from benchmarks import __main__ as bench, report
    monkeypatch.delenv("RESCALE_MALLOC", raising=False)
    args = bench.parse_args(["--quick", "--device", "cpu", *flag])
    allocator.keep_freed_memory(dict(os.environ, **({allocator.ENV: "system"} if flag else {})))
    rows = dict(report.environment(bench.build_settings(args), ["--quick", *flag]))
    assert rows["host memory"].startswith(phrase)
    allocator.keep_freed_memory({})  # what the suite runs with (tests/conftest.py)
