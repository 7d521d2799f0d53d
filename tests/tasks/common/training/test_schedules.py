"""Schedules stepped every optimizer step, against values computed by hand at their boundaries: the
first step, the end of the warm-up, each milestone, the last step, and a resume mid-warm-up.

``lrs(...)[s]`` is the learning rate optimizer step ``s`` (0-based) runs with, as Lightning steps
a per-step schedule: once after every optimizer step. The formulas are the papers' recipes: a
linear warm-up reaching the base rate on its last step (Goyal et al. 2017), then a cosine from
the base rate to ``min_factor`` times it over the remaining epochs (Loshchilov & Hutter 2017), or
x``gamma`` at each milestone (He et al. 2016); Detectron2's warm-up from ``warmup_factor``.
"""
from __future__ import annotations

import math

import pytest
import torch

from rescale_tasks.common.training import (ConstantLR, InverseSqrtLR, IterationMultiStepLR, WarmupCosineLR,
                                           WarmupMultiStepLR)


def lrs(scheduler, steps: int) -> list[float]:
    """The learning rate of each of the next ``steps`` optimizer steps."""
    out = []
    for _ in range(steps):
        out.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def test_inverse_sqrt_warms_up_linearly_then_decays_as_fairseq():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=5e-4, betas=(0.9, 0.98))
    got = lrs(InverseSqrtLR(opt, warmup_updates=4), 16)
    # step s runs at fairseq's num_updates s: from warmup_init_lr (0), the peak at step 4 (update 5)
    assert got[:5] == pytest.approx([5e-4 * s / 4 for s in (0, 1, 2, 3)] + [5e-4])
    assert got[15] == pytest.approx(5e-4 * math.sqrt(4 / 15))  # lr * sqrt(warmup / num_updates)
    assert max(got) == pytest.approx(5e-4)


def test_inverse_sqrt_without_warmup_is_t_fixups_schedule():
    """layer6ai-labs/T-Fixup's inverse_sqrt_nowarmup: lr * sqrt(P / (P + num_updates)), the
    first update at lr (num_updates 0)."""
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=5e-4, betas=(0.9, 0.98))
    got = lrs(InverseSqrtLR(opt, warmup_updates=0, decay_period=4), 9)
    assert got == pytest.approx([5e-4 * math.sqrt(4 / (4 + n)) for n in range(9)])
    with pytest.raises(ValueError, match="decay_period .* with warmup_updates 0"):
        InverseSqrtLR(opt, warmup_updates=10, decay_period=4)


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


BASE = 0.1


def optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE, momentum=0.9)


def resumed(make, done: int, steps: int) -> list[float]:
    """The rates of ``steps`` steps after ``done`` steps, resumed as a checkpoint does it: a new
    optimizer and schedule, then the saved optimizer state and schedule state loaded into them."""
    first = make(optimizer())
    lrs(first, done)
    again = make(optimizer())
    again.optimizer.load_state_dict(first.optimizer.state_dict())
    again.load_state_dict(first.state_dict())
    return lrs(again, steps)


def test_an_epoch_schedule_resumed_with_other_steps_per_epoch_keeps_its_epoch():
    """Resumed at an epoch's end with another batch size (another ``steps_per_epoch``): the schedule
    goes on from the same epoch, as a run with the new batch size from the start would be there."""
    first = WarmupCosineLR(optimizer(), warmup_epochs=1, steps_per_epoch=3, max_epochs=4)
    lrs(first, 6)  # two epochs of 3 steps
    again = WarmupCosineLR(optimizer(), warmup_epochs=1, steps_per_epoch=6, max_epochs=4)
    again.optimizer.load_state_dict(first.optimizer.state_dict())
    again.load_state_dict(first.state_dict())
    fresh = WarmupCosineLR(optimizer(), warmup_epochs=1, steps_per_epoch=6, max_epochs=4)
    lrs(fresh, 12)
    assert lrs(again, 12) == pytest.approx(lrs(fresh, 12))
    assert again.steps_per_epoch == 6


