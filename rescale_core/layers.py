"""Small layers the residual schemes are made of.

- :class:`MeanShiftBias`: RescaleNet's bias re-parameterisation against dead ReLUs
  (Shao et al., NeurIPS 2020, Sec. 4.4): ``y = x + b - mu0`` where ``mu0`` is the per-channel
  mean of ``x`` measured over the first ``measure_batches`` training batches.
- :class:`ScalarBias` / :class:`Gain`: Fixup's scalar biases and the learnable branch
  multipliers (scalar or per-channel) of RescaleNet, SkipInit, Fixup and ReZero.
- :class:`ScaledStdConv1d` / ``2d`` / ``3d``: Scaled Weight Standardization (Brock, De & Smith,
  ICLR 2021, Sec. 4.2, Eq. 1): the convolution with ``gain * gamma * (W - mean) / (std * sqrt(fan_in))``
  per output channel; :data:`RELU_GAMMA` is ReLU's gamma (docs/nf_resnets.md).
- :class:`PointwiseNorm`: a normalization layer replaced by a pointwise function with no
  statistics, ``weight * f(alpha * x + shift) + bias``: DyT (``f = tanh``, no shift; Zhu, Chen, He,
  LeCun & Liu, CVPR 2025, "Transformers without Normalization") and Derf (``f = erf``; Chen, Lu,
  Zhu, Sun & Liu 2025, "Stronger Normalization-Free Transformers", arXiv:2512.10938).
- :func:`make_norm`, :func:`conv_nd`, :func:`scaled_std_conv_nd`: factories so one block serves
  1D/2D/3D and every norm.

Under autocast these layers act in the dtype of the activation they receive (their float32
parameters are cast to it, as autocast casts a convolution's weight and bias, and as a BatchNorm
returns its input's dtype): a bf16 stream stays bf16 instead of being promoted to float32 by a
float32 offset or gain, which would double the bytes of every later elementwise pass and add a
cast before every convolution.

Deviations from the official RescaleNet code (hukkai/rescaling, ``models/layers.py``):

- the measuring counter advances only in training mode with gradients enabled, so
  evaluation passes (Lightning's sanity check, ``torch.no_grad()`` validation) never consume
  the measuring batches;
- the "still measuring?" test reads a Python integer mirrored from the ``count`` buffer, so
  once measuring is over ``forward`` performs no host-device synchronisation;
- under ``torch.distributed`` the batch means are averaged across ranks while measuring, so
  every rank ends with the same ``mu0``;
- :meth:`MeanShiftBias.offset` exposes the term ``bias - mu0`` (measuring first when the call
  is a measuring one), so that the folded plan (:mod:`rescale_core.plans.folded`) can fold it into
  a convolution's bias instead of adding it to the activations. The measuring update is hidden
  from ``torch.compile`` (it changes Python state every step); compiled code only reads the
  ``_measuring`` flag, which changes once;
- :attr:`MeanShiftBias.measure_mask` (None unless set): a validity mask of the input pixels,
  so that a measuring call averages only over real pixels, not over the zero padding of a
  detection batch of images of different sizes (``rescale_tasks.detection.measurement``).
"""
from __future__ import annotations

import itertools
import math

import torch
import torch.distributed as dist
from torch import nn

from .compat import mean_shift_state

__all__ = ["MeanShiftBias", "drop_path", "ScalarBias", "Gain", "PointwiseNorm", "POINTWISE_NORMS", "POINTWISE_ALPHA_INIT",
           "channel_shape", "make_norm", "conv_nd", "pool_nd",
           "dropout_nd", "StridedAvgPool", "RELU_GAMMA", "RELU_GAMMA_EXACT", "ScaledStdConv1d", "ScaledStdConv2d",
           "ScaledStdConv3d", "scaled_std_conv_nd", "writes_into_buffers", "backward_writes_into_buffers",
           "with_combined_form", "apply_function", "MEASURING_RUNS_EAGERLY"]

