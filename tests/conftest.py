"""Suite-wide test settings."""
from __future__ import annotations

import gc
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# only tests that need a CUDA device may skip; no test reaches the network; real parallel text
# comes with the suite; the longest files start first (see each module)
pytest_plugins = ["skip_policy", "no_network", "parallel_text", "file_order"]

# W&B lists every installed distribution into each run it starts (its requirements file), reading
# the metadata of the whole environment: 0.3 s a run, 22 s of the suite's runs (measured with
# py-spy); no test reads that list. Child processes (the CLI tests, DDP ranks) inherit it.
os.environ.setdefault("WANDB__SAVE_REQUIREMENTS", "false")


# The cyclic garbage collector: a full collection traverses every object the worker holds (torch,
# Lightning, W&B, the suite, the test modules, the parsers and models the tests keep cached: half a
# million objects and more), 0.4-0.5 s a time, 14% of the CPU time of five classification and core test files
# (measured with gc.callbacks). What has lived through collection, or through a test file and its
# fixtures, lives as long as the worker: it is moved out of the collector's generations
# (gc.freeze), and full collections wait for 100 younger ones instead of 10 (Python's default),
# each then finding more garbage at once: 4.7 s of full collections there instead of 12 s, the
# files' CPU time 9% lower, their peak memory 4% higher.
FULL_COLLECTION_EVERY = 100


def pytest_collection_finish(session) -> None:
    gc.collect()
    gc.freeze()
    gen0, gen1, _ = gc.get_threshold()
    gc.set_threshold(gen0, gen1, FULL_COLLECTION_EVERY)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    # after a test file's last test (and its fixtures' teardown)
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        gc.collect()
        gc.freeze()


@pytest.fixture(autouse=True, scope="session")
def _host_memory_as_the_rescale_command_keeps_it():
    """Freed host memory kept for reuse, as every ``rescale`` command does at start
    (``rescale_tasks.common.system.allocator``): the same in every test, whichever runs a command first."""
    from rescale_tasks.common.system import keep_freed_memory
    keep_freed_memory()


@pytest.fixture(autouse=True, scope="session")
def _messages_as_the_rescale_command_writes_them():
    """The suite's log messages written to stdout (warnings to stderr) as the ``rescale`` command
    writes them (``rescale_tasks.common.system.logs``), for tests that call its functions directly
    and read what a user would see; ``caplog`` sees them too."""
    from rescale_tasks.common.system import command_logging
    with command_logging():
        yield


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """One intra-op thread for the whole test session: on a small shared machine two OpenMP
    threads that wait for each other make the tiny test models ~10x slower (measured 1.3 s vs
    14.7 s). Timings are not asserted anywhere; this only keeps the suite short."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class HostSyncCounter(TorchDispatchMode):
    """Counts ``aten::_local_scalar_dense``: the op behind ``item()``, ``bool(t)``, ``int(t)``,
    ``float(t)`` and every Python ``if`` on a tensor: a device-to-host sync on GPU."""

    def __init__(self):
        super().__init__()
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.syncs += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def count_host_syncs():
    """``with count_host_syncs() as probe: ...`` then ``probe.syncs``: host reads inside the block."""
    return HostSyncCounter
