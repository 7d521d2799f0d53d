"""Corpus BLEU by sacreBLEU (Post 2018), with its signature, summed correctly over DDP ranks.

- ``style="sacrebleu"``: plain sacreBLEU on detokenized text (``tok:13a``), the number to report.
- ``style="compound_split"``: the convention of the WMT14 En-De papers (Vaswani et al. 2017 and
  the deep-Transformer papers after them, via tensor2tensor's ``get_ende_bleu.sh``): hypotheses
  and references tokenized, hyphenated compounds split (``a-b`` -> ``a ##AT##-##AT## b``), then
  BLEU on the tokens. Deviation: sacreBLEU's 13a tokenizer stands in for Moses'
  ``tokenizer.perl`` (sacremoses is no dependency of the suite): 13a keeps non-ASCII quotes and
  apostrophes on their words and splits abbreviations' periods and digit hyphens, Moses the
  other way round; the signature says ``tok:13a+compound-split``.

Under DDP each rank scores its own sentences; the n-gram statistics (matches and totals per
order, hypothesis and reference lengths), not the scores, are summed over ranks and BLEU is
computed once from the sums, so the result equals scoring the whole corpus in one process.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import torch

from ..common.system import sum_tensor_over_ranks

__all__ = ["BleuResult", "corpus_bleu", "bleu_statistics", "bleu_from_statistics", "split_compounds", "STYLES"]

STYLES = ("sacrebleu", "compound_split")
_COMPOUND = re.compile(r"(\S)-(\S)")


@dataclass
class BleuResult:
    score: float
    signature: str
    statistics: list[int]  # 4 matches, 4 totals, hypothesis length, reference length

    def __str__(self) -> str:
        return f"BLEU = {self.score:.2f} ({self.signature})"


def split_compounds(text: str) -> str:
    """``Rock-Musik`` -> ``Rock ##AT##-##AT## Musik``: the script's ``s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g``,
    one pass of non-overlapping matches as in Perl (``a-b-c`` -> ``a ##AT##-##AT## b-c``)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def _metric(style: str):
    from sacrebleu.metrics import BLEU

    if style not in STYLES:
        raise ValueError(f"unknown BLEU style {style!r}; one of {', '.join(STYLES)}")
    if style == "sacrebleu":
        return BLEU(tokenize="13a")
    # the text is tokenized here on purpose: force=True keeps sacreBLEU from warning, at every 100
    # sentences ending in " .", that the user forgot to detokenize (it changes no count or signature)
    return BLEU(tokenize="none", force=True)


def _prepare(lines: Sequence[str], style: str) -> list[str]:
    if style == "sacrebleu":
        return list(lines)
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tokenize = Tokenizer13a()
    return [split_compounds(tokenize(line.strip())) for line in lines]


def bleu_statistics(hypotheses: Sequence[str], references: Sequence[str], style: str = "sacrebleu") -> list[int]:
    """The sufficient statistics of corpus BLEU for these sentence pairs (summable over ranks)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    if not hypotheses:
        return [0] * 10
    score = _metric(style).corpus_score(_prepare(hypotheses, style), [_prepare(references, style)])
    return [*score.counts, *score.totals, score.sys_len, score.ref_len]


def bleu_from_statistics(stats: Sequence[int], style: str = "sacrebleu") -> BleuResult:
    from sacrebleu.metrics import BLEU

    stats = [int(s) for s in stats]
    metric = _metric(style)
    score = BLEU.compute_bleu(correct=stats[:4], total=stats[4:8], sys_len=stats[8], ref_len=stats[9],
                              smooth_method="exp")
    metric.num_refs = 1  # what scoring would set: one reference per sentence
    signature = str(metric.get_signature())
    if style == "compound_split":
        signature = signature.replace("tok:none", "tok:13a+compound-split")
    return BleuResult(float(score.score), signature, stats)


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], style: str = "sacrebleu") -> BleuResult:
    """Corpus BLEU over all ranks: each rank passes its own sentences (every sentence on exactly
    one rank); statistics are summed with ``all_reduce`` when ``torch.distributed`` runs."""
    stats = torch.tensor(bleu_statistics(hypotheses, references, style), dtype=torch.int64)
    return bleu_from_statistics(sum_tensor_over_ranks(stats).tolist(), style)
