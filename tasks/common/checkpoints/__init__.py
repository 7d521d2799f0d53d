"""Checkpoints a multi-day run can trust: files written atomically and loaded safely, when a run
writes them and how it resumes from them exactly, whether one belongs to the architecture a run
builds, and ``rescale average-checkpoints``.

- ``files``: checkpoint files written atomically and loaded without running code (local or fsspec URLs)
- ``callbacks``: ``last.ckpt`` and epoch checkpoints: when they are written, and an exact resume
- ``architecture_match``: does a checkpoint belong to the architecture this run builds? one line saying what differs
- ``averaging``: ``rescale average-checkpoints``: the weights of a run's last N checkpoints, averaged
"""
from .files import (RUN_CONFIG_KEY, SAFE_GLOBALS, AtomicCheckpointIO, CheckpointError, CheckpointInfo,
                    checkpoint_exists, checkpoint_run_id, is_remote, non_finite_text, non_finite_weights,
                    peek_checkpoint, require_restorable, safe_load)
from .callbacks import (LAST_NAME, EpochCheckpoint, LastCheckpoint, ResumeState, checkpoint_folder,
                        logger_folder, planned_checkpoint_folder, preempted_message, stop_signal)
from .architecture_match import (ARCHITECTURE_KEYS, CONFIG_FILE, CONFIG_KEYS, MISMATCH_FIX, NETWORK_PREFIX,
                     check_checkpoint_compatible, check_config_against_checkpoint, hparam_differences,
                     load_into_module, network_weights, require_classification_checkpoint,
                     run_arguments_over_checkpoint, saved_config, state_dict_differences,
                     trained_config_fix, typed_model_arguments)
from .averaging import average_checkpoints

__all__ = ["RUN_CONFIG_KEY", "SAFE_GLOBALS", "AtomicCheckpointIO", "CheckpointError", "CheckpointInfo", "checkpoint_exists",
           "checkpoint_run_id", "is_remote", "peek_checkpoint", "require_restorable", "safe_load", "LAST_NAME", "EpochCheckpoint",
           "non_finite_text", "non_finite_weights",
           "LastCheckpoint", "ResumeState", "checkpoint_folder", "logger_folder", "planned_checkpoint_folder",
           "preempted_message", "stop_signal",
           "ARCHITECTURE_KEYS", "CONFIG_FILE", "CONFIG_KEYS", "MISMATCH_FIX", "NETWORK_PREFIX", "saved_config",
           "trained_config_fix",
           "check_checkpoint_compatible", "check_config_against_checkpoint", "hparam_differences",
           "load_into_module", "network_weights", "require_classification_checkpoint",
           "run_arguments_over_checkpoint", "state_dict_differences", "typed_model_arguments",
           "average_checkpoints"]
