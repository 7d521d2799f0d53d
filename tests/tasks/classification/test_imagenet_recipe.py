"""The ImageNet configs train on RescaleNet's official schedule (hukkai/rescaling ``imagenet.py``,
``vgg_imagenet.py``, ``utils/lr_scheduler.py``): 5 warm-up epochs at batch 1024, then 100 epochs
whose milestones (or cosine) are counted from the end of the warm-up, 105 in all; the VGGs at
lr 0.01 x batch / 256, the ResNets at 0.1 x batch / 256."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rescale_tasks.common.cli import build_run
from rescale_tasks.common.training import build_scheduler

IMAGENET = Path(__file__).resolve().parents[3] / "experiments" / "imagenet"
STEPS_PER_EPOCH = 4
TINY = {"vgg19_rescale": "{base_width: 4, hidden_dim: 8}", "vgg19_bn": "{base_width: 4, hidden_dim: 8}",
        "rescale50": "{base_width: 4}", "rescale50_cosine": "{base_width: 4}", "rescale50_mixup": "{base_width: 4}",
        "resnet50_bn_mixup": "{base_width: 4}"}


def official_factor(step: int, milestones: list[int], epochs: int, warmup: int = 5) -> float:
    """hukkai/rescaling's ``warmup_scheduler`` at its iteration ``step + 1`` (a run of
    ``epochs + warmup`` epochs; no milestones: the cosine)."""
    it, warmup_iters = step + 1, warmup * STEPS_PER_EPOCH
    if it < warmup_iters:
        return it / warmup_iters
    if milestones:
        return 0.1 ** sum((it - warmup_iters) / STEPS_PER_EPOCH > k for k in milestones)
    return max(0.5 * (1 + math.cos(math.pi * (it - warmup_iters) / (STEPS_PER_EPOCH * epochs))), 1e-5)


@pytest.mark.parametrize("config, lr, milestones, epochs", [
    ("rescale50", 0.4, [30, 60, 90], 100),
    ("rescale50_cosine", 0.4, [], 100),
    ("vgg19_rescale", 0.04, [60, 90], 100),  # training.md: vgg19_noBN --multi_step=[60, 90]
    ("vgg19_bn", 0.04, [30, 60, 90], 100),
    ("rescale50_mixup", 0.4, [60, 120, 180], 200),  # mixup's 200-epoch schedule after the warm-up
    ("resnet50_bn_mixup", 0.4, [60, 120, 180], 200),
])
def test_each_config_trains_the_official_schedule(config, lr, milestones, epochs):
    cli = build_run(["--config", str(IMAGENET / f"{config}.yaml"), "--model.init_args.network_options", TINY[config]])
    assert cli.config["trainer"]["max_epochs"] == epochs + 5  # imagenet.py: range(100 + warmup_epoch)
    optimizer = cli.model.optimizer_factory([torch.nn.Parameter(torch.zeros(1))])
    assert optimizer.defaults["lr"] == pytest.approx(lr)  # at the recipe's batch of 1024
    base = optimizer.defaults["lr"]
    schedule, _ = build_scheduler(cli.model.scheduler_factory, optimizer, STEPS_PER_EPOCH, epochs + 5)
    for step in range((epochs + 5) * STEPS_PER_EPOCH):
        want = official_factor(step, milestones, epochs)
        got = optimizer.param_groups[0]["lr"] / base
        # the cosine's phase is one step apart (the official scheduler counts iterations from 1)
        assert got == pytest.approx(want, rel=1e-9, abs=0 if milestones else 5e-3), f"step {step}"
        optimizer.step()
        schedule.step()
