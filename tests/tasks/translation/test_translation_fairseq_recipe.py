"""The translation recipe against fairseq's formulas, written out here from fairseq's definitions
(``criterions/label_smoothed_cross_entropy.py``, ``optim/lr_scheduler/inverse_square_root_schedule.py``
with the trainer's ``step_update(num_updates)``, ``optim/adam.py``): the label-smoothed loss and
what is logged of it, the inverse-sqrt schedule of experiments/wmt, and Adam's update, as
docs/tasks/translation.md states them."""
from __future__ import annotations

import math

import pytest
import torch

from rescale_tasks.common.training import InverseSqrtLR
from rescale_tasks.translation.loss import label_smoothed_nll_loss


def test_the_smoothed_loss_is_the_cross_entropy_with_fairseqs_smoothed_targets():
    """fairseq's target distribution: 1 - eps on the reference token, eps / (V - 1) on each of the
    others, padding positions left out; the loss is its cross entropy with the model (nats, summed),
    the NLL that of the reference alone. fairseq logs both per target token in base 2 and its
    perplexity 2 ** nll_bits, which is exp of the per-token NLL in nats logged here."""
    vocab, pad, eps = 7, 1, 0.1
    logits = torch.randn(2, 4, vocab, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    target = torch.tensor([[3, 5, 2, pad], [4, pad, pad, pad]])
    loss, nll = label_smoothed_nll_loss(logits, target, eps, pad)
    log_p = logits.log_softmax(-1)
    expected_loss = expected_nll = 0.0
    tokens = 0
    for row, position in zip(*torch.nonzero(target.ne(pad), as_tuple=True)):
        y = int(target[row, position])
        smoothed = torch.full((vocab,), eps / (vocab - 1), dtype=torch.float64)
        smoothed[y] = 1 - eps
        expected_loss += float(-(smoothed * log_p[row, position]).sum())
        expected_nll += float(-log_p[row, position, y])
        tokens += 1
    assert loss.dtype == torch.float64 and tokens == 4
    assert float(loss) == pytest.approx(expected_loss, rel=1e-12)
    assert float(nll) == pytest.approx(expected_nll, rel=1e-12)
    nll_bits = expected_nll / tokens / math.log(2)  # fairseq's logged nll_loss
    assert math.exp(float(nll) / tokens) == pytest.approx(2 ** nll_bits, rel=1e-12)  # train/ppl = fairseq's ppl


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


def _fairseq_adam_step(p, grad, m, v, step, lr, betas, eps, weight_decay):
    """One update of fairseq's Adam (optim/adam.py): eps added to sqrt(v) before the bias
    correction, which goes into the step size; weight decay subtracted from the weights, times lr
    (decoupled, as AdamW)."""
    m = betas[0] * m + (1 - betas[0]) * grad
    v = betas[1] * v + (1 - betas[1]) * grad * grad
    step_size = lr * math.sqrt(1 - betas[1] ** step) / (1 - betas[0] ** step)
    p = p - weight_decay * lr * p
    return p - step_size * m / (v.sqrt() + eps), m, v


@pytest.mark.parametrize("optimizer,weight_decay,close", [
    (torch.optim.Adam, 0.0, True),  # the WMT configs: no weight decay, Adam is fairseq's Adam
    (torch.optim.AdamW, 0.01, True),  # fairseq's --weight-decay is AdamW's decoupled decay
    (torch.optim.Adam, 0.01, False),  # torch's Adam adds the decay to the gradient (L2) instead
])
def test_adam_against_fairseqs_update(optimizer, weight_decay, close):
    """Three updates with betas (0.9, 0.98), eps 1e-8: torch's eps is added after the bias
    correction of sqrt(v), fairseq's before it, a relative difference near eps / |grad|."""
    g = torch.Generator().manual_seed(0)
    start = torch.randn(5, generator=g, dtype=torch.float64)
    grads = [torch.randn(5, generator=g, dtype=torch.float64) for _ in range(3)]
    lr, betas, eps = 7e-4, (0.9, 0.98), 1e-8
    param = torch.nn.Parameter(start.clone())
    opt = optimizer([param], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    p, m, v = start.clone(), torch.zeros(5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64)
    for step, grad in enumerate(grads, start=1):
        param.grad = grad.clone()
        opt.step()
        p, m, v = _fairseq_adam_step(p, grad, m, v, step, lr, betas, eps, weight_decay)
    moved = (p - start).abs().max().item()
    assert moved > 1e-3
    difference = (param.detach() - p).abs().max().item()
    assert (difference < 1e-6 * moved) == close, difference / moved
