"""The suite's LightningCLI: how ``rescale fit|validate|test|predict`` builds and runs a task.

:func:`run_lightning` applies the ``_defaults.yaml`` files of the run configs' folders
(:mod:`.config_layers`), checks the config files, then builds :class:`RescaleCLI`: Lightning's CLI
with the data -> model links every task needs, the always-on callbacks (each with its own config
section), one-line errors for bad configs, a checkpoint of another architecture refused before it
is loaded, and one closing line per command. Networks, optimizers, schedulers, data modules and
loggers are chosen by ``class_path``/``init_args``.
"""
from __future__ import annotations

import copy
import logging
import os
import re
import sys
import warnings
from typing import Optional

import lightning.pytorch as L
import yaml
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from ..checkpoints import (LAST_NAME, CheckpointError, EpochCheckpoint, LastCheckpoint, ResumeState,
                           check_config_against_checkpoint, checkpoint_exists, peek_checkpoint, planned_checkpoint_folder,
                           run_arguments_over_checkpoint, typed_model_arguments)
from ..data import TaskDataModule
from ..errors import ConfigError, UserError
from ..module import RescaleTaskModule
from ..reporting import discard_run, label_runs, use_line_progress
from ..run import (ResultsFolder, RunSummary, SaveConfigToRun, SkippedDataReport, check_run_outputs,
                   checkpoint_results_folder, claim_run_folder, evaluation_checkpoint, evaluation_report, fit_report,
                   keep_csv_history, refuse_starting_over, resume_point)
from ..system import rank_zero_log, require_writable, write_output
from ..training import (DivergenceMonitor, LearnedScalarsLogger, WeightEMA, check_network, check_optimization, class_of,
                        resolved_architecture)
from .config_files import SafeLoader, files_read_once, refuse_duplicate_keys
from .config_layers import (CLASS_ARGUMENTS, CONFIG_FLAGS, carried_arguments, check_layers, flag_values, key_location,
                            option_sets, refuse_lost_overrides, replaced_mappings)
from .moved_modules import follow_moved_modules
from .parse_errors import config_errors, trainer_config_errors
from .quiet import quiet_evaluation, quiet_libraries, quiet_resume

__all__ = ["RescaleCLI", "run_lightning", "trainer_defaults", "resume_wandb_run", "LoggedLearningRate",
           "TRAINER_SUBCOMMANDS"]

TRAINER_SUBCOMMANDS = ("fit", "validate", "test", "predict")
# the model arguments the data module sets (its classes, image channels, vocabulary)
LINKED_FROM_DATA = ("num_classes", "in_channels", "vocab_size", "pad_index", "bos_index", "eos_index")

log = logging.getLogger(__name__)


