"""Initialisers (He et al. 2015; RescaleNet, Shao et al. 2020; Fixup, Zhang et al. 2019; NF-ResNets,
Brock et al. 2021), each citing the equation it implements.

Transformer rules, applied on top of fairseq's Xavier init of each sublayer's linear layers
(:class:`TransformerStack`: N encoder and M decoder layers; docs/transformers.md):

- ``init="deepnorm"`` (DeepNet, Wang et al. 2022, Sec. 2.3 and Fig. 2, encoder-decoder column):
  ``x_{l+1} = LN(alpha x_l + F(x_l))`` with encoder ``alpha = 0.81 (N^4 M)^(1/16)``, decoder
  ``alpha = (3M)^(1/4)``; ``v_proj``, ``out_proj``, ``fc1``, ``fc2`` Xavier-normal with gain
  ``beta`` (encoder ``0.87 (N^4 M)^(-1/16)``, decoder ``(12M)^(-1/4)``), ``q_proj``/``k_proj``
  Xavier-normal with gain 1.
- ``init="tfixup"`` (T-Fixup, Huang et al., ICML 2020, Sec. 3.2; layer6ai-labs/T-Fixup's
  ``fixup_initialization``): encoder ``out_proj``/``fc1``/``fc2`` times ``0.67 N^(-1/4)`` and
  ``v_proj`` times ``0.67 N^(-1/4) sqrt(2)``, decoder (self- and cross-attention) the same with
  ``(9M)^(-1/4)``; token embeddings times ``(9N)^(-1/4)`` (encoder, and a shared matrix) and
  ``(9M)^(-1/4)`` (decoder). ``q_proj``/``k_proj`` keep their init.

``init="nf"`` (timm's ``NormFreeNet`` and the official JAX code): every conv N(0, 1/fan_in), the
classifier N(0, 0.01^2), zero biases. Scaled Weight Standardization makes a conv's function
independent of its raw weight's scale; that scale sets only the size of the updates relative to
the weight (the gradient of a standardized weight is inversely proportional to its std).

Called once by the blocks and model families at construction time (never from ``forward``).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from .layers import PointwiseNorm
from .schemes import Scheme

__all__ = ["he_normal_", "rescale_conv_multiplier", "fixup_multiplier", "init_branch",
           "init_shortcut", "init_stem", "init_classifier", "TransformerStack", "deepnorm_constants",
           "tfixup_multiplier", "stack_scheme", "init_transformer_branch", "init_transformer_embeddings"]

TRANSFORMER_INITS = ("deepnorm", "tfixup")  # the rules that read a TransformerStack


def _fans(weight: torch.Tensor) -> tuple[int, int]:
    receptive = math.prod(weight.shape[2:]) if weight.dim() > 2 else 1
    return weight.shape[1] * receptive, weight.shape[0] * receptive


@torch.no_grad()
def he_normal_(weight: torch.Tensor, mode: str = "fan_in", gain: float = math.sqrt(2.0),
               multiplier: float = 1.0) -> torch.Tensor:
    """N(0, (gain * multiplier)^2 / fan): He et al. 2015, Eq. 10 (gain sqrt(2) for ReLU).

    ``fan_in`` of a grouped conv counts only the channels of one group, like PyTorch. A weight on
    the meta device (a network built for its structure only) has no values to draw and is left
    as it is: PyTorch draws there through its Python reference, 8 ms a 3x3 convolution.
    """
    if weight.is_meta:
        return weight
    fan_in, fan_out = _fans(weight)
    fan = fan_in if mode == "fan_in" else fan_out
    return weight.normal_(0.0, gain * multiplier / math.sqrt(fan))


def rescale_conv_multiplier(k: int, L: int, m: int, c: float | None = None,
                            dropout: float = 0.0, fixed_beta: bool = True) -> float:
    """RescaleNet rebuttal [R4]: std multiplier of each of the m convs of branch k of L.

    With ``beta = L^-1/2`` fixed, ``(L / (k + c))^(1/(2m))`` per conv makes the branch variance at
    init ``L / (k + c)`` times smaller, so the effective ``beta_k^2 = 1 / (k + c)`` of Eq. 5.
    ``sqrt(1 - p)`` compensates conv dropout p (inverted dropout scales activations by 1/(1-p)).
    """
    c = float(L) if c is None else float(c)
    mult = (L / (k + c)) ** (1.0 / (2 * m)) if fixed_beta else 1.0
    return mult * math.sqrt(1.0 - dropout)


def fixup_multiplier(L: int, m: int) -> float:
    """Fixup (Zhang et al. 2019, Sec. 3, rule 2): scale branch layers' He init by L^(-1/(2m-2))."""
    return L ** (-1.0 / (2 * m - 2)) if m > 1 else 1.0


