"""The gradient of one update is fairseq's (``trainer.py`` ``train_step``): the label-smoothed loss
summed over every micro-batch of ``accumulate_grad_batches`` (``--update-freq``) and every rank,
divided by the target tokens of them all, before clipping and the step. In float64, one update
accumulated over micro-batches of different token counts, or spread over two gloo processes,
equals one step on all the batches together."""
from __future__ import annotations

import os
import socket

import lightning as L
import pytest
import torch
import torch.multiprocessing as mp
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from rescale_tasks.translation.module import TranslationModule

VOCAB, PAD, SRC, TGT = 20, 1, 5, 6


def _batch(target_lengths: list[int], seed: int) -> dict:
    """A batch of fixed padded shapes whose targets have the given lengths (the rest padding)."""
    g = torch.Generator().manual_seed(seed)
    n = len(target_lengths)
    src = torch.randint(3, VOCAB, (n, SRC), generator=g)
    tgt = torch.randint(3, VOCAB, (n, TGT), generator=g)
    for row, length in enumerate(target_lengths):
        tgt[row, length:] = PAD
    prev = torch.cat([torch.zeros(n, 1, dtype=torch.long), tgt[:, :-1]], dim=1).masked_fill(tgt.eq(PAD), PAD)
    return {"id": torch.arange(n), "src_tokens": src, "prev_output_tokens": prev, "target": tgt,
            "ntokens": int(tgt.ne(PAD).sum())}


def _together(*batches: dict) -> dict:
    return {k: sum(b[k] for b in batches) if k == "ntokens" else torch.cat([b[k] for b in batches])
            for k in batches[0]}


# micro-batches of 7, 17, 6 and 11 target tokens
BATCHES = [_batch([6, 1], 1), _batch([6, 6, 5], 2), _batch([1, 5], 3), _batch([6, 5], 4)]


class _Gradients(L.Callback):
    """The gradients the optimizer is about to step with (the callbacks' view, before clipping)."""

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.grads = {n: p.grad.detach().clone() for n, p in pl_module.named_parameters()}


def _sgd(params):
    return torch.optim.SGD(params, lr=1.0)


def _update(batches: list[dict], accumulate: int, **trainer: object) -> tuple[dict, dict, dict]:
    """(gradients, weights, logged step losses) after one update of a float64 tiny Transformer
    over ``batches``."""
    torch.manual_seed(0)
    module = TranslationModule("transformer_tiny", "pre_ln", vocab_size=VOCAB, pad_index=PAD, val_bleu_sentences=0,
                               network_options={"dropout": 0.0}, optimizer=_sgd).double()
    grads = _Gradients()
    fit = L.Trainer(accelerator="cpu", max_steps=1, accumulate_grad_batches=accumulate, precision="64-true",
                    gradient_clip_val=0.05, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, limit_val_batches=0, callbacks=[grads], **trainer)
    fit.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    logged = {k: float(fit.callback_metrics[k]) for k in ("train/loss_step", "train/nll_loss_step", "train/ppl")}
    return grads.grads, {n: p.detach().clone() for n, p in module.named_parameters()}, logged


def _assert_same(ours: dict, expected: dict) -> None:
    assert ours.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(ours[name], expected[name], rtol=1e-10, atol=1e-12, msg=name)


def test_accumulated_micro_batches_give_the_gradient_of_the_whole_update():
    """Accumulation 2 over micro-batches of 7 and 17 tokens: the gradients (and the weights after
    norm clipping at 0.05, which is not linear in them) of one step on the 24 tokens together; each
    micro-batch divided by its own tokens would weigh a token of the short one 17/7 times more."""
    first, second = BATCHES[:2]
    grads, weights, logged = _update([first, second], 2)
    one_grads, one_weights, one_logged = _update([_together(first, second)], 1)
    _assert_same(grads, one_grads)
    _assert_same(weights, one_weights)
    # the step's logged losses are the update's per token, not its last micro-batch's (fairseq's)
    assert logged == pytest.approx(one_logged, rel=1e-12)
    # and a partial update at the end of the data (1 micro-batch of 2) is that micro-batch's own
    grads, _, _ = _update([first], 2)
    _assert_same(grads, _update([first], 1)[0])


def test_the_logged_update_losses_are_summed_over_the_ranks_once_per_update(monkeypatch):
    """Each micro-batch's losses stay on its rank; the update's are reduced over the ranks once, at
    its last micro-batch (they were at every micro-batch, only for the logger to keep the last)."""
    reduced = []
    plain = SingleDeviceStrategy.reduce
    monkeypatch.setattr(SingleDeviceStrategy, "reduce",
                        lambda self, tensor, *args, **kw: reduced.append(tensor) or plain(self, tensor, *args, **kw))
    _update(BATCHES, 2)  # two micro-batches of the one update (max_steps 1), two left unread
    assert len([t for t in reduced if isinstance(t, torch.Tensor) and t.shape == (2,)]) == 1


def _rank(rank: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                      LOCAL_RANK=str(rank), NODE_RANK="0", OMP_NUM_THREADS="1")
    grads, weights, logged = _update(BATCHES[rank::2], 2, devices=2, use_distributed_sampler=False,
                                     strategy=DDPStrategy(process_group_backend="gloo"))
    torch.save({"grads": grads, "weights": weights, "logged": logged}, os.path.join(folder, f"rank{rank}.pt"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.ddp
def test_two_ranks_accumulating_equal_one_process_on_all_their_batches(tmp_path):
    """Two gloo processes, each accumulating 2 micro-batches (7 + 6 tokens on rank 0, 17 + 11 on
    rank 1): the gradients and weights of one process stepping once on the four together, and
    the step losses both log are its, weighted by tokens over both ranks' whole update."""
    context = mp.get_context("fork")
    ranks = [context.Process(target=_rank, args=(r, port, str(tmp_path))) for port in [_free_port()] for r in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(120)
    assert [p.exitcode for p in ranks] == [0, 0]
    one_grads, one_weights, one_logged = _update([_together(*BATCHES)], 1)
    for r in (0, 1):
        state = torch.load(tmp_path / f"rank{r}.pt", weights_only=True)
        _assert_same(state["grads"], one_grads)
        _assert_same(state["weights"], one_weights)
        assert state["logged"] == pytest.approx(one_logged, rel=1e-12)


def test_an_update_whose_first_micro_batch_has_no_token_divides_by_the_next_ones_tokens():
    """Not by 1 (losses thousands of times too large for fp16's scaler): the stand-in divisor is the
    first micro-batch with a token, and the factor still gives the loss summed over the update's tokens."""
    from rescale_tasks.translation.loss import UpdateTokens

    tokens = UpdateTokens()
    assert [tokens.add(0), tokens.add(100), tokens.add(50)] == [1, 100, 100]
    assert tokens.gradient_factor(3) == 100 * 3 / 150
    assert tokens.add(7) == 7  # the next update counts again
