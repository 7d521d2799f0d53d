"""Every private name of another library the suite relies on is listed in
``rescale_tasks.common.system.private_apis``, and each one still exists, as listed, in the installed
versions: an upgrade that moves one fails here, naming it, where it is used and the pin to revisit."""
from __future__ import annotations

import ast
import importlib
import inspect
from importlib.metadata import version
from pathlib import Path
from unittest import mock

import lightning.pytorch as L
import pytest
from jsonargparse import ArgumentParser
from lightning.pytorch.callbacks import ModelCheckpoint, WeightAveraging
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger

from rescale_tasks.common.system.private_apis import PINS, PRIVATE_APIS, PrivateApi

TASKS = Path(__file__).resolve().parents[3] / "tasks"


def _owner(path: str):
    """The module or class named by its import path."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return importlib.import_module(path)


def _quiet_trainer() -> L.Trainer:
    return L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)


class _Data(L.LightningDataModule):
    def __init__(self, batch_size: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()


def _parser_with_subcommands() -> ArgumentParser:
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subcommands()
    return parser


def _result_metric():
    from lightning.pytorch.trainer.connectors.logger_connector.result import _Metadata, _ResultMetric, _Sync

    meta = _Metadata("training_step", "train/loss")
    meta.sync = _Sync()
    return _ResultMetric(meta, is_tensor=True)


def _tensorboard_logger(tmp):
    """A TensorBoardLogger as label_runs meets it: built, its writer (which needs tensorboard) not made."""
    with mock.patch("lightning.fabric.loggers.tensorboard._TENSORBOARD_AVAILABLE", True):
        return TensorBoardLogger(str(tmp))


def _mean_metric():
    from torchmetrics import MeanMetric

    return MeanMetric()


# an instance holding each listed attribute, built as the suite's code meets it
INSTANCES = {
    "lightning.pytorch.Trainer": lambda tmp: _quiet_trainer(),
    "lightning.pytorch.trainer.connectors.logger_connector.logger_connector._LoggerConnector":
        lambda tmp: _quiet_trainer()._logger_connector,
    "lightning.pytorch.loops.training_epoch_loop._TrainingEpochLoop": lambda tmp: _quiet_trainer().fit_loop.epoch_loop,
    "lightning.pytorch.trainer.connectors.logger_connector.result._ResultMetric": lambda tmp: _result_metric(),
    "lightning.pytorch.trainer.connectors.logger_connector.result._Sync": lambda tmp: _result_metric().meta.sync,
    "torchmetrics.Metric": lambda tmp: _mean_metric(),
    "lightning.pytorch.loggers.WandbLogger": lambda tmp: WandbLogger(save_dir=str(tmp), offline=True, name="n"),
    "lightning.fabric.loggers.CSVLogger": lambda tmp: CSVLogger(str(tmp)),
    "lightning.fabric.loggers.TensorBoardLogger": _tensorboard_logger,
    "lightning.pytorch.callbacks.ModelCheckpoint": lambda tmp: ModelCheckpoint(),
    "lightning.pytorch.callbacks.WeightAveraging": lambda tmp: WeightAveraging(),
    "lightning.pytorch.loops.fit_loop._FitLoop": lambda tmp: _quiet_trainer().fit_loop,
    "lightning.pytorch.loops.evaluation_loop._EvaluationLoop":
        lambda tmp: _quiet_trainer().fit_loop.epoch_loop.val_loop,
    "lightning.pytorch.LightningModule": lambda tmp: L.LightningModule(),
    "lightning.pytorch.LightningDataModule": lambda tmp: _Data(),
    "jsonargparse.ArgumentParser": lambda tmp: _parser_with_subcommands(),
}


def _broken(api: PrivateApi, what: str) -> str:
    dist = api.distribution
    return (f"{api.owner}.{api.name} ({api.kind}) {what} in {dist} {version(dist)}: {api.used_by} relies on it "
            f"({api.why}). Pinned: {PINS[dist]}; replace it (or update the entry) before raising the pin.")


@pytest.mark.parametrize("api", PRIVATE_APIS, ids=lambda api: f"{api.owner.rpartition('.')[2]}.{api.name}")
def test_each_private_api_is_there(api, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert api.distribution in PINS
    if api.kind == "checkpoint key":
        state, (key, _, inner) = _quiet_trainer().fit_loop.state_dict(), api.name.partition("/")
        assert key in state and (not inner or inner in state[key]), _broken(api, "is not in a fit loop's state")
    elif api.kind == "attribute" and api.owner == "lightning.pytorch.cli.LightningCLI":
        source = inspect.getsource(LightningCLI)  # set while LightningCLI builds its parsers
        assert f"self.{api.name}" in source, _broken(api, "is no longer set")
    elif api.kind == "attribute":
        assert hasattr(INSTANCES[api.owner](tmp_path), api.name), _broken(api, "is gone")
    else:
        owner = _owner(api.owner)
        assert hasattr(owner, api.name), _broken(api, "is gone")
        if api.parameters is not None:
            found = tuple(inspect.signature(getattr(owner, api.name)).parameters)
            assert found == api.parameters, _broken(api, f"takes {found}, not {api.parameters}")


def test_lightning_parses_the_checkpoint_between_the_two_public_hooks():
    """RescaleCLI._parse_ckpt_path relies on when LightningCLI calls it."""
    source = inspect.getsource(LightningCLI.__init__)
    calls = [source.find(f"self.{name}(") for name in ("parse_arguments", "_parse_ckpt_path",
                                                         "before_instantiate_classes")]
    assert -1 not in calls and calls == sorted(calls), _broken(PRIVATE_APIS[0], "is called elsewhere")


def test_the_wandb_logger_internals_hold_what_the_suite_reads(tmp_path, monkeypatch):
    """Before the run starts: no run, the wandb.init arguments, the run name."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = WandbLogger(save_dir=str(tmp_path), offline=True, name="run-{pair}", group="g", id="abc")
    assert logger._experiment is None
    assert {"name": "run-{pair}", "group": "g", "id": "abc"}.items() <= logger._wandb_init.items()
    assert logger._name == "run-{pair}" and logger.version == "abc" and logger._experiment is None


def _private_names_read(path: Path) -> set[str]:
    """The underscore names ``path`` reads (``x._y``, ``self._y``, ``getattr(x, "_y")``) or imports
    (``from m import _y``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id == "os"):
            names.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "getattr", "hasattr", "setattr") and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
            names.add(str(node.args[1].value))
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.update(a.name for a in node.names)
    return {n for n in names if n.startswith("_") and not n.endswith("__")}


def _own_names() -> set[str]:
    """The underscore names the suite defines itself (functions, methods, classes, attributes)."""
    names = set()
    for path in TASKS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
    return names


def test_every_private_name_of_another_library_the_suite_reads_is_listed():
    listed = {api.name.split("/")[-1] for api in PRIVATE_APIS}
    own, unlisted = _own_names(), []
    for path in sorted(TASKS.rglob("*.py")):
        unlisted += [f"{path.relative_to(TASKS)}: {name}" for name in sorted(_private_names_read(path) - own - listed)]
    assert unlisted == [], "list these in rescale_tasks/common/system/private_apis.py (or use a public API)"
