"""Turning a contender into the callables that get timed: a train step and an eval forward.

Every contender gets the same treatment: the suite's loss, gradients zeroed with
``set_to_none=True``, SGD with momentum 0.9 and weight decay 1e-4 (the ImageNet recipe; the
optimizer is part of a train step; a suite may name its own, e.g. the translation task's Adam)
at learning rate 0, an optional ``torch.autocast`` dtype (bf16
on GPU), an optional channels_last memory format (model and input) and an optional
``torch.compile``. Learning rate 0: the update is computed in full (weight decay, momentum
buffer, the parameter update) but leaves the weights at their initial values, so the
no-normalization floors, which diverge within a few real steps (as they should), are never
timed on inf/NaN arithmetic, and every contender runs on the same finite numbers in every step.
On CUDA every step ends with ``torch.cuda.synchronize()``, so the timed statement contains the
whole step.

A suite with ``multi_batch`` makes a list of batches (the translation suite: real token-budget
batches of different shapes); its timed statement is one train step (or eval forward) per batch,
in order, and ``Prepared.steps_per_call`` says how many.

:func:`warm_up` runs at least ``measure_batches + 2`` training steps (RescaleNet's mean-shift
biases measure their input means during the first ``measure_batches`` steps), so the timings of
ordinary steps never include a measuring step; it checks that measuring is over afterwards.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

import rescale_core

from .models import Contender, Suite

__all__ = ["RunConfig", "Prepared", "prepare", "warm_up", "min_warmup", "reset_measuring",
           "finish_measuring"]


@dataclass(frozen=True)
class RunConfig:
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    amp_dtype: torch.dtype | None = None
    channels_last: bool = False
    compile: bool = False
    compile_backend: str = "inductor"  # torch.compile's backend when compiling

    def label(self) -> str:
        parts = [self.device.type]
        if self.amp_dtype is not None:
            parts.append(str(self.amp_dtype).replace("torch.", "") + " autocast")
        parts.append("channels_last" if self.channels_last else "contiguous")
        backend = "" if self.compile_backend == "inductor" else f" ({self.compile_backend})"
        parts.append(f"torch.compile{backend}" if self.compile else "eager")
        return ", ".join(parts)


@dataclass
class Prepared:
    """One contender ready to be timed. ``model`` is the plain module (state, memory probe);
    ``train_step``/``eval_step`` call the compiled module when compiling."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    inputs: tuple[torch.Tensor, ...]
    targets: torch.Tensor
    train_step: Callable[[], None]
    eval_step: Callable[[], None]
    batch_size: int
    compiled: bool = False
    warmup_seconds: float = 0.0   # wall time of the warm-up (includes compilation)
    warmup_steps: int = 0         # calls of the timed statement during the warm-up
    graphs: int = 0               # graphs torch.compile produced during the warm-up
    batches: list[tuple[tuple[torch.Tensor, ...], torch.Tensor]] = field(default_factory=list)

    @property
    def steps_per_call(self) -> int:
        """Optimizer steps (or forwards) in one call of ``train_step`` (``eval_step``)."""
        return max(1, len(self.batches))

    @property
    def tensors(self) -> list[torch.Tensor]:
        if self.batches:
            return [t for inputs, targets in self.batches for t in (*inputs, targets)]
        return [*self.inputs, self.targets]


def _memory_format(x: torch.Tensor) -> torch.memory_format | None:
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())


def prepare(suite: Suite, contender: Contender | str, batch_size: int, config: RunConfig,
            train: bool = True, seed: int = 0) -> Prepared:
    """Build ``contender`` of ``suite`` on ``config.device`` with its batch, optimizer and steps."""
    if isinstance(contender, str):
        contender = suite.contender(contender)
    device = config.device
    torch.manual_seed(seed)
    model = contender.build().to(device)
    made = suite.make_batch(batch_size, device)
    batches = list(made) if suite.multi_batch else [made]
    if not batches:
        raise ValueError(f"{suite.name}: make_batch gave no batch")
    if config.channels_last and suite.image_like:
        fmt = _memory_format(batches[0][0][0])
        model = model.to(memory_format=fmt)
        batches = [(tuple(x.contiguous(memory_format=fmt) for x in inputs), targets)
                   for inputs, targets in batches]
    model.train(train)
    optimizer = None
    if train:
        optimizer = (suite.optimizer(model.parameters()) if suite.optimizer is not None else
                     torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9, weight_decay=1e-4))
    runner = torch.compile(model, backend=config.compile_backend) if config.compile else model
    sync = device.type == "cuda"
    amp = config.amp_dtype
    clip = contender.after_backward

    def train_step() -> None:
        for inputs, targets in batches:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                loss = suite.loss(runner(*inputs), targets)
            loss.backward()
            if clip is not None:
                clip(model)
            optimizer.step()
        if sync:
            torch.cuda.synchronize(device)

    def eval_step() -> None:
        with torch.inference_mode(), torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            for inputs, _targets in batches:
                runner(*inputs)
        if sync:
            torch.cuda.synchronize(device)

    if not train:
        finish_measuring(model)  # an evaluated model has measured its statistics in training
    inputs, targets = batches[0]
    return Prepared(contender.name, model, optimizer, inputs, targets,
                    train_step if train else _no_train(contender.name), eval_step, batch_size,
                    compiled=config.compile, batches=batches if suite.multi_batch else [])


def _no_train(name: str) -> Callable[[], None]:
    def fail() -> None:
        raise RuntimeError(f"{name} was prepared for evaluation only")
    return fail


def min_warmup(model: nn.Module, extra: int = 2) -> int:
    """Training steps needed before timing ordinary steps: the longest measuring phase + extra."""
    layers = rescale_core.mean_shift_layers(model)
    return max((m.measure_batches for m in layers), default=0) + extra


def warm_up(prepared: Prepared, steps: int, train: bool = True) -> Prepared:
    """Run ``steps`` (at least :func:`min_warmup`) train steps, or ``steps`` eval forwards: as
    many calls of the timed statement as hold that many steps (one per call, except with a
    multi-batch suite).

    The warm-up's wall time is kept in ``prepared.warmup_seconds`` (with ``torch.compile`` it is
    dominated by compilation); it is bookkeeping, not a measurement.
    """
    if train:
        steps = max(steps, min_warmup(prepared.model))
    calls = -(-steps // prepared.steps_per_call)
    step = prepared.train_step if train else prepared.eval_step
    graphs = _graph_count() if prepared.compiled else 0
    start = time.perf_counter()
    for _ in range(calls):
        step()
    prepared.warmup_seconds += time.perf_counter() - start
    prepared.warmup_steps += calls
    if prepared.compiled:
        prepared.graphs += _graph_count() - graphs
    still = [m for m in rescale_core.mean_shift_layers(prepared.model) if m.measuring]
    if train and still:
        raise RuntimeError(f"{prepared.name}: {len(still)} mean-shift layers still measuring after "
                           f"{steps} warm-up steps")
    return prepared


def _graph_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def reset_measuring(model: nn.Module) -> None:
    """Put every RescaleNet mean-shift bias back at the start of its measuring phase."""
    for m in rescale_core.mean_shift_layers(model):
        m._count = 0
        m.count.zero_()
        m.mu0.zero_()


def finish_measuring(model: nn.Module) -> None:
    rescale_core.finish_measuring(model)
