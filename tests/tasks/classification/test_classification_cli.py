"""The `rescale` CLI on the classification task: configs, fast_dev_run per config family on real
on-disk formats, W&B offline runs, checkpoints (save, validate, resume) and bad input."""
from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest
import torch

import rescale_core
from rescale_tasks.cli import main
from rescale_tasks.common.cli import run_lightning
from wandb_runs import find_offline_runs, read_offline_run
from rescale_tasks.common.training import build_optimizer

REPO = Path(__file__).resolve().parents[3]
EXPERIMENTS = REPO / "experiments"
# experiments/cluster/ holds overlays (trainer settings applied after a run config) that need
# GPUs; test_classification_ddp.py runs them with CPU overrides. experiments/wmt/ is translation
# (tests/tasks/translation/test_translation_configs.py), coco/ and kinetics/ have their own tests
# (tests/tasks/detection/test_detection_cli.py, tests/tasks/video/test_video_cli.py).
RUN_CONFIGS = sorted(p for p in EXPERIMENTS.rglob("*.yaml")
                     if not p.name.startswith("_")
                     and p.relative_to(EXPERIMENTS).parts[0] not in ("cluster", "wmt", "coco", "kinetics")
                     and not {"recipes", "ablations", "agc"} & set(p.parts))
# recipes/, ablations/ and agc/: overlays given after a run config (tests/tasks/classification/test_basic_block_recipe.py,
# the AGC study of docs/studies.md)
CPU = ["--trainer.accelerator", "cpu", "--trainer.devices", "1"]


@pytest.fixture(autouse=True)
def _in_tmp(offline_in_tmp):
    """Each test in a folder of its own, W&B offline (tests/tasks/conftest.py)."""


def test_experiment_folders_hold_the_papers_rows():
    names = {p.stem for p in (EXPERIMENTS / "imagenet").glob("*.yaml")}
    for required in ["resnet50_bn", "resnet50_gn", "resnet50_bn_zero_gamma", "rescale50", "rescale101",
                     "rescale152", "rescalex101_32x8d", "fixup50", "skipinit50", "vgg19_bn",
                     "vgg19_rescale", "rescale50_mixup", "rescale50_cosine", "nf_resnet50"]:
        assert required in names
    cifar = {p.stem for p in (EXPERIMENTS / "cifar").glob("*.yaml")}
    for depth in ["wrn16-4", "wrn28-10", "wrn100-2", "wrn1000-2"]:
        for scheme in ["bn", "rescale", "skipinit", "fixup", "none", "nf"]:
            assert f"{depth}_{scheme}" in cifar


