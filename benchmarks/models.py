"""The contenders: for each model family a table name -> builder, with its normalized baseline,
its no-normalization floor and the model the goals are about.

- ``resnet50``: torchvision's BN ResNet-50 (the baseline); the floor, torchvision's ResNet-50 with
  every norm layer replaced by ``nn.Identity`` (the cheapest a normalization-free ResNet-50 can
  be: no scheme adds less than nothing); timm's ``nf_resnet50`` (NF-ResNet, Brock et al. 2021;
  left out where timm is not installed); this suite's ``rescale50`` (on the device's default
  plan, and on each plan by name: ``rescale50 lean``, ``rescale50 folded``), ``skipinit50``,
  ``fixup50`` and ``nf50`` (scheme ``nf``: Scaled WS, the pre-activation block) from
  :func:`rescale_core.create_model`, and ``nf50 + AGC``: ``nf50`` with adaptive gradient clipping
  (:mod:`rescale_core.agc`, lambda 0.01, the classifier excluded, as ``agc_clip`` trains) between
  the backward and the optimizer step.
- ``resnet50_plans``: the baseline, the floor and ``rescale50`` under each execution plan by name,
  the reference plan included (the ``plans`` section).
- ``resnet3d``: this suite's 3D ResNet (``resnet3d_50`` by default, Hara et al. 2018) under ``bn``
  (the baseline), ``rescale``, ``skipinit`` and ``none`` (the floor: ``x + F(x)``, no norm, no
  gain, no bias).
- ``transformer``: this suite's encoder-decoder Transformer (``transformer_small``, fairseq's
  IWSLT size, by default) under ``post_ln`` (the baseline, Vaswani et al. 2017), ``pre_ln``,
  ``rescale``, ``rezero``, ``skipinit`` and the floor (``skipinit`` without its gain: plain
  ``x + F(x)``, no LayerNorm).
- ``translation``: the translation task's network (``transformer_base``, shared embeddings,
  :class:`rescale_tasks.translation.module.TranslationModule`'s) under ``post_ln`` (the
  baseline), ``pre_ln``, ``rescale``, ``tfixup``, ``deepnorm``, ``dyt`` and ``derf``, trained
  with the task's label-smoothed loss and Adam on real token-budget batches (several per timed
  call, :attr:`Suite.multi_batch`); no floor.

A :class:`Suite` also knows how to make a batch for its models and the training loss.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

import rescale_core
from rescale_core.agc import adaptive_clip_grad_

__all__ = ["Contender", "Suite", "resnet50_suite", "resnet50_plans_suite", "RESNET50_PLANS", "resnet3d_suite",
           "transformer_suite", "translation_suite", "TRANSLATION_SCHEMES", "torchvision_resnet50",
           "resnet50_floor", "image_batch", "agc_but_classifier"]


@dataclass(frozen=True)
class Contender:
    """``after_backward(model)``: what a train step does between the backward and the optimizer
    step (gradient clipping), timed with the step."""

    name: str
    build: Callable[[], nn.Module]
    note: str = ""
    after_backward: Callable[[nn.Module], None] | None = None


@dataclass(frozen=True)
class Suite:
    """A family of contenders measured side by side.

    ``make_batch(batch_size, device) -> (inputs tuple, targets)``, or with ``multi_batch`` a
    list of them (one timed call = one step per batch); ``loss(output, targets)``;
    ``items`` is what one sample counts in the throughput column (1 image, 1 clip, T tokens)
    and ``unit`` names it; ``optimizer(params)`` replaces the harness's SGD (learning rate 0
    either way); ``floor`` None: the suite has no floor contender.
    """

    name: str
    title: str
    contenders: tuple[Contender, ...]
    baseline: str
    floor: str | None
    target: str
    make_batch: Callable[[int, torch.device], tuple[tuple[torch.Tensor, ...], torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    shape: str
    items: int = 1
    unit: str = "img"
    image_like: bool = True  # channels_last applies to its inputs
    multi_batch: bool = False
    optimizer: Callable[..., torch.optim.Optimizer] | None = None

    def __post_init__(self) -> None:
        names = [c.name for c in self.contenders]
        for role in ("baseline", "floor", "target"):
            if role == "floor" and self.floor is None:
                continue
            if getattr(self, role) not in names:
                raise ValueError(f"{self.name}: {role} {getattr(self, role)!r} not in {names}")

    def contender(self, name: str) -> Contender:
        for c in self.contenders:
            if c.name == name:
                return c
        raise KeyError(f"{self.name}: no contender {name!r}; have {[c.name for c in self.contenders]}")


# --- ResNet-50 ----------------------------------------------------------------------------------
def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def torchvision_resnet50(num_classes: int = 1000, **kwargs) -> nn.Module:
    """torchvision's ResNet-50; where torchvision is not installed (a GPU machine with only its
    own torch), the suite's ``resnet50`` under ``bn`` (the same layers, ops and parameters)."""
    if not _have("torchvision"):
        return rescale_core.create_model("resnet50", scheme="bn", num_classes=num_classes)
    import torchvision

    return torchvision.models.resnet50(num_classes=num_classes, **kwargs)


