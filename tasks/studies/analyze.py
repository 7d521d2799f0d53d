"""``rescale analyze``: the papers' probes of one or more runs, as tables and plots.

    rescale analyze signal    --config RUN.yaml [--config ...] [--ckpt FILE ...] [--input data|gaussian]
    rescale analyze scalars   --config RUN.yaml --ckpt FILE [--ckpt FILE ...]
    rescale analyze dead-relu --config RUN.yaml [--config ...] [--max_samples 512]

Common flags: ``--out DIR`` (default ``analysis/<command>``), ``--wandb_run RUN`` (a run folder
or id, with ``--wandb_project``), and Lightning overrides after ``--`` applied to every config,
e.g. ``-- --model.init_args.network_options "{depth: 20, base_width: 8}"``.

- ``signal``: per residual block, Var of the scaled skip and branch terms, of their sum and of
  the block output, and ``eta_k`` (RescaleNet rebuttal, Eq. 1 and Fig. (a)/(b)); the skip and
  branch variances against depth are the SkipInit view (under BN the skip path's variance grows
  with the block index). Model at initialisation, or from checkpoints.
- ``scalars``: the learned branch multiplier of every block (rebuttal [R2]); vector gains as
  mean, min, max and std; several checkpoints of one run give the multipliers over training.
- ``dead-relu``: the fraction of dead ReLUs at initialisation (on an evaluation batch, and per
  evaluation sample) against the number of samples the mean-shift statistic ``mu0`` is measured
  on, with and without the re-parameterisation (scheme option ``mean_shift``).

Each writes ``<out>/<name>.csv``, ``.md`` and ``.png`` and prints the markdown table.
"""
from __future__ import annotations

import argparse
import copy
import math
from typing import Optional, Sequence

import torch

from rescale_core import finish_measuring, get_scheme, list_schemes, mean_shift_layers
from rescale_core.analysis import dead_relu_fraction, residual_blocks, signal_propagation

from ..common.errors import UserArgumentParser as _Parser, UserError
from ..common.reporting import (SCALAR_COLUMNS, SIGNAL_COLUMNS, finish_figure, gain_rows, new_figure,
                                rows_by_run, scalars_figure, signal_figure, signal_rows)
from ..common.system import resolve_device
from ..common.training import take_samples
from .models import Subject, load_subject, probe_inputs, run_names, subjects
from .outputs import StudyOutputs, check_wandb_run

__all__ = ["main", "signal_stage_rows", "dead_relu_rows", "dead_relu_figure", "DEAD_RELU_COLUMNS"]

DEAD_RELU_COLUMNS = ["run", "mean_shift", "samples", "dead_fraction", "dead_per_sample"]


# --- rows --------------------------------------------------------------------------------------

def signal_stage_rows(rows: Sequence[dict]) -> list[dict]:
    """Per run and stage, the papers' claims in one line: the block output variance at the first and
    last block of the stage and their ratio (RescaleNet: flat, ~1; BN: growing about linearly with
    the number of blocks, SkipInit Sec. 2; no normalisation: exponentially), and the largest and
    mean ``eta_k`` (RescaleNet rebuttal Eq. 1: small when the merge keeps the skip and branch apart)."""
    out = []
    for run, mine in rows_by_run(rows).items():
        for stage in dict.fromkeys(r["stage"] for r in mine):
            blocks = [r for r in mine if r["stage"] == stage]
            first, last = blocks[0]["var_out"], blocks[-1]["var_out"]
            etas = [r["eta"] for r in blocks if r["eta"] is not None and math.isfinite(r["eta"])]
            out.append({"run": run, "stage": stage, "blocks": len(blocks), "var_out_first": first,
                        "var_out_last": last, "growth": last / first if first else None,
                        "eta_max": max(etas) if etas else None,
                        "eta_mean": sum(etas) / len(etas) if etas else None})
    return out


