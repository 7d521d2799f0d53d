"""The shared task module: what every task's LightningModule inherits."""
from __future__ import annotations

import functools

import pytest
import torch

from rescale_tasks.common.errors import ConfigError
from rescale_tasks.common.module import RescaleTaskModule, accepts
from rescale_tasks.common.schedules import WarmupCosineLR


def tiny(**kwargs) -> RescaleTaskModule:
    return RescaleTaskModule("cifar_resnet", scheme="rescale", network_options={"depth": 8, "base_width": 8},
                             network_kwargs={"num_classes": 3, "in_channels": 1}, **kwargs)


def test_the_network_is_built_by_name_with_the_tasks_sizes():
    module = tiny()
    assert module.scheme_name == "rescale" and module.net.fc.out_features == 3
    x = torch.randn(2, 1, 8, 8)
    (inputs,) = module.network_inputs((x, torch.zeros(2)))
    assert inputs is x and module.net(inputs).shape == (2, 3)


def test_channels_last_reaches_the_inputs():
    module = tiny(channels_last=True)
    (inputs,) = module.network_inputs((torch.randn(2, 1, 8, 8),))
    assert inputs.is_contiguous(memory_format=torch.channels_last)


def test_a_module_without_an_optimizer_says_so():
    with pytest.raises(ConfigError, match="has no optimizer: set model.init_args.optimizer"):
        tiny().configure_optimizers()


def test_accepts_sees_through_jsonargparse_partials():
    assert accepts(functools.partial(WarmupCosineLR, warmup_epochs=1), "steps_per_epoch")
    assert not accepts(functools.partial(torch.optim.lr_scheduler.StepLR, step_size=3), "steps_per_epoch")
