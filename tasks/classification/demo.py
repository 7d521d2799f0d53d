"""``rescale demo``: the suite in one command.

Trains the same deep CIFAR-style ResNet under ``bn``, ``rescale``, ``skipinit``, ``fixup`` and
``none`` on the embedded digits data set (scikit-learn's 1,797 real 8x8 digits: no download),
with an equal budget and each scheme's own recipe (Fixup's scalars at lr/10 come from the
parameter groups; RescaleNet's basic-block recipe, :data:`SCHEME_OPTIONS`, as
``experiments/digits/rescale56.yaml``), then prints a comparison table, writes a PNG of the
learning curves and logs every run to W&B (offline unless logged in). At this depth the plain network without
normalisation (``none``) cannot be trained: its forward signal grows ~2x per block at init.

Its settings are checked before any folder is made or data read (:func:`check_settings`): a
value ``rescale fit`` would refuse (an unknown scheme, a depth that is not 6n+2, an output folder
that cannot be written, no epoch to train) is one error line, in ``fit``'s words.

Each run also writes the suite's ``run_summary.json`` (``<out>/<scheme>/``, written by the same
:class:`~rescale_tasks.common.run.RunSummary` callback as every ``rescale fit``), so
``rescale compare <out>`` reads the demo like any other runs; the closing lines print the next
commands to try.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field

import lightning.pytorch as L
import torch

from ..common.cli import quiet_libraries
from ..common.errors import ConfigError, UserArgumentParser
from ..common.reporting import SuiteWandbLogger, use_line_progress
from ..common.run import SUMMARY_FILE, RunSummary
from ..common.system import atomic_open, atomic_path, require_writable, write_output
from ..common.training import DivergenceMonitor, WarmupCosineLR, create_network
from .data import DigitsDataModule
from .module import ClassificationModule

__all__ = ["DemoSettings", "check_settings", "run_demo", "main"]

log = logging.getLogger(__name__)

DEMO_SCHEMES = ("bn", "rescale", "skipinit", "fixup", "none")
# RescaleNet's basic-block recipe (docs/studies.md, the basic-block yardstick): signal-preserving
# projection shortcuts and classifier
SCHEME_OPTIONS = {"rescale": {"shortcut_gain": 2.0, "classifier_gain": 10.0}}
# the settings `rescale demo` takes as options, by their flags (the others: DemoSettings.<name>)
_FLAGS = {"epochs": "--epochs", "depth": "--depth", "schemes": "--schemes", "out": "--out", "seed": "--seed"}
_MAX_SEED = 2 ** 32 - 1  # numpy's bound, which seeding checks


@dataclass
class DemoSettings:
    schemes: tuple[str, ...] = DEMO_SCHEMES
    depth: int = 56                 # CIFAR ResNet depth 6n+2: 27 residual blocks
    base_width: int = 16
    epochs: int = 26                # ~500 SGD steps of batch 64
    batch_size: int = 64
    lr: float = 0.05                # one learning rate for every scheme
    weight_decay: float = 5e-4
    warmup_epochs: float = 1.0
    seed: int = 0
    out: str = "demo_output"
    limit_train_batches: float | int = 1.0
    progress: bool = True


@dataclass
class DemoResult:
    scheme: str
    test_acc: float
    test_loss: float
    final_train_loss: float
    diverged: bool
    diverged_step: int | None
    seconds: float
    curve: dict = field(default_factory=dict)  # epoch -> {train_loss, val_acc}

    @property
    def status(self) -> str:
        if self.diverged:
            return f"diverged (step {self.diverged_step})"
        if not math.isfinite(self.test_acc) or self.test_acc < 0.2:
            return "failed to learn"
        return "trained"


class _CurveRecorder(L.Callback):
    """Keeps per-epoch train loss and validation accuracy in memory for the plot."""

    def __init__(self) -> None:
        self.curve: dict[int, dict] = {}

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        m = trainer.callback_metrics
        self.curve[trainer.current_epoch] = {
            "val_acc": float(m.get("val/acc1", float("nan"))),
            "train_loss": float(m.get("train/loss_epoch", float("nan"))),
        }


def _name(setting: str) -> str:
    return _FLAGS.get(setting, f"DemoSettings.{setting}")


def check_settings(settings: DemoSettings) -> None:
    """Refuse, in one :class:`~rescale_tasks.common.errors.UserError` line, a setting the demo
    cannot run with, before any folder is made or data read. Each network is built once (a
    fraction of a second): an unknown scheme, one for Transformers, or a depth that is not 6n+2
    is refused in the words ``rescale fit`` uses for the same config."""
    for setting in ("epochs", "batch_size", "base_width"):
        value = getattr(settings, setting)
        if value < 1:
            raise ConfigError(f"{_name(setting)} must be at least 1, got {value}.")
    if not 0 <= settings.seed <= _MAX_SEED:
        raise ConfigError(f"{_name('seed')} must be between 0 and {_MAX_SEED}, got {settings.seed}.")
    if not settings.limit_train_batches > 0:
        raise ConfigError(f"{_name('limit_train_batches')} must be > 0, got {settings.limit_train_batches}.")
    try:  # torch's and the schedule's own checks of lr, weight_decay and warmup_epochs
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=settings.lr, momentum=0.9,
                                    weight_decay=settings.weight_decay)
        WarmupCosineLR(optimizer, warmup_epochs=settings.warmup_epochs, max_epochs=settings.epochs)
    except ValueError as err:
        raise ConfigError(f"bad demo setting (DemoSettings.lr, weight_decay, warmup_epochs): {err}") from None
    if not settings.schemes:
        raise ConfigError(f"{_name('schemes')}: give at least one scheme (rescale schemes lists them)")
    twice = next((s for i, s in enumerate(settings.schemes) if s in settings.schemes[:i]), None)
    if twice is not None:
        raise ConfigError(f"{_name('schemes')} gives {twice} twice; give each scheme once")
    data = DigitsDataModule(batch_size=settings.batch_size, seed=settings.seed)  # its shapes; reads nothing
    for scheme in settings.schemes:
        create_network("cifar_resnet", where=f"{_name('schemes')} / {_name('depth')}", scheme=scheme,
                       scheme_options=SCHEME_OPTIONS.get(scheme), depth=settings.depth,
                       base_width=settings.base_width, num_classes=data.num_classes, in_channels=data.in_channels)
    if not str(settings.out).strip():
        raise ConfigError(f"{_name('out')} is empty; give the folder the demo writes its table, plot and runs to")
    require_writable(settings.out, _name("out"), f"give {_name('out')} a folder you can write")


def _train_one(settings: DemoSettings, scheme: str, data: DigitsDataModule) -> DemoResult:
    L.seed_everything(settings.seed, workers=True, verbose=False)
    module = ClassificationModule(
        network="cifar_resnet", scheme=scheme, scheme_options=SCHEME_OPTIONS.get(scheme),
        network_options={"depth": settings.depth, "base_width": settings.base_width},
        num_classes=data.num_classes, in_channels=data.in_channels,
        optimizer=lambda p: torch.optim.SGD(p, lr=settings.lr, momentum=0.9,
                                            weight_decay=settings.weight_decay),
        lr_scheduler=lambda opt, **kw: WarmupCosineLR(opt, warmup_epochs=settings.warmup_epochs, **kw),
    )
    monitor, recorder = DivergenceMonitor(raise_error=False), _CurveRecorder()
    # what `rescale compare` reads, as every `rescale fit` writes it
    summary = RunSummary(path=os.path.join(settings.out, scheme, SUMMARY_FILE))
    logger = SuiteWandbLogger(name=f"demo-{scheme}", save_dir=os.path.join(settings.out, "runs"),
                              project="rescale-demo", group=f"digits-cifar_resnet{settings.depth}",
                              tags=[scheme, f"depth{settings.depth}", "demo"])
    logger.log_hyperparams({"demo": asdict(settings), "scheme": scheme})
    trainer = L.Trainer(max_epochs=settings.epochs, logger=logger, callbacks=[monitor, recorder, summary],
                        enable_checkpointing=False, enable_progress_bar=settings.progress,
                        enable_model_summary=False, limit_train_batches=settings.limit_train_batches,
                        log_every_n_steps=5, deterministic=True, accelerator="cpu", devices=1)
    use_line_progress(trainer)  # in a log file: a line every 5 steps, not a redrawn bar
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    seconds = time.perf_counter() - start
    train_loss = float(trainer.callback_metrics.get("train/loss_epoch", float("nan")))
    if monitor.diverged_at is None:
        metrics = trainer.test(module, datamodule=data, verbose=False)[0]
        acc, loss = metrics["test/acc1"], metrics["test/loss"]
    else:
        acc, loss = float("nan"), float("nan")
    logger.experiment.summary.update({"test/acc1": acc, "diverged": monitor.diverged_at is not None})
    logger.finalize("success")
    import wandb

    wandb.finish()
    return DemoResult(scheme, acc, loss, train_loss, monitor.diverged_at is not None,
                      monitor.diverged_at, seconds, recorder.curve)


def format_table(results: list[DemoResult]) -> str:
    rows = [("scheme", "test acc", "test loss", "train loss", "status", "time")]
    for r in results:
        rows.append((r.scheme, f"{100 * r.test_acc:.1f}%" if math.isfinite(r.test_acc) else "-",
                     f"{r.test_loss:.3f}" if math.isfinite(r.test_loss) else "-",
                     f"{r.final_train_loss:.3f}" if math.isfinite(r.final_train_loss) else "nan",
                     r.status, f"{r.seconds:.0f}s"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot_curves(results: list[DemoResult], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    for r in results:
        epochs = sorted(r.curve)
        label = f"{r.scheme} ({r.status})" if r.status != "trained" else r.scheme
        ax_loss.plot(epochs, [r.curve[e]["train_loss"] for e in epochs], marker="o", label=label)
        ax_acc.plot(epochs, [100 * r.curve[e]["val_acc"] for e in epochs], marker="o", label=label)
    ax_loss.set(xlabel="epoch", ylabel="train loss", title="Training loss", yscale="log")
    ax_acc.set(xlabel="epoch", ylabel="val top-1 (%)", title="Validation accuracy", ylim=(0, 100))
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Same deep ResNet, five residual schemes (embedded digits)")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format=os.path.splitext(path)[1][1:] or "png")
    plt.close(fig)
    return path


@contextlib.contextmanager
def _uninitialized_memory_unfilled():
    """The runs' ``deterministic=True`` turns torch's deterministic algorithms on, and with them
    the filling of every new uninitialised tensor with NaN (a check for kernels that read memory
    they never wrote): 13% of the demo's train step on a CPU core, for the same numbers (measured:
    equal weights after 25 steps with and without it). Left off while the demo trains."""
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill


def run_demo(settings: DemoSettings) -> list[DemoResult]:
    check_settings(settings)
    quiet_libraries()  # no Lightning advert or dependency warning before each scheme's run, as `rescale fit`
    os.makedirs(settings.out, exist_ok=True)
    data = DigitsDataModule(batch_size=settings.batch_size, seed=settings.seed)
    results = []
    with _uninitialized_memory_unfilled():
        for scheme in settings.schemes:
            log.info(f"\n=== {scheme}: cifar_resnet depth {settings.depth}, {settings.epochs} epochs ===")
            results.append(_train_one(settings, scheme, data))
    table = format_table(results)
    png = plot_curves(results, os.path.join(settings.out, "learning_curves.png"))
    with atomic_open(os.path.join(settings.out, "results.json")) as f:
        json.dump([{**asdict(r), "status": r.status} for r in results], f, indent=2)
    log.info(f"\nDigits (1,797 real 8x8 images, embedded), cifar_resnet depth {settings.depth}:\n")
    write_output(table)  # the demo's result
    log.info(f"\nlearning curves: {png}\nW&B runs: {os.path.join(settings.out, 'runs', 'wandb')} "
             f"(upload with `wandb sync`)")
    log.info("\n" + next_commands(settings))
    return results


def next_commands(settings: DemoSettings) -> str:
    """The demo's closing lines: what to run next, in the order a new user runs it."""
    out = settings.out if " " not in settings.out else f"'{settings.out}'"
    digits = "experiments/digits"
    return "\n".join([
        "Next:",
        f"  rescale compare {out}",
        "      # these runs against the bn baseline: table, compare/*_curves.png and *_metric.png",
        f"  rescale analyze signal --config {digits}/resnet56_bn.yaml --config {digits}/rescale56.yaml "
        "--input gaussian --samples 64",
        "      # why: the forward signal per block at initialisation (analysis/signal/)",
        f"  rescale study depth --config {digits}/resnet56_bn.yaml --depths 20 56 110 --budget_epochs 4",
        "      # a study: every scheme at three depths, 27 runs (studies/depth/; minutes on a CPU)",
        "  rescale --help                                      # every command",
    ])


def main(argv: list[str] | None = None) -> int:
    d = DemoSettings()
    p = UserArgumentParser(prog="rescale demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"epochs of each run ({d.epochs}: ~500 steps)")
    p.add_argument("--depth", type=int, default=d.depth, help=f"CIFAR ResNet depth, 6n+2 ({d.depth})")
    p.add_argument("--schemes", nargs="+", default=list(d.schemes),
                   help=f"the schemes trained, one run each ({' '.join(d.schemes)})")
    p.add_argument("--out", default=d.out, help=f"output folder: table, PNG, W&B runs ({d.out})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"the seed of every run's weights and data order ({d.seed})")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    run_demo(DemoSettings(schemes=tuple(args.schemes), depth=args.depth, epochs=args.epochs,
                          out=args.out, seed=args.seed, progress=not args.no_progress))
    return 0
