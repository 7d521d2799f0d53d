"""The state a Transformer decoder (Vaswani et al. 2017) keeps between incremental decoding steps,
as fairseq keeps it (Ott et al. 2019), for inference only (never a module, never saved): per
attention layer the keys and values seen so far (:class:`KVCache`), per batch the padding and
positions of the fed tokens (:class:`IncrementalState`), and the attend-mask of new queries after
cached keys. :class:`~rescale_core.models.transformer.Transformer` fills it (``new_cache``,
``decode_step``); beam search reorders it (:mod:`rescale_core.generation`, as fairseq's
``reorder_incremental_state``)."""
from __future__ import annotations

import torch

__all__ = ["KVCache", "IncrementalState", "cached_self_attn_mask", "check_masks"]


def check_masks(check: bool) -> bool:
    """Whether a mask may be left out after reading the tokens on the host: asked for
    (``check``) and not under ``torch.compile``, where a host read would break the graph."""
    return check and not torch.compiler.is_compiling()


class KVCache:
    """Keys and values [B, heads, T, head_dim] of one attention layer during incremental decoding.

    ``static`` (cross-attention): the projected encoder memory, fixed. Otherwise (causal
    self-attention) :meth:`append` writes each step's keys/values into buffers that double
    when full: amortised O(1) per step instead of re-copying the whole prefix (``torch.cat``,
    as fairseq does). Under autograd it concatenates instead, since later in-place writes
    would invalidate what backward saved. Inference state, not a module: never saved.
    """

    __slots__ = ("k", "v", "length", "static", "capacity")

    def __init__(self, k: torch.Tensor | None = None, v: torch.Tensor | None = None,
                 static: bool = False, capacity: int | None = None) -> None:
        self.k, self.v, self.static = k, v, static
        self.length = 0 if k is None else k.size(2)
        self.capacity = capacity

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append [B, H, t, d/H] keys/values; returns all of them (views of the buffers)."""
        if self.static:
            raise RuntimeError("a static (cross-attention) cache takes no new keys")
        n, t = self.length, k.size(2)
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            self.k = k if self.k is None else torch.cat([self.k[:, :, :n], k], dim=2)
            self.v = v if self.v is None else torch.cat([self.v[:, :, :n], v], dim=2)
        else:
            if self.k is None or n + t > self.k.size(2):
                old_cap = 0 if self.k is None else self.k.size(2)
                cap = max(n + t, 2 * old_cap, self.capacity or 0, 8)
                self.k, self.v = self._grow(self.k, k, n, cap), self._grow(self.v, v, n, cap)
            self.k[:, :, n:n + t] = k
            self.v[:, :, n:n + t] = v
        self.length = n + t
        return self.k[:, :, :n + t], self.v[:, :, :n + t]

    @staticmethod
    def _grow(old: torch.Tensor | None, new: torch.Tensor, n: int, cap: int) -> torch.Tensor:
        buf = new.new_empty(new.size(0), new.size(1), cap, new.size(3))
        if old is not None and n:
            buf[:, :, :n] = old[:, :, :n]
        return buf

    def reorder(self, index: torch.Tensor) -> None:
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class IncrementalState:
    """What the decoder keeps between incremental steps for a batch of B rows
    (:meth:`Transformer.new_cache`): per layer the self-attention :class:`KVCache` and the
    cross-attention keys/values of the encoder memory, the memory's attend-mask, which cached
    target tokens are padding, and each row's count of non-pad tokens (positions continue from
    it). Passed explicitly to :meth:`Transformer.decode_step`; no hidden state in the model.

    ``reorder(index)`` keeps rows ``index`` (a LongTensor into the current rows, repeats
    allowed): beam search reorders beams and drops finished sentences with it.
    """

    def __init__(self, self_attn: list[KVCache], cross_attn: list[KVCache],
                 memory_mask: torch.Tensor | None, batch_size: int, device: torch.device,
                 mask_check: bool = True) -> None:
        self.self_attn, self.cross_attn = self_attn, cross_attn
        self.memory_mask = memory_mask
        self.mask_check = mask_check
        self.length = 0  # target tokens fed so far (cached keys per row)
        self.num_tokens = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.key_padding = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)
        # with mask_check: whether any fed token was padding (else the masks are always built)
        self.saw_padding = False

    @property
    def batch_size(self) -> int:
        return self.num_tokens.size(0)

    def reorder(self, index: torch.Tensor) -> None:
        index = index.to(self.num_tokens.device)
        for kv in (*self.self_attn, *self.cross_attn):
            kv.reorder(index)
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, index)
        self.num_tokens = self.num_tokens.index_select(0, index)
        self.key_padding = self.key_padding.index_select(0, index)

    def _record(self, new_pad: torch.Tensor) -> bool:
        """Record tokens (padding ``new_pad`` [B, T]) as fed; returns whether the next
        self-attention mask must hide padding (always, unless ``mask_check`` may read the
        tokens on the host: one read per step, as the training path reads once per forward)."""
        self.num_tokens = self.num_tokens + (~new_pad).sum(dim=1)
        self.key_padding = torch.cat([self.key_padding, new_pad], dim=1)
        self.length += new_pad.size(1)
        if not check_masks(self.mask_check):
            return True
        self.saw_padding = self.saw_padding or bool(new_pad.any())
        return self.saw_padding


def cached_self_attn_mask(n: int, t: int, key_padding: torch.Tensor,
                           padded: bool) -> torch.Tensor | None:
    """Attend-mask of ``t`` new queries after ``n`` cached keys: query i sits at n + i and sees
    keys j <= n + i that are not padding (itself always, as in the full decode). Aligned
    bottom-right, so built explicitly (SDPA's ``is_causal`` aligns top-left); None for one query
    when nothing is padded (every cached key visible)."""
    if t == 1 and not padded:
        return None
    q = torch.arange(n, n + t, device=key_padding.device)[:, None]
    k = torch.arange(n + t, device=key_padding.device)[None, :]
    keep = k <= q  # [t, n + t]
    if padded:
        keep = (keep & ~key_padding[:, None, None, :]) | (k == q)
    return keep
