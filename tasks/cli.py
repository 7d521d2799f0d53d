"""The ``rescale`` command: Lightning's CLI for every task, plus the suite's own subcommands.

    rescale fit|validate|test|predict --config experiments/<task>/<run>.yaml [--key value ...]
    rescale demo [--epochs N] [--out DIR]
    rescale models [PATTERN] | rescale schemes

A run config holds only what differs from the ``_defaults.yaml`` files of its folder and the
folders above it up to ``experiments/`` (applied first, nearest last), so the shared recipe
lives in one place. Networks, optimizers, schedulers, data modules and loggers are chosen by
``class_path``/``init_args``; ``num_classes``/``in_channels`` are linked from the data module.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Optional

# Quiet start-up noise; must precede the heavy imports below.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import lightning.pytorch as L  # noqa: E402
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint  # noqa: E402
from lightning.pytorch.cli import LightningCLI  # noqa: E402

from .common.callbacks import DivergenceMonitor, LearnedScalarsLogger, TrainingDiverged  # noqa: E402
from .common.config import SaveConfigToRun  # noqa: E402
from .common.errors import UserError  # noqa: E402
from .common.networks import check_network  # noqa: E402

__all__ = ["RescaleCLI", "main", "defaults_for"]

TRAINER_SUBCOMMANDS = ("fit", "validate", "test", "predict")
DEFAULTS_NAME = "_defaults.yaml"


class RescaleCLI(LightningCLI):
    """LightningCLI with the data -> model links every classification-style task needs."""

    def add_arguments_to_parser(self, parser) -> None:
        for key in ("num_classes", "in_channels"):
            parser.link_arguments(f"data.{key}", f"model.init_args.{key}", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        """Check network and scheme names before anything is built, so a typo is one clear line
        (jsonargparse would otherwise wrap the error in its own multi-line report)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        init = config.get("model", {}).get("init_args", {}) or {}
        if "network" in init:
            check_network(init.get("network"), init.get("scheme"), init.get("scheme_options"))


def trainer_defaults() -> dict:
    return {
        "logger": {"class_path": "rescale_tasks.common.wandb_logger.SuiteWandbLogger",
                   "init_args": {"save_dir": "runs", "project": "rescale"}},
        # persistent callbacks: always present, whatever the config says
        "callbacks": [DivergenceMonitor(), LearnedScalarsLogger(),
                      ModelCheckpoint(save_last=True, filename="epoch{epoch:03d}", auto_insert_metric_name=False),
                      LearningRateMonitor(logging_interval="step")],
    }


def defaults_for(config_paths: list[str]) -> list[str]:
    """``_defaults.yaml`` files that apply to the given run configs, outermost first."""
    found: list[str] = []
    for cfg in config_paths:
        folder = Path(cfg).resolve().parent
        chain = []
        for parent in [folder, *folder.parents]:
            candidate = parent / DEFAULTS_NAME
            if candidate.is_file() and candidate != Path(cfg).resolve():
                chain.append(str(candidate))
            if parent.name == "experiments":
                break
        for path in reversed(chain):
            if path not in found:
                found.append(path)
    return found


def _config_args(argv: list[str]) -> list[str]:
    paths = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            paths.append(argv[i + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    return paths


def run_lightning(argv: list[str], run: bool = True, from_command_line: bool = False) -> RescaleCLI:
    configs = _config_args(argv)
    missing = [c for c in configs if not os.path.isfile(c)]
    if missing:
        raise UserError(f"config file not found: {missing[0]} (--config). Run configs live in "
                        f"experiments/<task>/, e.g. experiments/imagenet/rescale50.yaml")
    defaults = defaults_for(configs)
    if run:
        parser_kwargs = {cmd: {"default_config_files": defaults} for cmd in TRAINER_SUBCOMMANDS}
    else:  # parse and instantiate only (no subcommand): tests, notebooks, tools
        parser_kwargs = {"default_config_files": defaults}
        argv = argv[1:] if argv and argv[0] in TRAINER_SUBCOMMANDS else argv
    return RescaleCLI(L.LightningModule, L.LightningDataModule, subclass_mode_model=True,
                      subclass_mode_data=True, save_config_callback=SaveConfigToRun,
                      seed_everything_default=0, trainer_defaults=trainer_defaults(),
                      parser_kwargs=parser_kwargs, args=None if from_command_line else argv, run=run)


def _cmd_models(argv: list[str]) -> int:
    import rescale_core

    for name in rescale_core.list_models(argv[0] if argv else "*"):
        print(name)
    return 0


def _cmd_schemes(argv: list[str]) -> int:
    import rescale_core

    for name in rescale_core.list_schemes():
        print(name)
    return 0


def _cmd_demo(argv: list[str]) -> int:
    from .classification.demo import main as demo_main

    return demo_main(argv)


SUITE_COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "demo": _cmd_demo,
    "models": _cmd_models,
    "schemes": _cmd_schemes,
}


def main(argv: Optional[list[str]] = None) -> int:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in SUITE_COMMANDS:
            return SUITE_COMMANDS[argv[0]](argv[1:]) or 0
        run_lightning(argv, from_command_line=from_command_line)
        return 0
    except (UserError, TrainingDiverged) as err:
        print(f"error: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 1)
    finally:
        _finish_wandb()


def _finish_wandb() -> None:
    """Close the W&B run this command opened, so its history and summary are flushed to disk."""
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.finish()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
