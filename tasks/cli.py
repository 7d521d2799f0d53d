"""The ``rescale`` command: Lightning's CLI for every task, plus the suite's own subcommands.

    rescale fit|validate|test|predict --config experiments/<task>/<run>.yaml [--key value ...]
    rescale demo [--epochs N] [--out DIR]
    rescale models [PATTERN] | rescale schemes
    rescale --help                                  (every command, one line each)

A run config holds only what differs from the ``_defaults.yaml`` files of its folder and the
folders above it up to ``experiments/`` (applied first, nearest last), so the shared recipe
lives in one place. Networks, optimizers, schedulers, data modules and loggers are chosen by
``class_path``/``init_args``; ``num_classes``/``in_channels`` are linked from the data module.
"""
from __future__ import annotations

import copy
import os
import sys
import traceback
from pathlib import Path
from typing import Callable, Optional

# Quiet start-up noise; must precede the heavy imports below.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import lightning.pytorch as L  # noqa: E402
from lightning.pytorch.callbacks import LearningRateMonitor  # noqa: E402
from lightning.pytorch.cli import LightningCLI  # noqa: E402
from lightning.pytorch.utilities.exceptions import SIGTERMException  # noqa: E402

from .common.callbacks import DivergenceMonitor, LearnedScalarsLogger, TrainingDiverged  # noqa: E402
from .common.checkpointing import (EpochCheckpoint, LastCheckpoint, ResumeState, peek_checkpoint,  # noqa: E402
                                   preempted_message, stop_signal)
from .common.checkpoint_compat import (check_config_against_checkpoint, class_of,  # noqa: E402
                                       run_arguments_over_checkpoint, typed_model_arguments)
from .common.cli_errors import config_errors, trainer_config_errors  # noqa: E402
from .common.config import ResultsFolder, SaveConfigToRun  # noqa: E402
from .common.config_files import check_config_file  # noqa: E402
from .common.data_report import SkippedDataReport  # noqa: E402
from .common.progress import use_line_progress  # noqa: E402
from .common.quiet import quiet_evaluation, quiet_libraries  # noqa: E402
from .common.run_folder import check_run_outputs, claim_run_folder, resume_point  # noqa: E402
from .common.run_report import evaluation_report, fit_report  # noqa: E402
from .common.run_summary import RunSummary  # noqa: E402
from .common.wandb_logger import label_runs  # noqa: E402
from .common.errors import UserError  # noqa: E402
from .common.writable import require_writable  # noqa: E402
from .common.networks import check_network, resolved_architecture  # noqa: E402
from .common.optim_check import check_optimization  # noqa: E402

__all__ = ["RescaleCLI", "main", "defaults_for"]

TRAINER_SUBCOMMANDS = ("fit", "validate", "test", "predict")
DEFAULTS_NAME = "_defaults.yaml"


