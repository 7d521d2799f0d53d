"""What ``rescale export`` writes for the translation task: the Transformer's encoder and one step
of incremental decoding, each a function of tensors a runtime can call in its own search loop.

- ``encoder``: ``src_tokens [B, S] -> (memory [B, S, d], src_padding_mask [B, S])``
  (:meth:`~rescale_core.models.transformer.Transformer.encode`);
- ``decode_step``: :meth:`~rescale_core.models.transformer.Transformer.decode_step` on an
  :class:`~rescale_core.models.incremental.IncrementalState` rebuilt from tensors (:class:`DecodeStep`).

Both are captured with the attention masks always passed (``mask_check`` off: no host read of the
tokens, which a graph cannot hold; the same outputs, the masks deciding on the device). The real
inputs: the first batch's source sentences, and its target prefixes cut after ``n`` tokens, whose
keys and values the PyTorch model computes first, as a search would have. The prefix length is a
named dimension from 0 (the first step: bos alone, no cached keys) to ``max_positions - 1``: a
size ``torch.export`` infers (``Dim.AUTO``) is left free from 2 up only, and a search starts from
bos. A sampled size of 0 or 1 would be fixed, so the captured prefix is at least 2 tokens.
"""
from __future__ import annotations

import torch
from torch import nn

from rescale_core.models.incremental import KVCache

from ..common.export import ExportProgram, batch_dynamic

__all__ = ["Encoder", "DecodeStep", "SAMPLED_PREFIX", "STEP_AT_ANY_LENGTH", "translation_programs"]


class Encoder(nn.Module):
    """``src_tokens -> (memory, src_padding_mask)`` of a Transformer."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, src_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net.encode(src_tokens)


class DecodeStep(nn.Module):
    """One incremental decoding step of a Transformer as a function of tensors.

    ``forward(tokens [B, 1], memory [B, S, d], src_padding_mask [B, S], num_tokens [B],
    key_padding [B, n], self_k, self_v [layers, B, heads, n + 1, d / heads])`` -> ``(logits
    [B, 1, V], self_k, self_v)``: the self-attention keys/values of the ``n`` tokens fed so far
    with one free slot after them, which the step fills (a runtime appends a free slot before the
    next step); ``num_tokens`` counts each row's non-pad tokens so far and ``key_padding`` marks
    the padding among them (:class:`~rescale_core.models.incremental.IncrementalState`). The
    cross-attention keys/values are projected from ``memory`` on each call."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, tokens: torch.Tensor, memory: torch.Tensor, src_padding_mask: torch.Tensor,
                num_tokens: torch.Tensor, key_padding: torch.Tensor, self_k: torch.Tensor,
                self_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cache = self.net.new_cache(memory, src_padding_mask)
        cache.mask_check = False
        fed = self_k.size(3) - 1
        # copies: the step writes its keys/values into the free slot, never into the caller's tensors
        cache.self_attn = [KVCache(k.clone(), v.clone()) for k, v in zip(self_k.unbind(0), self_v.unbind(0))]
        for kv in cache.self_attn:
            kv.length = fed
        cache.length, cache.num_tokens, cache.key_padding = fed, num_tokens, key_padding
        logits = self.net.decode_step(tokens, cache)
        return logits, torch.stack([kv.k for kv in cache.self_attn]), torch.stack([kv.v for kv in cache.self_attn])


def _without_mask_checks(net: nn.Module) -> None:
    for m in net.modules():
        if hasattr(m, "mask_check"):
            m.mask_check = False


#: Why ``decode_step`` is not written in a format traced at the sample's sizes (TorchScript).
STEP_AT_ANY_LENGTH = ("a search loop calls it at every prefix length, and a file traced at one length fails at any "
                      "other")

#: The shortest prefix a capture samples (``torch.export`` fixes a sampled size of 0 or 1).
SAMPLED_PREFIX = 2


@torch.no_grad()
def translation_programs(net: nn.Module, src_tokens: torch.Tensor,
                         prev_output_tokens: torch.Tensor) -> list[ExportProgram]:
    """The encoder and one decoding step of ``net`` on a batch's source sentences and target
    prefixes (the step continues each prefix after its first half, at least :data:`SAMPLED_PREFIX`
    tokens: prefixes too short for that are repeated); the step takes any prefix length from 0."""
    _without_mask_checks(net)
    memory, src_padding_mask = net.encode(src_tokens)
    cache = net.new_cache(memory, src_padding_mask)
    while prev_output_tokens.size(1) <= SAMPLED_PREFIX:
        prev_output_tokens = torch.cat([prev_output_tokens, prev_output_tokens], dim=1)
    fed = max(SAMPLED_PREFIX, prev_output_tokens.size(1) // 2)
    net.decode_step(prev_output_tokens[:, :fed], cache)
    free = [torch.stack([getattr(kv, name)[:, :, :fed] for kv in cache.self_attn]) for name in ("k", "v")]
    self_k, self_v = (torch.cat([t, t.new_zeros(t[:, :, :, :1].shape)], dim=3) for t in free)
    step_inputs = (prev_output_tokens[:, fed:fed + 1], memory, src_padding_mask, cache.num_tokens,
                   cache.key_padding, self_k, self_v)
    step_dynamic = batch_dynamic(step_inputs, ((0,), (0, 1), (0, 1), (0,), (0,), (1,), (1,)))
    prefix = torch.export.Dim("prefix", min=0, max=net.config.max_positions - 1)
    step_dynamic[4][1] = prefix
    step_dynamic[5][3] = step_dynamic[6][3] = prefix + 1
    return [ExportProgram("encoder", Encoder(net), (src_tokens,), batch_dynamic((src_tokens,), ((0, 1),))),
            ExportProgram("decode_step", DecodeStep(net), step_inputs, step_dynamic)]
