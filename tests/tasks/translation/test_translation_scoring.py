"""The translation loss and BLEU against their references (fairseq's formula, sacreBLEU itself)."""
from __future__ import annotations

import math

import pytest
import sacrebleu
import torch
import torch.nn.functional as F

from rescale_tasks.translation.bleu import bleu_from_statistics, bleu_statistics, corpus_bleu, split_compounds
from rescale_tasks.translation.loss import label_smoothed_nll_loss

PAD = 1


def test_label_smoothing_keeps_exactly_one_minus_eps_on_the_target():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7)
    target = torch.tensor([[2, 4, PAD], [0, 6, 3]])
    loss, nll = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    lprobs = logits.log_softmax(-1)
    keep = target != PAD
    q = torch.full_like(lprobs, 0.1 / 6).scatter(-1, target.unsqueeze(-1), 0.9)  # the smoothed target
    expected = -(q * lprobs).sum(-1)[keep].sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert nll.item() == pytest.approx(F.nll_loss(lprobs[keep], target[keep], reduction="sum").item(), rel=1e-6)
    plain, _ = label_smoothed_nll_loss(logits, target, 0.0, PAD)
    assert plain.item() == pytest.approx(nll.item(), rel=1e-6)


def test_label_smoothing_in_bf16_is_computed_in_float32():
    logits = torch.randn(4, 50)
    target = torch.arange(4)
    full, _ = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    half, _ = label_smoothed_nll_loss(logits.bfloat16(), target, 0.1, PAD)
    assert half.dtype == torch.float32 and half.item() == pytest.approx(full.item(), rel=2e-2)


HYP = ["Das ist ein Rock-Musik-Test .", "Der Hund bellt laut", "Ein kleines Haus"]
REF = ["Das ist ein Rock-Musik-Test .", "Der Hund bellte laut", "Ein sehr kleines Haus"]


def test_sacrebleu_style_is_sacrebleu_itself():
    result = corpus_bleu(HYP, REF)
    reference = sacrebleu.corpus_bleu(HYP, [REF])
    assert result.score == pytest.approx(reference.score) and result.signature.startswith("nrefs:1|case:mixed")
    assert "tok:13a" in result.signature and str(result).startswith("BLEU = ")


def test_statistics_summed_over_shards_give_the_corpus_score():
    """What corpus_bleu does over DDP ranks: shard statistics summed, BLEU computed once."""
    shards = [bleu_statistics(HYP[:1], REF[:1]), bleu_statistics(HYP[1:], REF[1:])]
    summed = [a + b for a, b in zip(*shards)]
    assert bleu_from_statistics(summed).score == pytest.approx(sacrebleu.corpus_bleu(HYP, [REF]).score)
    assert bleu_statistics([], []) == [0] * 10


def test_compound_splitting_convention():
    # one Perl-style pass of non-overlapping matches, as tensor2tensor's get_ende_bleu.sh
    assert split_compounds("Rock-Musik-Test , e-mail") == "Rock ##AT##-##AT## Musik ##AT##-##AT## Test , e ##AT##-##AT## mail"
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"  # Perl leaves overlapping matches too
    result = corpus_bleu(HYP, REF, style="compound_split")
    assert "tok:13a+compound-split" in result.signature
    # the split compound counts as 5 matching tokens instead of one: the score rises
    assert result.score > corpus_bleu(HYP, REF).score and math.isfinite(result.score)
    with pytest.raises(ValueError, match="unknown BLEU style"):
        corpus_bleu(HYP, REF, style="multi-bleu")


def test_compound_split_scoring_never_says_the_text_was_not_detokenized(capsys, caplog):
    """compound_split tokenizes what it scores, so nearly every line ends in " .": sacreBLEU would
    warn at every batch of 100 such lines that the user forgot to detokenize, of text that is
    detokenized, and suggest a wrong fix. The score is sacreBLEU's on the tokens all the same."""
    hyps, refs = ["Das ist ein Haus."] * 120, ["Das ist ein Rock-Haus."] * 120
    stats = bleu_statistics(hyps, refs, "compound_split")
    said = capsys.readouterr().err + caplog.text
    assert "detokenize" not in said and "tokenized period" not in said
    tokens = ["Das ist ein Haus ."] * 120, [["Das ist ein Rock ##AT##-##AT## Haus ."] * 120]
    assert bleu_from_statistics(stats, "compound_split").score == pytest.approx(
        sacrebleu.corpus_bleu(*tokens, tokenize="none", force=True).score)


def test_a_batch_whose_loss_is_not_finite_makes_the_epoch_mean_nan():
    """The token-weighted epoch means of the loss (train, val, test) count every batch: one
    whose loss overflowed is not dropped, so a broken model cannot report its finite batches' loss."""
    from rescale_tasks.translation.module import TranslationModule

    module = TranslationModule("transformer_tiny", "rescale", vocab_size=32,
                               network_options={"d_model": 16, "nhead": 2, "dim_feedforward": 32})
    for split in ("train", "val", "test"):
        for metric in (getattr(module, f"{split}_loss"), getattr(module, f"{split}_nll")):
            metric.update(torch.tensor(2.0), weight=30)
            metric.update(torch.tensor(1.0), weight=10)
            assert metric.compute().item() == pytest.approx(1.75), split  # token-weighted
            metric.update(torch.tensor(float("nan")), weight=10)
            assert math.isnan(metric.compute().item()), split
