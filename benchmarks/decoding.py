"""Decoding speed of the encoder-decoder Transformer: with the key/value cache against full
recomputation of the decoder over the whole prefix, at fixed output lengths.

Every search here is forced to emit exactly ``length`` tokens and then EOS (``min_len = length``
forbids EOS before, ``max_len_a = 0, max_len_b = length`` forces it after), so a cached and an
uncached search of the same sentences do the same number of steps whatever the (untrained)
model prefers; a step count is the same for every sentence, so sentences/s is batch / seconds.

- ``greedy, cached``: :func:`rescale_core.generation.greedy_search` (``Transformer.new_cache`` /
  ``decode_step``: one new position per step through the decoder, cached self-attention
  keys/values, cross-attention memory projected once).
- ``greedy, recomputed``: :func:`greedy_recompute`, the reference without a cache: the encoder
  once, then at every step the decoder over the whole prefix (bos + the tokens so far) and the
  output projection of its last position, argmax with the same constraints (pad never, EOS
  only at the forced end). What the cache saves is everything but the last position's work.
  It returns the same tokens as the cached search (the harness checks and says so).
- ``beam k, cached``: :func:`rescale_core.generation.beam_search` at the same forced length
  (``k`` rows per sentence, the suite's batched beam search); there is no uncached beam search
  to pair it with, so it is reported beside the greedy pair, not as a goal.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from rescale_core.generation import beam_search, greedy_search

__all__ = ["forced", "greedy_recompute", "greedy_cached", "decoders"]


def forced(length: int) -> dict:
    """Search options that emit exactly ``length`` tokens, then EOS."""
    return {"max_len_a": 0.0, "max_len_b": int(length), "min_len": int(length)}


@torch.no_grad()
def greedy_recompute(model, src_tokens: torch.Tensor, *, bos: int, eos: int, length: int) -> torch.Tensor:
    """Greedy decoding of exactly ``length`` tokens (then EOS) per sentence without a cache:
    the decoder runs over the whole prefix at every step. Returns tokens [B, length] (without
    bos and EOS). The model must be in eval mode."""
    memory, src_padding_mask = model.encode(src_tokens)
    prefix = torch.full((src_tokens.size(0), 1), bos, dtype=torch.long, device=src_tokens.device)
    for _step in range(length):
        hidden = model.decoder(prefix, memory, src_padding_mask)[:, -1]
        lprobs = model.output_projection(hidden).float().log_softmax(dim=-1)
        lprobs[:, model.pad_index] = -math.inf
        lprobs[:, eos] = -math.inf  # min_len = length: no EOS before the end
        prefix = torch.cat([prefix, lprobs.argmax(dim=-1, keepdim=True)], dim=1)
    # the final step of the cached search: EOS is forced; its decoder pass is part of the cost
    model.output_projection(model.decoder(prefix, memory, src_padding_mask)[:, -1])
    return prefix[:, 1:]


def greedy_cached(model, src_tokens: torch.Tensor, *, bos: int, eos: int, length: int) -> torch.Tensor:
    """:func:`greedy_search` forced to ``length`` tokens, as tokens [B, length]."""
    hyps = greedy_search(model, src_tokens, bos=bos, eos=eos, **forced(length))
    return torch.stack([h.tokens for h in hyps])


def decoders(model, src_tokens: torch.Tensor, *, bos: int, eos: int, length: int, beam: int,
             sync: bool = False) -> dict[str, Callable[[], object]]:
    """The timed statements at one length: name -> zero-argument callable."""
    def done(x):
        if sync:
            torch.cuda.synchronize(src_tokens.device)
        return x

    out = {
        "greedy, cached": lambda: done(greedy_cached(model, src_tokens, bos=bos, eos=eos, length=length)),
        "greedy, recomputed": lambda: done(greedy_recompute(model, src_tokens, bos=bos, eos=eos, length=length)),
    }
    if beam > 1:
        out[f"beam {beam}, cached"] = lambda: done(beam_search(model, src_tokens, bos=bos, eos=eos, beam=beam,
                                                               **forced(length)))
    return out
