"""experiments/imagenet/nf_resnet50.yaml trains the official NF-ResNet recipe (deepmind-research
nfnets, experiment.py and the NF configs; docs/nf_resnets.md, "The ImageNet recipe"): built, not
trained, at a tiny width."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rescale_core.blocks import ResidualBlock
from rescale_tasks.common.cli import build_run
from rescale_tasks.common.training import WeightEMA, build_optimizer, build_scheduler

CONFIG = Path(__file__).resolve().parents[3] / "experiments" / "imagenet" / "nf_resnet50.yaml"
STEPS_PER_EPOCH = 4


def official_lr(step: int, epochs: int = 90, warmup_epochs: int = 5, max_lr: float = 0.4) -> float:
    """nfnets optim.WarmupCosineDecay (start_val 0, min_val 0) at iteration ``step``."""
    warmup, total = warmup_epochs * STEPS_PER_EPOCH, epochs * STEPS_PER_EPOCH
    if step <= warmup:
        return max_lr * step / warmup
    return 0.5 * max_lr * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


@pytest.fixture(scope="module")
def cli():
    return build_run(["--config", str(CONFIG), "--model.init_args.network_options", "{base_width: 4}"])


def test_the_run_keeps_the_official_average_of_the_weights(cli):
    (ema,) = [c for c in cli.trainer.callbacks if isinstance(c, WeightEMA)]
    assert ema.decay == 0.99999 and ema.warmup  # use_ema, ema_decay, which_ema tf1_ema


def test_optimizer_schedule_and_loss_are_the_official_ones(cli):
    assert cli.config["trainer"]["max_epochs"] == 90
    model = cli.model
    assert model.hparams["label_smoothing"] == 0.1 and model.hparams["mixup_alpha"] == 0.0
    optimizer = model.optimizer_factory([torch.nn.Parameter(torch.zeros(1))])
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.defaults["lr"] == pytest.approx(0.4)  # 0.1 x 1024 / 256
    assert optimizer.defaults["momentum"] == 0.9 and optimizer.defaults["nesterov"]
    assert optimizer.defaults["weight_decay"] == 5e-5
    schedule, _ = build_scheduler(model.scheduler_factory, optimizer, STEPS_PER_EPOCH, 90)
    for step in range(90 * STEPS_PER_EPOCH):
        # the official schedule at its iteration step + 1 (our first step already runs at 1/warmup)
        want = official_lr(step + 1)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(want, rel=1e-9, abs=5e-3 * 0.4), step
        optimizer.step()
        schedule.step()


def test_weight_decay_skips_what_the_official_code_skips(cli):
    """The official _make_opt: no decay on names with gain, bias, b (Haiku's bias), scale, offset;
    the classifier's weight decayed; no dropout, the NF scheme's alpha."""
    model = cli.model
    optimizer = build_optimizer(model.net, model.optimizer_factory, model.norm_weight_decay)
    names = {id(p): n for n, p in model.net.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = names[id(p)].rpartition(".")[2]
            skipped = name in ("bias", "gain") or "gain" in name
            assert (group["weight_decay"] == 0) == skipped, (names[id(p)], group["weight_decay"])
    assert any(names[id(p)].endswith("fc.weight") for g in optimizer.param_groups if g["weight_decay"] for p in
               g["params"])
    assert model.net.scheme.nf_alpha == 0.2 and model.net.scheme.classifier_dropout == 0.0


def test_stochastic_depth_is_the_official_one(cli):
    """NF_ResNet's stochdepth_rate 0.1, block ``index`` (from 0) of ``num_blocks`` dropping at
    0.1 * index / num_blocks (nfnets/nf_resnet.py), the kept branches not divided by the keep
    probability (nfnets/base.py's StochDepth, scale_by_keep=False)."""
    assert cli.model.net.scheme.stochdepth_rate == 0.1 and cli.model.net.scheme.stochdepth_scale is False
    blocks = [m for m in cli.model.net.modules() if isinstance(m, ResidualBlock)]
    assert len(blocks) == 16 and [m.drop_rate for m in blocks] == [0.1 * index / 16 for index in range(16)]
    assert not any(m.drop_scale for m in blocks)