@torch.no_grad()
def init_branch(scheme: Scheme, convs: list[nn.Module], norms: list[nn.Module], k: int, L: int,
                dropout: float = 0.0) -> None:
    """Initialise the m layers of residual branch k (1-based) of L under ``scheme``."""
    m = len(convs)
    for i, conv in enumerate(convs):
        last = i == m - 1
        if scheme.init == "rescale":
            mult = rescale_conv_multiplier(k, L, m, scheme.c, dropout, scheme.fixed_beta)
            he_normal_(conv.weight, "fan_in", multiplier=mult)
        elif scheme.init == "fixup":
            if last:
                conv.weight.zero_()
            else:
                he_normal_(conv.weight, "fan_out", multiplier=fixup_multiplier(L, m))
        elif scheme.init == "he_fan_in":
            he_normal_(conv.weight, "fan_in")
        elif scheme.init == "nf":
            he_normal_(conv.weight, "fan_in", gain=1.0)
        else:  # torchvision's ResNet: kaiming_normal_(mode="fan_out", nonlinearity="relu")
            he_normal_(conv.weight, "fan_out")
        if getattr(conv, "bias", None) is not None:
            conv.bias.zero_()
        if isinstance(getattr(conv, "gain", None), nn.Parameter):  # Scaled WS: the conv's own scale
            conv.gain.fill_(0.0 if (scheme.zero_gamma and last) else 1.0)
    for i, norm in enumerate(norms):
        if getattr(norm, "weight", None) is not None and isinstance(norm.weight, nn.Parameter):
            if isinstance(norm, (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, PointwiseNorm)):
                norm.weight.fill_(0.0 if (scheme.zero_gamma and i == len(norms) - 1) else 1.0)
                norm.bias.zero_()


@torch.no_grad()
def init_shortcut(scheme: Scheme, conv: nn.Module) -> None:
    """Projection shortcut: He gain 1 for RescaleNet (official code: kaiming_normal_, a=1),
    Fixup's fan-out He normal, torchvision's fan-out He normal otherwise. ``scheme.shortcut_gain``
    replaces the gain (the signal-preserving transition of docs/studies.md, the basic-block
    yardstick)."""
    mode, gain = {"rescale": ("fan_in", 1.0), "he_fan_in": ("fan_in", math.sqrt(2.0)),
                  "nf": ("fan_in", 1.0)}.get(scheme.init, ("fan_out", math.sqrt(2.0)))
    he_normal_(conv.weight, mode, gain=gain if scheme.shortcut_gain is None else scheme.shortcut_gain)
    if getattr(conv, "bias", None) is not None:
        conv.bias.zero_()


@torch.no_grad()
def init_stem(scheme: Scheme, conv: nn.Module) -> None:
    if scheme.init == "nf":
        he_normal_(conv.weight, "fan_in", gain=1.0)
    else:
        he_normal_(conv.weight, "fan_out" if scheme.init in ("he_fan_out", "fixup") else "fan_in")
    if getattr(conv, "bias", None) is not None:
        conv.bias.zero_()


@torch.no_grad()
def init_classifier(scheme: Scheme, fc: nn.Linear) -> None:
    """Fixup: zeros (rule 1). RescaleNet: He normal with gain 1 (official code). NF-ResNets:
    N(0, 0.01^2) (timm's ``NormFreeNet``, the official code's default ``fc_init``). Otherwise
    PyTorch's default Linear init, as torchvision's ResNet. ``scheme.classifier_gain``: He normal
    (fan-in) with that gain instead (the signal-preserving head of docs/studies.md, the
    basic-block yardstick)."""
    if scheme.zero_classifier:
        fc.weight.zero_()
        fc.bias.zero_()
    elif scheme.classifier_gain is not None or scheme.init == "rescale":
        gain = 1.0 if scheme.classifier_gain is None else scheme.classifier_gain
        he_normal_(fc.weight, "fan_in", gain=gain)
        fc.bias.zero_()
    elif scheme.init == "nf":
        fc.weight.normal_(0.0, 0.01)
        fc.bias.zero_()


