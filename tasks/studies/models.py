"""The model a study looks at: built from a run config as training builds it (at initialisation),
optionally with the weights of a checkpoint, and the network inputs it is probed with.

Task-independent: a study reads the LightningModule's ``net`` attribute (the network the
probes of :mod:`rescale_core.analysis` hook) and takes the network's inputs from a batch as
:func:`rescale_tasks.common.training.network_inputs` does (a tuple of the network's
positional arguments).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import torch
from torch import nn

from ..common.checkpoints import checkpoint_exists, load_into_module, safe_load
from ..common.cli import build_run
from ..common.errors import DataError, UserError
from ..common.system import resolve_device
from ..common.training import batch_size_of, network_inputs, take_samples

__all__ = ["Subject", "load_subject", "subjects", "data_inputs", "gaussian_inputs", "probe_inputs", "run_names"]

CKPT_FIX = "Give the --config the checkpoint was trained with ({config}), with the same overrides after --."


@dataclass
class Subject:
    """A built LightningModule (on its device, weights loaded), its data module and its names."""

    module: Any
    datamodule: Any
    name: str                      # the run: the config's name
    config: str
    ckpt: Optional[str] = None
    step: int = 0                  # the checkpoint's global_step (0 at initialisation)

    @property
    def net(self) -> nn.Module:
        return getattr(self.module, "net", self.module)

    @property
    def label(self) -> str:
        """The run, and the step of its checkpoint when there is one."""
        return self.name if self.ckpt is None else f"{self.name} step {self.step}"

    @property
    def device(self) -> torch.device:
        param = next(self.module.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    def describe(self) -> str:
        """``network/scheme`` when the module has those hyper-parameters (this suite's modules)."""
        hparams = getattr(self.module, "hparams", {}) or {}
        network = hparams.get("network") or type(self.net).__name__
        scheme = getattr(getattr(self.net, "scheme", None), "name", None) or hparams.get("scheme")
        return f"{network}" + (f" (scheme {scheme})" if scheme else "")


def load_subject(config: str, ckpt: Optional[str] = None, overrides: Sequence[str] = (),
                 name: Optional[str] = None, device: str | torch.device = "cpu") -> Subject:
    """Build the module and data module of ``config`` (``_defaults.yaml`` files and ``overrides``
    applied, seeded as ``rescale fit`` seeds) without training, and load ``ckpt``'s weights.

    Built uncompiled whatever the config's ``compile`` says: the probes hook the network and run
    it eagerly, and a copy of a network compiled in place (what ``dead-relu`` measures on) would
    run the original's compiled code, not its own.

    A missing file, or a checkpoint of another architecture, is one :class:`UserError` line.
    """
    cli = build_run(["--config", config, *overrides, "--model.init_args.compile", "false"])
    subject = Subject(cli.model, cli.datamodule, name or _stem(config), config)
    if ckpt is not None:
        subject.ckpt = ckpt
        subject.step = load_weights(subject.module, ckpt)
    subject.module.to(resolve_device(device) if isinstance(device, str) else device)
    return subject


def load_weights(module, path: str) -> int:
    """Load a checkpoint's weights into ``module`` as Lightning does; returns its global step."""
    if not checkpoint_exists(path):
        raise UserError(f"checkpoint not found: {path} (--ckpt). Give a .ckpt file written by this suite, "
                        "e.g. runs/<project>/<run id>/checkpoints/last.ckpt")
    return load_into_module(module, safe_load(path), f"checkpoint {path}", fix=CKPT_FIX, ckpt_path=path)


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def run_names(configs: Sequence[str]) -> list[str]:
    """A short name per config, distinct for distinct files: its file name, with as many of its
    folders as tell it from the configs of the same name (the configs two runs saved,
    ``<run>/files/rescale_config.yaml``, by their run folders); a file given twice is numbered."""
    paths = [os.path.splitext(os.path.abspath(c))[0].split(os.sep) for c in configs]
    depths = [1] * len(paths)
    while True:
        names = ["/".join(p[-d:]) for p, d in zip(paths, depths)]
        clashing = [i for i, n in enumerate(names) if names.count(n) > 1 and depths[i] < len(paths[i])
                    and any(paths[j] != paths[i] for j, m in enumerate(names) if m == n)]
        if not clashing:
            break
        for i in clashing:
            depths[i] += 1
    return [n if names.count(n) == 1 else f"{n} ({names[:i + 1].count(n)})" for i, n in enumerate(names)]


def subjects(configs: Sequence[str], ckpts: Sequence[str] = (), overrides: Sequence[str] = (),
             device: str | torch.device = "auto") -> Iterator[Subject]:
    """The subjects of a command, built one at a time (a paper-scale model is freed before the
    next is built): one per config at initialisation; with checkpoints, one per checkpoint of a
    single config (several checkpoints of one run) or one checkpoint per config, in order. Each
    has a label of its own (the rows of two are never pooled): a checkpoint at the step of an
    earlier one is named by its file."""
    configs, ckpts = list(configs), list(ckpts or ())
    names = run_names(configs)
    if not ckpts:
        pairs = [(c, None, n) for c, n in zip(configs, names)]
    elif len(configs) == 1:
        pairs = [(configs[0], k, names[0]) for k in ckpts]
    elif len(ckpts) == len(configs):
        pairs = list(zip(configs, ckpts, names))
    else:
        raise UserError(f"{len(ckpts)} --ckpt for {len(configs)} --config: give one --ckpt per --config (in the "
                        "same order), or one --config with several --ckpt (checkpoints of one run)")
    labels: set[str] = set()
    for n, (config, ckpt, name) in enumerate(pairs, start=1):
        subject = load_subject(config, ckpt, overrides, name=name, device=device)
        # two checkpoints of one run at one step (an epoch's and last.ckpt): rows of its own each
        for other in (f"{name} ({os.path.basename(ckpt or config)})", f"{name} (--ckpt {n})"):
            if subject.label not in labels:
                break
            subject.name = other
        labels.add(subject.label)
        yield subject


# --- inputs ----------------------------------------------------------------------------------------

def _concat(parts: list[tuple], what: str) -> tuple:
    try:
        return tuple(torch.cat([p[i] for p in parts]) for i in range(len(parts[0])))
    except (RuntimeError, TypeError) as err:
        raise UserError(f"{what}: the batches of the training loader cannot be joined into one "
                        f"({str(err).splitlines()[0]}); lower --samples to one batch") from None


def data_inputs(subject: Subject, samples: int) -> tuple:
    """The first ``samples`` network inputs of the data module's training loader (``setup("fit")``)."""
    datamodule = subject.datamodule
    if datamodule is None or not hasattr(datamodule, "train_dataloader"):
        raise UserError(f"{subject.name}: the config has no data module; use --input gaussian --shape C,H,W")
    datamodule.setup("fit")
    parts, seen = [], 0
    for batch in datamodule.train_dataloader():
        parts.append(network_inputs(subject.module, batch))
        seen += batch_size_of(parts[-1])
        if seen >= samples:
            break
    if seen < samples:
        raise UserError(f"{subject.name}: the training set has {seen} samples, fewer than the {samples} asked "
                        "for; lower --samples (or --max_samples)")
    return take_samples(_concat(parts, subject.name), 0, samples)


def _shape_from_data(subject: Subject) -> tuple[int, ...]:
    """The shape of one sample: from a real batch, else from the data module's ``in_channels``
    and ``image_size`` when its data are not on this machine."""
    try:
        inputs = data_inputs(subject, 1)
    except DataError:
        datamodule = subject.datamodule
        channels, size = getattr(datamodule, "in_channels", None), getattr(datamodule, "image_size", None)
        if channels is None or size is None:
            raise UserError(f"{subject.name}: no data to take the input shape from; give --shape C,H,W") from None
        return (int(channels), int(size), int(size))
    if len(inputs) != 1 or not inputs[0].is_floating_point():
        raise UserError(f"{subject.name}: the network takes {len(inputs)} inputs of type {inputs[0].dtype}; "
                        "Gaussian input is for a network of one float input: use --input data")
    return tuple(inputs[0].shape[1:])


def gaussian_inputs(subject: Subject, samples: int, shape: Optional[Sequence[int]] = None,
                    seed: int = 0) -> tuple:
    """``samples`` standard Gaussian inputs of ``shape`` (default: the shape of a real sample)."""
    shape = tuple(shape) if shape else _shape_from_data(subject)
    return (torch.randn((samples, *shape), generator=torch.Generator().manual_seed(seed)),)


def probe_inputs(subject: Subject, source: str, samples: int, shape: Optional[Sequence[int]] = None,
                 seed: int = 0) -> tuple:
    """``--input data`` or ``--input gaussian`` (a tuple of the network's inputs), on the subject's device."""
    inputs = data_inputs(subject, samples) if source == "data" else gaussian_inputs(subject, samples, shape, seed)
    return tuple(t.to(subject.device) for t in inputs)
