"""Optimizer and schedule values torch (or the schedule) refuses end ``rescale fit`` with one line
naming the config key, before any data work: the imagenet config's data root does not exist
here, so a run that got as far as the data would fail with another line."""
from __future__ import annotations

from pathlib import Path

import pytest

from rescale_tasks.cli import main
from rescale_tasks.common.errors import ConfigError
from rescale_tasks.common.training import check_optimization

RESCALE50 = str(Path(__file__).resolve().parents[4] / "experiments/imagenet/rescale50.yaml")
OPTIMIZER = "--model.init_args.optimizer.init_args."
SCHEDULE = "--model.init_args.lr_scheduler.init_args."


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")


@pytest.mark.parametrize("args,expected", [
    ([OPTIMIZER + "lr", "-1"], "bad value for model.init_args.optimizer.init_args.lr: -1.0 (torch.optim.SGD: "
                               "Invalid learning rate: -1.0); set it with --model.init_args.optimizer.init_args.lr"),
    ([OPTIMIZER + "weight_decay", "-0.0001"], "optimizer.init_args.weight_decay: -0.0001 (torch.optim.SGD: Invalid "
                                            "weight_decay value"),
    ([OPTIMIZER + "nesterov", "true", OPTIMIZER + "momentum", "0"],
     "optimizer.init_args.nesterov: True (torch.optim.SGD: Nesterov momentum requires a momentum"),
    ([SCHEDULE + "milestones", "[30, 6, 90]"], "bad value for model.init_args.lr_scheduler.init_args.milestones: "
                                               "[30.0, 6.0, 90.0] (WarmupMultiStepLR: milestones [30.0, 6.0, 90.0] "
                                               "must increase"),
    ([SCHEDULE + "warmup_epochs", "-5"], "lr_scheduler.init_args.warmup_epochs: -5.0 (WarmupMultiStepLR: "
                                         "warmup_epochs (-5.0) must be >= 0)"),
    (["--model.init_args.norm_weight_decay", "-1"], "bad value for model.init_args.norm_weight_decay: -1.0"),
    (["--model.init_args.agc_clip", "0"], "bad value for model.init_args.agc_clip: 0.0 (a positive number: AGC's "
                                          "clipping threshold lambda, e.g. 0.01; null turns AGC off); set it with "
                                          "--model.init_args.agc_clip"),
    (["--model.init_args.agc_clip", "0.01", "--model.init_args.agc_eps", "-1"],
     "bad value for model.init_args.agc_eps: -1.0 (a positive number"),
    (["--model.init_args.agc_clip", "x"], "bad value for model.init_args.agc_clip: expected float or null, got 'x'"),
    (["--model.init_args.agc_clip_classifier", "true"],
     "model.init_args.agc_clip_classifier=True does nothing while model.init_args.agc_clip is null (adaptive gradient "
     "clipping off): set --model.init_args.agc_clip (e.g. 0.01) to clip, or remove agc_clip_classifier"),
    (["--model.init_args.agc_eps", "0.1"], "model.init_args.agc_eps=0.1 does nothing while model.init_args.agc_clip "
                                           "is null"),
])
def test_a_refused_optimizer_or_schedule_value_is_one_line(args, expected, error_line):
    assert main(["fit", "--config", RESCALE50, *args, "--trainer.accelerator", "cpu", "--trainer.devices", "1"]) == 2
    assert expected in error_line()


def section(class_path: str, **init_args) -> dict:
    return {"class_path": class_path, "init_args": init_args}


def test_what_no_single_value_explains_names_the_section():
    sgd = section("torch.optim.SGD", lr=0.1)
    with pytest.raises(ConfigError, match=r"^bad model.init_args.lr_scheduler \(rescale_tasks.common.training."
                                          r"WarmupCosineLR\): WarmupCosineLR needs max_epochs .*; set "
                                          r"trainer.max_epochs$"):
        check_optimization({"optimizer": sgd, "lr_scheduler": section("rescale_tasks.common.training.WarmupCosineLR")},
                           {"max_epochs": -1, "max_steps": 10})
    with pytest.raises(ConfigError, match=r"optimizer.init_args.betas: \[1.5, 0.9\] \(torch.optim.Adam: Invalid "
                                          r"beta parameter at index 0"):
        check_optimization({"optimizer": section("torch.optim.Adam", lr=1e-3, betas=[1.5, 0.9])}, {})


def test_good_values_pass():
    schedule = section("rescale_tasks.common.training.WarmupCosineLR", warmup_epochs=1)
    check_optimization({"optimizer": section("torch.optim.SGD", lr=0.1, momentum=0.9), "lr_scheduler": schedule},
                       {"max_epochs": None})  # Lightning's default: 1000 epochs
    check_optimization({"optimizer": section("torch.optim.SGD", lr=0.1), "lr_scheduler": schedule},
                       {"max_steps": 10, "fast_dev_run": True})
    check_optimization({"optimizer": section("torch.optim.SGD", lr=0.1),
                        "lr_scheduler": section("torch.optim.lr_scheduler.StepLR", step_size=3)}, {})
    # AGC's details with AGC on, or at their defaults with it off
    check_optimization({"agc_clip": 0.01, "agc_eps": 0.1, "agc_clip_classifier": True}, {})
    check_optimization({"agc_clip": None, "agc_eps": 1e-3, "agc_clip_classifier": False}, {})


def test_a_negative_value_read_as_an_option_says_how_to_write_it(error_line):
    # argparse reads -1e-4 (not a plain number to it) as an option, and names only the section
    assert main(["fit", "--config", RESCALE50, OPTIMIZER + "weight_decay", "-1e-4"]) == 2
    assert error_line() == ("option --model or a key under it got no value: write --key VALUE, or --key=VALUE when "
                            "the value starts with '-' (a value such as -1e-4 is otherwise read as an option)")
    assert main(["fit", "--config", RESCALE50, OPTIMIZER + "weight_decay=-1e-4"]) == 2
    assert "bad value for model.init_args.optimizer.init_args.weight_decay: -0.0001" in error_line()
