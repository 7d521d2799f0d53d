"""`--ckpt_path` with a checkpoint of another architecture: one line naming the checkpoint's
network/scheme and this run's, exit 2, before any weight is loaded (Lightning would otherwise
replace the configured model with the checkpoint's, or fail with a page of key mismatches)."""
from __future__ import annotations

import glob
from pathlib import Path

import pytest

from rescale_tasks.cli import main

CSV = {"logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "logs"}}}


def write_config(run_config, folder: Path, name: str, **init_args) -> str:
    """The 2-step rescale run on the digits, with ``init_args`` of the model changed."""
    init = {"scheme_options": {"measure_batches": 2}, **init_args}
    return run_config(folder / f"{name}.yaml", model={"init_args": init}, trainer=CSV)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, run_config) -> tuple[Path, str]:
    """(folder, checkpoint) of a 2-step rescale run, shared by the tests of this file."""
    folder = tmp_path_factory.mktemp("ckpt")
    assert main(["fit", "--config", write_config(run_config, folder, "rescale"), "--trainer.default_root_dir", str(folder),
                 "--trainer.logger.init_args.save_dir", str(folder / "logs")]) == 0
    ckpts = sorted(glob.glob(str(folder / "**" / "*.ckpt"), recursive=True))
    assert ckpts
    return folder, ckpts[0]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")


def test_same_architecture_loads(trained, tmp_path):
    folder, ckpt = trained
    assert main(["validate", "--config", str(folder / "rescale.yaml"), "--ckpt_path", ckpt]) == 0


def test_validate_with_a_checkpoint_of_another_scheme(trained, tmp_path, error_line, run_config):
    _, ckpt = trained
    config = write_config(run_config, tmp_path, "bn", scheme="bn", scheme_options=None)
    assert main(["validate", "--config", config, "--ckpt_path", ckpt]) == 2
    line = error_line()
    assert f"checkpoint {ckpt} was saved from network=cifar_resnet, scheme=rescale" in line
    assert "this run builds network=cifar_resnet, scheme=bn" in line and "differ in scheme" in line
    assert "drop --ckpt_path" in line and "rescale_config.yaml" in line
    (saved,) = Path(ckpt).parent.parent.glob("rescale_config.yaml")  # the CSV logger's version folder
    assert f"its run saved it as {saved}" in line  # the very file, not a name to search for


def test_fit_with_a_checkpoint_of_another_network(trained, tmp_path, error_line, run_config):
    _, ckpt = trained
    assert main(["fit", "--config", write_config(run_config, tmp_path, "deeper", network_options={"depth": 14}),
                 "--ckpt_path", ckpt]) == 2
    line = error_line()
    assert "network_options={'base_width': 8, 'depth': 8}" in line
    assert "network_options={'base_width': 8, 'depth': 14}" in line and "differ in network_options" in line

    assert main(["fit", "--config", write_config(run_config, tmp_path, "vgg", network="vgg11"),
                 "--model.init_args.network_options", "{base_width: 8}", "--ckpt_path", ckpt]) == 2
    assert "network=cifar_resnet" in (line := error_line()) and "network=vgg11" in line


def test_checkpoint_of_another_class_count_fails_when_loading(trained, tmp_path, data_writers, error_line, run_config):
    """num_classes/in_channels come from the data module at instantiation, so the module's
    on_load_checkpoint catches these, before load_state_dict."""
    _, ckpt = trained
    root = data_writers.cifar(tmp_path / "cifar", "cifar100", n_per_file=12, n_test=8).root
    code = main(["validate", "--config", write_config(run_config, tmp_path, "c100"), "--ckpt_path", ckpt,
                 "--data", "rescale_tasks.classification.data.CIFARDataModule", "--data.root", str(root),
                 "--data.variant", "cifar100", "--data.batch_size", "4", "--data.num_workers", "0"])
    line = error_line()
    assert code == 2
    assert "num_classes=10, in_channels=1" in line and "num_classes=100, in_channels=3" in line
    assert "differ in num_classes, in_channels" in line


def _module_hparams(folder: Path) -> dict:
    """The hyper-parameters the run's module was built with, as Lightning logged them
    (the CSV logger's hparams.yaml of the one run under ``folder``)."""
    import yaml

    (hparams,) = sorted(folder.rglob("hparams.yaml"))
    return yaml.load(hparams.read_text(), Loader=yaml.UnsafeLoader)  # it holds the config's Path objects


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_a_command_line_argument_wins_over_the_checkpoint(trained, tmp_path, command):
    """Lightning's CLI replaces the command line's model arguments with the checkpoint's saved
    hyper-parameters; the suite puts back what the user typed."""
    folder, ckpt = trained
    assert main([command, "--config", str(folder / "rescale.yaml"), "--ckpt_path", ckpt,
                 "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"),
                 "--model.init_args.plan", "reference", "--model.init_args.label_smoothing=0.3"]) == 0
    hparams = _module_hparams(tmp_path / "logs")
    assert hparams["plan"] == "reference" and hparams["label_smoothing"] == 0.3
    assert hparams["network_options"] == {"base_width": 8, "depth": 8}  # the rest from the run


def test_a_config_value_wins_and_a_default_keeps_the_checkpoints(trained, tmp_path, run_config):
    """A run config that sets an evaluation argument wins too; one left at its default keeps the
    value the checkpoint was trained with."""
    folder, ckpt = trained
    config = write_config(run_config, tmp_path, "reference", plan="reference")
    assert main(["validate", "--config", config, "--ckpt_path", ckpt,
                 "--trainer.logger.init_args.save_dir", str(tmp_path / "logs")]) == 0
    assert _module_hparams(tmp_path / "logs")["plan"] == "reference"


def test_an_architecture_argument_cannot_change_with_a_checkpoint(trained, error_line):
    folder, ckpt = trained
    assert main(["validate", "--config", str(folder / "rescale.yaml"), "--ckpt_path", ckpt,
                 "--model.init_args.scheme", "bn", "--model.init_args.scheme_options", "null"]) == 2
    line = error_line()
    assert "differ in scheme" in line and "scheme_options" in line
    assert "the network the weights belong to, so cannot change with a checkpoint" in line
