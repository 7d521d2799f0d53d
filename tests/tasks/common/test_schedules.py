"""Schedules stepped every optimizer step."""
from __future__ import annotations

import math

import pytest
import torch

from rescale_tasks.common.schedules import InverseSqrtLR


def lrs(scheduler, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        out.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def test_inverse_sqrt_warms_up_linearly_then_decays_as_fairseq():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=5e-4, betas=(0.9, 0.98))
    got = lrs(InverseSqrtLR(opt, warmup_updates=4), 16)
    assert got[:4] == pytest.approx([5e-4 * u / 4 for u in (1, 2, 3)] + [5e-4])
    assert got[15] == pytest.approx(5e-4 * math.sqrt(4 / 16))  # update 16: lr * sqrt(warmup / update)
    assert max(got) == pytest.approx(5e-4)


def test_inverse_sqrt_resumes_from_its_state():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    first = InverseSqrtLR(opt, warmup_updates=3, warmup_init_factor=0.1)
    lrs(first, 5)
    opt2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    again = InverseSqrtLR(opt2, warmup_updates=3, warmup_init_factor=0.1)
    opt2.load_state_dict(opt.state_dict())  # as a checkpoint restores both
    again.load_state_dict(first.state_dict())
    assert lrs(again, 3) == pytest.approx(lrs(first, 3))
    with pytest.raises(ValueError, match="warmup_init_factor"):
        InverseSqrtLR(opt, warmup_init_factor=2.0)
