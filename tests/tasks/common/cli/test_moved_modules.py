"""Class paths written before ``rescale_tasks.common`` was split into subpackages (a user's config, a
run's saved ``rescale_config.yaml``) still build the same run (``common/cli/moved_modules.py``)."""
from __future__ import annotations

import importlib
from pathlib import Path

from rescale_tasks.cli import main
from rescale_tasks.common.checkpoints import AtomicCheckpointIO
from rescale_tasks.common.cli import MOVED_MODULES, follow_moved_modules, run_lightning
from rescale_tasks.common.reporting import SuiteWandbLogger
from rescale_tasks.common.training import WarmupCosineLR, build_scheduler

TASKS = Path(__file__).resolve().parents[4] / "tasks"
EARLIER = {
    "trainer": {"logger": {"class_path": "rescale_tasks.common.wandb_logger.SuiteWandbLogger",
                           "init_args": {"project": "moved", "name": "earlier-paths", "save_dir": "runs",
                                         "id": "earlier"}},
                "plugins": [{"class_path": "rescale_tasks.common.checkpointing.AtomicCheckpointIO"}]},
    "model": {"init_args": {"optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.05}},
                            "lr_scheduler": {"class_path": "rescale_tasks.common.schedules.WarmupCosineLR",
                                             "init_args": {"warmup_epochs": 1}}}},
}


def test_a_config_naming_the_earlier_paths_builds_the_same_classes(tmp_path, monkeypatch, run_config):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    cli = run_lightning(["--config", run_config(tmp_path / "earlier.yaml", **EARLIER)], run=False)
    assert isinstance(cli.trainer.logger, SuiteWandbLogger)
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    optimizer = cli.model.optimizer_factory(cli.model.net.parameters())
    schedule, interval = build_scheduler(cli.model.scheduler_factory, optimizer, steps_per_epoch=2, max_epochs=1)
    assert isinstance(schedule, WarmupCosineLR) and interval == "step"


def test_a_fit_with_the_earlier_paths_trains_and_saves_its_checkpoint(tmp_path, monkeypatch, run_config):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert main(["fit", "--config", run_config(tmp_path / "earlier.yaml", **EARLIER)]) == 0
    assert (tmp_path / "runs" / "moved" / "earlier" / "checkpoints" / "last.ckpt").is_file()


def test_every_earlier_path_is_the_module_it_moved_to_and_no_file_of_its_own():
    follow_moved_modules()  # as every Lightning command of the suite does before it parses
    for earlier, now in MOVED_MODULES.items():
        assert not (TASKS / "common" / f"{earlier.rpartition('.')[2]}.py").exists(), earlier
        assert importlib.import_module(earlier) is importlib.import_module(now)
    # a module that exists under its name is never answered by the finder
    assert importlib.import_module("rescale_tasks.common.export").__name__ == "rescale_tasks.common.export"


def test_the_checkpoint_architecture_check_is_named_for_its_role_and_found_at_its_earlier_name():
    """``checkpoints.compat`` read as the compatibility shims of ``rescale_core.compat`` (modules pickled
    under an earlier layout); it checks that a checkpoint belongs to the network a run builds."""
    follow_moved_modules()
    module = importlib.import_module("rescale_tasks.common.checkpoints.architecture_match")
    assert importlib.import_module("rescale_tasks.common.checkpoints.compat") is module
    assert not (TASKS / "common" / "checkpoints" / "compat.py").exists()
    assert callable(module.check_checkpoint_compatible)