class RescaleCLI(LightningCLI):
    """LightningCLI with the data -> model links every classification-style task needs."""

    # --- one-line errors (parsers are built with exit_on_error=False, see run_lightning) ---
    def parse_arguments(self, parser, args) -> None:
        argv = sys.argv[1:] if args is None else args
        self._argv = [str(a) for a in argv] if isinstance(argv, (list, tuple)) else []  # for the closing line
        self._typed_model_arguments = typed_model_arguments(argv if isinstance(argv, (list, tuple)) else ())
        parsers = getattr(self, "_subcommand_parsers", {})
        sub = next((parsers[a] for a in argv if isinstance(a, str) and a in parsers), parser) \
            if isinstance(argv, (list, tuple)) else parser
        with config_errors(sub):  # the subcommand's parser knows the valid keys
            super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        """Refuse a checkpoint of another architecture before Lightning replaces the configured
        model with the checkpoint's hyper-parameters (which would hide the mismatch); then put
        back the model arguments the user set, which win over the checkpoint's
        (:func:`~rescale_tasks.common.checkpoint_compat.run_arguments_over_checkpoint`)."""
        sub = self.config.get("subcommand")
        before = None
        if sub:
            section = self.config[sub]
            check_config_against_checkpoint(section.get("model"), section.get("ckpt_path"),
                                            normalize=resolved_architecture)
            before = copy.deepcopy(section.get("model"))
        with config_errors(self.parser):
            super()._parse_ckpt_path()
        if sub and before is not None and self.config[sub].get("ckpt_path"):
            restored = run_arguments_over_checkpoint(before, self.config[sub].get("model"), self.config[sub].ckpt_path,
                                                     typed=getattr(self, "_typed_model_arguments", ()))
            for key, value in restored.items():
                self.config[sub].model.init_args[key] = value

    def instantiate_classes(self) -> None:
        with config_errors():  # a UserError raised in a constructor, unwrapped from jsonargparse's report
            super().instantiate_classes()
        if self.trainer is not None:  # (None: a caller that builds everything but the Trainer)
            label_runs(self.trainer.loggers, self.datamodule)  # run name/group {labels} from the data

    def instantiate_trainer(self, **kwargs):
        with trainer_config_errors():
            trainer = super().instantiate_trainer(**kwargs)
        trainer.callbacks.append(ResultsFolder(self._get(self.config_init, "output_dir")))
        return use_line_progress(trainer)  # a line every N steps where the output is a file

    def add_arguments_to_parser(self, parser) -> None:
        for key in ("num_classes", "in_channels", "vocab_size", "pad_index", "bos_index", "eos_index"):
            parser.link_arguments(f"data.{key}", f"model.init_args.{key}", apply_on="instantiate")
        # always-on callbacks, each with its own config section, e.g.
        # `last_checkpoint: {every_n_train_steps: N, every_minutes: M}`, `divergence: {check_every_n_steps: 25}`
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        parser.add_lightning_class_args(DivergenceMonitor, "divergence")
        parser.add_lightning_class_args(LearnedScalarsLogger, "learned_scalars")
        parser.add_lightning_class_args(RunSummary, "run_summary")  # run_summary.json for compare/studies
        parser.add_argument("--output_dir", type=Optional[str], default=None,
                            help="where test/predict write their result files (default: results/<checkpoint "
                                 "name>/ in the folder of the run that wrote --ckpt_path; see results_folder)")

    def before_instantiate_classes(self) -> None:
        """Check network and scheme names before anything is built, so a typo is one clear line
        (jsonargparse would otherwise wrap the error in its own multi-line report)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        init = config.get("model", {}).get("init_args", {}) or {}
        if "network" in init:
            check_network(init.get("network"), init.get("scheme"), init.get("scheme_options"))
        model_class = class_of(config.get("model", {}).get("class_path"))
        if hasattr(model_class, "check_arguments"):  # e.g. a missing checkpoint file, before any data work
            model_class.check_arguments(init)
        if self.subcommand in (None, "fit") and _is_task_module(model_class):  # torch's own value checks
            check_optimization(init, config.get("trainer"))
        if self.subcommand == "fit":
            resume_wandb_run(config)

    # --- the subcommands: their output folders checked before any data work, one closing line ---
    def fit(self, **kwargs) -> None:
        config = self.config["fit"]
        check_run_outputs(self.trainer, config.get("run_summary", {}).get("path"))
        kwargs["ckpt_path"] = resume_point(self.trainer, kwargs.get("ckpt_path"), _run_id_given(config))
        with claim_run_folder(self.trainer):
            self.trainer.fit(**kwargs)
        self._closing_line(fit_report(self.trainer, self._argv))

    def validate(self, **kwargs) -> None:
        self._evaluate("validate", **kwargs)

    def test(self, **kwargs) -> None:
        self._evaluate("test", **kwargs)

    def predict(self, **kwargs) -> None:
        self._evaluate("predict", **kwargs)

    def _evaluate(self, command: str, **kwargs) -> None:
        output_dir = self._get(self.config_init, "output_dir")
        if output_dir:
            require_writable(output_dir, "--output_dir", "give --output_dir a folder you can write")
        with quiet_evaluation():
            getattr(self.trainer, command)(**kwargs)
        self._closing_line(evaluation_report(command, self.trainer, self._argv, kwargs.get("ckpt_path")))

    def _closing_line(self, line: str) -> None:
        if self.trainer.is_global_zero:
            print(line, flush=True)


def _run_id_given(config) -> bool:
    """Whether the run's id is fixed by the user, so that each start of the same command is the
    same run (a run without a logger, or with Lightning's default one, has a fixed folder too)."""
    logger = config.get("trainer", {}).get("logger")
    if not hasattr(logger, "get"):
        return True
    init = logger.get("init_args") or {}
    return bool(init.get("id")) or init.get("version") is not None


def _is_task_module(model_class) -> bool:
    """Whether a model class builds its optimizer and schedule as the suite's task modules do."""
    from .common.module import RescaleTaskModule

    return isinstance(model_class, type) and issubclass(model_class, RescaleTaskModule)


def resume_wandb_run(config) -> None:
    """``fit --ckpt_path <file>``: continue the W&B run the checkpoint was written under (same
    run id, hence the same run and checkpoint folder) instead of starting a second run."""
    ckpt = config.get("ckpt_path")
    logger = config.get("trainer", {}).get("logger")
    if not ckpt or ckpt in ("last", "best", "hpc", "registry") or not hasattr(logger, "get"):
        return
    init = logger.get("init_args")
    if not str(logger.get("class_path", "")).endswith("WandbLogger") or init is None or init.get("id"):
        return
    run_id = peek_checkpoint(ckpt).run_id
    if run_id:
        init["id"] = run_id


class LoggedLearningRate(LearningRateMonitor):
    """Lightning's LearningRateMonitor, silent when the run has no logger (``trainer.logger:
    false``), where Lightning's own refuses to start the run."""

    def on_train_start(self, trainer: L.Trainer, *args, **kwargs) -> None:
        if trainer.loggers:
            super().on_train_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer: L.Trainer, *args, **kwargs) -> None:
        if trainer.loggers:
            super().on_train_batch_start(trainer, *args, **kwargs)

    def on_train_epoch_start(self, trainer: L.Trainer, *args, **kwargs) -> None:
        if trainer.loggers:
            super().on_train_epoch_start(trainer, *args, **kwargs)