def test_warmup_cosine_at_its_boundaries():
    # 2 warm-up epochs of 5 steps, then a cosine over the other 8 epochs (40 steps) down to 0.1 x
    def make(opt):
        return WarmupCosineLR(opt, warmup_epochs=2, min_factor=0.1, steps_per_epoch=5, max_epochs=10)
    lr = lrs(make(optimizer()), 50)
    assert lr[0] == pytest.approx(BASE * 1 / 10)  # first step: 1/10 of the warm-up
    assert lr[4] == pytest.approx(BASE * 5 / 10)
    assert lr[9] == pytest.approx(BASE)  # last warm-up step: the base rate
    assert lr[10] == pytest.approx(BASE)  # the cosine starts at its top
    assert lr[30] == pytest.approx(BASE * (0.1 + 0.9 * 0.5))  # half-way: the mean of top and floor
    assert lr[49] == pytest.approx(BASE * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 39 / 40))))
    assert min(lr[10:]) == lr[49] > BASE * 0.1  # never below the floor within the run
    assert all(a >= b for a, b in zip(lr[10:], lr[11:]))  # monotone after the warm-up
    assert resumed(make, 3, 10) == pytest.approx(lr[3:13])  # resumed mid-warm-up: the same rates


def slowfast_lr(epoch: float, base: float, start: float, warmup: float, max_epoch: float) -> float:
    """SlowFast's ``get_lr_at_epoch`` with ``lr_func_cosine`` (``COSINE_AFTER_WARMUP: False``,
    ``COSINE_END_LR`` 0): the cosine over the whole run from epoch 0, the warm-up linear in epochs
    from ``WARMUP_START_LR`` to the cosine's value at its end."""
    def cosine(e):
        return base * (math.cos(math.pi * e / max_epoch) + 1.0) * 0.5
    if epoch < warmup:
        return start + epoch * (cosine(warmup) - start) / warmup
    return cosine(epoch)


def test_warmup_cosine_from_epoch_zero_is_slowfasts_schedule():
    """The Kinetics recipe's (SLOW_8x8_R50: 34 warm-up epochs from lr 0.01 of 0.1, 196 epochs): the
    lr at every step, SlowFast reading it at epoch ``step / steps_per_epoch``; the shared warm-up
    then cosine after it ran 8% higher at the warm-up's end and a third higher mid-run."""
    steps_per_epoch, warmup, epochs = 2, 34, 196

    def make(opt):
        return WarmupCosineLR(opt, warmup_epochs=warmup, steps_per_epoch=steps_per_epoch, max_epochs=epochs,
                              cosine_after_warmup=False, warmup_start_factor=0.1)
    lr = lrs(make(optimizer()), epochs * steps_per_epoch)
    want = [slowfast_lr(s / steps_per_epoch, BASE, 0.1 * BASE, warmup, epochs) for s in range(len(lr))]
    assert lr == pytest.approx(want, rel=1e-9, abs=1e-15)
    assert resumed(make, 60, 20) == pytest.approx(lr[60:80])  # resumed across the warm-up's end


def test_a_warmup_start_factor_lifts_the_shared_warmup():
    lr = lrs(WarmupCosineLR(optimizer(), warmup_epochs=1, steps_per_epoch=4, max_epochs=3, warmup_start_factor=0.2), 5)
    assert lr[:5] == pytest.approx([BASE * (0.2 + 0.8 * s / 4) for s in (1, 2, 3, 4)] + [BASE])


def test_the_new_settings_at_their_defaults_leave_a_saved_schedule_as_it_was():
    """A checkpoint's schedule written before ``cosine_after_warmup`` and ``warmup_start_factor``
    existed compares equal to the same schedule now (a resume is not refused), and a setting off
    its default is one the comparison names."""
    from rescale_tasks.common.training import training_state_differences

    old = WarmupCosineLR(optimizer(), warmup_epochs=1, steps_per_epoch=2, max_epochs=3)
    assert "cosine_after_warmup" not in old.state_dict() and "warmup_start_factor" not in old.state_dict()
    slowfast = WarmupCosineLR(optimizer(), warmup_epochs=1, steps_per_epoch=2, max_epochs=3,
                              cosine_after_warmup=False)
    opt = [old.optimizer.state_dict()]
    assert training_state_differences(opt, [old.state_dict()], [old.optimizer], [old]) == []
    assert training_state_differences(opt, [old.state_dict()], [slowfast.optimizer], [slowfast])


def test_warmup_cosine_to_zero_without_warmup():
    lr = lrs(WarmupCosineLR(optimizer(), steps_per_epoch=4, max_epochs=2), 8)
    assert lr[0] == pytest.approx(BASE)
    assert lr[4] == pytest.approx(BASE * 0.5)
    assert lr[7] == pytest.approx(BASE * 0.5 * (1 + math.cos(math.pi * 7 / 8)))


