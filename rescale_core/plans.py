"""Execution plans: how a network's normalisation-free blocks are computed, for one function
(RescaleNet, Shao et al. 2020; SkipInit, De & Smith 2020; Fixup, Zhang et al. 2019; ReZero,
Bachlechner et al. 2020).

Every plan computes the reference function (the layer-by-layer code of :mod:`rescale_core.blocks`
and the model families) with the same parameters, buffers and state dict; they differ only in
which ops they launch. What is cheap depends on the device:

- ``"folded"`` (:mod:`rescale_core.fastpath`): biases, offsets and multipliers folded into the
  convolutions' weights and biases every step. On a CPU a pass over the activations is what
  costs, and the folds remove passes. Each fold is several weight-sized ops with their autograd
  nodes.
- ``"lean"``: the fewest ops per step, for an eager accelerator step, which is host-bound (each
  launched op costs ~9 us of host time on an H100 node whatever its size, METHOD.md). Every
  additive term (RescaleNet's ``bias - mu0``, Fixup's scalar biases) and every branch multiplier
  (``gain * branch_scale``) of the whole network is computed in one pass at the start of the
  forward (:class:`LeanTerms`: one concatenation of the parameters, one subtraction of the
  measured means, one multiplication by constants, one cast to the activations' dtype, whatever
  the depth), then used as views: an offset is one per-channel add (or the conv's own bias slot
  where the conv follows it directly), a merge is one ``addcmul(skip, branch, multiplier)``,
  RescaleNet's skip multipliers are carried along the stages as in the folded plan. Nothing
  weight-sized is computed per step. Which plan compiles to the faster step depends on the
  device: on the CPU, inductor's compiled folded ResNet-50 is 1.03x compiled BN and the compiled
  lean one 1.27x (``benchmarks/RESULTS.md``); ``make bench-gpu`` compiles both on a GPU.
- ``"reference"``: the layer-by-layer definition (``fused = False``).
- ``"auto"`` (the default): lean for tensors on an accelerator, folded on the CPU, decided
  per call from the input's device.

Select a plan with :func:`set_plan` (``create_model(..., plan=...)`` calls it). Measuring steps
of RescaleNet (the first ``measure_batches`` training steps) run the folded plan under ``lean``:
the offsets being measured exist only after their layer's input has been seen.
"""
from __future__ import annotations

import torch
from torch import nn

from .layers import Gain, MeanShiftBias, ScalarBias

__all__ = ["PLANS", "check_plan", "set_plan", "plan_of", "wants_lean", "LeanTerms",
           "activation_dtype", "is_term_module", "gain_merge", "cached_on"]

PLANS = ("auto", "lean", "folded", "reference")


def check_plan(plan: str) -> str:
    if plan not in PLANS:
        raise ValueError(f"unknown execution plan {plan!r}; expected one of {', '.join(PLANS)}")
    return plan


def _planned(model: nn.Module):
    """The modules of ``model`` that choose a path (they carry a ``fused`` flag)."""
    return [m for m in model.modules() if isinstance(getattr(m, "fused", None), bool)]


def set_plan(model: nn.Module, plan: str) -> nn.Module:
    """Run ``model`` under ``plan`` (one of :data:`PLANS`) from now on; returns ``model``.
    ``"reference"`` sets every ``fused`` flag False; the others set it True (a module whose
    scheme the fast paths do not implement still runs its reference path)."""
    check_plan(plan)
    for m in _planned(model):
        m.fused = plan != "reference"
        m.plan = "auto" if plan == "reference" else plan
    drop_cached(model)
    return model


def drop_cached(model: nn.Module) -> None:
    """Forget the lean schedules cached in ``model``'s modules (:func:`cached_on`): they depend
    on the ``fused`` flags, which :func:`set_plan` and ``reference_path`` change."""
    for m in model.modules():
        m.__dict__.pop("_lean_cache", None)


def plan_of(model: nn.Module) -> str:
    """The plan ``model`` was set to (its own module's, or its first planned submodule's)."""
    mods = _planned(model)
    if not mods:
        return "reference"
    m = mods[0]
    return getattr(m, "plan", "auto") if m.fused else "reference"


