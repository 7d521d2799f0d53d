"""Residual schemes: how a block normalises (or not), merges skip path and branch, and inits.

A scheme is data. One generic block (:mod:`rescale_core.blocks`) reads it; every model family
builds its blocks the same way. Select a scheme by name and override any field for ablations::

    get_scheme("rescale", c=10.0, gain="vector", mean_shift=False)

The merge every scheme reduces to (block k of L, k = 1..L)::

    x_k = block_scale * (skip_scale_k * shortcut(x_{k-1}) + branch_scale_k * g_k * F_k(x_{k-1}) + b_k)

- ``bn`` / ``gn``: torchvision ResNet (He et al. 2016) with BatchNorm / GroupNorm(32) after
  every conv; ``zero_gamma`` zero-initialises the last norm weight of each branch
  (Goyal et al. 2017).
- ``none``: norm layers removed, He init, ``x + F(x)``: trains at small depth, fails deep.
- ``rescale``: RescaleNet (Shao et al., NeurIPS 2020, Eq. 4-6): ``alpha_k = sqrt((k-1+c)/(k+c))``,
  ``beta = L^-1/2`` fixed with each of the m branch convs' He std multiplied by
  ``(L/(k+c))^(1/2m) * sqrt(1-p)`` (rebuttal [R4]), or ``beta_k = (k+c)^-1/2``
  (``fixed_beta=False``); learnable gain (init 1, no weight decay); mean-shift biases. ``c``
  defaults to L, the paper's choice; the official code (hukkai/rescaling ``models/rescale.py``)
  numbers its blocks from ``block_idx = L - 1``, i.e. ``c = L - 1`` (``scheme_options: {c: ...}``
  gives it).
  ``shortcut_gain`` / ``classifier_gain`` (default: the official code's He gain 1 for both):
  the basic-block recipe's signal-preserving transition and head (docs/studies.md, the
  basic-block yardstick).
- ``skipinit``: SkipInit (De & Smith, NeurIPS 2020): learnable scalar at the end of each
  branch, init 0, no normalisation. ``skipinit_reg``: Regularized SkipInit (biases in the convs
  and dropout before the classifier).
- ``fixup``: Fixup (Zhang et al., ICLR 2019): last branch layer and classifier zero-initialised,
  the other branch layers' He std scaled by ``L^(-1/(2m-2))``, scalar biases before each conv,
  activation and the classifier, one scalar multiplier per branch; scalars at lr/10.
- ``rezero``: ReZero (Bachlechner et al. 2020): ``x + a F(x)``, ``a = 0`` at init, no
  normalisation: in a conv network the fields of ``skipinit`` (one ``a`` per residual block, the
  same network seed for seed); in a Transformer one ``a`` per layer, shared by its sublayers
  (``layer_gain``: self-attention and feed-forward; the decoder's cross-attention too), as the
  ReZero code's ``resweight`` (majumderb/rezero ``rztx.py``; docs/transformers.md), where
  ``skipinit`` has one per sublayer.
- SkipInit's counter-examples (rebuttal): ``bn_scaled`` (a BN ResNet whose blocks output
  ``alpha (x + F(x))``, alpha = sqrt(1/2)), ``bn_head`` (one BN before the classifier only),
  ``bn_merge`` (BN on the branch plus a BN after the merge).
- ``nf``: NF-ResNet (Brock, De & Smith, ICLR 2021, Sec. 3-4, the layout of their Fig. 2 and
  timm's ``nf_resnet50``): ``layout="preact"``, ``x_{l+1} = x_l + alpha * F_l(relu(x_l) / beta_l)``
  with ``alpha = nf_alpha`` (0.2) and ``beta_l`` the analytic std of the stream (1 after every
  transition block, ``beta_{l+1}^2 = beta_l^2 + alpha^2`` after each other block), the transition's
  projection shortcut on the scaled activation; Scaled Weight Standardization on every conv
  (``scaled_ws``, :class:`rescale_core.layers.ScaledStdConv2d`) with ReLU's gamma folded into it
  and conv biases; the last conv gain of each branch zero-initialised (``zero_gamma``, timm's
  default); ``init="nf"``. ``nf_skipinit``: that gain starts at 1 and a scalar SkipInit gain, init
  0, ends each branch (timm's ``skipinit=True``). Formulas, layout and where we differ from timm
  and from the official JAX code: docs/nf_resnets.md.
- ``stochdepth_rate`` (any conv scheme; NF-ResNet's recipe sets 0.1): stochastic depth (Huang et
  al. 2016) by the official NF-ResNet rule: in training block k of L drops its whole branch, per
  sample, with probability ``stochdepth_rate * (k - 1) / L`` and divides the kept ones by the keep
  probability (``stochdepth_scale: false``: keeps them as they are, the official code's
  ``StochDepth``); evaluation is unchanged (:func:`rescale_core.layers.drop_path`).
- Transformer sublayers: ``post_ln`` and ``pre_ln`` beside ``rescale``, ``rezero``, ``skipinit``;
  ``dyt`` (Zhu et al., CVPR 2025) and ``derf`` (Chen et al. 2025): ``pre_ln`` with every
  LayerNorm, the stacks' final ones included, replaced by the pointwise
  :class:`~rescale_core.layers.PointwiseNorm` (``gamma * tanh(alpha x) + beta``,
  ``gamma * erf(alpha x + s) + beta``); ``norm_alpha`` (and ``norm_alpha_attention``,
  ``norm_alpha_ffn``, ``norm_alpha_final`` per site) sets alpha's init, 0.5 by default as in both
  public codes. In a conv network ``dyt`` replaces every BatchNorm of ``bn`` (branch, shortcut,
  stem) by the pointwise layer over channels: the counter-example of the DyT paper's own
  ConvNet trial, which lost accuracy against BN (docs/studies.md, DyT on ResNets).
  ``deepnorm`` (Wang et al. 2022, "DeepNet"): ``post_ln`` with an up-weighted shortcut,
  ``LN(alpha x + F(x))``, and the branch's value/output/feed-forward weights initialised with gain
  ``beta``, the encoder-decoder constants of the paper per stack (``init="deepnorm"``;
  ``skip_alpha`` overrides alpha). ``tfixup`` (Huang et al., ICML 2020): no LayerNorm at all,
  ``x + F(x)``, and T-Fixup's init (``init="tfixup"``), trained without warm-up. Constants:
  :mod:`rescale_core.init`.

Every field is typed: an override whose value does not fit (``mean_shift="flase"``,
``shortcut_gain="two"``, a list for a number) raises :class:`SchemeOptionError` (a ``TypeError``
and a ``ValueError``) naming the option, the value, what it should be and the scheme, as does a
value outside a field's choices or range. The coercions a config's reader needs are made: an
integer for a float field, a string that reads as one (``"2"``), a YAML boolean word for a
boolean (``"false"``, ``"no"``, ``"off"``), a list for a tuple field.

A new field is listed in :data:`rescale_core.plans.IMPLEMENTED_FIELDS` (a test fails until it is):
with its default value only (``"shortcut_mult": (1.0,)``) until the fast plans handle it, so that
the schemes leaving it at its default keep the fast plans and those setting it run the reference
path (:func:`rescale_core.plans.implements`); with all the values they handle (None: any) once they
do. A new value of a categorical field runs the reference until it is added to its tuple there.
Every field is listed in :data:`FIELD_READERS` with the networks that read it (``conv``,
``transformer`` or both; a test fails until it is, and every network refuses it set until then): a
network that does not read a field refuses it rather than take it and ignore it. VGG refuses it
unless ``rescale_core.models.vgg.VGG_OPTIONS`` names it. docs/design.md, "Adding a
scheme".

Deviation (all schemes but ``nf``, conv families): blocks use the ResNet v1 layout (ReLU after the
merge, ``layout="v1"``), including the Wide-ResNets that are pre-activation in Zagoruyko &
Komodakis (2016).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional

__all__ = ["CONV_ONLY_OPTIONS", "FIELD_READERS", "GAIN_INIT_WITHOUT_GAIN", "TRAINING_ONLY_OPTIONS",
           "TRANSFORMER_ONLY_OPTIONS", "Scheme", "SchemeOptionError", "definition", "definition_changes", "get_scheme",
           "list_schemes", "register_scheme", "shown"]

Family = Literal["conv", "transformer"]
_FAMILIES = typing.get_args(Family)  # the networks a scheme may build: conv networks, Transformers

_TRUE, _FALSE = ("true", "yes", "on"), ("false", "no", "off")  # YAML's boolean words, any case
_KINDS = {bool: ("a boolean (true or false)", "booleans"), int: ("an integer", "integers"),
          float: ("a number", "numbers"), str: ("a string", "strings")}
# the values a categorical field accepts
_CHOICES: dict[str, tuple] = {
    "norm": (None, "bn", "gn", "ln", "dyt", "derf"),
    "merge": ("add", "rescale"),
    "gain": (None, "scalar", "vector"),
    "init": ("he_fan_out", "he_fan_in", "rescale", "fixup", "nf", "deepnorm", "tfixup"),
    "norm_position": ("post", "pre"),
    "layout": ("v1", "preact"),
}

_POSITIVE = ("a positive number or null", lambda v: v > 0)
# the numeric fields' ranges: what a value must be, and the test its finite value passes (a value
# that is not finite is refused too)
_RANGES: dict[str, tuple[str, Callable[[float], bool]]] = {
    "shortcut_gain": _POSITIVE, "classifier_gain": _POSITIVE, "skip_alpha": _POSITIVE, "c": _POSITIVE,
    **dict.fromkeys(("norm_alpha", "norm_alpha_attention", "norm_alpha_ffn", "norm_alpha_final"), _POSITIVE),
    "block_scale": ("a positive number", lambda v: v > 0),
    "gain_init": ("a finite number", lambda v: True),
    "scalar_lr_factor": ("a number >= 0", lambda v: v >= 0),
}


_CONV, _TRANSFORMER, _BOTH = frozenset({"conv"}), frozenset({"transformer"}), frozenset(_FAMILIES)
#: the networks that read each :class:`Scheme` field: ``conv`` (the residual block's convs, norms,
#: projections and classifier), ``transformer`` (where its norms sit, their alphas per site) or
#: both. A network refuses a field it does not read, set off its scheme's definition or given as an
#: option, rather than ignore it (:func:`rescale_core.blocks.check_buildable`), and any field this
#: table does not name (a new field, or a field of a ``Scheme`` subclass, until it is added here).
#: tests/core/test_core_schemes.py fails while a field of ``Scheme`` is missing.
FIELD_READERS: dict[str, frozenset[str]] = {
    "name": _BOTH, "families": _BOTH,
    # the branch
    "norm": _BOTH, "zero_gamma": _CONV, "norm_position": _TRANSFORMER, "mean_shift": _CONV, "measure_batches": _CONV,
    "scalar_biases": _BOTH, "conv_bias": _CONV, "conv_dropout": _CONV, "conv_dropout_stages": _CONV,
    "scaled_ws": _CONV, "norm_alpha": _BOTH, "norm_alpha_attention": _TRANSFORMER, "norm_alpha_ffn": _TRANSFORMER,
    "norm_alpha_final": _TRANSFORMER,
    # the merge
    "merge": _BOTH, "c": _BOTH, "fixed_beta": _BOTH, "gain": _BOTH, "gain_init": _BOTH, "layer_gain": _TRANSFORMER,
    "block_scale": _BOTH,
    "skip_alpha": _BOTH, "merge_norm": _CONV, "layout": _BOTH, "nf_alpha": _BOTH,  # a Transformer refuses preact
    # the network
    "head_norm": _CONV, "classifier_dropout": _CONV, "stochdepth_rate": _CONV, "stochdepth_scale": _CONV,
    "init": _BOTH,
    "zero_classifier": _CONV,
    "shortcut_gain": _CONV, "classifier_gain": _CONV, "scalar_lr_factor": _BOTH,
}
#: the fields that act in training only (dropout, stochastic depth: the identity in eval mode): two
#: schemes that differ in these alone hold the same weights and compute the same evaluation, so a
#: checkpoint is evaluated under a config without them (a resume still refuses a change of them)
TRAINING_ONLY_OPTIONS = frozenset({"conv_dropout", "conv_dropout_stages", "classifier_dropout", "stochdepth_rate",
                                   "stochdepth_scale"})
#: the fields only the conv families read (of :data:`FIELD_READERS`): as ``scheme_options`` of a
#: Transformer they would change nothing, so the Transformer refuses them (checked field by field in
#: tests/core/models/test_transformer_ln_free.py)
CONV_ONLY_OPTIONS = frozenset(k for k, readers in FIELD_READERS.items() if readers == _CONV)
#: the fields only a Transformer reads (of :data:`FIELD_READERS`): a conv network refuses them set
#: off its scheme's definition
TRANSFORMER_ONLY_OPTIONS = frozenset(k for k, readers in FIELD_READERS.items() if readers == _TRANSFORMER)
#: the fields that say which scheme a :class:`Scheme` is, not how it builds: no option of it
_IDENTITY = ("name", "families")
#: what a ``gain_init`` set without a gain is not (no network reads it)
GAIN_INIT_WITHOUT_GAIN = "an option without a gain (gain: scalar or vector; it changes nothing here: remove it)"


class SchemeOptionError(TypeError, ValueError):
    """A scheme option (a :class:`Scheme` field) whose value does not fit: its type, its choices
    or its range. The message names the option, the value as YAML writes it and the scheme."""

    def __init__(self, option: str, value: Any, expected: str, scheme: Any):
        self.option, self.value, self.expected, self.scheme = option, value, expected, scheme
        super().__init__(f"scheme_options.{option}: {shown(value)} is not {expected} for scheme {scheme}")


def shown(value: Any) -> str:
    """``value`` as a config writes it: ``"flase"``, ``[1]``, ``true``, ``null``."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _unread_options(scheme: "Scheme") -> list[tuple[str, str]]:
    """The fields ``scheme`` sets off their default while the switch that reads them is off, so
    that no network reads them (each would change nothing): (field, what it should be)."""
    defaults = {f.name: f.default for f in dataclasses.fields(scheme)}
    rules = (
        ("conv_dropout_stages", scheme.conv_dropout == 0.0,
         "an option without conv_dropout (it picks the stages conv_dropout drops in: remove it, or set "
         "conv_dropout)"),
        ("layer_gain", scheme.gain is None,
         "an option without a gain (it shares the gain between the sublayers of a Transformer layer, and "
         "there is none: remove it, or set gain)"),
        ("scalar_lr_factor", scheme.gain is None and not scheme.scalar_biases,
         "an option without a gain or scalar_biases (it sets their learning rate, and the network has "
         "neither: remove it)"),
    )
    return [(key, expected) for key, off, expected in rules
            if off and getattr(scheme, key) != defaults.get(key, getattr(scheme, key))]