# --------------------------------------------------------------- Transformers
class TransformerStack(NamedTuple):
    """Where a Transformer sublayer sits: its stack (``side``: ``encoder`` or ``decoder``) and
    the depths of both stacks, in layers (N, M), which DeepNorm's and T-Fixup's constants read."""
    side: str
    encoder_layers: int
    decoder_layers: int


def deepnorm_constants(stack: TransformerStack) -> tuple[float, float]:
    """``(alpha, beta)`` of DeepNet's encoder-decoder (Wang et al. 2022, Fig. 2): the skip
    multiplier and the init gain of ``v_proj``, ``out_proj``, ``fc1``, ``fc2``."""
    N, M = stack.encoder_layers, stack.decoder_layers
    if stack.side == "encoder":
        return 0.81 * (N ** 4 * M) ** (1 / 16), 0.87 * (N ** 4 * M) ** (-1 / 16)
    return (3 * M) ** 0.25, (12 * M) ** -0.25


def tfixup_multiplier(stack: TransformerStack) -> float:
    """T-Fixup's multiplier of a stack's ``out_proj``, ``fc1`` and ``fc2`` (``v_proj``: times
    sqrt(2) more): encoder ``0.67 N^(-1/4)``, decoder ``(9M)^(-1/4)``."""
    if stack.side == "encoder":
        return 0.67 * stack.encoder_layers ** -0.25
    return (9 * stack.decoder_layers) ** -0.25


def stack_scheme(scheme: Scheme, stack: TransformerStack) -> Scheme:
    """The scheme one stack's sublayers are built with: under ``init="deepnorm"`` its
    ``skip_alpha`` is the stack's DeepNorm alpha (unless the scheme sets one)."""
    if scheme.init == "deepnorm" and scheme.skip_alpha is None:
        return scheme.replace(skip_alpha=deepnorm_constants(stack)[0])
    return scheme


@torch.no_grad()
def init_transformer_branch(scheme: Scheme, fn: nn.Module, stack: TransformerStack | None) -> None:
    """Rewrite the init of a sublayer's branch ``fn`` (attention: ``q_proj``, ``k_proj``,
    ``v_proj``, ``out_proj``; feed-forward: ``fc1``, ``fc2``) under DeepNorm or T-Fixup; other
    schemes keep fairseq's init (rescale scales its layers in the sublayer)."""
    if scheme.init not in TRANSFORMER_INITS:
        return
    if stack is None:
        raise ValueError(f"init {scheme.init!r} needs the sublayer's stack and depths (TransformerStack)")
    layers = {name: getattr(fn, name) for name in ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")
              if isinstance(getattr(fn, name, None), nn.Linear)}
    if scheme.init == "deepnorm":
        beta = deepnorm_constants(stack)[1]
        for name, layer in layers.items():
            nn.init.xavier_normal_(layer.weight, gain=1.0 if name in ("q_proj", "k_proj") else beta)
            if layer.bias is not None:
                layer.bias.zero_()
    else:
        mult = tfixup_multiplier(stack)
        for name, layer in layers.items():
            if name not in ("q_proj", "k_proj"):
                layer.weight.mul_(mult * math.sqrt(2.0) if name == "v_proj" else mult)


@torch.no_grad()
def init_transformer_embeddings(scheme: Scheme, src: nn.Embedding, tgt: nn.Embedding,
                                encoder_layers: int, decoder_layers: int) -> None:
    """T-Fixup's token-embedding multipliers: ``(9N)^(-1/4)`` on the source (or shared) matrix,
    ``(9M)^(-1/4)`` on a separate target matrix (layer6ai-labs/T-Fixup scales a shared one once,
    with the encoder's)."""
    if scheme.init != "tfixup":
        return
    src.weight.mul_((9 * encoder_layers) ** -0.25)
    if tgt is not src:
        tgt.weight.mul_((9 * decoder_layers) ** -0.25)