def dead_relu_rows(net: torch.nn.Module, measure, evaluate, sizes: Sequence[int], run: str,
                   mean_shift: bool, batch_size: int = 64) -> list[dict]:
    """Dead ReLUs on ``evaluate`` after measuring ``mu0`` on the first n samples of ``measure``,
    for every n of ``sizes``, each time from the model at initialisation: ``dead_fraction``, the
    channels silent on every evaluation sample (the paper's dead neurons), and ``dead_per_sample``,
    the mean over evaluation samples of the channels silent on that sample (finer: at
    initialisation a mean-shifted network rarely has a channel dead on a whole batch).

    Measuring is what training does on its first batches, in chunks of at most ``batch_size``
    samples (``mu0`` = the running mean of the chunk means, equal chunks when n is a multiple of
    the chunk count); only the mean-shift statistics are kept: the forward passes that measure
    them in training mode leave BN statistics, dropout's random stream and every weight as they
    were. Without mean-shift layers nothing depends on n: the fraction is measured once.
    """
    def fractions(model) -> dict:
        return {"dead_fraction": dead_relu_fraction(model, evaluate),
                "dead_per_sample": dead_relu_fraction(model, evaluate, per_sample=True)}

    rows, fixed = [], None
    for n in sizes:
        if not mean_shift_layers(net):
            fixed = fractions(net) if fixed is None else fixed
            rows.append({"run": run, "mean_shift": mean_shift, "samples": n, **fixed})
            continue
        measured = copy.deepcopy(net).train()
        for p in measured.parameters():
            p.requires_grad_(False)  # mean-shift layers measure with gradients enabled: build no graph
        chunks = math.ceil(n / batch_size)
        for layer in mean_shift_layers(measured):
            layer.measure_batches = chunks
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            for i in range(chunks):
                measured(*take_samples(measure, i * n // chunks, (i + 1) * n // chunks))
        finish_measuring(measured)
        probe = copy.deepcopy(net)
        for target, source in zip(mean_shift_layers(probe), mean_shift_layers(measured)):
            target.load_state_dict(source.state_dict())
        finish_measuring(probe)  # frozen at what n samples gave, whatever measure_batches says
        rows.append({"run": run, "mean_shift": mean_shift, "samples": n, **fractions(probe)})
    return rows


# --- figures -----------------------------------------------------------------------------------

def dead_relu_figure(rows: Sequence[dict]):
    """Dead fraction on the evaluation batch and per sample against n (log2), one line per run and
    variant (dashed: without mean shift, flat)."""
    fig, axes = new_figure(2)
    for ax, key, what in zip(axes, ("dead_fraction", "dead_per_sample"),
                             ("dead on the whole evaluation batch", "silent per evaluation sample")):
        for i, (run, rs) in enumerate(rows_by_run(rows).items()):
            for shift, style in ((True, "o-"), (False, "s--")):
                points = [r for r in rs if r["mean_shift"] is shift]
                if points:
                    ax.plot([r["samples"] for r in points], [r[key] for r in points], style, ms=3,
                            color=f"C{i % 10}", label=f"{run}, {'mean shift' if shift else 'no mean shift'}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("samples measuring mu0")
        ax.set_ylabel("fraction of ReLU channels")
        ax.set_title(what)
    return finish_figure(fig)


# --- commands ----------------------------------------------------------------------------------

def _no_blocks(subject: Subject, what: str) -> UserError:
    return UserError(f"{subject.name}: {subject.describe()} has no residual blocks; `rescale analyze {what}` "
                     "needs a residual network (a ResNet, Wide-ResNet or Transformer, not a VGG)")


def _signal(args, overrides: list[str]) -> int:
    out = StudyOutputs(args.out or "analysis/signal")
    rows = []
    for subject in subjects(args.config, args.ckpt, overrides, args.device):
        if not residual_blocks(subject.net):
            raise _no_blocks(subject, "signal")
        inputs = probe_inputs(subject, args.input, args.samples, args.shape, args.seed)
        rows += signal_rows(signal_propagation(subject.net, inputs, train=args.train), subject.label)
        del subject
    mode = "train" if args.train else "eval"
    title = f"signal propagation ({args.samples} {args.input} samples, {mode} mode)"
    out.table("signal", rows, SIGNAL_COLUMNS, title=title)
    out.table("signal_stages", signal_stage_rows(rows),
              title=f"per stage: block output variance, first and last block, growth = last / first; eta_k ({title})")
    out.figure("signal", signal_figure(rows, title))
    out.finish(args.wandb_run, args.wandb_project, echo=["signal", "signal_stages"])
    return 0


def _scalars(args, overrides: list[str]) -> int:
    out = StudyOutputs(args.out or "analysis/scalars")
    rows = []
    for subject in subjects(args.config, args.ckpt, overrides, "cpu"):
        found = gain_rows(subject.net, subject.name, subject.step)
        if not found:
            if not residual_blocks(subject.net):
                raise _no_blocks(subject, "scalars")
            with_gains = [n for n in list_schemes("conv") if get_scheme(n).gain]
            raise UserError(f"{subject.name}: {subject.describe()} has no learned branch multipliers (scheme gain: "
                            f"none); `rescale analyze scalars` needs a scheme with gains: {', '.join(with_gains)}")
        rows += found
        del subject
    out.table("scalars", rows, SCALAR_COLUMNS, title="learned branch multipliers per block")
    out.figure("scalars", scalars_figure(rows))
    out.finish(args.wandb_run, args.wandb_project, echo=["scalars"])
    return 0


def _dead_relu(args, overrides: list[str]) -> int:
    if args.max_samples < 1 or args.eval_samples < 1 or args.batch_size < 1:
        raise UserError("--max_samples, --eval_samples and --batch_size must be at least 1")
    sizes = [2 ** i for i in range(args.max_samples.bit_length())]  # 1, 2, 4, .. up to --max_samples
    out = StudyOutputs(args.out or "analysis/dead_relu")
    shifted = ["--model.init_args.scheme_options.mean_shift", "true"]
    for config, name in zip(args.config, run_names(args.config)):  # every config checked before any is measured
        try:
            subject = load_subject(config, None, [*overrides, *shifted], name=name, device="cpu")
        except UserError as err:
            # a config or override that fails without mean shift too: its own error, not this one
            load_subject(config, None, overrides, name=name, device="cpu")
            raise UserError(f"{name}: `rescale analyze dead-relu` compares the network with and without "
                            f"mean-shift biases (scheme_options.mean_shift true and false), and this one cannot "
                            f"take them; leave its config out ({err})") from None
        if not mean_shift_layers(subject.net):
            raise UserError(f"{name}: {subject.describe()} has no mean-shift layers even with mean_shift: true; "
                            "`rescale analyze dead-relu` needs a network with biases before its convolutions")
        del subject
    rows = []
    for config, name in zip(args.config, run_names(args.config)):
        for shift in (True, False):
            option = ["--model.init_args.scheme_options.mean_shift", "true" if shift else "false"]
            subject = load_subject(config, None, [*overrides, *option], name=name, device=args.device)
            inputs = probe_inputs(subject, args.input, sizes[-1] + args.eval_samples, args.shape, args.seed)
            measure, evaluate = take_samples(inputs, 0, sizes[-1]), take_samples(inputs, sizes[-1])
            rows += dead_relu_rows(subject.net, measure, evaluate, sizes, name, shift, args.batch_size)
            del subject
    out.table("dead_relu", rows, DEAD_RELU_COLUMNS,
              title=f"dead ReLUs at initialisation ({args.eval_samples} {args.input} evaluation samples)")
    out.figure("dead_relu", dead_relu_figure(rows))
    out.finish(args.wandb_run, args.wandb_project, echo=["dead_relu"])
    return 0


# --- command line ------------------------------------------------------------------------------

def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(v) for v in text.replace("x", ",").split(",") if v.strip())
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected positive sizes like 3,224,224, got {text!r}")
    return shape


def _parser() -> _Parser:
    common = _Parser(add_help=False)
    common.add_argument("--config", action="append", required=True,
                        help="run config (repeatable: several runs in one table and plot)")
    common.add_argument("--out", help="output folder (default analysis/<command>)")
    common.add_argument("--wandb_run", help="log tables and plots to this W&B run (run folder or id)")
    common.add_argument("--wandb_project", help="W&B project of a --wandb_run given as an id")
    ckpt = _Parser(add_help=False)
    ckpt.add_argument("--ckpt", action="append", default=[],
                      help="checkpoint (repeatable: one per --config, or several of one run)")
    inputs = _Parser(add_help=False)
    inputs.add_argument("--input", choices=("data", "gaussian"), default="data",
                        help="the data module's training samples (default) or standard Gaussian input")
    inputs.add_argument("--shape", type=_shape, help="sample shape C,H,W for --input gaussian (default: a real "
                                                      "sample's, or the data module's in_channels/image_size)")
    inputs.add_argument("--seed", type=int, default=0, help="seed of the Gaussian input")
    inputs.add_argument("--device", default="auto", help="auto (a GPU when there is one), cpu, cuda, cuda:N")

    parser = _Parser(prog="rescale analyze", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="{signal,scalars,dead-relu}")
    signal = commands.add_parser("signal", parents=[common, ckpt, inputs], prog="rescale analyze signal",
                                 help="per-block variances and eta_k (at init or from checkpoints)")
    signal.add_argument("--samples", type=int, default=64, help="samples in the probed batch (default 64)")
    mode = signal.add_mutually_exclusive_group()
    mode.add_argument("--train", dest="train", action="store_true", default=True,
                      help="training mode, as at the first step (default): BN uses batch statistics "
                           "(dropout and stochastic depth off in either mode)")
    mode.add_argument("--eval", dest="train", action="store_false", help="evaluation mode")
    signal.set_defaults(func=_signal)
    scalars = commands.add_parser("scalars", parents=[common, ckpt], prog="rescale analyze scalars",
                                  help="learned branch multipliers per block, over training")
    scalars.set_defaults(func=_scalars)
    dead = commands.add_parser("dead-relu", parents=[common, inputs], prog="rescale analyze dead-relu",
                               help="dead ReLUs at init vs samples measuring the mean-shift statistic")
    dead.add_argument("--max_samples", type=int, default=512, help="largest n of 1, 2, 4, ... (default 512)")
    dead.add_argument("--eval_samples", type=int, default=64,
                      help="samples the dead fraction is measured on, after the measuring ones (default 64)")
    dead.add_argument("--batch_size", type=int, default=64, help="measuring chunk size (default 64)")
    dead.set_defaults(func=_dead_relu)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``rescale analyze <command> [flags] [-- lightning overrides]``."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    overrides: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, overrides = argv[:cut], argv[cut + 1:]
    args = _parser().parse_args(argv)
    if getattr(args, "samples", 1) < 1:
        raise UserError("--samples must be at least 1")
    check_wandb_run(args.wandb_run, args.wandb_project)  # before the probes' work, as the folders are
    if hasattr(args, "device"):
        args.device = resolve_device(args.device)  # before anything is built
    return args.func(args, overrides)