class _Mismatch(Exception):
    """A value that does not fit a type hint."""


@functools.lru_cache(maxsize=None)
def _field_types(cls: type) -> dict[str, Any]:
    """The type hint of every dataclass field of ``cls`` (a :class:`Scheme` or a subclass)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name in hints}


def _one_of(field: str) -> Optional[str]:
    """The values a categorical field accepts, in words (None for other fields)."""
    allowed = _CHOICES.get(field)
    if allowed is None:
        return None
    return "one of " + ", ".join(shown(a) for a in allowed if a is not None) + (" or null" if None in allowed else "")


def _describe(hint: Any) -> str:
    """What a type hint accepts, in words: ``a number or null``, ``a list of integers``."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:
        return " or ".join(_describe(a) for a in args if a is not type(None)) + " or null"
    if typing.get_origin(hint) is tuple:
        return f"a list of {_KINDS.get(args[0], ('', 'values'))[1]}"
    return _KINDS.get(hint, (getattr(hint, "__name__", str(hint)), ""))[0]


def _typed(value: Any, hint: Any) -> Any:
    """``value`` as the type ``hint`` holds it (the coercions a config reader needs), or
    :class:`_Mismatch`. A hint this module does not know accepts any value."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _typed(value, arg)
            except _Mismatch:
                pass
        raise _Mismatch
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        return tuple(_typed(v, args[0]) for v in value) if args and args[-1] is Ellipsis else tuple(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise _Mismatch
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise _Mismatch from None
        raise _Mismatch
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise _Mismatch from None
        raise _Mismatch
    if hint is str and not isinstance(value, str):
        raise _Mismatch
    return value


@dataclass(frozen=True)
class Scheme:
    """Every switch a residual scheme has. Field defaults describe a plain ``x + F(x)`` net."""

    name: str
    families: tuple[str, ...] = ("conv",)
    # --- the branch -----------------------------------------------------------------------
    norm: Optional[str] = None            # "bn" | "gn" | "ln" | "dyt" | "derf" | None: after each branch layer
    zero_gamma: bool = False              # last norm weight (scaled_ws: conv gain) of a branch starts at 0
    norm_position: str = "post"           # transformers: "post" (LN after merge) | "pre"
    mean_shift: bool = False              # RescaleNet: bias - mu0 before every conv
    measure_batches: int = 8              # batches averaged into mu0
    scalar_biases: bool = False           # Fixup: scalar biases before convs/activations
    conv_bias: bool = False               # ordinary per-channel conv biases
    conv_dropout: float = 0.0             # dropout after each branch conv ...
    conv_dropout_stages: tuple[int, ...] = (3, 4)  # ... in these stages (1-based; default: 3, 4 where they exist)
    scaled_ws: bool = False               # NF: Scaled Weight Standardization on every conv
    norm_alpha: Optional[float] = None    # dyt / derf: alpha's init at every site (None: 0.5)
    norm_alpha_attention: Optional[float] = None  # ... before attention (None: norm_alpha)
    norm_alpha_ffn: Optional[float] = None        # ... before feed-forward (None: norm_alpha)
    norm_alpha_final: Optional[float] = None      # ... the stacks' final norms (None: norm_alpha)
    # --- the merge ------------------------------------------------------------------------
    merge: str = "add"                    # "add" | "rescale"
    c: Optional[float] = None             # rescale: None -> L (the paper's choice)
    fixed_beta: bool = True               # rescale: beta = L^-1/2 + init multiplier
    gain: Optional[str] = None            # "scalar" | "vector" | None
    gain_init: float = 1.0
    layer_gain: bool = False              # transformers: one gain per layer, shared by its sublayers
    #                                       (ReZero's resweight); false: one per sublayer
    block_scale: float = 1.0              # counter-example: x_k = block_scale * (x + F(x))
    skip_alpha: Optional[float] = None    # x_k = skip_alpha * x + F(x) (DeepNorm's alpha; None: 1,
    #                                       or under init deepnorm each stack's constant)
    merge_norm: bool = False              # counter-example: a norm after the merge
    layout: str = "v1"                    # "v1" (ReLU after the merge) | "preact" (NF-ResNet)
    nf_alpha: Optional[float] = None      # preact: x + nf_alpha * F(relu(x) / beta)
    # --- the network ----------------------------------------------------------------------
    head_norm: bool = False               # counter-example: BN before the classifier only
    classifier_dropout: float = 0.0
    stochdepth_rate: float = 0.0          # stochastic depth: block k of L drops its branch at rate * (k-1) / L
    stochdepth_scale: bool = True         # kept branches divided by the keep probability (timm's); false: the
    #                                       official NF-ResNet code's StochDepth, kept branches as they are
    init: str = "he_fan_out"              # "he_fan_out" | "he_fan_in" | "rescale" | "fixup" | "nf"
    #                                       | "deepnorm" | "tfixup" (Transformers: rescale_core.init)
    zero_classifier: bool = False
    shortcut_gain: Optional[float] = None    # He gain of projection shortcuts (None: the init's)
    classifier_gain: Optional[float] = None  # He gain of the classifier (None: the init's)
    scalar_lr_factor: float = 1.0         # lr multiplier of gains and scalar biases

    def __post_init__(self) -> None:
        name = self.name if isinstance(self.name, str) else shown(self.name)
        for key, hint in _field_types(type(self)).items():
            value = getattr(self, key)
            try:
                typed = _typed(value, hint)
            except _Mismatch:
                raise SchemeOptionError(key, value, _one_of(key) or _describe(hint), name) from None
            if typed is not value:
                object.__setattr__(self, key, typed)  # frozen: the coerced value, set once here
        for key, allowed in _CHOICES.items():
            if getattr(self, key) not in allowed:
                raise SchemeOptionError(key, getattr(self, key), _one_of(key), name)
        if not self.families or not set(self.families) <= set(_FAMILIES):
            raise SchemeOptionError("families", list(self.families), "a list of the families the scheme builds, "
                                    f"each one of {', '.join(map(shown, _FAMILIES))}", name)
        for key in ("conv_dropout", "classifier_dropout", "stochdepth_rate"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise SchemeOptionError(key, getattr(self, key), "a rate in [0, 1)", name)
        for key in ("norm_alpha", "norm_alpha_attention", "norm_alpha_ffn", "norm_alpha_final"):
            value = getattr(self, key)
            if value is not None and self.norm not in ("dyt", "derf"):
                raise SchemeOptionError(key, value, "null unless norm is dyt or derf", name)
        for key, (expected, within) in _RANGES.items():
            value = getattr(self, key)
            if value is not None and not (math.isfinite(value) and within(value)):
                raise SchemeOptionError(key, value, expected, name)
        if self.classifier_gain is not None and self.zero_classifier:
            raise ValueError(f"scheme {self.name!r}: classifier_gain has no effect with zero_classifier=True")
        if self.block_scale != 1.0 and self.scalar_biases:
            # the merge adds Fixup's bias after block_scale's product: not the block_scale * (... + b_k)
            # of the merge rule above
            raise SchemeOptionError("block_scale", self.block_scale, "1 under scalar_biases (the merge would add "
                                    "Fixup's scalar bias outside block_scale * (...), not inside as its rule says)",
                                    name)
        if self.skip_alpha is not None and self.merge == "rescale":
            raise ValueError(f"scheme {self.name!r}: skip_alpha replaces the shortcut multiplier "
                             "that merge 'rescale' sets (alpha_k); use one or the other")
        if self.merge != "rescale":
            for key, unread in (("c", self.c is not None), ("fixed_beta", not self.fixed_beta)):
                if unread:
                    raise SchemeOptionError(key, getattr(self, key), f"an option of merge {self.merge!r} (it shapes "
                                            'merge "rescale" only: remove it)', name)
        if self.measure_batches < 1:
            raise SchemeOptionError("measure_batches", self.measure_batches, "an integer >= 1", name)
        if any(stage < 1 for stage in self.conv_dropout_stages):
            raise SchemeOptionError("conv_dropout_stages", list(self.conv_dropout_stages),
                                    "a list of stages, each >= 1", name)
        for key, expected in _unread_options(self):
            raise SchemeOptionError(key, getattr(self, key), expected, name)
        if self.zero_gamma and self.norm is None and not self.scaled_ws:
            raise SchemeOptionError("zero_gamma", True, "possible without a norm or scaled_ws (it zeroes the "
                                    "last norm weight or conv gain of each branch)", name)
        if self.layout == "preact":
            alpha = self.nf_alpha
            if alpha is None or not (math.isfinite(alpha) and alpha > 0):
                raise SchemeOptionError("nf_alpha", alpha, "a positive number under layout preact", name)
            clashes = [f"{k}={getattr(self, k)!r}" for k, ok in (("merge", self.merge == "add"),
                       ("mean_shift", not self.mean_shift), ("merge_norm", not self.merge_norm)) if not ok]
            if clashes:
                raise ValueError(f"scheme {self.name!r}: layout 'preact' merges x + nf_alpha * F(x) "
                                 f"(Brock et al. 2021), which {', '.join(clashes)} would change")
        elif self.nf_alpha is not None:
            raise SchemeOptionError("nf_alpha", self.nf_alpha, "null outside layout preact", name)

    # --- the merge rule, per block ----------------------------------------------------------
    def skip_scale(self, k: int, L: int) -> float:
        """Multiplier of the shortcut of block k (1-based) of L, before ``block_scale``."""
        if self.skip_alpha is not None:
            return float(self.skip_alpha)
        if self.merge == "rescale":
            c = self.c_for(L)
            return math.sqrt((k - 1 + c) / (k + c))
        return 1.0

    def branch_scale(self, k: int, L: int) -> float:
        """Fixed multiplier of the branch of block k (the learnable gain comes on top)."""
        if self.merge == "rescale":
            return L ** -0.5 if self.fixed_beta else (k + self.c_for(L)) ** -0.5
        if self.layout == "preact":
            return float(self.nf_alpha)
        return 1.0

    def norm_alpha_at(self, site: str) -> Optional[float]:
        """The init of a pointwise norm's alpha (``dyt``, ``derf``) at ``site``: ``attention``,
        ``ffn`` or ``final`` (None: the layer's default, 0.5)."""
        specific = {"attention": self.norm_alpha_attention, "ffn": self.norm_alpha_ffn,
                    "final": self.norm_alpha_final}[site]
        return self.norm_alpha if specific is None else specific

    def c_for(self, L: int) -> float:
        return float(L) if self.c is None else float(self.c)

    def supports(self, family: str) -> bool:
        return family in self.families

    def overrides(self) -> dict[str, Any]:
        """The fields set off the scheme's definition: those whose value differs from the
        registered scheme of this name (for a name not registered, from the field defaults); a
        field of a ``Scheme`` subclass that the registered scheme lacks, where it differs from
        the field's default."""
        return self.unlike(_SCHEMES.get(self.name) or Scheme(self.name))

    def unlike(self, base: "Scheme") -> dict[str, Any]:
        """The fields (but ``name`` and ``families``) whose value differs from ``base``'s; a field
        ``base`` lacks (of a ``Scheme`` subclass), where it differs from the field's default."""
        defaults = base if type(self) is type(base) else type(self)(base.name)  # a subclass's fields at their defaults
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _IDENTITY
                and getattr(self, f.name) != getattr(base, f.name, getattr(defaults, f.name))}

    def replace(self, **overrides) -> "Scheme":
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(self)})
        if unknown:  # the options: every field but those saying which scheme this is
            options = [f.name for f in dataclasses.fields(self) if f.name not in _IDENTITY]
            hints = {u: difflib.get_close_matches(u, options, n=2) for u in unknown}
            raise ValueError(f"unknown scheme option(s) {hints} for scheme {self.name!r}; "
                             f"options are {options}")
        return dataclasses.replace(self, **overrides)