def trainer_defaults() -> dict:
    return {
        "logger": {"class_path": "rescale_tasks.common.wandb_logger.SuiteWandbLogger",
                   "init_args": {"save_dir": "runs", "project": "rescale"}},
        # persistent callbacks: always present, whatever the config says
        # (and LastCheckpoint, DivergenceMonitor, LearnedScalarsLogger: see add_arguments_to_parser)
        "callbacks": [ResumeState(), SkippedDataReport(),
                      EpochCheckpoint(),  # epoch<NNN>.ckpt, completed epochs only
                      LoggedLearningRate(logging_interval="step")],
        # atomic saves; loading never runs code from the file
        "plugins": [{"class_path": "rescale_tasks.common.checkpointing.AtomicCheckpointIO"}],
    }


def defaults_for(config_paths: list[str]) -> list[str]:
    """``_defaults.yaml`` files that apply to the given run configs, outermost first: those of
    the config's folder and its parents up to the ``experiments`` folder holding it, or of the
    config's own folder alone outside an ``experiments`` tree (an unrelated ``_defaults.yaml``
    higher up, in a home or scratch folder, is never applied)."""
    found: list[str] = []
    for cfg in config_paths:
        folder = Path(cfg).resolve().parent
        parents = [folder, *folder.parents]
        top = next((i for i, p in enumerate(parents) if p.name == "experiments"), 0)
        chain = []
        for parent in parents[:top + 1]:
            candidate = parent / DEFAULTS_NAME
            if candidate.is_file() and candidate != Path(cfg).resolve():
                chain.append(str(candidate))
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
    for path in configs:
        check_config_file(path, "--config")
    defaults = defaults_for(configs)
    for path in defaults:
        check_config_file(path, f"the {DEFAULTS_NAME} applied to the run configs below its folder")
    quiet_libraries()  # before the Trainer is built: it prints an advert
    if any(a == "--print_config" or a.startswith("--print_config=") for a in argv):
        # stderr: the printed YAML on stdout stays a config that can be saved and reused
        print("# defaults applied (outermost first): " + (", ".join(defaults) or "none"), file=sys.stderr)
    if run:
        parser_kwargs = {cmd: {"default_config_files": defaults} for cmd in TRAINER_SUBCOMMANDS}
        parser_kwargs["exit_on_error"] = False  # raise, for one-line errors (subcommands inherit it)
    else:  # parse and instantiate only (no subcommand): tests, notebooks, tools
        parser_kwargs = {"default_config_files": defaults, "exit_on_error": False}
        argv = argv[1:] if argv and argv[0] in TRAINER_SUBCOMMANDS else argv
    return RescaleCLI(L.LightningModule, L.LightningDataModule, subclass_mode_model=True,
                      subclass_mode_data=True, save_config_callback=SaveConfigToRun,
                      seed_everything_default=0, trainer_defaults=trainer_defaults(),
                      parser_kwargs=parser_kwargs, args=None if from_command_line else argv, run=run)