def wants_lean(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``module`` (fused) runs its lean plan on input ``x``: plan ``lean``, or ``auto``
    with ``x`` on an accelerator."""
    plan = getattr(module, "plan", "auto")
    return plan == "lean" or (plan == "auto" and x.device.type not in ("cpu", "meta"))


def activation_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the network's activations will have: autocast's where it is on, else ``x``'s
    (floating) dtype."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype if x.is_floating_point() else torch.get_default_dtype()


def cached_on(module: nn.Module, key, build):
    """``build()``, cached in ``module.__dict__`` until ``key()`` changes. Under
    ``torch.compile`` a cached value is reused without evaluating the key: compiling registers
    modules of its own (fx graph modules), which moves the module-tree version the keys contain,
    so checking it there would recompile every step."""
    cached = module.__dict__.get("_lean_cache")
    if cached is not None and torch.compiler.is_compiling():
        return cached[1]
    k = key()
    if cached is None or cached[0] != k:
        cached = (k, build())
        module.__dict__["_lean_cache"] = cached
    return cached[1]


def _term_parameter(mod: nn.Module) -> torch.Tensor:
    return mod.weight if isinstance(mod, Gain) else mod.bias


class LeanTerms:
    """Every additive term and branch multiplier of a network, computed in one pass.

    ``entries``: (module, multiplier) pairs, each module a :class:`MeanShiftBias` (term
    ``bias - mu0``, or ``bias * measure_bias_scale - mu0`` before it has measured), a
    :class:`ScalarBias` (``bias``) or a :class:`Gain` (``weight``); the multiplier (a float) is
    applied to the whole term: ``1 / c`` for a term added to activations carried in units of
    ``c``, ``branch_scale * c_in / c_out`` for a gain. :meth:`values` returns, per module, its
    term in the activations' dtype with its parameter's shape: views of one vector computed by
    a fixed number of ops (concatenation, subtraction of the means, multiplication, cast), so
    that the network launches the same few ops for these terms whatever its depth, and their
    backward is one multiplication and one cast."""

    def __init__(self, entries: list[tuple]) -> None:
        self.modules = [e[0] for e in entries]
        self.multipliers = [float(e[1]) for e in entries]
        # a third element n: a scalar term wanted as n equal values (a conv's bias slot)
        self.expand = [e[2] if len(e) > 2 else None for e in entries]
        self.sizes = [_term_parameter(m).numel() for m in self.modules]
        self.shapes = [tuple(_term_parameter(m).shape) if n is None else (n,)
                       for m, n in zip(self.modules, self.expand)]
        self.out_sizes = [s if n is None else n for s, n in zip(self.sizes, self.expand)]
        self._constants: dict = {}

    def __len__(self) -> int:
        return len(self.modules)

    def _constant(self, kind: str, like: torch.Tensor, premultiplied: tuple[bool, ...]):
        """Cached per device and dtype: the per-element multiplier vectors and a zero vector
        (None where every multiplier is 1)."""
        key = (kind, like.device, like.dtype, premultiplied)
        if key not in self._constants:
            if kind == "zeros":
                value = torch.zeros(max(self.sizes), device=like.device, dtype=like.dtype)
            elif kind == "index":  # source element of every output element
                starts = [0]
                for n in self.sizes:
                    starts.append(starts[-1] + n)
                index = [j for start, n, e in zip(starts, self.sizes, self.expand)
                         for j in ([start] * e if e is not None else range(start, start + n))]
                value = torch.tensor(index, device=like.device, dtype=torch.long)
            else:
                if kind == "pre":
                    per = [m.measure_bias_scale if p else 1.0 for m, p in zip(self.modules, premultiplied)]
                    sizes = self.sizes
                else:
                    per, sizes = self.multipliers, self.out_sizes
                if all(s == 1.0 for s in per):
                    value = None
                else:
                    value = torch.cat([torch.full((n,), s, dtype=torch.float64) for n, s in zip(sizes, per)])
                    value = value.to(device=like.device, dtype=like.dtype)
            self._constants[key] = value
        return self._constants[key]

    def values(self, dtype: torch.dtype) -> dict[nn.Module, torch.Tensor]:
        if not self.modules:
            return {}
        params = [_term_parameter(m) for m in self.modules]
        flat = torch.cat([p.reshape(-1) for p in params])
        # a mean-shift layer that has not measured yet (evaluated before training) scales its bias
        pre = tuple(isinstance(m, MeanShiftBias) and m.measuring for m in self.modules)
        if any(pre):
            flat = flat * self._constant("pre", flat, pre)
        means = [m.mu0 if isinstance(m, MeanShiftBias) else None for m in self.modules]
        if any(mu is not None for mu in means):
            zeros = self._constant("zeros", flat, ())
            flat = flat - torch.cat([zeros[:n] if mu is None else mu.reshape(-1).to(flat.dtype)
                                     for mu, n in zip(means, self.sizes)])
        if any(n is not None for n in self.expand):  # one gather for every expanded term
            flat = flat.index_select(0, self._constant("index", flat, ()))
        mult = self._constant("post", flat, ())
        if mult is not None:
            flat = flat * mult
        flat = flat.to(dtype)
        parts = torch.split(flat, self.out_sizes)
        return {m: part.view(shape) for m, part, shape in zip(self.modules, parts, self.shapes)}


def is_term_module(mod: nn.Module) -> bool:
    """A module whose term :class:`LeanTerms` computes."""
    return isinstance(mod, (MeanShiftBias, ScalarBias, Gain))


class _GainMerge(torch.autograd.Function):
    """``alpha * skip + s * f`` (``s`` a gain times constants, one value or one per channel;
    ``alpha`` a float): one ``addcmul`` forward (and a multiplication where ``alpha != 1``);
    backward ``df = s g`` (in ``f``'s dtype), ``ds = sum(g f)`` (a dot product for one value)
    and ``dskip = alpha g``: three ops where autograd's addcmul formula launches five."""

    @staticmethod
    def forward(ctx, skip, f, s, alpha):
        ctx.save_for_backward(f, s)
        ctx.alpha = alpha
        return _addcmul(skip, f, s, alpha)

    @staticmethod
    def backward(ctx, g):
        f, s = ctx.saved_tensors
        gskip = gf = gs = None
        if ctx.needs_input_grad[0]:
            gskip = g if ctx.alpha == 1.0 else g * ctx.alpha
        if g.dtype != f.dtype and (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):
            g = g.to(f.dtype)  # what autograd would cast df to anyway (a float32 stream, bf16 branch)
        if ctx.needs_input_grad[1]:
            gf = g * s
        if ctx.needs_input_grad[2]:
            gs = _dot(g, f) if s.numel() == 1 else (g * f).sum_to_size(s.shape)
            gs = gs.reshape(s.shape).to(s.dtype)
        return gskip, gf, gs, None


def _flat_view(t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s elements as a 1-D view in memory order (contiguous or channels_last), else None."""
    if t.is_contiguous():
        return t.view(-1)
    if t.dim() in (4, 5):
        perm = (0,) + tuple(range(2, t.dim())) + (1,)
        p = t.permute(perm)
        if p.is_contiguous():
            return p.view(-1)
    return None


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum(a * b)`` in one op where both lie in memory in the same order."""
    if a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype:
        fa, fb = _flat_view(a), _flat_view(b)
        if fa is not None and fb is not None:
            return torch.dot(fa, fb)
    return (a * b).sum()


def _addcmul(skip: torch.Tensor, f: torch.Tensor, s: torch.Tensor, alpha: float) -> torch.Tensor:
    """``alpha * skip + s * f`` laid out as the branch ``f`` (channels_last stays channels_last
    where a shortcut's pooling returned another layout), in the promoted dtype."""
    out = torch.empty_like(f, dtype=torch.promote_types(skip.dtype, f.dtype))
    return torch.addcmul(skip if alpha == 1.0 else skip * alpha, f, s, out=out)


def gain_merge(skip: torch.Tensor, f: torch.Tensor, s: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """``alpha * skip + s * f`` with the fewest ops in forward and backward (:class:`_GainMerge`)."""
    if torch.is_grad_enabled() and (f.requires_grad or s.requires_grad or skip.requires_grad):
        return _GainMerge.apply(skip, f, s, float(alpha))
    return _addcmul(skip, f, s, alpha)
