"""The shared decisions of a distributed run, in one process (the two-process run is in
tests/tasks/classification/test_classification_ddp.py)."""
from __future__ import annotations

import torch
from torch import nn

from rescale_tasks.common.system import every_rank_has_samples, sum_over_ranks, world_size, zero_loss


def test_one_process_decides_alone():
    assert world_size() == 1
    assert every_rank_has_samples(3) and not every_rank_has_samples(0)
    assert sum_over_ranks(5) == 5


def test_zero_loss_gives_every_trainable_parameter_a_zero_gradient():
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    net[0].bias.requires_grad_(False)
    loss = zero_loss(net)
    loss.backward()
    assert loss.item() == 0.0 and net[0].bias.grad is None
    grads = [p.grad for p in net.parameters() if p.requires_grad]
    assert len(grads) == 3 and all(g is not None and not g.any() for g in grads)