#: What ``torch.compile(..., fullgraph=True)`` says when it meets a RescaleNet's measuring step
#: (the reason of the ``torch.compiler.disable`` hiding the measuring from dynamo).
MEASURING_RUNS_EAGERLY = ("RescaleNet's mean-shift measuring steps (its first measure_batches training steps) run "
                          "eagerly, a graph break: compile with fullgraph=True once they are over (after those "
                          "steps, or rescale_core.finish_measuring), or without fullgraph")


def channel_shape(num_channels: int, spatial_dims: int) -> tuple[int, ...]:
    """Broadcast shape of a per-channel parameter for (N, C, *spatial) inputs."""
    return (1, num_channels) + (1,) * spatial_dims


class MeanShiftBias(nn.Module):
    """``y = x + bias - mu0`` with ``mu0`` the input's per-channel mean over the first batches.

    Args:
        num_channels: channels C of an input shaped (N, C, *spatial) or (N, C).
        spatial_dims: 0 for (N, C) inputs (before a linear layer), 1, 2 or 3.
        measure_batches: number of training forward calls averaged into ``mu0`` (paper: 8).
        measure_bias_scale: the learnable bias is multiplied by this while measuring (1e-2 in the
            official code), so the first updates cannot move it far before ``mu0`` is known.
    """

    #: None, or an (N, 1, *spatial) bool/float mask of the valid input positions, read only by a
    #: measuring call: ``mu0`` then averages ``x`` over the positions where the mask is non-zero.
    #: At another resolution than ``x`` it is resized by nearest interpolation (a mask at the
    #: image's resolution serves every layer). Set and cleared around a forward by its owner.
    measure_mask: torch.Tensor | None = None

    def __init__(self, num_channels: int, spatial_dims: int = 2, measure_batches: int = 8,
                 measure_bias_scale: float = 1e-2) -> None:
        super().__init__()
        shape = channel_shape(num_channels, spatial_dims)
        self.num_channels = num_channels
        self._measure_batches = int(measure_batches)
        self.measure_bias_scale = float(measure_bias_scale)
        self.bias = nn.Parameter(torch.zeros(shape))
        self.register_buffer("mu0", torch.zeros(shape))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self._reduce_dims = (0,) + tuple(range(2, spatial_dims + 2))
        self._count = 0  # Python mirror of `count`: no device sync to ask "still measuring?"

    # `_count` and `measure_batches` keep the flag `_measuring` up to date: forward (and compiled
    # code) reads only the flag, which changes once, not the counter, which changes every step.
    @property
    def _count(self) -> int:
        return self._n

    @_count.setter
    def _count(self, value: int) -> None:
        self._n = int(value)
        self._measuring = self._n < self._measure_batches

    @property
    def measure_batches(self) -> int:
        return self._measure_batches

    @measure_batches.setter
    def measure_batches(self, value: int) -> None:
        self._measure_batches = int(value)
        if "_n" in self.__dict__:
            self._count = self._n

    @property
    def measuring(self) -> bool:
        return self._measuring

    @property
    def updating(self) -> bool:
        """Whether a call now would measure (training mode, gradients enabled, still measuring)."""
        return self._measuring and self.training and torch.is_grad_enabled()

    def offset(self, x: torch.Tensor | None = None) -> torch.Tensor:
        """The term added to the input: ``bias - mu0`` (``bias * measure_bias_scale - mu0`` while
        measuring). With ``x`` (this layer's input) a measuring call measures it first, exactly
        as :meth:`forward` does; ``forward(x) == x + offset(x)``."""
        if not self._measuring:
            return self.bias - self.mu0
        if x is not None and self.training and torch.is_grad_enabled():
            self._update(x.detach())
        return self.bias * self.measure_bias_scale - self.mu0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.offset(x).to(x.dtype)

    @torch.compiler.disable(reason=MEASURING_RUNS_EAGERLY)
    @torch.no_grad()
    def _update(self, x: torch.Tensor) -> None:
        if self.measure_mask is None:
            mean = x.mean(dim=self._reduce_dims, keepdim=True, dtype=self.mu0.dtype)
        else:
            mean = self._masked_mean(x, self.measure_mask)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(mean, op=dist.ReduceOp.SUM)
            mean /= dist.get_world_size()
        self._count += 1
        # Running mean over the measured batches: mu0 <- mu0 + (m - mu0) / n (one kernel each)
        self.mu0.lerp_(mean, 1.0 / self._count)
        self.count.fill_(self._count)

    def _masked_mean(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-channel ``sum(x * m) / sum(m)`` with ``m`` the mask at ``x``'s resolution."""
        if mask.dim() != x.dim() or mask.shape[0] != x.shape[0] or mask.shape[1] != 1:
            raise ValueError(f"measure_mask of shape {tuple(mask.shape)} does not fit an input of shape "
                             f"{tuple(x.shape)}; expected (N, 1, *spatial) with the input's N")
        m = mask.to(device=x.device, dtype=self.mu0.dtype)
        if m.shape[2:] != x.shape[2:]:
            # nearest: position j of a map s times coarser reads input position floor(j * s), so an
            # image of h valid rows keeps ceil(h / s) rows, as a convolution of stride s gives it
            m = nn.functional.interpolate(m, size=x.shape[2:], mode="nearest")
        total = (x.to(self.mu0.dtype) * m).sum(dim=self._reduce_dims, keepdim=True)
        return total / m.sum().clamp_min(1.0)

    def finish_measuring(self) -> None:
        """Freeze ``mu0`` now (e.g. after measuring on a calibration set instead of batches)."""
        self._count = max(self._count, self.measure_batches)
        self.count.fill_(self._count)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._count = int(self.count.item())  # one sync at load time, never in forward

    def __setstate__(self, state: dict) -> None:
        state, count, batches = mean_shift_state(state)  # an earlier layout's pickle
        super().__setstate__(state)
        if batches is not None:
            self._measure_batches = int(batches)
        if count is not None:
            self._count = count

    def extra_repr(self) -> str:
        return f"{self.num_channels}, measure_batches={self.measure_batches}"


class ScalarBias(nn.Module):
    """A single learnable scalar added to the input (Fixup, Zhang et al. 2019, Sec. 3)."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias.to(x.dtype)


class Gain(nn.Module):
    """A learnable multiplier of the given broadcast shape: ``(1,)`` for a scalar, or per channel.
    ``scale``: a constant folded into the multiplier (a merge's branch scale), one product."""

    def __init__(self, init: float = 1.0, shape: tuple[int, ...] = (1,)) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full(shape, float(init)))

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x * (self.weight if scale == 1.0 else self.weight * scale).to(x.dtype)


#: The pointwise replacements of a norm layer: their function, and whether they learn a shift
#: (Derf's ``s``; DyT has none). Their public code's default ``alpha`` init is 0.5 for both.
POINTWISE_NORMS = {"dyt": (torch.tanh, False), "derf": (torch.erf, True)}
POINTWISE_ALPHA_INIT = 0.5


class PointwiseNorm(nn.Module):
    """``weight * f(alpha * x + shift) + bias`` in place of a normalization layer: no statistics,
    ``alpha`` (and ``shift``, Derf only) one learnable scalar, ``weight`` (ones) and ``bias``
    (zeros) one value per feature, as the layer it replaces had.

    ``kind``: ``"dyt"`` (``f = tanh``; the public ``DynamicTanh``, jiachenzhu/DyT) or ``"derf"``
    (``f = erf``, ``shift`` init ``shift_init``; the public ``Dynamic_erf``, zlab-princeton/Derf).
    The parameter names are theirs, so their state dicts load. ``spatial_dims``: None for
    features-last inputs (a Transformer's ``[..., d]``), else the features are dim 1 of
    ``(N, C, *spatial)`` (a conv net's BatchNorm replaced, as DyT's ``channels_last=False``).
    """

    def __init__(self, kind: str, num_features: int, alpha_init: float = POINTWISE_ALPHA_INIT, shift_init: float = 0.0,
                 spatial_dims: int | None = None) -> None:
        super().__init__()
        if kind not in POINTWISE_NORMS:
            raise ValueError(f"unknown pointwise norm {kind!r}; expected one of {', '.join(POINTWISE_NORMS)}")
        self.kind, self.num_features, self.spatial_dims = kind, num_features, spatial_dims
        self.fn, has_shift = POINTWISE_NORMS[kind]
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.shift = nn.Parameter(torch.full((1,), float(shift_init))) if has_shift else None
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self._shape = (num_features,) if spatial_dims is None else channel_shape(num_features, spatial_dims)

    def unscaled(self, x: torch.Tensor) -> torch.Tensor:
        """``f(alpha * x + shift)``: the layer without ``weight`` and ``bias`` (the frozen plan folds
        those into the linear layers that read it)."""
        alpha = self.alpha.to(x.dtype)
        return self.fn(x * alpha if self.shift is None else torch.addcmul(self.shift.to(x.dtype), x, alpha))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.bias.to(x.dtype).view(self._shape), self.unscaled(x),
                             self.weight.to(x.dtype).view(self._shape))

    def extra_repr(self) -> str:
        where = "features last" if self.spatial_dims is None else f"channels dim 1, {self.spatial_dims}d"
        return f"{self.kind}, {self.num_features}, {where}"