def resnet50_floor(num_classes: int = 1000) -> nn.Module:
    """torchvision's ResNet-50 with every BatchNorm replaced by ``nn.Identity`` (without
    torchvision: the suite's ``resnet50`` under ``none``, the same network)."""
    if not _have("torchvision"):
        return rescale_core.create_model("resnet50", scheme="none", num_classes=num_classes)
    return torchvision_resnet50(num_classes, norm_layer=lambda channels: nn.Identity())


def _timm(name: str, num_classes: int) -> nn.Module:
    import timm

    return timm.create_model(name, num_classes=num_classes)


def _ours(name: str, num_classes: int, plan: str = "auto", **kwargs):
    return lambda: rescale_core.create_model(name, num_classes=num_classes, plan=plan, **kwargs)


def agc_but_classifier(clip: float) -> Callable[[nn.Module], None]:
    """Adaptive gradient clipping of every parameter but the output layer's, as the ``agc_clip``
    training option clips (the parameters chosen once per model, by the option's own
    ``output_layers``, not in every step; kept while the model lives, so that a model built later
    at the same address gets its own)."""
    chosen: "weakref.WeakKeyDictionary[nn.Module, list[torch.Tensor]]" = weakref.WeakKeyDictionary()

    def clip_(model: nn.Module) -> None:
        if model not in chosen:
            # the task package only when used: the harness also runs on a GPU machine's own torch
            from rescale_tasks.common.training.clipping import output_layers

            skip = {id(p) for layer in output_layers(model) for p in layer.parameters()}
            chosen[model] = [p for p in model.parameters() if id(p) not in skip]
        adaptive_clip_grad_(chosen[model], clip)
    return clip_


def image_batch(image_size: int, num_classes: int, frames: int | None = None):
    """``make_batch`` of an image (or clip, with ``frames``) suite: seeded normal images, random labels."""
    def make(batch: int, device: torch.device):
        g = torch.Generator().manual_seed(0)
        shape = (batch, 3, image_size, image_size) if frames is None else (batch, 3, frames, image_size, image_size)
        x = torch.randn(shape, generator=g)
        y = torch.randint(0, num_classes, (batch,), generator=g)
        return (x.to(device),), y.to(device)
    return make


