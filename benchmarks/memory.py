"""Peak training memory of one train step: tensor bytes, the same quantity on CPU and GPU.

What is measured: the most bytes held by live tensors at any moment of one training step
(forward, backward, optimizer update), counting the contender's resting state (parameters,
buffers, optimizer state, the input batch) plus everything the step allocates (activations
saved for backward, gradients, temporaries). The step starts with ``grad = None`` (the harness
zeroes gradients with ``set_to_none=True``), as in the timed steps.

- GPU: :func:`torch.cuda.max_memory_allocated` after :func:`torch.cuda.reset_peak_memory_stats`;
  the rise above the memory allocated before the step is the step's peak, and the contender's
  own resting bytes are added (other contenders' models live on the same device while the
  harness interleaves them, so the absolute figure would count them too).
- CPU: PyTorch's profiler with ``profile_memory=True`` records every allocation and free of the
  CPU allocator (``[memory]`` events with signed byte counts, the CPU counterpart of the CUDA
  allocator statistics). Summed in time order they give the live-tensor bytes added by the
  step; their maximum plus the resting bytes is the peak. This is the CPU analogue of
  ``max_memory_allocated``: it is exact for tensors, deterministic, in-process and needs one
  step. The alternative, a fresh subprocess per contender and ``resource.getrusage`` ``ru_maxrss``
  minus a baseline, was rejected: RSS also counts the interpreter, libraries, glibc's retained
  free lists and oneDNN's private buffers, so differences of tens of MB between contenders
  would drown in allocator noise, and every contender would pay a fresh import and warm-up.
  Caveat: memory that libraries allocate outside PyTorch's allocator (oneDNN scratch pads) is
  not counted here, just as on GPU. The profiler cannot see frees of blocks allocated before
  it started; starting the step with ``grad = None`` avoids those, and ``unaccounted`` (end
  balance minus the gradients the step leaves behind) checks that nothing else was freed.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["MemoryResult", "tensor_bytes", "resting_bytes", "peak_step_memory"]

_CPU_LIKE = {"CPU", "MKLDNN", "IDEEP"}


@dataclass(frozen=True)
class MemoryResult:
    peak: int          # bytes: resting + step_peak
    resting: int       # parameters, buffers, optimizer state, inputs
    step_peak: int     # most bytes the step added at any moment
    unaccounted: int   # CPU only: end balance - gradients left behind (0 when every free was seen)


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (shared or tied tensors count once)."""
    seen: dict[tuple, int] = {}
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor) or t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        seen[(t.device.type, storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def _optimizer_tensors(optimizer: torch.optim.Optimizer | None):
    if optimizer is None:
        return
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def resting_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                  batch: Iterable[torch.Tensor] = ()) -> int:
    tensors = [*model.parameters(), *model.buffers(), *_optimizer_tensors(optimizer), *batch]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    return tensor_bytes(tensors)


@contextlib.contextmanager
def _quiet_stderr():
    """Kineto prints start/stop lines to file descriptor 2; hide them during the probe."""
    try:
        fd = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(fd, 2)
        os.close(fd)


def _cpu_step_peak(step: Callable[[], object]) -> tuple[int, int]:
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and str(e.device_type()).rsplit(".", 1)[-1] in _CPU_LIKE]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak, live


def peak_step_memory(step: Callable[[], object], model: nn.Module,
                     optimizer: torch.optim.Optimizer | None,
                     batch: Iterable[torch.Tensor] = (), device: torch.device | str = "cpu") -> MemoryResult:
    """Peak tensor bytes of one call of ``step`` (a train step after warm-up), see module doc."""
    device = torch.device(device)
    batch = list(batch)
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)
    resting = resting_bytes(model, optimizer, batch)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        step_peak = torch.cuda.max_memory_allocated(device) - before
        return MemoryResult(resting + step_peak, resting, step_peak, 0)
    step_peak, end = _cpu_step_peak(step)
    grads = tensor_bytes(p.grad for p in model.parameters() if p.grad is not None)
    return MemoryResult(resting + step_peak, resting, step_peak, end - grads)