def make_norm(kind: str | None, num_channels: int, spatial_dims: int = 2,
              groups: int = 32, alpha_init: float | None = None) -> nn.Module:
    """BatchNorm{1,2,3}d, GroupNorm (``groups`` groups, fewer when C is small), LayerNorm, a
    :class:`PointwiseNorm` (``dyt``, ``derf``: channels dim 1 of ``(N, C, *spatial)``, or features
    last with ``spatial_dims=None``; ``alpha_init``: None for 0.5) or Identity."""
    if kind is None or kind == "none":
        return nn.Identity()
    if kind in POINTWISE_NORMS:
        return PointwiseNorm(kind, num_channels, POINTWISE_ALPHA_INIT if alpha_init is None else alpha_init,
                             spatial_dims=spatial_dims)
    if kind == "bn":
        return {0: nn.BatchNorm1d, 1: nn.BatchNorm1d, 2: nn.BatchNorm2d,
                3: nn.BatchNorm3d}[spatial_dims](num_channels)
    if kind == "gn":
        g = groups
        while num_channels % g:
            g //= 2
        return nn.GroupNorm(g, num_channels)
    if kind == "ln":
        return nn.LayerNorm(num_channels)
    raise ValueError(f"unknown norm {kind!r}; expected one of bn, gn, ln, dyt, derf, none")


