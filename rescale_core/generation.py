"""Greedy and beam search for the encoder-decoder Transformer
(:class:`rescale_core.models.transformer.Transformer`) after fairseq's ``SequenceGenerator``
(Ott et al. 2019), over cached keys/values (``Transformer.new_cache`` / ``decode_step``).

What the beam search does, as fairseq does it:

- beams flattened into the batch (``B * beam`` rows); scores are sums of log-softmax
  probabilities; pad is never generated (every other token may be, bos included);
- each step takes the ``2 * beam`` best candidates over all ``beam * V`` extensions, so that
  candidates ending in EOS (at most one per beam) cannot starve the beam: EOS candidates among
  the ``beam`` best are finished, the ``beam`` best non-EOS candidates go on;
- a finished hypothesis is scored ``log p / lp(n)``, n its length including EOS, with
  ``lp(n) = n^alpha`` (fairseq, Hugging Face; ``length_penalty_style="fairseq"``) or
  ``((5 + n) / 6)^alpha`` (Wu et al. 2016, GNMT / OpenNMT; ``"gnmt"``, the penalty Vaswani et
  al. 2017 decode with: beam 4, alpha 0.6). ``len_penalty=0`` ranks by the raw log-probability;
- at most ``max_len = int(max_len_a * src_len + max_len_b)`` tokens before EOS, EOS forced at
  that step; EOS forbidden before ``min_len`` tokens (forcing wins where they conflict);
- a sentence stops once it has ``beam`` finished hypotheses (fairseq's criterion: with a length
  penalty a longer, unfinished hypothesis could still have scored higher) or reaches its
  ``max_len``; finished sentences leave the batch (``IncrementalState.reorder``), so they stop
  costing compute;
- the result per sentence: its finished hypotheses, best first.

Deviations from fairseq: ``src_len`` is each sentence's own non-pad source length (fairseq
takes the padded batch width, so a sentence's translation depends on the batch it is in; here
padding never changes a result) and ``max_len`` is capped at ``max_positions - 1`` of the model;
beams are initialised with -inf scores except the first, instead of searching the first step
on beam 0 only (same result), so any beam size works with any vocabulary (fairseq caps it at
``V - 1``; beams without a finite candidate stay dead and never finish); no unk penalty,
sampling, prefix tokens, n-gram blocking or ensembles. The search runs in eval mode (dropout
off) and restores the model's modes afterwards.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Hypothesis", "GenerationConfig", "LENGTH_PENALTY_STYLES", "length_penalty",
           "max_lengths", "greedy_search", "beam_search", "generate", "best_tokens"]

LENGTH_PENALTY_STYLES = ("fairseq", "gnmt")


@dataclass(frozen=True)
class Hypothesis:
    """One finished translation: ``tokens`` [n] (without bos and EOS), ``score`` (its total
    log-probability divided by the length penalty of n + 1 tokens) and ``positional_scores``
    [n + 1], the log-probability of each token and of the final EOS."""

    tokens: torch.Tensor
    score: float
    positional_scores: torch.Tensor

    @property
    def log_prob(self) -> float:
        return float(self.positional_scores.sum())


@dataclass(frozen=True)
class GenerationConfig:
    """The search settings (:func:`generate`); defaults: beam 4, at most 1.2 * src_len + 10
    tokens (common WMT settings), fairseq's length penalty 1.0. Settings no search can decode
    with are a ValueError naming them: lengths below 0 or not finite, ``max_len_a`` 0 with
    ``max_len_b`` 0 (every translation empty), a length penalty that is not finite."""

    beam: int = 4
    max_len_a: float = 1.2
    max_len_b: int = 10
    min_len: int = 1
    len_penalty: float = 1.0
    length_penalty_style: str = "fairseq"

    def __post_init__(self) -> None:
        _check(self.beam, self.min_len, self.length_penalty_style, self.max_len_a, self.max_len_b,
               self.len_penalty)


def _check(beam: int, min_len: int, style: str, max_len_a: float, max_len_b: int,
           len_penalty: float) -> None:
    """Refuse settings no search can decode with: one ValueError line naming the setting."""
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    if min_len < 0:
        raise ValueError(f"min_len must be >= 0, got {min_len}")
    if style not in LENGTH_PENALTY_STYLES:
        raise ValueError(f"length_penalty_style must be one of {LENGTH_PENALTY_STYLES}, "
                         f"got {style!r}")
    for name, value in (("max_len_a", max_len_a), ("max_len_b", max_len_b), ("len_penalty", len_penalty)):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
    if max_len_a < 0 or max_len_b < 0:
        raise ValueError(f"max_len_a and max_len_b must be >= 0, got {max_len_a} and {max_len_b}")
    if max_len_a == 0 and max_len_b < 1:
        raise ValueError(f"max_len_a {max_len_a} and max_len_b {max_len_b} allow no token: every translation "
                         "(at most int(max_len_a * src_len + max_len_b) tokens) would be empty; give "
                         "max_len_b >= 1 or max_len_a > 0")


def length_penalty(length: int, alpha: float, style: str = "fairseq") -> float:
    """The divisor of a finished hypothesis' log-probability; ``length`` counts EOS."""
    if style == "fairseq":
        return float(length) ** alpha
    if style == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    raise ValueError(f"length_penalty_style must be one of {LENGTH_PENALTY_STYLES}, "
                     f"got {style!r}")


