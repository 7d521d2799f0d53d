"""The command line of ``rescale fit|validate|test|predict``: the suite's LightningCLI, the layers of
a run's configuration, config files checked before jsonargparse reads them, one-line errors, the
class paths of configs written before a module moved, and how every command ends.

- ``lightning_commands``: the suite's LightningCLI: how ``rescale fit|validate|test|predict`` runs a task
- ``config_layers``: the layers of a run's configuration: ``_defaults.yaml``, ``--config`` files, overrides
- ``config_files``: config files checked before jsonargparse reads them (one line naming a bad one)
- ``parse_errors``: one-line messages for bad config keys and values
- ``moved_modules``: the modules' earlier paths, still followed in configs and checkpoints
- ``quiet``: other libraries' messages that concern no run, silenced one by one
- ``command``: how every command ends: one error line, an exit status, W&B flushed
- ``build_only``: a task's module and data module built as ``rescale fit`` builds them, not trained
"""
from .lightning_commands import (TRAINER_SUBCOMMANDS, LoggedLearningRate, RescaleCLI, resume_wandb_run,
                                 run_lightning, trainer_defaults)
from .config_layers import CONFIG_FLAGS, DEFAULTS_NAME, check_layers, defaults_for, flag_values, yaml_layers
from .config_files import (DuplicateKeyError, UniqueKeyLoader, check_config_file, load_yaml,
                           refuse_duplicate_keys)
from .parse_errors import (config_errors, describe_argument_error, flatten, trainer_config_errors,
                           user_error_in)
from .moved_modules import MOVED_MODULES, follow_moved_modules
from .quiet import quiet_evaluation, quiet_libraries
from .command import run_command
from .build_only import BUILD_ONLY, build_run

__all__ = ["TRAINER_SUBCOMMANDS", "LoggedLearningRate", "RescaleCLI", "resume_wandb_run", "run_lightning",
           "trainer_defaults", "CONFIG_FLAGS", "DEFAULTS_NAME", "check_layers", "defaults_for", "flag_values",
           "yaml_layers", "DuplicateKeyError", "UniqueKeyLoader", "check_config_file", "load_yaml",
           "refuse_duplicate_keys", "config_errors", "describe_argument_error", "flatten",
           "trainer_config_errors", "user_error_in", "MOVED_MODULES", "follow_moved_modules",
           "quiet_evaluation", "quiet_libraries", "run_command", "BUILD_ONLY", "build_run"]
