"""The modules of ``rescale_tasks.common`` under the paths they had before the package was split into
subpackages by role, for the class paths written then: a user's config or a run's saved
``rescale_config.yaml`` that names ``rescale_tasks.common.schedules.WarmupCosineLR`` (now
``rescale_tasks.common.training.WarmupCosineLR``) builds the same run.

:func:`follow_moved_modules` adds one import finder, after every other, that answers an import of an
earlier path with the module at its new place (the module itself, not a copy); every other import
goes where it went. :func:`~.lightning_commands.run_lightning` installs it before jsonargparse
resolves a class path, for ``rescale fit|validate|test|predict`` and the commands that build runs.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Optional, Sequence

__all__ = ["MOVED_MODULES", "follow_moved_modules"]

#: earlier module path -> where the module is now
MOVED_MODULES = {f"rescale_tasks.common.{old}": f"rescale_tasks.common.{new}" for old, new in {
    "acceleration": "training.acceleration",
    "allocator": "system.allocator",
    "analysis_logger": "reporting.analysis_logger",
    "atomic": "system.atomic",
    "averaging": "checkpoints.averaging",
    "batch_sampling": "data.batch_sampling",
    "build_only": "cli.build_only",
    "callbacks": "training.callbacks",
    "checkpoint_callbacks": "checkpoints.callbacks",
    "checkpoint_compat": "checkpoints.architecture_match",
    "checkpointing": "checkpoints.files",
    "checkpoints.compat": "checkpoints.architecture_match",
    "cli_errors": "cli.parse_errors",
    "command": "cli.command",
    "config": "run.outputs",
    "config_files": "cli.config_files",
    "config_layers": "cli.config_layers",
    "data_report": "run.data_report",
    "distributed": "system.distributed",
    "empty_batches": "data.empty_batches",
    "export_programs": "export.programs",
    "exporters": "export.formats",
    "figures": "reporting.figures",
    "images": "data.images",
    "labels": "data.labels",
    "lightning_cli": "cli.lightning_commands",
    "lock": "system.lock",
    "network_inputs": "training.inputs",
    "networks": "training.networks",
    "optim": "training.optim",
    "optim_check": "training.optim_check",
    "predictions": "run.predictions",
    "probe_plots": "reporting.probe_plots",
    "progress": "reporting.progress",
    "quiet": "cli.quiet",
    "run_folder": "run.folder",
    "run_report": "run.report",
    "run_summary": "run.summary",
    "sampling": "data.sampling",
    "schedules": "training.schedules",
    "stop_signals": "system.stop_signals",
    "throughput": "data.throughput",
    "wandb_logger": "reporting.wandb_logger",
    "writable": "system.writable",
}.items()}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the earlier paths of :data:`MOVED_MODULES` (last of all finders, so a module that
    exists under a name is always found first) and loads each as the module it became."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED_MODULES else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder, replaced by the module itself in exec_module

    def exec_module(self, module: ModuleType) -> None:
        # the import system returns what sys.modules holds under the name once this returns
        sys.modules[module.__name__] = importlib.import_module(MOVED_MODULES[module.__name__])


def follow_moved_modules() -> None:
    """Let the earlier module paths of :data:`MOVED_MODULES` import (once per process)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