def max_lengths(model, src_tokens: torch.Tensor, max_len_a: float, max_len_b: int) -> list[int]:
    """Per sentence ``int(a * src_len + b)`` tokens before EOS, ``src_len`` its non-pad source
    length, within ``[0, max_positions - 1]`` (the decoder's input holds bos + that many)."""
    cap = model.config.max_positions - 1
    src_lens = src_tokens.ne(model.pad_index).sum(dim=1).tolist()
    return [min(max(int(max_len_a * n + max_len_b), 0), cap) for n in src_lens]


@contextmanager
def _eval_mode(model: nn.Module):
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _step_log_probs(model, cache, prev: torch.Tensor, step: int, max_len: torch.Tensor,
                    min_len: int, eos: int) -> torch.Tensor:
    """Log-probabilities [rows, V] of the next token with the search's constraints: pad never;
    EOS not before ``min_len`` tokens; only EOS (its own log-probability) at ``max_len``."""
    lprobs = model.decode_step(prev[:, None], cache)[:, -1].float().log_softmax(dim=-1)
    lprobs[:, model.pad_index] = -math.inf
    eos_lp = lprobs[:, eos].clone()
    if step < min_len:
        lprobs[:, eos] = -math.inf
    at_max = max_len.le(step)  # device-side: no host read for the constraint
    lprobs.masked_fill_(at_max[:, None], -math.inf)
    lprobs[:, eos] = torch.where(at_max, eos_lp, lprobs[:, eos])
    return lprobs


def _start(model, src_tokens, bos, eos, max_len_a, max_len_b, rows_per_sentence):
    if model.pad_index in (bos, eos):
        raise ValueError(f"bos ({bos}) and eos ({eos}) must differ from pad ({model.pad_index})")
    memory, src_padding_mask = model.encode(src_tokens)
    max_lens = max_lengths(model, src_tokens, max_len_a, max_len_b)
    cache = model.new_cache(memory, src_padding_mask, capacity=max(max_lens, default=0) + 1)
    device = src_tokens.device
    row_max = torch.tensor(max_lens, device=device)
    if rows_per_sentence > 1:
        expand = torch.arange(src_tokens.size(0), device=device)
        expand = expand.repeat_interleave(rows_per_sentence)
        cache.reorder(expand)  # memory projected once per sentence, then copied per beam
        row_max = row_max[expand]
    return cache, max_lens, row_max


@torch.no_grad()
def greedy_search(model, src_tokens: torch.Tensor, *, bos: int, eos: int, max_len_a: float = 1.2,
                  max_len_b: int = 10, min_len: int = 1, len_penalty: float = 1.0,
                  length_penalty_style: str = "fairseq") -> list[Hypothesis]:
    """The most probable next token at every step, per sentence of ``src_tokens`` [B, S]; same
    result as :func:`beam_search` with ``beam=1`` (the score normalised the same way)."""
    _check(1, min_len, length_penalty_style, max_len_a, max_len_b, len_penalty)
    B, device = src_tokens.size(0), src_tokens.device
    with _eval_mode(model):
        cache, max_lens, row_max = _start(model, src_tokens, bos, eos, max_len_a, max_len_b, 1)
        sent = list(range(B))  # original sentence of each live row
        prev = torch.full((B,), bos, dtype=torch.long, device=device)
        cum = torch.zeros(B, device=device)
        hist = torch.empty(B, 0, dtype=torch.long, device=device)
        lp_hist = torch.empty(B, 0, device=device)
        out: list[Hypothesis | None] = [None] * B
        step = 0
        while sent:
            lprobs = _step_log_probs(model, cache, prev, step, row_max, min_len, eos)
            lp, prev = lprobs.max(dim=-1)
            cum = cum + lp  # accumulated as beam search does: same rounding
            hist = torch.cat([hist, prev[:, None]], dim=1)
            lp_hist = torch.cat([lp_hist, lp[:, None]], dim=1)
            done = prev.eq(eos).tolist()
            if any(done):
                divisor = length_penalty(step + 1, len_penalty, length_penalty_style)
                scores = cum.tolist()
                for r, d in enumerate(done):
                    if d:
                        out[sent[r]] = Hypothesis(hist[r, :step].clone(), scores[r] / divisor,
                                                  lp_hist[r].clone())
                keep = [r for r, d in enumerate(done) if not d]
                sent = [sent[r] for r in keep]
                if not sent:
                    break
                index = torch.tensor(keep, device=device)
                cache.reorder(index)  # finished sentences leave the batch
                prev, cum, hist, lp_hist, row_max = (
                    t[index] for t in (prev, cum, hist, lp_hist, row_max))
            step += 1
        return out


