"""Transformer encoder-decoder (Vaswani et al. 2017) whose every residual sublayer follows a scheme.

Every attention and feed-forward sublayer is a :class:`rescale_core.blocks.ResidualSublayer`, so
the same model trains as ``post_ln`` (Vaswani et al. 2017), ``pre_ln`` (Xiong et al. 2020, with a
final LayerNorm on each stack's output), ``rescale`` (RescaleNet, Shao et al. 2020: the paper's
deep WMT En-De Transformers without LayerNorm), ``rezero`` (Bachlechner et al. 2020) or
``skipinit`` (De & Smith 2020). It is this suite's native replacement for fairseq's
``transformer_wmt_en_de`` family (fairseq does not import on this stack; ``docs/design.md``).

Block numbering for the schemes: k = 1..L over the sublayers of one stack in forward order;
the encoder has L = 2 * num_encoder_layers (self-attention, feed-forward per layer), the decoder
L = 3 * num_decoder_layers (causal self-attention, cross-attention, feed-forward). Under
``rescale`` the layers that carry a branch's variance get the init multiplier
``(L / (k + c))^(1/4)`` (m = 2): ``v_proj`` and ``out_proj`` of attention, ``fc1`` and ``fc2``
of the feed-forward network; biases start at 0, so the branch is scaled by exactly
``(L / (k + c))^(1/2)`` at init.

Pieces as fairseq (Ott et al. 2019) builds them: token embeddings ``N(0, d^-1/2)`` with the pad
row zeroed, multiplied by ``sqrt(d_model)``; sinusoidal positions counted over non-pad tokens
(fairseq's ``make_positions``: left- and right-padded sequences get the same positions, pad
positions get a zero vector); dropout after the embedding, after every branch (``dropout``), on
the attention weights (``attention_dropout``) and after the feed-forward activation
(``activation_dropout``); Xavier-uniform attention and feed-forward weights, with gain
``1/sqrt(2)`` for ``q_proj``/``k_proj``/``v_proj`` and 1 for ``out_proj``/``fc1``/``fc2``;
output projection tied to the decoder embedding by default.

Incremental decoding (inference): :meth:`Transformer.new_cache` encodes nothing but projects
the encoder memory once into every cross-attention's keys/values and returns an
:class:`IncrementalState`; :meth:`Transformer.decode_step` feeds the next target token(s),
appends their self-attention keys/values to the cache and returns their logits, equal to the
full :meth:`Transformer.decode` of the whole prefix (up to rounding). Positions continue from the
number of non-pad tokens already fed (as :class:`TransformerEmbedding` counts them), and new
queries see cached keys through an explicit bottom-right-aligned causal mask (SDPA's
``is_causal`` aligns top-left, wrong for queries after cached keys; the state and that mask live
in :mod:`rescale_core.models.incremental`). ``IncrementalState.reorder``
selects rows for beam search (fairseq's ``reorder_incremental_state``); the searches themselves
live in :mod:`rescale_core.generation`.

Attribute names: ``encoder.layers[i].self_attn`` / ``.ffn`` and ``decoder.layers[i].self_attn`` /
``.cross_attn`` / ``.ffn`` are the :class:`ResidualSublayer` objects; their ``fn`` is the
:class:`MultiheadAttention` or :class:`FeedForward`; ``encoder.embed`` / ``decoder.embed``,
``encoder.layer_norm`` / ``decoder.layer_norm`` (``pre_ln`` only) and ``output_projection``.

Deviations: the scheme fields only conv networks read (``CONV_ONLY_OPTIONS``: ``mean_shift`` /
``measure_batches``, RescaleNet's mean-shift biases before convolutions, ``conv_*``, ``head_norm``,
``classifier_dropout``, ``zero_classifier`` ...) are refused here, as are the norms (``bn``,
``gn``) and inits (``fixup``, ``nf``) of conv networks: every linear layer keeps an ordinary bias,
initialised to 0 (fairseq leaves PyTorch's uniform default on the q/k/v biases). Positions use
Vaswani et al.'s interleaved sin/cos formula (fairseq concatenates the sin and cos halves), so
fairseq checkpoints do not load as they are. The architectures follow fairseq's
``transformer_iwslt_de_en`` (small), ``transformer_wmt_en_de`` (base) and
``transformer_vaswani_wmt_en_de_big`` (big); ``transformer_deep`` is base with 18 + 18 layers.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import ResidualSublayer, check_buildable, share_layer_gain, sublayer_norm
from ..plans.folds import scaled_linear
from ..generation import greedy_search
from ..init import TransformerStack, init_transformer_embeddings, stack_scheme
from .incremental import IncrementalState, KVCache, cached_self_attn_mask, check_masks
from ..registry import register_model
from ..schemes import Scheme, get_scheme, list_schemes

__all__ = ["TransformerConfig", "TRANSFORMERS", "MultiheadAttention", "FeedForward",
           "SinusoidalPositions", "TransformerEmbedding", "TransformerEncoderLayer",
           "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder", "Transformer",
           "KVCache", "IncrementalState", "transformer"]


@dataclass(frozen=True)
class TransformerConfig:
    d_model: int = 512
    nhead: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    dim_feedforward: int = 2048
    dropout: float = 0.1               # after embeddings and after every residual branch
    attention_dropout: float = 0.0     # on the attention weights
    activation_dropout: float = 0.0    # after the feed-forward activation
    max_positions: int = 1024          # longest source / target sequence
    # True: leave out the attention masks when nothing needs masking (fused unmasked / causal
    # kernels) at the price of one host read per forward (a device sync on GPU, a graph break
    # under torch.compile, where it is skipped); False: always pass the masks, sync-free.
    # Same outputs either way (up to the attention kernels' rounding).
    mask_check: bool = True

    def __post_init__(self) -> None:
        if self.d_model % self.nhead:
            raise ValueError(f"d_model={self.d_model} is not divisible by nhead={self.nhead}")
        if min(self.d_model, self.nhead, self.dim_feedforward, self.max_positions) < 1:
            raise ValueError(f"Transformer sizes must be positive: {self}")
        if self.num_encoder_layers < 1 or self.num_decoder_layers < 1:
            raise ValueError("a Transformer needs at least one encoder and one decoder layer")
        for key in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ValueError(f"{key} must lie in [0, 1), got {getattr(self, key)}")


# --- attention, feed-forward, embeddings --------------------------------------------------------
class MultiheadAttention(nn.Module):
    """Multi-head attention with separate ``q_proj``/``k_proj``/``v_proj``/``out_proj`` layers,
    computed by :func:`torch.nn.functional.scaled_dot_product_attention` (flash / memory-efficient
    kernels where available).

    ``forward(x, memory=None, attn_mask=None, is_causal=False, cache=None)``: self-attention on
    ``x`` [B, T, d], or cross-attention from ``x`` to ``memory`` [B, S, d]. ``attn_mask`` is a
    boolean mask broadcastable to [B, heads, T, S], True where a query may attend. ``cache`` (a
    :class:`KVCache`, incremental decoding): a static one holds the projected memory
    (cross-attention, ``memory`` is then not needed); otherwise this call's keys/values are
    appended to it and the queries attend to all of them (the caller passes the mask that
    places them after the cached keys). ``out_scale`` multiplies the output, folded into
    ``out_proj`` (the residual sublayer's folded plan), or is ``out_proj``'s weight and bias
    with the multiplier folded in once (its frozen plan). ``in_layers`` (the frozen plan): a
    :class:`~rescale_core.plans.folds.FrozenLinear` per projection of ``x`` to use in its place
    (a pointwise norm's ``weight`` and ``bias`` folded in); ``memory`` keeps the layers'.
    """

    supports_out_scale = True
    out_scale_layer = "out_proj"  # the layer ``out_scale`` acts on
    in_layers = ("q_proj", "k_proj", "v_proj")  # the layers that read x (``in_layers``)

    def __init__(self, d_model: int, nhead: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        self.d_model, self.nhead, self.head_dim = d_model, nhead, d_model // nhead
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """fairseq's init: Xavier-uniform, gain 1/sqrt(2) for the input projections, biases 0."""
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            if proj.bias is not None:
                proj.bias.zero_()

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, d] -> [B, H, T, d/H]
        return x.unflatten(-1, (self.nhead, self.head_dim)).transpose(1, 2)

    def memory_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [B, H, S, d/H] of ``memory`` [B, S, d] (cross-attention)."""
        return self._heads(self.k_proj(memory)), self._heads(self.v_proj(memory))

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                cache: "KVCache | None" = None, out_scale=None, in_layers: dict | None = None) -> torch.Tensor:
        folded = in_layers or {}
        q = self._heads(scaled_linear(self.q_proj, x, folded.get("q_proj")))
        if cache is not None and cache.static:  # cross-attention, memory projected once
            k, v = cache.k, cache.v
        elif memory is not None:
            k, v = self.memory_kv(memory)
        else:  # self-attention
            k = self._heads(scaled_linear(self.k_proj, x, folded.get("k_proj")))
            v = self._heads(scaled_linear(self.v_proj, x, folded.get("v_proj")))
            if cache is not None:
                k, v = cache.append(k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                             dropout_p=self.dropout if self.training else 0.0,
                                             is_causal=is_causal)
        return scaled_linear(self.out_proj, out.transpose(1, 2).flatten(2), out_scale)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, nhead={self.nhead}, dropout={self.dropout}"


class FeedForward(nn.Module):
    """``fc2(dropout(relu(fc1(x))))`` with Xavier-uniform weights and zero biases (fairseq);
    ``out_scale`` multiplies the output, folded into ``fc2`` (or is ``fc2`` with it folded in)."""

    supports_out_scale = True
    out_scale_layer = "fc2"  # the layer ``out_scale`` acts on
    in_layers = ("fc1",)  # the layer that reads x (``in_layers``: it, folded, in its place)

    def __init__(self, d_model: int, dim_feedforward: int, activation_dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, dim_feedforward)
        self.activation = nn.ReLU(inplace=True)  # on fc1's fresh output: no copy
        self.activation_dropout = nn.Dropout(activation_dropout)
        self.fc2 = nn.Linear(dim_feedforward, d_model)
        with torch.no_grad():
            for fc in (self.fc1, self.fc2):
                nn.init.xavier_uniform_(fc.weight)
                fc.bias.zero_()

    def forward(self, x: torch.Tensor, out_scale=None, in_layers: dict | None = None) -> torch.Tensor:
        hidden = scaled_linear(self.fc1, x, (in_layers or {}).get("fc1"))
        return scaled_linear(self.fc2, self.activation_dropout(self.activation(hidden)), out_scale)


class SinusoidalPositions(nn.Module):
    """Vaswani et al. (2017, Sec. 3.5) sinusoids for positions 0..max_positions-1, indexed by
    fairseq-style positions (1-based over non-pad tokens; 0 = pad -> zero vector)."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        pos = torch.arange(max_positions, dtype=torch.float64)[:, None]
        two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
        inv_freq = torch.exp(two_i * (-math.log(10000.0) / d_model))  # 10000^(-2i/d)
        table = torch.zeros(max_positions + 1, d_model, dtype=torch.float64)
        table[1:, 0::2] = torch.sin(pos * inv_freq)
        table[1:, 1::2] = torch.cos(pos * inv_freq)[:, : d_model // 2]
        self.register_buffer("table", table.float(), persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return F.embedding(positions, self.table)


class TransformerEmbedding(nn.Module):
    """``dropout(sqrt(d) * embed_tokens(tokens) + positions)``. ``offset`` [B] (incremental
    decoding): the number of non-pad tokens before ``tokens`` in each row, so that positions
    continue where the cached prefix ended."""

    def __init__(self, embed_tokens: nn.Embedding, max_positions: int, dropout: float) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.pad_index = embed_tokens.padding_idx
        d_model = embed_tokens.embedding_dim
        self.embed_scale = math.sqrt(d_model)
        self.positions = SinusoidalPositions(d_model, max_positions)
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: torch.Tensor, offset: torch.Tensor | None = None) -> torch.Tensor:
        if offset is None and tokens.size(1) > self.positions.max_positions:
            raise ValueError(f"sequence length {tokens.size(1)} exceeds max_positions="
                             f"{self.positions.max_positions}; build the model with a larger "
                             "max_positions")
        nonpad = tokens.ne(self.pad_index).long()
        positions = torch.cumsum(nonpad, dim=1)
        if offset is not None:
            positions = positions + offset[:, None]
        positions = positions * nonpad
        x = torch.add(self.positions(positions), self.embed_tokens(tokens), alpha=self.embed_scale)
        return self.dropout(x)


def _embedding(vocab_size: int, d_model: int, pad_index: int) -> nn.Embedding:
    emb = nn.Embedding(vocab_size, d_model, padding_idx=pad_index)
    with torch.no_grad():
        nn.init.normal_(emb.weight, 0.0, d_model ** -0.5)
        emb.weight[pad_index].zero_()
    return emb


def _read(flag: torch.Tensor) -> bool | None:
    """A one-element boolean tensor read on the host; None where it cannot be: under
    ``torch.func.vmap`` a host read of a batched tensor is data-dependent control flow, which it
    refuses (the caller then keeps the mask, computing the same outputs)."""
    try:
        return bool(flag)
    except RuntimeError:
        return None


def _key_padding_attn_mask(padding_mask: torch.Tensor | None, check: bool = True) -> torch.Tensor | None:
    """[B, S] (True = pad) -> boolean attend-mask [B, 1, 1, S], or None when nothing is padded
    and ``check`` (so the fused attention kernels run unmasked; one host read). A row that is
    all padding attends to every position instead of producing NaNs."""
    if padding_mask is None or (check_masks(check) and _read(padding_mask.any()) is False):
        return None
    keep = ~padding_mask
    keep = keep | ~keep.any(dim=1, keepdim=True)
    return keep[:, None, None, :]


# --- layers and stacks --------------------------------------------------------------------------
def _stack(cfg: TransformerConfig, side: str) -> TransformerStack:
    return TransformerStack(side, cfg.num_encoder_layers, cfg.num_decoder_layers)


def _attention_sublayer(cfg: TransformerConfig, scheme: Scheme, k: int, L: int, side: str) -> ResidualSublayer:
    attn = MultiheadAttention(cfg.d_model, cfg.nhead, cfg.attention_dropout)
    return ResidualSublayer(scheme, cfg.d_model, attn, k, L, cfg.dropout,
                            scaled_layers=[attn.v_proj, attn.out_proj], site="attention",
                            stack=_stack(cfg, side))


def _ffn_sublayer(cfg: TransformerConfig, scheme: Scheme, k: int, L: int, side: str) -> ResidualSublayer:
    ffn = FeedForward(cfg.d_model, cfg.dim_feedforward, cfg.activation_dropout)
    return ResidualSublayer(scheme, cfg.d_model, ffn, k, L, cfg.dropout,
                            scaled_layers=[ffn.fc1, ffn.fc2], site="ffn", stack=_stack(cfg, side))


class TransformerEncoderLayer(nn.Module):
    """Self-attention sublayer (block k) and feed-forward sublayer (block k + 1) of L."""

    def __init__(self, cfg: TransformerConfig, scheme: Scheme, k: int, L: int) -> None:
        super().__init__()
        self.self_attn = _attention_sublayer(cfg, scheme, k, L, "encoder")
        self.ffn = _ffn_sublayer(cfg, scheme, k + 1, L, "encoder")
        share_layer_gain(scheme, self, ("self_attn", "ffn"))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.ffn(self.self_attn(x, attn_mask=attn_mask))


class TransformerDecoderLayer(nn.Module):
    """Causal self-attention (block k), cross-attention (k + 1), feed-forward (k + 2) of L."""

    def __init__(self, cfg: TransformerConfig, scheme: Scheme, k: int, L: int) -> None:
        super().__init__()
        self.self_attn = _attention_sublayer(cfg, scheme, k, L, "decoder")
        self.cross_attn = _attention_sublayer(cfg, scheme, k + 1, L, "decoder")
        self.ffn = _ffn_sublayer(cfg, scheme, k + 2, L, "decoder")
        share_layer_gain(scheme, self, ("self_attn", "cross_attn", "ffn"))

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None,
                memory_mask: torch.Tensor | None = None, self_mask: torch.Tensor | None = None,
                is_causal: bool = False, self_cache: "KVCache | None" = None,
                cross_cache: "KVCache | None" = None) -> torch.Tensor:
        """``memory`` may be None when ``cross_cache`` holds its keys/values."""
        x = self.self_attn(x, attn_mask=self_mask, is_causal=is_causal, cache=self_cache)
        x = self.cross_attn(x, memory=memory, attn_mask=memory_mask, cache=cross_cache)
        return self.ffn(x)


def _final_norm(scheme: Scheme, d_model: int) -> nn.Module | None:
    """A pre-norm scheme's norm on a stack's output (LayerNorm, or DyT's / Derf's pointwise layer)."""
    norm = sublayer_norm(scheme, d_model, "final", "final")
    return None if isinstance(norm, nn.Identity) else norm


class TransformerEncoder(nn.Module):
    def __init__(self, cfg: TransformerConfig, scheme: Scheme, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.num_blocks = L = 2 * cfg.num_encoder_layers
        scheme = stack_scheme(scheme, _stack(cfg, "encoder"))  # (DeepNorm: this stack's alpha)
        self.embed = TransformerEmbedding(embed_tokens, cfg.max_positions, cfg.dropout)
        self.layers = nn.ModuleList(TransformerEncoderLayer(cfg, scheme, 2 * i + 1, L)
                                    for i in range(cfg.num_encoder_layers))
        self.layer_norm = _final_norm(scheme, cfg.d_model)
        self.mask_check = cfg.mask_check

    def forward(self, src_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        padding_mask = src_tokens.eq(self.embed.pad_index)
        attn_mask = _key_padding_attn_mask(padding_mask, self.mask_check)
        x = self.embed(src_tokens)
        for layer in self.layers:
            x = layer(x, attn_mask)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return x, padding_mask


class TransformerDecoder(nn.Module):
    def __init__(self, cfg: TransformerConfig, scheme: Scheme, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.num_blocks = L = 3 * cfg.num_decoder_layers
        scheme = stack_scheme(scheme, _stack(cfg, "decoder"))
        self.embed = TransformerEmbedding(embed_tokens, cfg.max_positions, cfg.dropout)
        self.layers = nn.ModuleList(TransformerDecoderLayer(cfg, scheme, 3 * i + 1, L)
                                    for i in range(cfg.num_decoder_layers))
        self.layer_norm = _final_norm(scheme, cfg.d_model)
        self.mask_check = cfg.mask_check

    def _self_attn_mask(self, tgt_tokens: torch.Tensor) -> tuple[torch.Tensor | None, bool]:
        """(attn_mask, is_causal). Trailing padding (fairseq's right-padded targets) cannot be seen
        by a real token under the causal mask: use the fused causal kernel (checked with one host
        read, unless ``mask_check`` is off). Padding before a real token is masked explicitly
        (each query always keeps itself, so no row is empty). Without the check the same choice
        is made on the device (``torch.where``), so padded positions get the same outputs too."""
        pad = tgt_tokens.eq(self.embed.pad_index)
        left_padding = (pad[:, :-1] & ~pad[:, 1:]).any()
        checked = _read(left_padding) if check_masks(self.mask_check) else None
        if checked is False:
            return None, True
        T = tgt_tokens.size(1)
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_tokens.device).tril()
        keep = causal & ~pad[:, None, None, :]
        keep = keep | torch.eye(T, dtype=torch.bool, device=tgt_tokens.device)
        if checked is None:
            keep = torch.where(left_padding, keep, causal)
        return keep, False

    def forward(self, tgt_tokens: torch.Tensor, memory: torch.Tensor,
                src_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Features [B, T, d] of the whole target prefix (teacher forcing)."""
        memory_mask = _key_padding_attn_mask(src_padding_mask, self.mask_check)
        self_mask, is_causal = self._self_attn_mask(tgt_tokens)
        x = self.embed(tgt_tokens)
        for layer in self.layers:
            x = layer(x, memory, memory_mask, self_mask, is_causal)
        return x if self.layer_norm is None else self.layer_norm(x)

    def new_cache(self, memory: torch.Tensor, src_padding_mask: torch.Tensor | None = None,
                  capacity: int | None = None) -> "IncrementalState":
        """An empty :class:`IncrementalState` for ``memory`` [B, S, d]: every cross-attention's
        keys/values and the memory's attend-mask computed once here. ``capacity``: the number
        of target tokens to reserve room for (the buffers grow past it when needed)."""
        cross = [KVCache(*layer.cross_attn.fn.memory_kv(memory), static=True)
                 for layer in self.layers]
        selfs = [KVCache(capacity=capacity) for _ in self.layers]
        memory_mask = _key_padding_attn_mask(src_padding_mask, self.mask_check)
        return IncrementalState(selfs, cross, memory_mask, memory.size(0), memory.device,
                                self.mask_check)

    def step(self, tokens: torch.Tensor, cache: "IncrementalState") -> torch.Tensor:
        """Features [B, T, d] of ``tokens`` [B, T] (usually T = 1), the next tokens after the
        prefix held in ``cache``; their keys/values are appended to it."""
        total = cache.length + tokens.size(1)
        if total > self.embed.positions.max_positions:
            raise ValueError(f"target length {total} exceeds max_positions="
                             f"{self.embed.positions.max_positions}; build the model with a "
                             "larger max_positions")
        n = cache.length
        x = self.embed(tokens, offset=cache.num_tokens)
        padded = cache._record(tokens.eq(self.embed.pad_index))
        if n == 0:  # a first call is a whole prefix: the training path's masks
            self_mask, is_causal = self._self_attn_mask(tokens)
        else:
            self_mask = cached_self_attn_mask(n, tokens.size(1), cache.key_padding, padded)
            is_causal = False
        for layer, self_cache, cross_cache in zip(self.layers, cache.self_attn, cache.cross_attn):
            x = layer(x, None, cache.memory_mask, self_mask, is_causal, self_cache, cross_cache)
        return x if self.layer_norm is None else self.layer_norm(x)


# --- the model ----------------------------------------------------------------------------------
class Transformer(nn.Module):
    """Encoder-decoder Transformer whose residual sublayers follow ``scheme``.

    Args:
        config: the architecture (:class:`TransformerConfig`).
        scheme: a Transformer scheme name or instance (``post_ln``, ``pre_ln``, ``rescale``,
            ``rezero``, ``skipinit``); ``scheme_options`` override its fields.
        src_vocab_size, tgt_vocab_size: vocabulary sizes (target defaults to the source's).
        share_embeddings: one embedding matrix for source and target (equal vocab sizes).
        tie_output: the output projection reuses the decoder's embedding matrix.
        pad_index: padding token id; padding masks are derived from it.

    ``forward(src_tokens, tgt_in_tokens)`` -> logits [B, T, V] (teacher forcing: ``tgt_in_tokens``
    is the target shifted right, starting with bos). ``encode`` / ``decode`` expose the two halves;
    ``new_cache`` / ``decode_step`` decode incrementally (:mod:`rescale_core.generation` searches
    with them) and :meth:`greedy_decode` generates.
    """

    def __init__(self, config: TransformerConfig, scheme: "str | Scheme" = "post_ln",
                 scheme_options: dict | None = None, src_vocab_size: int | None = None,
                 tgt_vocab_size: int | None = None, share_embeddings: bool = False,
                 tie_output: bool = True, pad_index: int = 1) -> None:
        super().__init__()
        self.config = config
        self.scheme = scheme = get_scheme(scheme, **(scheme_options or {}))
        if not scheme.supports("transformer"):
            raise ValueError(f"scheme {scheme.name!r} has no Transformer form; Transformer schemes "
                             f"are {', '.join(list_schemes('transformer'))}")
        check_buildable(scheme, "transformer", given=scheme_options or {})
        if src_vocab_size is None:
            raise ValueError("a Transformer needs src_vocab_size (and optionally tgt_vocab_size)")
        tgt_vocab_size = src_vocab_size if tgt_vocab_size is None else tgt_vocab_size
        if not 0 <= pad_index < min(src_vocab_size, tgt_vocab_size):
            raise ValueError(f"pad_index={pad_index} is outside the vocabularies "
                             f"({src_vocab_size}, {tgt_vocab_size})")
        if share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(f"share_embeddings needs equal vocab sizes, got src {src_vocab_size} "
                             f"and tgt {tgt_vocab_size}")
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.pad_index = pad_index
        d = config.d_model
        src_embed = _embedding(src_vocab_size, d, pad_index)
        tgt_embed = src_embed if share_embeddings else _embedding(tgt_vocab_size, d, pad_index)
        init_transformer_embeddings(scheme, src_embed, tgt_embed, config.num_encoder_layers,
                                    config.num_decoder_layers)  # T-Fixup's multipliers
        self.encoder = TransformerEncoder(config, scheme, src_embed)
        self.decoder = TransformerDecoder(config, scheme, tgt_embed)
        self.output_projection = nn.Linear(d, tgt_vocab_size, bias=False)
        if tie_output:
            self.output_projection.weight = tgt_embed.weight
        else:
            nn.init.normal_(self.output_projection.weight, 0.0, d ** -0.5)

    def encode(self, src_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(memory [B, S, d], src_padding_mask [B, S] bool, True at padding)``."""
        return self.encoder(src_tokens)

    def decode(self, tgt_in_tokens: torch.Tensor, memory: torch.Tensor,
               src_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, V] of the whole target prefix ``tgt_in_tokens`` (teacher forcing)."""
        return self.output_projection(self.decoder(tgt_in_tokens, memory, src_padding_mask))

    def new_cache(self, memory: torch.Tensor, src_padding_mask: torch.Tensor | None = None,
                  capacity: int | None = None) -> IncrementalState:
        """An empty :class:`IncrementalState` for incremental decoding against ``memory``
        (from :meth:`encode`): the cross-attention keys/values are projected here, once."""
        return self.decoder.new_cache(memory, src_padding_mask, capacity)

    def decode_step(self, tokens: torch.Tensor, cache: IncrementalState) -> torch.Tensor:
        """Logits [B, T, V] of the next target tokens ``tokens`` [B, T] (T = 1 per step of a
        search; a longer first call feeds a whole prefix) given the prefix in ``cache``, which
        it extends. Equal to the last T positions of :meth:`decode` on the whole prefix."""
        return self.output_projection(self.decoder.step(tokens, cache))

    def forward(self, src_tokens: torch.Tensor, tgt_in_tokens: torch.Tensor) -> torch.Tensor:
        memory, src_padding_mask = self.encode(src_tokens)
        return self.decode(tgt_in_tokens, memory, src_padding_mask)

    def greedy_decode(self, src_tokens: torch.Tensor, bos_index: int, eos_index: int,
                      max_len: int = 200) -> torch.Tensor:
        """Greedy search (:func:`rescale_core.generation.greedy_search`, eval mode, no minimum
        length) as a tensor: tokens [B, n], n <= ``max_len``, without the leading bos; each row
        ends with its eos unless it reached ``max_len`` tokens first; positions after a row's
        end hold ``pad_index``; n is the longest row. Never emits pad."""
        if not 1 <= max_len <= self.config.max_positions:
            raise ValueError(f"max_len must lie in [1, max_positions={self.config.max_positions}], "
                             f"got {max_len}")
        hyps = greedy_search(self, src_tokens, bos=bos_index, eos=eos_index, max_len_a=0.0,
                             max_len_b=max_len, min_len=0)
        rows = [torch.cat([h.tokens, h.tokens.new_full((1,), eos_index)])[:max_len] for h in hyps]
        return nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=self.pad_index)


# --- named architectures ------------------------------------------------------------------------
TRANSFORMERS: dict[str, TransformerConfig] = {
    # for tests
    "transformer_tiny": TransformerConfig(32, 2, 2, 2, 64, max_positions=256),
    # fairseq transformer_iwslt_de_en
    "transformer_small": TransformerConfig(512, 4, 6, 6, 1024, dropout=0.3),
    # Vaswani et al. 2017 base; fairseq transformer_wmt_en_de
    "transformer_base": TransformerConfig(512, 8, 6, 6, 2048, dropout=0.1),
    # Vaswani et al. 2017 big (En-De dropout 0.3); fairseq transformer_vaswani_wmt_en_de_big
    "transformer_big": TransformerConfig(1024, 16, 6, 6, 4096, dropout=0.3),
    # the deep setting the normalisation-free schemes are for: base width, 18 + 18 layers
    "transformer_deep": TransformerConfig(512, 8, 18, 18, 2048, dropout=0.1),
}

_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(TransformerConfig))


def transformer(arch: str = "transformer_base", scheme: "str | Scheme" = "post_ln",
                scheme_options: dict | None = None, src_vocab_size: int | None = None,
                tgt_vocab_size: int | None = None, share_embeddings: bool = False,
                tie_output: bool = True, pad_index: int = 1, depth: int | None = None,
                **overrides) -> Transformer:
    """A named Transformer (:data:`TRANSFORMERS`); ``overrides`` replace
    :class:`TransformerConfig` fields, e.g. ``transformer("transformer_base", dropout=0.3,
    num_encoder_layers=12)``. ``depth``: the layers of each side (encoder and decoder alike), the
    key ``rescale study depth`` sets, as it sets a ResNet's depth."""
    if depth is not None:
        clash = sorted({"num_encoder_layers", "num_decoder_layers"} & set(overrides))
        if clash:
            raise TypeError(f"give depth (the layers of each side) or {' / '.join(clash)}, not both")
        overrides.update(num_encoder_layers=depth, num_decoder_layers=depth)
    if "num_classes" in overrides:
        raise ValueError("Transformers take src_vocab_size / tgt_vocab_size, not num_classes")
    unknown = sorted(set(overrides) - set(_CONFIG_FIELDS))
    if unknown:
        accepted = ["src_vocab_size", "tgt_vocab_size", "depth", "share_embeddings", "tie_output", "pad_index",
                    *_CONFIG_FIELDS]
        named = []
        for u in unknown:
            close = difflib.get_close_matches(u, accepted, n=2)
            named.append(repr(u) + (f" (did you mean {' or '.join(close)}?)" if close else ""))
        raise TypeError(f"unknown Transformer argument(s) {', '.join(named)}; the arguments are "
                        f"{', '.join(accepted)}")
    if arch not in TRANSFORMERS:
        raise KeyError(f"unknown Transformer {arch!r}; known: {', '.join(TRANSFORMERS)}")
    cfg = dataclasses.replace(TRANSFORMERS[arch], **overrides)
    return Transformer(cfg, scheme, scheme_options, src_vocab_size, tgt_vocab_size,
                       share_embeddings, tie_output, pad_index)


def _register() -> None:
    for arch in TRANSFORMERS:
        register_model(arch, transformer, "transformer", arch=arch)


_register()