def conv_nd(spatial_dims: int, *args, **kwargs) -> nn.Module:
    return {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[spatial_dims](*args, **kwargs)


#: ReLU's gamma in closed form (Brock et al. 2021, Sec. 4.2): ``1 / std(relu(z))`` for
#: ``z ~ N(0, 1)``. ``E[relu(z)] = 1/sqrt(2 pi)`` and ``E[relu(z)^2] = 1/2``, so
#: ``Var[relu(z)] = (1 - 1/pi) / 2`` and ``gamma = sqrt(2 / (1 - 1/pi)) = 1.7128585...``.
RELU_GAMMA_EXACT = math.sqrt(2.0 / (1.0 - 1.0 / math.pi))
#: The ReLU gamma the NF networks use: the official code's constant (timm's too), a numerical
#: estimate 0.064% above :data:`RELU_GAMMA_EXACT`. The published results and pretrained weights
#: were obtained with it, and our outputs equal timm's only with it (docs/nf_resnets.md).
RELU_GAMMA = 1.7139588594436646


class _ScaledStd:
    """Scaled Weight Standardization of a convolution's weight (Brock et al. 2021, Sec. 4.2, Eq. 1),
    mixed into ``nn.Conv1d`` / ``nn.Conv2d`` / ``nn.Conv3d``: the convolution runs with

        ``W_hat[o] = gain[o] * gamma * (W[o] - mean(W[o])) / (sqrt(var(W[o]) + eps) * sqrt(fan_in))``

    where ``W[o]`` is the weight of output channel ``o`` (``fan_in`` values: input channels of
    its group times the kernel), ``var`` the biased variance, ``gain`` a learnable per-channel
    scale (init 1; no weight decay, :func:`rescale_core.param_groups`) and ``gamma`` the
    nonlinearity's constant that the paper puts in the activation before the conv (for ReLU,
    :data:`RELU_GAMMA`; ReLU is positively homogeneous, so the product is the same). ``eps``
    sits beside the variance, 1e-5 as timm's ``NfCfg.std_conv_eps`` (the official JAX code
    clamps ``var * fan_in`` at 1e-4 instead: docs/nf_resnets.md). The standardized weight is
    computed in every forward, from the raw weight the optimizer updates."""

    def __init__(self, *args, gamma: float = 1.0, eps: float = 1e-5, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gamma, self.eps = float(gamma), float(eps)
        self.fan_in = self.weight[0].numel()
        self.gain = nn.Parameter(torch.ones(self.out_channels, dtype=self.weight.dtype,
                                            device=self.weight.device))

    def standardized_weight(self) -> torch.Tensor:
        """``W_hat``: one batch-norm over each output channel's ``fan_in`` weights (the weight seen
        as a batch of one with ``out_channels`` channels), the per-channel scale
        ``gain * gamma / sqrt(fan_in)`` as its affine weight: one fused kernel each way."""
        scale = self.gain * (self.gamma / math.sqrt(self.fan_in))
        flat = self.weight.reshape(1, self.out_channels, self.fan_in)
        return nn.functional.batch_norm(flat, None, None, weight=scale, training=True, momentum=0.0,
                                        eps=self.eps).reshape_as(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.standardized_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gamma={self.gamma:.6g}, eps={self.eps:g}"


class ScaledStdConv1d(_ScaledStd, nn.Conv1d):
    """``nn.Conv1d`` with Scaled Weight Standardization (:class:`_ScaledStd`)."""


class ScaledStdConv2d(_ScaledStd, nn.Conv2d):
    """``nn.Conv2d`` with Scaled Weight Standardization (:class:`_ScaledStd`); timm's
    ``ScaledStdConv2d`` computes the same function (its gain is shaped ``(C, 1, 1, 1)``)."""


class ScaledStdConv3d(_ScaledStd, nn.Conv3d):
    """``nn.Conv3d`` with Scaled Weight Standardization (:class:`_ScaledStd`)."""


def scaled_std_conv_nd(spatial_dims: int, *args, gamma: float = 1.0, eps: float = 1e-5,
                       **kwargs) -> nn.Module:
    """:func:`conv_nd` with Scaled Weight Standardization."""
    cls = {1: ScaledStdConv1d, 2: ScaledStdConv2d, 3: ScaledStdConv3d}[spatial_dims]
    return cls(*args, gamma=gamma, eps=eps, **kwargs)


def pool_nd(kind: str, spatial_dims: int, *args, **kwargs) -> nn.Module:
    table = {"avg": {1: nn.AvgPool1d, 2: nn.AvgPool2d, 3: nn.AvgPool3d},
             "max": {1: nn.MaxPool1d, 2: nn.MaxPool2d, 3: nn.MaxPool3d}}
    return table[kind][spatial_dims](*args, **kwargs)


def writes_into_buffers() -> bool:
    """Whether a custom autograd function (:class:`_BlockMean`, the plans' functions) may return a
    result written by an ``out=`` op into a buffer it chose (a layout kept, a fresh tensor to add
    into): in eager mode only, outside ``torch.func``'s transforms. Under ``torch.compile``, which
    lays out and fuses its buffers itself, the ops are out of place: dynamo in torch 2.11 (not
    2.14) silently gives such a function a zero gradient, and the compiled lean plan trained
    nothing below the classifier. Under ``torch.func.grad``, ``vmap`` or ``jacrev`` the tensors
    are the transforms' wrappers, which a plain buffer would neither batch nor track."""
    return not (torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active())


def backward_writes_into_buffers(g: torch.Tensor) -> bool:
    """:func:`writes_into_buffers` for a backward given the gradient ``g``, which may also use
    ``out=`` ops only with grad mode off (with it on, under ``create_graph=True`` or
    ``torch.func.grad``, the backward is itself differentiated, and autograd records no ``out=``
    op) and on a plain ``g`` (not batched by autograd's own vmap: ``torch.autograd.grad(...,
    is_grads_batched=True)``, ``torch.autograd.functional.jacobian(..., vectorize=True)``)."""
    return (not torch.is_grad_enabled() and writes_into_buffers()
            and not torch._C._functorch.is_legacy_batchedtensor(g))


def with_combined_form(fn: type[torch.autograd.Function]) -> type[torch.autograd.Function]:
    """Class decorator of a custom autograd function written in ``setup_context`` form (the form
    ``torch.func``'s transforms take): adds ``fn.combined``, the same function in the combined
    form (``forward`` taking the context), which :func:`apply_function` applies outside the
    transforms. Autograd binds a ``setup_context`` form's arguments to its ``forward``'s signature
    at every call (``inspect``: ~15 us, 4x the rest of a call), which an eager GPU step, bound by
    host time, would pay in every block."""
    def forward(ctx, *args):
        output = fn.forward(*args)
        fn.setup_context(ctx, args, output)
        return output

    fn.combined = type(f"{fn.__name__}Combined", (torch.autograd.Function,),
                       {"forward": staticmethod(forward), "backward": staticmethod(fn.backward),
                        "jvp": staticmethod(fn.jvp), "__doc__": fn.__doc__})
    return fn


def apply_function(fn: type[torch.autograd.Function], *args):
    """``fn.apply(*args)`` for a function decorated :func:`with_combined_form`: its combined form
    where :func:`writes_into_buffers` (eager, outside ``torch.func``'s transforms), ``fn`` itself
    under the transforms and ``torch.compile`` (dynamo traces it once, and not ``fn.combined``)."""
    return (fn.combined if writes_into_buffers() else fn).apply(*args)


@with_combined_form
class _BlockMean(torch.autograd.Function):
    """Mean over non-overlapping blocks (``strides[d]`` along spatial dim d, which it divides) of a
    contiguous (N, C, ...) tensor, as a sum of strided slices: the same as ``avg_pool`` with
    kernel = stride, ~3x faster on CPU for contiguous (not channels_last) inputs. Its backward
    spreads ``g / prod(strides)`` over each block, differentiably where grad mode is on."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
        parts = [x[(slice(None), slice(None)) + tuple(slice(o, None, s) for o, s in zip(offset, strides))]
                 for offset in itertools.product(*[range(s) for s in strides])]
        out = parts[0] + parts[1] if len(parts) > 1 else parts[0].clone()
        for part in parts[2:]:
            out.add_(part)
        return out.mul_(1.0 / len(parts))

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, strides = inputs
        ctx.strides, ctx.in_shape = strides, x.shape

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        strides, shape = ctx.strides, ctx.in_shape
        blocks = tuple(d for n, s in zip(shape[2:], strides) for d in (n // s, s))
        ones = tuple(d for n, s in zip(shape[2:], strides) for d in (n // s, 1))
        spread = g.reshape(shape[:2] + ones).expand(shape[:2] + blocks)
        if not backward_writes_into_buffers(g):
            return (spread * (1.0 / math.prod(strides))).reshape(shape), None
        gx = torch.empty(shape, dtype=g.dtype, device=g.device)
        torch.mul(spread, 1.0 / math.prod(strides), out=gx.view(shape[:2] + blocks))
        return gx, None

    @staticmethod
    def jvp(ctx, x_t: torch.Tensor, _) -> torch.Tensor:
        return _BlockMean.forward(x_t, ctx.strides)


class StridedAvgPool(nn.Module):
    """``avgpool(stride)`` of RescaleNet's downsample shortcut whose output always has the size of
    the branch's strided 3x3 conv, ``ceil(n / stride)``: the official ``nn.AvgPool2d(stride)``
    fails on odd sizes (shape mismatch at the merge) and on size 1 (e.g. a 3D clip's time axis
    after a few strides). Same result as ``AvgPool(stride)`` on sizes divisible by the stride,
    where contiguous inputs take a faster kernel (:class:`_BlockMean`). ``stride``: an int, or
    one per spatial dim (``(1, 2, 2)``: a video block that downsamples space only, SlowOnly)."""

    def __init__(self, stride: "int | tuple[int, ...]", spatial_dims: int) -> None:
        super().__init__()
        strides = (stride,) * spatial_dims if isinstance(stride, int) else tuple(int(s) for s in stride)
        if len(strides) != spatial_dims:
            raise ValueError(f"one stride per spatial dim expected, got {stride} for {spatial_dims} dims")
        self.stride = int(stride) if isinstance(stride, int) else strides
        self._strides, self.spatial_dims = strides, spatial_dims
        self._pool = {1: nn.functional.avg_pool1d, 2: nn.functional.avg_pool2d,
                      3: nn.functional.avg_pool3d}[spatial_dims]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = tuple(min(s, n) for s, n in zip(self._strides, x.shape[2:]))
        if (x.device.type == "cpu" and x.is_contiguous() and x.dim() == self.spatial_dims + 2
                and all(n % k == 0 for n, k in zip(x.shape[2:], kernel))
                and not torch.compiler.is_compiling()):
            return apply_function(_BlockMean, x, kernel)
        return self._pooled(x, kernel)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` as one pooling op: the lean plan's choice (the fewest ops, where
        :class:`_BlockMean` is several faster ones on a CPU)."""
        return self._pooled(x, tuple(min(s, n) for s, n in zip(self._strides, x.shape[2:])))

    def _pooled(self, x: torch.Tensor, kernel: tuple[int, ...]) -> torch.Tensor:
        # a CPU has no bfloat16 or float16 avg_pool3d: a network cast to one pools in float32 (as
        # autocast, which casts the pool's input itself, pools there), in its own dtype out
        low = (x.dtype in (torch.bfloat16, torch.float16) and self.spatial_dims == 3 and x.device.type == "cpu"
               and not torch.is_autocast_enabled("cpu"))  # the float32 training step: one dtype test
        out = self._pool(x.float() if low else x, kernel, self._strides, ceil_mode=True, count_include_pad=False)
        return out.to(x.dtype) if low else out

    def extra_repr(self) -> str:
        return f"stride={self.stride}"


def dropout_nd(p: float, spatial_dims: int) -> nn.Module:
    if p <= 0:
        return nn.Identity()
    return {0: nn.Dropout, 1: nn.Dropout1d, 2: nn.Dropout2d, 3: nn.Dropout3d}[spatial_dims](p)


def drop_path(x: torch.Tensor, rate: float, training: bool, scale_by_keep: bool = True) -> torch.Tensor:
    """Stochastic depth (Huang et al. 2016) on a residual branch's output ``x``: in training, each
    sample's whole ``x`` is zeroed with probability ``rate`` and, with ``scale_by_keep``, kept ones
    are divided by the keep probability ``1 - rate`` (so evaluation, which returns ``x``
    unchanged, sees the training mean; without it, the official NF-ResNet code's ``StochDepth``,
    evaluation sees each branch ``1 / (1 - rate)`` times its training mean). One Bernoulli draw per
    sample, from the global generator of ``x``'s device: the stream dropout draws from, seeded and
    checkpointed with it."""
    if not training or rate == 0.0:
        return x
    keep = 1.0 - rate
    mask = torch.empty((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype, device=x.device).bernoulli_(keep)
    return x * (mask.div_(keep) if scale_by_keep else mask)