@torch.no_grad()
def beam_search(model, src_tokens: torch.Tensor, *, bos: int, eos: int, beam: int = 4,
                max_len_a: float = 1.2, max_len_b: int = 10, min_len: int = 1,
                len_penalty: float = 1.0, length_penalty_style: str = "fairseq",
                ) -> list[list[Hypothesis]]:
    """Beam search (module docstring) for every sentence of ``src_tokens`` [B, S] (any
    padding); per sentence up to ``beam`` finished hypotheses, best first."""
    _check(beam, min_len, length_penalty_style, max_len_a, max_len_b, len_penalty)
    B, K, V = src_tokens.size(0), beam, model.tgt_vocab_size
    device = src_tokens.device
    with _eval_mode(model):
        cache, max_lens, row_max = _start(model, src_tokens, bos, eos, max_len_a, max_len_b, K)
        sent = list(range(B))  # original sentence of each live group of K rows
        finalized: list[list[Hypothesis]] = [[] for _ in range(B)]
        prev = torch.full((B * K,), bos, dtype=torch.long, device=device)
        # every beam starts as the same empty prefix: keep only the first one alive
        cum = torch.full((B, K), -math.inf, device=device)
        cum[:, 0] = 0.0
        hist = torch.empty(B * K, 0, dtype=torch.long, device=device)
        lp_hist = torch.empty(B * K, 0, device=device)
        n_cand = min(2 * K, K * V)
        step = 0
        while True:
            b = len(sent)
            lprobs = _step_log_probs(model, cache, prev, step, row_max, min_len, eos)
            cand = (cum.view(-1, 1) + lprobs).view(b, K * V)
            cand_scores, cand_idx = cand.topk(n_cand, dim=1)  # best first
            cand_beam, cand_tok = cand_idx.div(V, rounding_mode="floor"), cand_idx.remainder(V)
            cand_row = cand_beam + torch.arange(b, device=device)[:, None] * K
            is_eos = cand_tok.eq(eos)
            # EOS among the K best (with a finite score: dead beams never finish)
            fin = is_eos[:, :K] & cand_scores[:, :K].isfinite()
            fin_at = fin.nonzero().tolist()  # row-major: each sentence's best first
            if fin_at:
                rows = cand_row[:, :K][fin]
                eos_lp = lprobs[rows, eos]
                scores = cand_scores[:, :K][fin].tolist()
                divisor = length_penalty(step + 1, len_penalty, length_penalty_style)
                for i, (g, _) in enumerate(fin_at):
                    hyps = finalized[sent[g]]
                    if len(hyps) < K:
                        r = rows[i]
                        hyps.append(Hypothesis(hist[r].clone(), scores[i] / divisor,
                                               torch.cat([lp_hist[r], eos_lp[i:i + 1]])))
            keep = [g for g in range(b)
                    if len(finalized[sent[g]]) < K and step < max_lens[sent[g]]]
            if not keep:
                break
            # the K best candidates that are not EOS: at most K of the 2K are EOS (one per beam)
            rank = torch.arange(n_cand, device=device) + is_eos * n_cand
            active = rank.topk(K, dim=1, largest=False).indices
            if len(keep) < b:  # finished sentences leave the batch
                kept = torch.tensor(keep, device=device)
                active, cand_scores, cand_row, cand_tok = (
                    t[kept] for t in (active, cand_scores, cand_row, cand_tok))
                sent = [sent[g] for g in keep]
            order = cand_row.gather(1, active).view(-1)
            tok = cand_tok.gather(1, active).view(-1)
            cum = cand_scores.gather(1, active)
            cache.reorder(order)
            hist = torch.cat([hist[order], tok[:, None]], dim=1)
            lp_hist = torch.cat([lp_hist[order], lprobs[order, tok][:, None]], dim=1)
            row_max, prev = row_max[order], tok
            step += 1
        for hyps in finalized:
            hyps.sort(key=lambda h: h.score, reverse=True)  # stable: ties keep finishing order
        return finalized


def generate(model, src_tokens: torch.Tensor, *, bos: int, eos: int,
             config: GenerationConfig = GenerationConfig()) -> list[list[Hypothesis]]:
    """The n-best lists of ``config`` (:func:`greedy_search` for beam 1, its equal and cheaper)."""
    kwargs = dict(bos=bos, eos=eos, max_len_a=config.max_len_a, max_len_b=config.max_len_b,
                  min_len=config.min_len, len_penalty=config.len_penalty,
                  length_penalty_style=config.length_penalty_style)
    if config.beam == 1:
        return [[h] for h in greedy_search(model, src_tokens, **kwargs)]
    return beam_search(model, src_tokens, beam=config.beam, **kwargs)


def best_tokens(nbest: list[Hypothesis]) -> torch.Tensor:
    """The tokens of the best of a sentence's hypotheses (:func:`generate`'s result per sentence);
    none where no hypothesis finished: a model whose scores are not finite leaves every beam dead."""
    return nbest[0].tokens if nbest else torch.zeros(0, dtype=torch.long)