_SCHEMES: dict[str, Scheme] = {}


def register_scheme(scheme: Scheme) -> Scheme:
    """Make ``scheme`` selectable by its name (``get_scheme``, ``create_model(..., scheme=name)``,
    ``model.init_args.scheme``). Refused: a name already registered, and a definition that sets
    ``gain_init`` without a gain (no network would read it: it would train without any gain)."""
    if scheme.name in _SCHEMES:
        raise ValueError(f"scheme {scheme.name!r} is already registered")
    if scheme.gain is None and scheme.gain_init != Scheme(scheme.name).gain_init:
        raise SchemeOptionError("gain_init", scheme.gain_init, GAIN_INIT_WITHOUT_GAIN, scheme.name)
    _SCHEMES[scheme.name] = scheme
    return scheme


def list_schemes(family: str | None = None) -> list[str]:
    return sorted(n for n, s in _SCHEMES.items() if family is None or s.supports(family))


def get_scheme(scheme: "str | Scheme", **overrides) -> Scheme:
    """The scheme called ``scheme`` (or the given instance) with ``overrides`` applied (a
    network's ``scheme_options``): any field but ``name`` and ``families``, which say which scheme
    it is (a run that renamed its scheme would be filed under another: ``rescale compare`` would
    take a RescaleNet run named ``bn`` for the BN baseline). ``Scheme.replace`` derives a scheme
    of another name to register."""
    named = sorted(set(overrides) & set(_IDENTITY))
    if named:
        label = scheme.name if isinstance(scheme, Scheme) else scheme
        raise SchemeOptionError(named[0], overrides[named[0]], "an option (it says which scheme this is: select "
                                "another with the scheme argument, model.init_args.scheme)", label)
    if isinstance(scheme, Scheme):
        return scheme.replace(**overrides) if overrides else scheme
    if scheme not in _SCHEMES:
        close = difflib.get_close_matches(str(scheme), list(_SCHEMES), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown scheme {scheme!r}.{hint} Known schemes: {', '.join(list_schemes())}")
    return _SCHEMES[scheme].replace(**overrides) if overrides else _SCHEMES[scheme]


def definition(scheme: Scheme) -> dict[str, Any]:
    """Every field of ``scheme`` but ``name`` and ``families``, as JSON holds it (a tuple as a
    list): the network a run built, which its ``run_summary.json`` records as ``scheme_fields``."""
    return {f.name: list(value) if isinstance(value := getattr(scheme, f.name), tuple) else value
            for f in dataclasses.fields(scheme) if f.name not in _IDENTITY}


def definition_changes(recorded: dict[str, Any], scheme: Scheme,
                       family: Optional[str] = None) -> dict[str, tuple[Any, Any]]:
    """The fields whose value in ``recorded`` (a :func:`definition` written earlier, as JSON read it
    back) differs from ``scheme``'s: field -> (recorded value, value now). A field ``recorded`` lacks
    (one added to :class:`Scheme` since) counts at its default, so a new field changes no earlier
    record unless the scheme sets it off its default (``layer_gain`` of ``rezero``); a recorded
    field :class:`Scheme` no longer has is left out. ``family`` (``conv`` or ``transformer``: the
    network the record is of): only the fields it reads (:data:`FIELD_READERS`), so that
    ``rezero``'s ``layer_gain`` leaves its conv networks as they were."""
    defaults, now = definition(type(scheme)(scheme.name)), definition(scheme)
    return {key: (recorded.get(key, defaults[key]), value) for key, value in now.items()
            if recorded.get(key, defaults[key]) != value
            and (family is None or family in FIELD_READERS.get(key, _BOTH))}


_CONV_TF = ("conv", "transformer")

register_scheme(Scheme("bn", norm="bn"))
register_scheme(Scheme("gn", norm="gn"))
register_scheme(Scheme("none", init="he_fan_in"))
register_scheme(Scheme("rescale", families=_CONV_TF, merge="rescale", gain="scalar",
                       mean_shift=True, init="rescale"))
register_scheme(Scheme("skipinit", families=_CONV_TF, gain="scalar", gain_init=0.0,
                       init="he_fan_in"))
register_scheme(Scheme("skipinit_reg", gain="scalar", gain_init=0.0, init="he_fan_in",
                       conv_bias=True, classifier_dropout=0.2))
register_scheme(Scheme("fixup", gain="scalar", scalar_biases=True, init="fixup",
                       zero_classifier=True, scalar_lr_factor=0.1))
register_scheme(Scheme("rezero", families=_CONV_TF, gain="scalar", gain_init=0.0, layer_gain=True,
                       init="he_fan_in"))
register_scheme(Scheme("bn_scaled", norm="bn", block_scale=math.sqrt(0.5)))
register_scheme(Scheme("bn_head", head_norm=True, init="he_fan_in"))
register_scheme(Scheme("bn_merge", norm="bn", merge_norm=True))
register_scheme(Scheme("nf", layout="preact", nf_alpha=0.2, scaled_ws=True, conv_bias=True,
                       zero_gamma=True, init="nf"))
register_scheme(Scheme("nf_skipinit", layout="preact", nf_alpha=0.2, scaled_ws=True, conv_bias=True,
                       gain="scalar", gain_init=0.0, init="nf"))
register_scheme(Scheme("post_ln", families=("transformer",), norm="ln", norm_position="post"))
register_scheme(Scheme("pre_ln", families=("transformer",), norm="ln", norm_position="pre"))
register_scheme(Scheme("deepnorm", families=("transformer",), norm="ln", norm_position="post",
                       init="deepnorm"))
register_scheme(Scheme("tfixup", families=("transformer",), init="tfixup"))
register_scheme(Scheme("dyt", families=_CONV_TF, norm="dyt", norm_position="pre"))
register_scheme(Scheme("derf", families=("transformer",), norm="derf", norm_position="pre"))
