"""The CIFAR Wide-ResNet configs train with Zagoruyko & Komodakis' optimizer: SGD with Nesterov
momentum 0.9 (their paper; szagoruyko/wide-residual-networks ``scripts/train_cifar.sh``,
``nesterov=true``), weight decay 5e-4, x0.2 at 60/120/160 of 200 epochs; RescaleNet's overlay
changes the lr and the warm-up only."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rescale_tasks.common.cli import build_run

CIFAR = Path(__file__).resolve().parents[3] / "experiments" / "cifar"


@pytest.mark.parametrize("config, lr", [("wrn16-4_bn", 0.1), ("wrn16-4_rescale", 0.05), ("wrn16-4_fixup", 0.1)])
def test_the_wide_resnet_configs_step_with_nesterov_momentum(config, lr):
    cli = build_run(["--config", str(CIFAR / f"{config}.yaml"), "--model.init_args.network_options",
                     "{depth: 10, width: 1}"])
    optimizer = cli.model.optimizer_factory([torch.nn.Parameter(torch.zeros(1))])
    assert isinstance(optimizer, torch.optim.SGD)
    assert {k: optimizer.defaults[k] for k in ("lr", "momentum", "nesterov", "dampening", "weight_decay")} == \
        {"lr": lr, "momentum": 0.9, "nesterov": True, "dampening": 0.0, "weight_decay": 0.0005}
    assert cli.config["trainer"]["max_epochs"] == 200
    assert cli.config["model"]["init_args"]["lr_scheduler"]["init_args"]["milestones"] == [60, 120, 160]