def _cmd_models(argv: list[str]) -> int:
    import rescale_core

    from .common.errors import UserArgumentParser

    p = UserArgumentParser(prog="rescale models", description=COMMAND_HELP["models"])
    p.add_argument("pattern", nargs="?", default="*",
                   help="a shell-style pattern, e.g. 'rescale*', or a part of the name, e.g. resnet5 "
                        "(default: all)")
    pattern = p.parse_args(argv).pattern
    if not any(c in pattern for c in "*?["):
        pattern = f"*{pattern}*"  # no wildcard: a part of the name
    names = rescale_core.list_models(pattern)
    if not names:
        print(f"error: no registered network matches {pattern!r} (rescale models: all of them)", file=sys.stderr)
        return 1
    for name in names:
        print(name)
    return 0


def _cmd_schemes(argv: list[str]) -> int:
    import rescale_core

    from .common.errors import UserArgumentParser

    UserArgumentParser(prog="rescale schemes", description=COMMAND_HELP["schemes"]).parse_args(argv)
    for name in rescale_core.list_schemes():
        print(name)
    return 0


def _cmd_demo(argv: list[str]) -> int:
    from .classification.demo import main as demo_main

    return demo_main(argv)


def _run_module(module: str, argv: list[str]) -> int:
    import importlib

    return importlib.import_module(module).main(argv)


def _studies(module: str) -> Callable[[list[str]], int]:
    """``rescale analyze|study|compare``: the papers' studies (imported when called)."""
    return lambda argv: _run_module(f"rescale_tasks.studies.{module}", argv)


SUITE_COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "analyze": _studies("analyze"),
    "study": _studies("study"),
    "compare": _studies("compare"),
    "average-checkpoints": lambda argv: _run_module("rescale_tasks.common.averaging", argv),
    "prepare-translation": lambda argv: _run_module("rescale_tasks.translation.prepare", argv),
    "translate": lambda argv: _run_module("rescale_tasks.translation.translate", argv),
    "prepare-video": lambda argv: _run_module("rescale_tasks.video.prepare", argv),
    "demo": _cmd_demo,
    "models": _cmd_models,
    "schemes": _cmd_schemes,
}


# ``rescale --help``: one line per command, every command of the suite (tested)
COMMAND_HELP: dict[str, str] = {
    "fit": "train a model: --config experiments/<task>/<run>.yaml [--key value ...]",
    "validate": "one evaluation pass over the validation set (--config ... --ckpt_path FILE)",
    "test": "one evaluation pass over the test set (--config ... --ckpt_path FILE)",
    "predict": "a checkpoint's predictions on the test split (--config ... --ckpt_path FILE)",
    "demo": "train one deep ResNet under bn/rescale/skipinit/fixup/none on embedded digits",
    "models": "list the registered networks [PATTERN]",
    "schemes": "list the registered residual schemes",
    "prepare-translation": "SentencePiece model and encoded corpus of a parallel text folder, once",
    "prepare-video": "re-encode a video data set (short side, keyframes) for clip decoding, once",
    "translate": "translate text with a translation checkpoint (beam search)",
    "average-checkpoints": "average the weights of a run's last N checkpoints",
    "analyze": "probes of runs: signal propagation, learned scalars, dead ReLUs",
    "study": "the papers' studies as grids of fit runs: depth, batch-lr, seeds",
    "compare": "each normalization-free run against its normalized baseline: table, plots",
}


def print_help() -> None:
    width = max(map(len, COMMAND_HELP))
    lines = ["usage: rescale <command> [options]    (rescale <command> --help: its options)", "",
             "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, text in COMMAND_HELP.items()]
    lines += ["", "New here? `rescale demo`, then the commands it prints; the README's quick start."]
    print("\n".join(lines))


def main(argv: Optional[list[str]] = None) -> int:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print_help()
        return 0
    try:
        if argv and argv[0] in SUITE_COMMANDS:
            return SUITE_COMMANDS[argv[0]](argv[1:]) or 0
        run_lightning(argv, from_command_line=from_command_line)
        return 0
    except (UserError, TrainingDiverged) as err:
        if os.environ.get("RESCALE_TRACEBACK", "") not in ("", "0"):  # the error behind the line
            traceback.print_exception(getattr(err, "original", None) or err, file=sys.stderr)
        print(f"error: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 1)
    except SIGTERMException as err:  # SIGTERM, or Ctrl-C while training (common.checkpointing)
        print(f"error: {preempted_message(err)}", file=sys.stderr)
        return 128 + stop_signal(err)
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
