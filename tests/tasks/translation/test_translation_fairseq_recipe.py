"""The translation recipe against fairseq's formulas, written out here from fairseq's definitions
(``optim/lr_scheduler/inverse_square_root_schedule.py`` with the trainer's
``step_update(num_updates)``): the inverse-sqrt schedule of experiments/wmt."""
from __future__ import annotations

import pytest
import torch

from rescale_tasks.common.training import InverseSqrtLR


def _fairseq_inverse_sqrt(lr: float, warmup_init_lr: float, warmup: int, num_updates: int) -> float:
    """fairseq's rate for the update taken after ``num_updates`` updates (``step_update(0)`` when the
    scheduler is built, ``step_update(n)`` after the n-th update)."""
    if num_updates < warmup:
        return warmup_init_lr + num_updates * (lr - warmup_init_lr) / warmup
    return lr * warmup ** 0.5 * num_updates ** -0.5


@pytest.mark.parametrize("warmup_init_lr", [0.0, 1e-7])  # fairseq's default, its WMT recipe's
def test_the_wmt_schedule_is_fairseqs_inverse_sqrt_update_by_update(warmup_init_lr):
    """experiments/wmt: lr 7e-4, 4000 warm-up updates. Optimizer step s (0-based) runs at fairseq's
    rate for num_updates = s: the first at warmup_init_lr, the peak 7e-4 at the 4001st update."""
    lr, warmup = 7e-4, 4000
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=lr, betas=(0.9, 0.98))
    schedule = InverseSqrtLR(opt, warmup_updates=warmup, warmup_init_factor=warmup_init_lr / lr)
    probes = {0, 1, 2, 1999, 3999, 4000, 4001, 4002, 10000}
    got = {}
    for step in range(10001):
        if step in probes:
            got[step] = opt.param_groups[0]["lr"]
        opt.step()
        schedule.step()
    assert got == {s: pytest.approx(_fairseq_inverse_sqrt(lr, warmup_init_lr, warmup, s), rel=1e-12, abs=1e-20)
                   for s in probes}
    assert got[4000] == pytest.approx(lr) and got[3999] < lr and got[4001] < lr