class RescaleCLI(LightningCLI):
    """LightningCLI with the data -> model links every classification-style task needs.

    ``subcommands``: the subcommands whose parsers are built (None: Lightning's four). A command
    line names one, and each parser costs about as much as the rest of a tiny run's start (the
    trainer's, model's and data's arguments from their signatures): ``rescale fit`` builds fit's
    alone."""

    def __init__(self, *args, subcommands: Optional[tuple[str, ...]] = None, from_command_line: bool = False,
                 **kwargs) -> None:
        self._built_subcommands = subcommands
        # ``args`` are the command line less what ``rescale`` takes before the command (--quiet,
        # --verbose): parsed instead of sys.argv, which still holds them, without Lightning's warning
        self._from_command_line = from_command_line
        super().__init__(*args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:  # Lightning's is static; every call is ``self.subcommands()``
        every = LightningCLI.subcommands()
        if not self._built_subcommands:
            return every
        return {name: skip for name, skip in every.items() if name in self._built_subcommands}

    # --- one-line errors (parsers are built with exit_on_error=False, see run_lightning) ---
    def parse_arguments(self, parser, args) -> None:
        argv = sys.argv[1:] if args is None else args
        self._argv = [str(a) for a in argv] if isinstance(argv, (list, tuple)) else []  # for the closing line
        self._typed_model_arguments = typed_model_arguments(argv if isinstance(argv, (list, tuple)) else ())
        linked = sorted(self._typed_model_arguments & set(LINKED_FROM_DATA))
        if linked:
            raise ConfigError(f"model.init_args.{linked[0]} is set from the data module (data.{linked[0]}), and a "
                              f"value given for it is not used: drop --model.init_args.{linked[0]} (the data decides "
                              "it: its classes, channels or vocabulary)")
        parsers = getattr(self, "_subcommand_parsers", {})  # Lightning's (system.private_apis)
        sub = next((parsers[a] for a in argv if isinstance(a, str) and a in parsers), parser) \
            if isinstance(argv, (list, tuple)) else parser
        try:
            with config_errors(sub), warnings.catch_warnings():  # the subcommand's parser knows the valid keys
                if self._from_command_line:
                    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
                super().parse_arguments(parser, args)
        except ConfigError as err:
            raise _naming_the_file(err, self._argv) from None

    def _parse_ckpt_path(self) -> None:
        """Refuse a checkpoint of another architecture before Lightning replaces the configured
        model with the checkpoint's hyper-parameters (which would hide the mismatch); then put
        back the model arguments the user set, which win over the checkpoint's
        (:func:`~rescale_tasks.common.checkpoints.run_arguments_over_checkpoint`). Lightning's own
        step (listed in :mod:`~rescale_tasks.common.system.private_apis`): the public hooks come before
        it (``parse_arguments``) or after it (``before_instantiate_classes``), and neither would turn a
        checkpoint whose hyper-parameters do not parse into one line. Lightning reads
        hyper-parameters from a file's path only: ``--ckpt_path last`` is read from this run's
        ``last.ckpt`` (:func:`_last_checkpoint_file`), and stays ``last`` for the run."""
        sub = self.config.get("subcommand")
        before = given = None
        if sub:
            section = self.config[sub]
            given = section.get("ckpt_path")
            if given == "last":
                section.ckpt_path = _last_checkpoint_file(section) or given
            check_config_against_checkpoint(section.get("model"), section.get("ckpt_path"),
                                            normalize=resolved_architecture, evaluating=sub != "fit")
            before = copy.deepcopy(section.get("model"))
        try:
            with config_errors(self.parser):
                super()._parse_ckpt_path()
            if sub and before is not None and self.config[sub].get("ckpt_path"):
                restored = run_arguments_over_checkpoint(before, self.config[sub].get("model"),
                                                         self.config[sub].ckpt_path,
                                                         typed=getattr(self, "_typed_model_arguments", ()))
                for key, value in restored.items():
                    self.config[sub].model.init_args[key] = value
            if sub in ("validate", "test", "predict") and self.config[sub].get("ckpt_path"):
                _class_count_from_checkpoint(self.config[sub], self.config[sub].ckpt_path)
        finally:
            if sub:
                self.config[sub].ckpt_path = given

    def _dump_config(self) -> None:
        """Lightning's (:mod:`~rescale_tasks.common.system.private_apis`): the config as a
        checkpoint's hyper-parameters record it, for ``load_from_checkpoint``. Dumped without
        checking it again (``skip_validation``): it was checked when it was parsed (and
        ``_parse_ckpt_path`` puts back only values that were), and the second check cost as much
        as the parse."""
        if hasattr(self, "config_dump"):
            return
        dumped = self.parser.dump(self.config, skip_link_targets=False, skip_none=False, format="yaml",
                                  skip_validation=True)
        self.config_dump = yaml.load(dumped, Loader=SafeLoader)
        if "subcommand" in self.config:
            self.config_dump = self.config_dump[self.config.subcommand]

    def _setting(self, key: str):
        """``key`` of the running subcommand's config (of the whole config without a subcommand)."""
        return self.config_init.get(str(self.subcommand), self.config_init).get(key)

    def instantiate_classes(self) -> None:
        with config_errors():  # a UserError raised in a constructor, unwrapped from jsonargparse's report
            super().instantiate_classes()
        self._refuse_values_the_data_replaced()
        if self.trainer is not None:  # (None: a caller that builds everything but the Trainer)
            label_runs(self.trainer.loggers, self.datamodule)  # run name/group {labels} from the data

    def _refuse_values_the_data_replaced(self) -> None:
        """A linked argument (``num_classes`` ...) that a config file, or a mapping on the command
        line (``--model.init_args '{num_classes: 5}'``), gives a value other than the data module's is
        refused in one line naming the file: the link puts the data's value in its place without a
        word (``--model.init_args.num_classes`` itself is refused in :meth:`parse_arguments`)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        init = (config.get("model") or {}).get("init_args") or {}
        hparams = getattr(self.model, "hparams", {})
        argv = getattr(self, "_argv", [])
        for key in LINKED_FROM_DATA:
            given, actual = init.get(key), hparams.get(key)
            if given is None or key not in hparams or given == actual:
                continue
            where = key_location(f"model.init_args.{key}", flag_values(argv, CONFIG_FLAGS))
            typed = option_sets(argv, f"model.init_args.{key}")  # even the class's default
            if where is None and (not typed or config.get("ckpt_path")):
                continue  # the class's default, or a checkpoint's value
            raise ConfigError(f"{where + ': ' if where else ''}model.init_args.{key}: {given} is set from the data "
                              f"module, which gives {actual} (data.{key}), and the value given is not used: drop "
                              f"model.init_args.{key} (the data decides it: its classes, channels or vocabulary)")

    def instantiate_trainer(self, **kwargs):
        with trainer_config_errors():
            trainer = super().instantiate_trainer(**kwargs)
        trainer.callbacks.append(ResultsFolder(self._setting("output_dir")))
        return use_line_progress(trainer)  # a line every N steps where the output is a file

    def add_arguments_to_parser(self, parser) -> None:
        for key in LINKED_FROM_DATA:
            parser.link_arguments(f"data.{key}", f"model.init_args.{key}", apply_on="instantiate")
        # always-on callbacks, each with its own config section, e.g.
        # `last_checkpoint: {every_n_train_steps: N, every_minutes: M}`, `divergence: {check_every_n_steps: 25}`
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        parser.add_lightning_class_args(DivergenceMonitor, "divergence")
        parser.add_lightning_class_args(LearnedScalarsLogger, "learned_scalars")
        parser.add_lightning_class_args(WeightEMA, "ema")  # off unless ema.decay is given
        parser.add_lightning_class_args(RunSummary, "run_summary")  # run_summary.json for compare/studies
        parser.add_argument("--output_dir", type=Optional[str], default=None,
                            help="where test/predict write their result files (default: results/<checkpoint "
                                 "name>/ in the folder of the run that wrote --ckpt_path; see results_folder)")
        parser.add_argument("--resume_other_data", type=bool, default=False,
                            help="fit --ckpt_path: resume a checkpoint whose run read other data than this run "
                                 "reads (another class set, split or corpus: its data fingerprint differs), which "
                                 "is refused otherwise; the run's curves and summary then pool both")
        if self._built_subcommands is None:
            # parse and instantiate only (run_lightning's run=False: rescale analyze, export): the config
            # a fit run saved (rescale_config.yaml) holds fit's own arguments (ckpt_path, weights_only),
            # parsed here as fit's parser parses them, and not used
            parser.add_method_arguments(self.trainer_class, "fit", skip=set(LightningCLI.subcommands()["fit"]))

    def before_instantiate_classes(self) -> None:
        """Check network and scheme names before anything is built, so a typo is one clear line
        (jsonargparse would otherwise wrap the error in its own multi-line report)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        init = config.get("model", {}).get("init_args", {}) or {}
        model_class = class_of(config.get("model", {}).get("class_path"))
        for line in carried_arguments(getattr(self, "_argv", []), _class_arguments(init)):
            rank_zero_log(log, logging.WARNING, line)  # an optimizer's class changed, the recipe's lr kept
        if "network" in init and _builds_registered_network(model_class):
            check_network(init.get("network"), init.get("scheme"), init.get("scheme_options"))
        if (config.get("trainer") or {}).get("enable_checkpointing") is False:
            argv = getattr(self, "_argv", [])
            where = None if _given_as_flag("trainer.enable_checkpointing", argv) else \
                key_location("trainer.enable_checkpointing", flag_values(argv, CONFIG_FLAGS))
            raise ConfigError(f"{where + ': ' if where else ''}trainer.enable_checkpointing false: every run of the suite "
                              "writes last.ckpt and epoch<NNN>.ckpt (always-on callbacks, which resuming, the run "
                              "summary and the closing line's next command rely on), so checkpointing cannot be turned "
                              "off; drop trainer.enable_checkpointing (last_checkpoint: {every_n_train_steps: N, "
                              "every_minutes: M} sets how often last.ckpt is written in between)")
        if hasattr(model_class, "check_arguments"):  # e.g. a missing checkpoint file, before any data work
            model_class.check_arguments(init)
        if self.subcommand in (None, "fit") and _is_task_module(model_class):  # torch's own value checks
            _refuse_lightning_optimizer(config, model_class)
            check_optimization(init, config.get("trainer"))
        if self.subcommand == "fit":
            resume_wandb_run(config)

    # --- the subcommands: their output folders checked before any data work, one closing line ---
    def fit(self, **kwargs) -> None:
        config = self.config["fit"]
        check_run_outputs(self.trainer, config.get("run_summary", {}).get("path"))
        kwargs["ckpt_path"] = resume_point(self.trainer, kwargs.get("ckpt_path"), _run_id_given(config))
        if isinstance(self.model, RescaleTaskModule):
            self.model.resume_other_data = bool(config.get("resume_other_data"))
        self._give_checkpoint_labels(kwargs["ckpt_path"])
        with claim_run_folder(self.trainer):  # a run still training is named first
            refuse_starting_over(self.trainer, kwargs["ckpt_path"])
            keep_csv_history(self.trainer, kwargs["ckpt_path"])
            with quiet_resume(kwargs["ckpt_path"] is not None):
                try:
                    self.trainer.fit(**kwargs)
                except UserError:
                    _discard_untrained_runs(self.trainer)
                    raise
        self._closing_line(fit_report(self.trainer, self._argv))

    def validate(self, **kwargs) -> None:
        self._evaluate("validate", **kwargs)

    def test(self, **kwargs) -> None:
        self._evaluate("test", **kwargs)

    def predict(self, **kwargs) -> None:
        # the task writes its predictions to a file as they come (common.run.predictions): Lightning
        # need not keep every batch's outputs in memory too
        kwargs["return_predictions"] = False
        self._evaluate("predict", **kwargs)

    def _evaluate(self, command: str, **kwargs) -> None:
        kwargs["ckpt_path"] = evaluation_checkpoint(self.trainer, command, kwargs.get("ckpt_path"),
                                                    _run_id_given(self.config[command]))
        output_dir = self._setting("output_dir")
        if output_dir:
            require_writable(output_dir, "--output_dir", "give --output_dir a folder you can write")
        elif command == "predict" and kwargs["ckpt_path"] and os.path.isfile(kwargs["ckpt_path"]):
            # every task's predict writes its file there once the whole split is predicted: checked first
            require_writable(checkpoint_results_folder(kwargs["ckpt_path"]), "the results folder beside the checkpoint",
                             "give --output_dir a folder you can write")
        self._give_checkpoint_labels(kwargs["ckpt_path"])
        with quiet_evaluation():
            getattr(self.trainer, command)(**kwargs)
        self._closing_line(evaluation_report(command, self.trainer, self._argv, kwargs.get("ckpt_path")))

    def _give_checkpoint_labels(self, ckpt_path: Optional[str]) -> None:
        """The labels ``ckpt_path`` records, handed to the data module before its setup, whose check
        of its class count then names the classes the data lacks or adds (a val/ that lost a class
        folder), not the count."""
        if isinstance(self.datamodule, TaskDataModule) and ckpt_path and checkpoint_exists(str(ckpt_path)):
            try:
                self.datamodule.trained_labels = peek_checkpoint(str(ckpt_path)).labels
            except (CheckpointError, OSError):  # unreadable or unreachable: Lightning's restore says so in one line
                pass

    def _closing_line(self, line: str) -> None:
        if self.trainer.is_global_zero:
            log.info(line)


def _discard_untrained_runs(trainer: L.Trainer) -> None:
    """A fit refused before this process trained a batch (a resume whose data, layout or checkpoint
    does not fit, found once the W&B run has started: under FSDP the checkpoint is read after it)
    leaves no offline W&B run behind: it holds none of the run's results, only the refused config,
    which ``wandb sync`` would make the run's, and a run for ``compare --wandb_project`` to read."""
    summary = next((c for c in trainer.callbacks if isinstance(c, RunSummary)), None)
    if trainer.global_rank != 0 or summary is None or summary.stepped:
        return
    for logger in trainer.loggers:
        discard_run(logger)


def _naming_the_file(err: ConfigError, argv: list[str]) -> ConfigError:
    """``err`` about a key a config file sets (``unknown config key trainer.max_epoch``, ``bad value
    for ...``) led by that file and line (``run.yaml:3: unknown config key ...``), where the value
    came from a file and not from the command line; other errors as they are."""
    match = _KEY_IN_ERROR.match(str(err))
    if not match or _given_as_flag(match.group(1), argv):
        return err
    where = key_location(match.group(1), flag_values(argv, CONFIG_FLAGS))
    if where is None:
        return err
    named = ConfigError(f"{where}: {err}")
    named.original = getattr(err, "original", None) or err
    return named


_KEY_IN_ERROR = re.compile(r"^(?:unknown config key|bad value for) ([^\s:;]+)")


def _given_as_flag(key: str, argv: list[str]) -> bool:
    """Whether an option of ``argv`` sets ``key`` or a section above it (``init_args`` levels aside)."""
    def parts(name: str) -> tuple[str, ...]:
        return tuple(p for p in name.split(".") if p and p != "init_args")

    wanted = parts(key)
    for arg in argv:
        name = arg[2:].partition("=")[0].rstrip("+") if arg.startswith("--") else ""
        if name and name not in ("config", "print_config") and wanted[:len(parts(name))] == parts(name):
            return True
    return False


def _class_arguments(init) -> dict[str, dict]:
    """The ``init_args`` the model's class arguments (:data:`~.config_layers.CLASS_ARGUMENTS`) were
    parsed to, by dotted name."""
    found = {}
    for argument in CLASS_ARGUMENTS:
        given = init.get(argument.split(".", 1)[1]) if hasattr(init, "get") else None
        arguments = given.get("init_args") if hasattr(given, "get") else None
        if hasattr(arguments, "get"):
            found[argument] = arguments.as_dict() if hasattr(arguments, "as_dict") else dict(arguments)
    return found


def _refuse_lightning_optimizer(config, model_class) -> None:
    """Refuse, in one line, Lightning's own top-level ``optimizer`` / ``lr_scheduler`` (``--optimizer
    Adam``) for a task module: Lightning's CLI would replace the module's ``configure_optimizers``
    with one of its own (dropping the parameter groups and ``model.init_args.lr_scheduler``, with a
    warning at most), and a ``--lr_scheduler`` without ``--optimizer`` is ignored without a word.
    A run's saved ``rescale_config.yaml`` holds both as null, which passes."""
    effects = {"optimizer": "replace {module}'s optimizer, its parameter groups and model.init_args.lr_scheduler",
               "lr_scheduler": "be ignored by {module} (or, with a top-level optimizer, replace its schedule)"}
    for key, effect in effects.items():
        given = config.get(key)
        if given is None:
            continue
        name = str(given.get("class_path", given) if hasattr(given, "get") else given).rsplit(".", 1)[-1]
        raise ConfigError(f"{key}: {name} at the top level (--{key}) is Lightning's own option, which would "
                          f"{effect.format(module=model_class.__name__)}; set model.init_args.{key} instead "
                          f"(--model.init_args.{key} {name} --model.init_args.{key}.init_args.<name> <value>) and "
                          f"drop the top-level {key}")


def _run_id_given(config) -> bool:
    """Whether the run's id is fixed by the user, so that each start of the same command is the
    same run (a run without a logger, or with Lightning's default one, has a fixed folder too)."""
    logger = config.get("trainer", {}).get("logger")
    if not hasattr(logger, "get"):
        return True
    init = logger.get("init_args") or {}
    return bool(init.get("id")) or init.get("version") is not None


def _class_count_from_checkpoint(section, ckpt_path: str) -> None:
    """An evaluation's data left to count its classes itself (``data.num_classes: null``) numbers the
    classes the checkpoint's network learned (its ``num_classes``) where the data module says its
    count numbers integer labels (``counts_integer_labels``: the video task's integer-labelled list
    files, whose validation list alone need not name the highest class); named classes are their own
    count, matched to the checkpoint's by name."""
    data = section.get("data")
    init = data.get("init_args") if hasattr(data, "get") else None
    if not hasattr(init, "get") or "num_classes" not in init or init.get("num_classes") is not None:
        return
    counts = getattr(class_of(data.get("class_path")), "counts_integer_labels", None)
    arguments = init.as_dict() if hasattr(init, "as_dict") else dict(init)
    if counts is None or not counts(arguments):
        return
    if not checkpoint_exists(str(ckpt_path)):
        return
    count = peek_checkpoint(ckpt_path).hyper_parameters.get("num_classes")
    if isinstance(count, int) and not isinstance(count, bool) and count > 0:
        init["num_classes"] = count


def _last_checkpoint_file(config) -> Optional[str]:
    """The ``last.ckpt`` that ``fit --ckpt_path last`` resumes (:func:`~rescale_tasks.common.run.resume_point`),
    found from the config before the Trainer is built: in the run's checkpoint folder
    (:func:`~rescale_tasks.common.checkpoints.planned_checkpoint_folder`, with the configured logger);
    None when the run has none, or no fixed id (``last`` then resumes nothing)."""
    trainer = config.get("trainer") or {}
    logger = trainer.get("logger")
    logger = logger[0] if isinstance(logger, list) and logger else logger
    if not _run_id_given(config):
        return None  # a new run id: nothing of this run to resume
    if logger is True:
        return None  # Lightning's default logger: a new version, and a new folder, at every start
    if hasattr(logger, "get"):
        init = logger.get("init_args")
        logger = class_of(logger.get("class_path"))(**(init.as_dict() if hasattr(init, "as_dict") else init or {}))
    callbacks = trainer.get("callbacks") or []
    checkpoint = next((c for c in (callbacks if isinstance(callbacks, list) else [callbacks])
                       if hasattr(c, "get") and _is_checkpoint_callback(class_of(c.get("class_path")))), None)
    dirpath = (checkpoint.get("init_args") or {}).get("dirpath") if checkpoint is not None else None
    folder = planned_checkpoint_folder(logger if logger else None, trainer.get("default_root_dir"),
                                       os.path.expanduser(dirpath) if dirpath else None,
                                       (config.get("last_checkpoint") or {}).get("dirpath"))
    path = os.path.join(folder, LAST_NAME)
    return path if checkpoint_exists(path) else None


def _is_checkpoint_callback(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, ModelCheckpoint)


def _builds_registered_network(model_class) -> bool:
    """Whether ``model_class`` builds ``network`` by name from ``rescale_core``'s registry, as
    the suite's task modules do (an unknown class too: its network is checked as theirs). A
    task module of one's own whose ``build_network`` builds another network (one outside the
    registry) checks its own arguments when it is built."""
    build = getattr(model_class, "build_network", None)
    return build is None or getattr(build, "__module__", "").startswith(f"{RescaleTaskModule.__module__.split('.')[0]}.")


def _is_task_module(model_class) -> bool:
    """Whether a model class builds its optimizer and schedule as the suite's task modules do."""
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
    false``), where Lightning's own refuses to start the run, and logging once per optimizer step:
    under gradient accumulation Lightning's logs the same rates at the same step for every batch
    of the window."""

    _logged_step: Optional[int] = None

    def on_train_start(self, trainer: L.Trainer, *args, **kwargs) -> None:
        if trainer.loggers:
            super().on_train_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer: L.Trainer, *args, **kwargs) -> None:
        if trainer.loggers and trainer.global_step != self._logged_step:
            self._logged_step = trainer.global_step
            super().on_train_batch_start(trainer, *args, **kwargs)

    def on_train_epoch_start(self, trainer: L.Trainer, *args, **kwargs) -> None:
        if trainer.loggers:
            super().on_train_epoch_start(trainer, *args, **kwargs)


def trainer_defaults() -> dict:
    """The Trainer settings every run starts from: the suite's W&B logger, the callbacks always
    present and atomic checkpoint saves."""
    return {
        "logger": {"class_path": "rescale_tasks.common.reporting.SuiteWandbLogger",
                   "init_args": {"save_dir": "runs", "project": "rescale"}},
        # persistent callbacks: always present, whatever the config says
        # (and LastCheckpoint, DivergenceMonitor, LearnedScalarsLogger: see add_arguments_to_parser)
        "callbacks": [ResumeState(), SkippedDataReport(),
                      EpochCheckpoint(),  # epoch<NNN>.ckpt, completed epochs only
                      LoggedLearningRate(logging_interval="step")],
        # atomic saves; loading never runs code from the file
        "plugins": [{"class_path": "rescale_tasks.common.checkpoints.AtomicCheckpointIO"}],
    }


def run_lightning(argv: list[str], run: bool = True, from_command_line: bool = False) -> RescaleCLI:
    """Run ``rescale fit|validate|test|predict`` with ``argv`` once its config files are checked and
    their ``_defaults.yaml`` applied. ``run=False``: parse and instantiate only (no subcommand), for
    tests, notebooks and the studies; ``from_command_line``: ``argv`` is the command line (``sys.argv``
    less the log flags ``rescale`` took before the command)."""
    with files_read_once():  # each config file read and composed once by the checks below
        refuse_duplicate_keys()  # in YAML values on the command line too
        follow_moved_modules()  # the class paths of configs written before the modules moved
        defaults = check_layers(flag_values(argv, CONFIG_FLAGS))
        refuse_lost_overrides(argv)  # an option before a --config that sets it again
        for line in replaced_mappings(argv):  # a mapping given whole drops the keys set before it
            rank_zero_log(log, logging.WARNING, line)
        quiet_libraries()  # before the Trainer is built: it prints an advert
        # once per run: under DDP the other ranks run this command again (Lightning's launcher)
        rank_zero_log(log, logging.DEBUG, "defaults applied (outermost first): " + (", ".join(defaults) or "none"))
        printing = [a.partition("=")[2] for a in argv if a == "--print_config" or a.startswith("--print_config=")]
        if printing:
            # a comment beside the printed config, on stderr: the YAML on stdout stays a config that can be
            # saved and reused
            write_output("# defaults applied (outermost first): " + (", ".join(defaults) or "none"), sys.stderr)
            if defaults and any("skip_default" in flags.split(",") for flags in printing):
                # jsonargparse counts what the _defaults.yaml set as defaults: the output is a run config
                folder = os.path.dirname(flag_values(argv, CONFIG_FLAGS)[0]) or "."
                write_output(f"# skip_default leaves out what these defaults set too (network, optimizer, data ...): "
                             f"the printed config builds this run only as a --config in {folder}, where they apply",
                             sys.stderr)
        if run:
            # the subcommand the command line names gets a parser; all four only for a line that names none
            built = (argv[0],) if argv and argv[0] in TRAINER_SUBCOMMANDS else TRAINER_SUBCOMMANDS
            parser_kwargs = {cmd: {"default_config_files": defaults} for cmd in built}
            parser_kwargs["exit_on_error"] = False  # raise, for one-line errors (subcommands inherit it)
            # an abbreviated key (trainer.max_epoch) is a misspelling to name, not a key to guess (inherited too)
            parser_kwargs["allow_abbrev"] = False
        else:  # parse and instantiate only (no subcommand): tests, notebooks, tools
            parser_kwargs = {"default_config_files": defaults, "exit_on_error": False, "allow_abbrev": False}
            argv = argv[1:] if argv and argv[0] in TRAINER_SUBCOMMANDS else argv
        return RescaleCLI(L.LightningModule, L.LightningDataModule, subclass_mode_model=True,
                          subclass_mode_data=True, save_config_callback=SaveConfigToRun,
                          seed_everything_default=0, trainer_defaults=trainer_defaults(),
                          parser_kwargs=parser_kwargs, args=argv, run=run,
                          subcommands=built if run else None, from_command_line=from_command_line)