def resnet50_suite(image_size: int = 224, num_classes: int = 1000,
                   base_width: int | None = None) -> Suite:
    """``base_width`` (e.g. 8) shrinks this suite's own models for smoke tests; the torchvision and
    timm models keep their widths then, so use it only to exercise the harness."""
    ours = {} if base_width is None else {"base_width": base_width}
    contenders = (
        Contender("resnet50 BN", lambda: torchvision_resnet50(num_classes), "torchvision, the baseline"),
        Contender("floor (no norm)", lambda: resnet50_floor(num_classes), "torchvision, BN -> Identity"),
        *((Contender("nf_resnet50", lambda: _timm("nf_resnet50", num_classes), "timm NF-ResNet"),)
          if _have("timm") else ()),
        Contender("rescale50", _ours("rescale50", num_classes, **ours), "plan auto: lean on GPU, folded on CPU"),
        Contender("rescale50 lean", _ours("rescale50", num_classes, "lean", **ours), "plan lean"),
        Contender("rescale50 folded", _ours("rescale50", num_classes, "folded", **ours), "plan folded"),
        Contender("skipinit50", _ours("skipinit50", num_classes, **ours)),
        Contender("fixup50", _ours("fixup50", num_classes, **ours)),
        Contender("nf50", _ours("resnet50", num_classes, scheme="nf", **ours), "NF-ResNet, plan auto"),
        Contender("nf50 + AGC", _ours("resnet50", num_classes, scheme="nf", **ours), "lambda 0.01, output layer unclipped",
                  after_backward=agc_but_classifier(0.01)),
    )
    return Suite("resnet50", "ResNet-50", contenders, baseline="resnet50 BN", floor="floor (no norm)",
                 target="rescale50", make_batch=image_batch(image_size, num_classes),
                 loss=F.cross_entropy, shape=f"3x{image_size}x{image_size}")


RESNET50_PLANS = ("reference", "folded", "lean")


def resnet50_plans_suite(image_size: int = 224, num_classes: int = 1000, base_width: int | None = None,
                         target_plan: str = "folded") -> Suite:
    """BN ResNet-50, the floor and ``rescale50`` under each execution plan by name
    (``rescale50 reference``, ``rescale50 folded``, ``rescale50 lean``); the target is
    ``rescale50 {target_plan}``. ``base_width`` as in :func:`resnet50_suite`."""
    base = resnet50_suite(image_size, num_classes, base_width)
    ours = {} if base_width is None else {"base_width": base_width}
    notes = {"reference": "the layer-by-layer definition", "folded": "folded into the convolutions",
             "lean": "the fewest ops"}
    contenders = (base.contender(base.baseline), base.contender(base.floor),
                  *(Contender(f"rescale50 {plan}", _ours("rescale50", num_classes, plan, **ours),
                              f"plan {plan}: {notes[plan]}") for plan in RESNET50_PLANS))
    return replace(base, contenders=contenders, target=f"rescale50 {target_plan}")


# --- 3D ResNet ----------------------------------------------------------------------------------
RESNET3D_SCHEMES = {"bn": "3D BN", "rescale": "3D rescale", "skipinit": "3D skipinit",
                    "none": "3D floor (none)"}


def resnet3d_suite(arch: str = "resnet3d_50", frames: int = 16, image_size: int = 112,
                   num_classes: int = 400, base_width: int | None = None) -> Suite:
    extra = {} if base_width is None else {"base_width": base_width}

    def builder(scheme: str):
        return lambda: rescale_core.create_model(arch, scheme=scheme, num_classes=num_classes, **extra)

    contenders = tuple(Contender(f"{label}", builder(scheme), f"{arch} scheme={scheme}")
                       for scheme, label in RESNET3D_SCHEMES.items())
    return Suite("resnet3d", f"3D ResNet ({arch})", contenders, baseline="3D BN",
                 floor="3D floor (none)", target="3D rescale",
                 make_batch=image_batch(image_size, num_classes, frames), loss=F.cross_entropy,
                 shape=f"3x{frames}x{image_size}x{image_size}", unit="clip")


# --- Transformer --------------------------------------------------------------------------------
TRANSFORMER_SCHEMES = {"post_ln": ("post-LN", None), "pre_ln": ("pre-LN", None),
                       "rescale": ("T rescale", None), "rezero": ("T rezero", None),
                       "skipinit": ("T skipinit", None), "tfixup": ("T-Fixup", None),
                       "deepnorm": ("DeepNorm", None), "dyt": ("DyT", None), "derf": ("Derf", None),
                       "floor": ("T floor (no LN)", ("skipinit", {"gain": None}))}