@pytest.mark.slow
@pytest.mark.parametrize("config", RUN_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_experiment_config_instantiates_without_data(config):
    """Built on the meta device: every module and parameter of the full-size network, no memory
    filled (VGG-19's 140M weights took 2.6 s to initialise, against 0.3 s); the initialisations
    themselves are checked on real weights by every registered model's tests (tests/core)."""
    with torch.device("meta"):
        cli = run_lightning(["fit", "--config", str(config)], run=False)
    module, data = cli.model, cli.datamodule
    assert module.hparams.num_classes == data.num_classes
    assert any(isinstance(m, rescale_core.ResidualMerge) for m in module.net.modules()) or "vgg" in config.stem
    optimizer = build_optimizer(module.net, module.optimizer_factory)
    seen = [p for g in optimizer.param_groups for p in g["params"]]
    assert len(seen) == len(list(module.net.parameters())) and seen[0].is_meta
    scheduler = module.scheduler_factory(optimizer, steps_per_epoch=10, max_epochs=cli.trainer.max_epochs)
    optimizer.step()
    scheduler.step()
    assert all(g["lr"] >= 0 for g in optimizer.param_groups)
    cfg = cli.config
    assert cfg.trainer.logger.init_args.group  # every run sits in a W&B group


def _tiny_imagenet_args(root):
    return ["--data.root", str(root), "--data.num_classes", "3", "--data.image_size", "32",
            "--data.eval_resize", "36", "--data.batch_size", "4", "--data.num_workers", "0"]


@pytest.mark.parametrize("config,extra", [
    ("imagenet/rescale50.yaml", ["--model.init_args.network_options", "{base_width: 8}"]),
    ("imagenet/resnet50_bn.yaml", ["--model.init_args.network_options", "{base_width: 8}"]),
    ("imagenet/fixup50.yaml", ["--model.init_args.network_options", "{base_width: 8}"]),
    ("imagenet/vgg19_rescale.yaml", ["--model.init_args.network_options", "{base_width: 8, hidden_dim: 32}"]),
    ("imagenet/rescale50_mixup.yaml", ["--model.init_args.network_options", "{base_width: 8}"]),
])
def test_fast_dev_run_imagenet_family(imagenet_folder, config, extra):
    code = main(["fit", "--config", str(EXPERIMENTS / config), *_tiny_imagenet_args(imagenet_folder),
                 *extra, "--trainer.fast_dev_run", "2", *CPU])
    assert code == 0


def test_fast_dev_run_cifar_family(cifar10_root):
    code = main(["fit", "--config", str(EXPERIMENTS / "cifar/wrn16-4_rescale.yaml"), "--data.root", str(cifar10_root),
                 "--data.batch_size", "4", "--data.num_workers", "0",
                 "--model.init_args.network_options", "{depth: 10, width: 1}", "--trainer.fast_dev_run", "2", *CPU])
    assert code == 0


def test_fast_dev_run_mnist_idx_files(mnist_root):
    code = main(["fit", "--config", str(EXPERIMENTS / "cifar/wrn16-4_skipinit.yaml"),
                 "--data", "rescale_tasks.classification.data.MNISTDataModule", "--data.root", str(mnist_root),
                 "--data.batch_size", "4", "--data.num_workers", "0",
                 "--model.init_args.network_options", "{depth: 10, width: 1}", "--trainer.fast_dev_run", "2", *CPU])
    assert code == 0


SGD_COSINE = {
    "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0005}},
    "lr_scheduler": {"class_path": "rescale_tasks.common.training.WarmupCosineLR", "init_args": {"warmup_epochs": 1}},
}


@pytest.fixture
def digits_run(tmp_path, run_config, suite_wandb_logger) -> str:
    """A 4-step rescale run on the digits, logged to an offline W&B run."""
    return run_config(tmp_path / "digits.yaml",
                      model={"init_args": {"scheme_options": {"measure_batches": 3}, **SGD_COSINE}},
                      data={"init_args": {"batch_size": 128}},
                      trainer={"limit_train_batches": 4, "limit_val_batches": 2, "log_every_n_steps": 1,
                               "logger": suite_wandb_logger("rescale-test", "digits-rescale", group="digits-test")})


def test_fit_logs_metrics_and_full_config_to_offline_wandb(digits_run):
    assert main(["fit", "--config", digits_run]) == 0
    runs = find_offline_runs("runs")
    assert len(runs) == 1
    run = read_offline_run(runs[0])
    assert run.name == "digits-rescale" and run.group == "digits-test"
    # the full resolved config, not only the module's hyper-parameters
    assert run.config["model"]["init_args"]["scheme"] == "rescale"
    assert run.config["data"]["class_path"].endswith("DigitsDataModule")
    assert run.config["trainer"]["max_epochs"] == 1
    losses = run.metric("train/loss_step")
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    assert run.metric("val/acc1")
    # the learned scalars, read after the first step and after the last (every 50 otherwise), once each
    scalars = [row["scalars/layer1.0"] for row in run.history if "scalars/layer1.0" in row]
    assert len(scalars) == 2 and scalars[-1] != scalars[0], scalars
    saved = glob.glob(os.path.join(runs[0], "files", "rescale_config.yaml"))
    assert saved and "DigitsDataModule" in Path(saved[0]).read_text()


def test_checkpoint_validate_and_resume(digits_run):
    config = digits_run
    # a 2-epoch cosine stopped after its first epoch (resuming with the same max_epochs: another one
    # would be another cosine, which a resume refuses)
    assert main(["fit", "--config", config, "--trainer.max_epochs", "2", "--trainer.max_steps", "4"]) == 0
    last = glob.glob("runs/rescale-test/*/checkpoints/last.ckpt")
    assert len(last) == 1
    ckpt = torch.load(last[0], map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 4 and ckpt["epoch"] == 0
    counts = [v for k, v in ckpt["state_dict"].items() if k.endswith(".count")]
    assert counts and all(int(c) == 3 for c in counts)  # mean-shift measuring state saved

    assert main(["validate", "--config", config, "--ckpt_path", last[0]]) == 0

    cli = run_lightning(["--config", config], run=False)
    from rescale_core import mean_shift_layers

    assert all(m.measuring for m in mean_shift_layers(cli.model.net))  # fresh model
    metrics = cli.trainer.validate(cli.model, datamodule=cli.datamodule, ckpt_path=last[0], verbose=False)[0]
    assert 0.0 <= metrics["val/acc1"] <= 1.0
    assert all(not m.measuring for m in mean_shift_layers(cli.model.net))  # restored, not re-measured
    import wandb

    wandb.finish()

    assert main(["fit", "--config", config, "--ckpt_path", last[0], "--trainer.max_epochs", "2"]) == 0
    # the same W&B run (and so the same checkpoint folder) continues
    assert glob.glob("runs/rescale-test/*/checkpoints/last.ckpt") == last
    state = torch.load(last[0], map_location="cpu", weights_only=True)
    assert state["epoch"] == 1 and state["global_step"] == 8  # continued, not restarted
    fits = [run for run in map(read_offline_run, find_offline_runs("runs")) if run.metric("train/loss_step")]
    assert len(fits) == 2 and fits[0].run_id == fits[1].run_id  # (validate runs are runs of their own)


def test_checkpoints_are_written_atomically_and_loaded_weights_only(digits_run):
    from rescale_tasks.common.checkpoints import AtomicCheckpointIO

    cli = run_lightning(["--config", digits_run], run=False)
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    import wandb

    wandb.finish()


def test_missing_data_path_is_one_clear_line(capsys):
    code = main(["fit", "--config", str(EXPERIMENTS / "imagenet/resnet50_bn.yaml"),
                 "--data.root", "/does/not/exist", "--model.init_args.network_options", "{base_width: 8}", *CPU])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("error: ") and "/does/not/exist" in err[-1] and "data.root" in err[-1]


@pytest.mark.parametrize("override,expected", [
    (["--model.init_args.network", "resnet5"], "resnet50"),
    (["--model.init_args.scheme", "rescal"], "rescale"),
])
def test_unknown_model_or_scheme_is_one_clear_line(capsys, override, expected):
    code = main(["fit", "--config", str(EXPERIMENTS / "imagenet/resnet50_bn.yaml"), *override, *CPU])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: cannot build network") and expected in err[-1]


def test_missing_config_file_is_one_clear_line(capsys):
    assert main(["fit", "--config", "experiments/imagenet/nope.yaml"]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_suite_subcommands_list_models_and_schemes(capsys):
    assert main(["models", "rescale*"]) == 0
    assert "rescale50" in capsys.readouterr().out.split()
    assert main(["schemes"]) == 0
    assert {"bn", "rescale", "skipinit", "fixup", "rezero", "none"} <= set(capsys.readouterr().out.split())
