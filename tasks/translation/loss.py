"""Label-smoothed cross entropy as fairseq computes it (``label_smoothed_cross_entropy``;
Szegedy et al. 2016, eps = 0.1 in Vaswani et al. 2017), and fairseq's normalisation of the
gradient of one update.

``loss = (1 - eps - eps_i) * nll + eps_i * sum_v(-log p_v)`` with ``eps_i = eps / (V - 1)``: the
smoothing mass goes to the V - 1 other tokens, so the target keeps exactly ``1 - eps``
(PyTorch's ``label_smoothing`` spreads eps over all V tokens, the target included; fairseq's
criterion did too before it moved to ``V - 1``). Padding positions count nothing. Both terms are
returned summed, not averaged, in nats.

The gradient of an update is that of the losses summed over every micro-batch of the update
(``trainer.accumulate_grad_batches``, fairseq's ``--update-freq``) and every rank, divided by the
target tokens of them all (fairseq's ``sample_size``), so a token weighs the same whatever rank
and micro-batch it is in: :class:`UpdateTokens` keeps the count.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Optional

import torch

from ..common.system import sum_over_ranks

__all__ = ["label_smoothed_nll_loss", "tokens_over_ranks", "UpdateTokens", "scale_gradients"]


def label_smoothed_nll_loss(logits: torch.Tensor, target: torch.Tensor, epsilon: float,
                            ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed smoothed loss and summed NLL of ``logits [..., V]`` against ``target [...]``,
    computed in float32 (float64 for float64 logits) whatever the logits' dtype (bf16 log-softmax
    loses the small terms)."""
    lprobs = torch.log_softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1)
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


class UpdateTokens:
    """The target tokens of one optimizer update, summed over its micro-batches and ranks, and the
    factor that turns the accumulated gradient into the gradient of the summed loss divided by them.

    The loss of a micro-batch is not known to be the last of its update when it runs backward, so
    each is divided by the same stand-in, the tokens (over ranks) of the update's first micro-batch
    (:meth:`add`), which keeps the losses near one per token, as fp16 AMP's scaler wants; Lightning
    then divides each by ``accumulate_grad_batches`` and DDP averages over the ranks.
    :meth:`gradient_factor`, taken once the update's last backward has run, gives what the
    gradients are multiplied by, before any clipping and the optimizer step; it starts the count of
    the next update. Host integers only (no device sync); :meth:`add_sums` keeps the update's
    losses on this rank and :meth:`per_token` sums them over the ranks once, for the update's
    logged losses, as fairseq logs an update's."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.first, self.total = 0, 0
        self.sums: Optional[torch.Tensor] = None

    def add_sums(self, sums: torch.Tensor) -> None:
        """Add a micro-batch's losses on this rank (any tensor, on the device: no sync)."""
        self.sums = sums if self.sums is None else self.sums + sums

    def per_token(self, reduce: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The update's losses so far per target token (of the micro-batches :meth:`add` counted,
        over all ranks): this rank's sums (:meth:`add_sums`) summed over the ranks by ``reduce``,
        once per update (every rank calls it at the same micro-batch)."""
        return reduce(self.sums) / max(self.total, 1)

    def add(self, tokens: int) -> int:
        """Count a micro-batch of ``tokens`` target tokens over all ranks; the number its summed
        loss is divided by."""
        if self.first == 0 and tokens > 0:  # an update's first micro-batch with a token: not 1 for one without
            self.first = int(tokens)
        self.total += int(tokens)
        return max(self.first, 1)

    def gradient_factor(self, accumulate_grad_batches: int) -> float:
        """``first * accumulate_grad_batches / total`` (1.0 for an update without a token, whose
        gradient is zero), and the count starts again."""
        factor = self.first * accumulate_grad_batches / self.total if self.total else 1.0
        self.reset()
        return factor


def scale_gradients(parameters: Iterable[torch.Tensor], factor: float) -> None:
    """Multiply the gradient of every parameter that has one by ``factor`` (nothing when it is 1)."""
    if factor == 1.0:
        return
    for p in parameters:
        if p.grad is not None:
            p.grad.mul_(factor)