def transformer_suite(arch: str = "transformer_small", src_len: int = 32, tgt_len: int = 32,
                      vocab_size: int = 8000, **overrides) -> Suite:
    """``overrides`` replace TransformerConfig fields (e.g. ``d_model``) for small smoke runs."""

    def builder(scheme: str, options: dict | None):
        return lambda: rescale_core.create_model(arch, scheme=scheme, scheme_options=options,
                                                 src_vocab_size=vocab_size, **overrides)

    contenders = []
    for scheme, (label, alias) in TRANSFORMER_SCHEMES.items():
        real, options = alias if alias else (scheme, None)
        note = f"{arch} scheme={real}" + (f" {options}" if options else "")
        contenders.append(Contender(label, builder(real, options), note))

    def make(batch: int, device: torch.device):
        g = torch.Generator().manual_seed(0)
        low = 4  # above pad (1), bos, eos: no padding, so every kernel runs unmasked
        src = torch.randint(low, vocab_size, (batch, src_len), generator=g)
        tgt = torch.randint(low, vocab_size, (batch, tgt_len + 1), generator=g)
        return (src.to(device), tgt[:, :-1].to(device)), tgt[:, 1:].to(device)

    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())

    return Suite("transformer", f"Transformer ({arch})", tuple(contenders), baseline="post-LN",
                 floor="T floor (no LN)", target="T rescale", make_batch=make, loss=loss,
                 shape=f"src {src_len} + tgt {tgt_len} tokens, vocab {vocab_size}",
                 items=tgt_len, unit="tok", image_like=False)


# --- the translation task's Transformer -----------------------------------------------------------
TRANSLATION_SCHEMES = ("post_ln", "pre_ln", "rescale", "tfixup", "deepnorm", "dyt", "derf")


def translation_suite(batches: list[dict], vocab_size: int, arch: str = "transformer_base",
                      schemes: tuple[str, ...] = TRANSLATION_SCHEMES, label_smoothing: float = 0.1,
                      pad_index: int = 1, max_tokens: int | None = None, **overrides) -> Suite:
    """The translation task's network on real batches (the data module's dicts: ``src_tokens``,
    ``prev_output_tokens``, ``target``): ``rescale_core.create_model(arch, scheme=...,
    src_vocab_size=vocab_size, share_embeddings=True)`` as TranslationModule builds it, the
    label-smoothed loss summed and divided by the batch's target tokens (TranslationModule's
    ``training_step`` on one process), Adam (0.9, 0.98) as the task's default optimizer, at
    learning rate 0. ``overrides`` replace TransformerConfig fields (smaller CPU sizes)."""
    # the task package only when used: the harness also runs on a GPU machine's own torch without it
    from rescale_tasks.translation.loss import label_smoothed_nll_loss

    if not batches:
        raise ValueError("translation_suite needs at least one batch")

    def builder(scheme: str):
        return lambda: rescale_core.create_model(arch, scheme=scheme, src_vocab_size=vocab_size,
                                                 share_embeddings=True, pad_index=pad_index, **overrides)

    contenders = tuple(Contender(TRANSFORMER_SCHEMES[s][0], builder(s), f"{arch} scheme={s}") for s in schemes)

    def make(_batch_size: int, device: torch.device):
        return [((b["src_tokens"].to(device), b["prev_output_tokens"].to(device)), b["target"].to(device))
                for b in batches]

    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss_sum, _nll = label_smoothed_nll_loss(logits, target, label_smoothing, pad_index)
        return loss_sum / target.ne(pad_index).sum()  # on the device: no host read in the step

    def adam(params):
        return torch.optim.Adam(params, lr=0.0, betas=(0.9, 0.98), eps=1e-8)

    tokens = sum(int(b["target"].ne(pad_index).sum()) for b in batches)
    sizes = ", ".join(f"{tuple(b['src_tokens'].shape)}/{tuple(b['target'].shape)}" for b in batches)
    budget = f" of max_tokens {max_tokens}" if max_tokens else ""
    labels = [c.name for c in contenders]
    return Suite("translation", f"Translation ({arch})", contenders, baseline=labels[0], floor=None,
                 target=TRANSFORMER_SCHEMES["rescale"][0] if "rescale" in schemes else labels[-1],
                 make_batch=make, loss=loss,
                 shape=f"{len(batches)} real batches{budget} (src/target [rows, width]: {sizes}), "
                       f"{tokens} target tokens, vocab {vocab_size}",
                 items=tokens, unit="tok", image_like=False, multi_batch=True, optimizer=adam)