def test_a_fractional_warmup_never_overshoots_the_base_rate():
    # half an epoch of 3 steps: 1.5 warm-up steps; the second step is past it, at the base rate
    lr = lrs(WarmupCosineLR(optimizer(), warmup_epochs=0.5, steps_per_epoch=3, max_epochs=10), 4)
    assert lr[0] == pytest.approx(BASE / 1.5)
    assert lr[1] == pytest.approx(BASE)
    assert max(lr) == pytest.approx(BASE)


def test_warmup_multistep_at_its_boundaries():
    # 1 warm-up epoch of 4 steps, then x0.1 after epochs 2 and 4
    def make(opt):
        return WarmupMultiStepLR(opt, milestones=[2, 4], gamma=0.1, warmup_epochs=1, steps_per_epoch=4)
    lr = lrs(make(optimizer()), 20)
    assert lr[0] == pytest.approx(BASE / 4)
    assert lr[3] == pytest.approx(BASE)  # end of the warm-up
    assert lr[4:8] == pytest.approx([BASE] * 4)
    assert lr[7] == pytest.approx(BASE) and lr[8] == pytest.approx(BASE * 0.1)  # first milestone: epoch 2
    assert lr[15] == pytest.approx(BASE * 0.1) and lr[16] == pytest.approx(BASE * 0.01)  # second: epoch 4
    assert lr[19] == pytest.approx(BASE * 0.01)  # last step
    assert resumed(make, 2, 8) == pytest.approx(lr[2:10])


def test_constant_with_and_without_warmup():
    lr = lrs(ConstantLR(optimizer(), warmup_epochs=1, steps_per_epoch=4), 8)
    assert lr == pytest.approx([BASE / 4, BASE / 2, BASE * 3 / 4] + [BASE] * 5)
    assert lrs(ConstantLR(optimizer(), steps_per_epoch=4), 3) == pytest.approx([BASE] * 3)


def test_iteration_multistep_as_detectron2():
    # warm-up over 4 iterations from 0.001 x, then x0.1 at iterations 6 and 8
    def make(opt):
        return IterationMultiStepLR(opt, milestones=[6, 8], gamma=0.1, warmup_iters=4, warmup_factor=0.001)
    lr = lrs(make(optimizer()), 10)
    assert lr[0] == pytest.approx(BASE * 0.001)
    assert lr[2] == pytest.approx(BASE * (0.001 * 0.5 + 0.5))  # half-way: alpha = 2 / 4
    assert lr[4] == pytest.approx(BASE) and lr[5] == pytest.approx(BASE)
    assert lr[6] == pytest.approx(BASE * 0.1) and lr[8] == pytest.approx(BASE * 0.01)
    assert lr[9] == pytest.approx(BASE * 0.01)
    assert resumed(make, 1, 6) == pytest.approx(lr[1:7])
    # a milestone inside the warm-up multiplies the warm-up factor
    early = lrs(IterationMultiStepLR(optimizer(), milestones=[2], warmup_iters=4, warmup_factor=0.001), 3)
    assert early[2] == pytest.approx(BASE * 0.1 * (0.001 * 0.5 + 0.5))


@pytest.mark.parametrize("make,match", [
    (lambda o: WarmupCosineLR(o, warmup_epochs=-1, max_epochs=5), r"warmup_epochs \(-1.0\) must be >= 0"),
    (lambda o: WarmupCosineLR(o, min_factor=1.5, max_epochs=5), r"min_factor \(1.5\) must be in \[0, 1\]"),
    (lambda o: WarmupCosineLR(o, warmup_start_factor=-0.1, max_epochs=5),
     r"warmup_start_factor \(-0.1\) must be in \[0, 1\]"),
    (lambda o: WarmupMultiStepLR(o, milestones=[30, 6, 90]), r"milestones \[30.0, 6.0, 90.0\] must increase"),
    (lambda o: WarmupMultiStepLR(o, milestones=[-1, 3]), r"milestones \[-1.0, 3.0\] must be >= 0"),
    (lambda o: WarmupMultiStepLR(o, gamma=-0.1), r"gamma \(-0.1\) must be > 0"),
    (lambda o: ConstantLR(o, warmup_epochs=-2), r"warmup_epochs \(-2.0\) must be >= 0"),
    (lambda o: IterationMultiStepLR(o, milestones=[80000, 60000]), r"milestones \[80000, 60000\] must increase"),
    (lambda o: IterationMultiStepLR(o, gamma=0), r"gamma \(0.0\) must be > 0"),
])
def test_a_bad_schedule_argument_is_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make(optimizer())
