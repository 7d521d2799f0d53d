"""Host memory: keep what the C allocator frees, so a step does not page-fault its tensors afresh.

glibc's ``malloc`` serves a large block (from 128 KiB, a threshold that rises to at most 32 MiB)
with a fresh ``mmap`` and returns it to the system when it is freed. A CPU forward allocates
and frees the same activation tensors every step, so every step faults their pages in again and
the kernel zeroes them: on 2 cores, a ResNet-50 eval forward (batch 16 at 224 px) of the
no-norm floor took 649.8 ms with glibc's defaults and 394.7 ms with freed memory kept (BN 791.1
and 412.0 ms), a rescale50 train step 1.80 s and 1.22 s (peak RSS 1,866 and 1,934 MB). Measured
back to back in ``docs/speed.md`` ("Host memory on a CPU").

:func:`keep_freed_memory` tells glibc, through ``mallopt``, to serve every block from its heap
(``M_MMAP_MAX`` 0) and to keep up to 2 GiB freed at the heap's top (``M_TRIM_THRESHOLD``): what
``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647`` in the environment does, applied in the
process. The freed memory is reused by the next step, not returned: the process keeps its peak.
The ``rescale`` command and ``make bench`` call it at start (forked data-loader workers inherit
it). ``RESCALE_MALLOC=system`` keeps glibc's defaults; ``MALLOC_*`` variables in the environment
or an allocator in ``LD_PRELOAD`` (jemalloc, tcmalloc) are left to do their own work.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Mapping

__all__ = ["keep_freed_memory", "host_allocator", "ENV"]

ENV = "RESCALE_MALLOC"
# mallopt's parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_TRIM = 2**31 - 1  # the largest value mallopt takes (an int): 2 GiB
_GLIBC_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
                    "GLIBC_TUNABLES")

_applied: str | None = None


def host_allocator() -> str:
    """What :func:`keep_freed_memory` did in this process (one phrase, for reports), or glibc's
    defaults when it was not called."""
    return _applied or "the C library's defaults"


def keep_freed_memory(environ: Mapping[str, str] | None = None) -> str:
    """Keep freed host memory for reuse (the module docstring says why and what it costs); the
    phrase :func:`host_allocator` returns from now on. Idempotent; does nothing but say why where
    the user chose otherwise or the C library is not glibc."""
    global _applied
    env = os.environ if environ is None else environ
    preload = env.get("LD_PRELOAD", "")
    if env.get(ENV, "").strip().lower() == "system":
        _applied = f"the C library's defaults ({ENV}=system)"
    elif any(lib in preload for lib in ("jemalloc", "tcmalloc", "mimalloc")):
        _applied = f"the preloaded allocator (LD_PRELOAD={preload})"
    elif any(name in env for name in _GLIBC_VARIABLES):
        _applied = "glibc as the environment sets it (" + ", ".join(n for n in _GLIBC_VARIABLES if n in env) + ")"
    elif not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        _applied = "the C library's defaults (not glibc)"
    else:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, _TRIM) == 1
        _applied = ("glibc keeps freed memory (M_MMAP_MAX 0, M_TRIM_THRESHOLD 2 GiB)" if ok
                    else "the C library's defaults (mallopt refused)")
    return _applied
