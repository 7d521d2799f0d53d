"""Label-smoothed cross entropy as fairseq computes it (``label_smoothed_cross_entropy``;
Szegedy et al. 2016, eps = 0.1 in Vaswani et al. 2017).

``loss = (1 - eps - eps_i) * nll + eps_i * sum_v(-log p_v)`` with ``eps_i = eps / (V - 1)``: the
smoothing mass goes to the V - 1 other tokens, so the target keeps exactly ``1 - eps``
(PyTorch's ``label_smoothing`` spreads eps over all V tokens, the target included). Padding
positions count nothing. Both terms are returned summed, not averaged: the training step divides
by the number of target tokens summed over every rank (:func:`tokens_over_ranks`), as fairseq
normalises gradients, so a rank with short sentences does not weigh more than one with long ones.
"""
from __future__ import annotations

import torch

from ..common.system import sum_over_ranks

__all__ = ["label_smoothed_nll_loss", "tokens_over_ranks"]


def label_smoothed_nll_loss(logits: torch.Tensor, target: torch.Tensor, epsilon: float,
                            ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed smoothed loss and summed NLL of ``logits [..., V]`` against ``target [...]``,
    computed in float32 whatever the logits' dtype (bf16 log-softmax loses the small terms)."""
    lprobs = torch.log_softmax(logits.float(), dim=-1)
    target = target.unsqueeze(-1)
    keep = target.ne(ignore_index)
    nll = -lprobs.gather(dim=-1, index=target.clamp_min(0)).masked_fill(~keep, 0.0)
    smooth = -lprobs.sum(dim=-1, keepdim=True).masked_fill(~keep, 0.0)
    eps_i = epsilon / (lprobs.size(-1) - 1)
    loss = (1.0 - epsilon - eps_i) * nll.sum() + eps_i * smooth.sum()
    return loss, nll.sum()


def tokens_over_ranks(ntokens: int) -> int:
    """The target tokens of this step on every rank together (host integers, no device sync)."""
    return sum_over_ranks(ntokens)
