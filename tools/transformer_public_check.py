"""Our LayerNorm-free Transformer schemes beside their public code, run side by side outside the
suite: the fidelity check of docs/transformers.md, at length.

- ``dyt`` / ``derf``: our Transformer under the scheme, and a copy of it whose every
  :class:`rescale_core.layers.PointwiseNorm` is replaced by the public module holding the same
  parameters (``DynamicTanh`` of jiachenzhu/DyT's ``dynamic_tanh.py``, ``Dynamic_erf`` of
  zlab-princeton/Derf's ``dynamic_erf.py``, loaded from a checkout: ``--dyt``, ``--derf``): the
  largest output difference, then ``--steps`` Adam steps side by side on the same batches.
- ``deepnorm``: torchscale's ``EncoderDecoder`` (microsoft/torchscale, ``deepnorm=True``, ReLU,
  no dropout): its alpha next to ours; its init statistics (the std of every weight group) next
  to ours; its encoder and decoder layers' weights mapped into our ``deepnorm`` sublayers, the
  largest difference of the encoder's and the decoder's outputs (causal self-attention,
  cross-attention), then ``--steps`` Adam steps of both stacks side by side.

Float64 throughout; each lockstep prints the largest relative difference of the losses over the
run. torchscale computes its feed-forward activation in float32 whatever the input's dtype, so
its float64 run differs from ours by float32's rounding from the first step; its check passes
when the losses agree within 100 times the drift of a control (torchscale's stacks against a copy
moved by 1e-8 of each weight, trained alike), as ``tools/nf_timm_check.py`` does for timm.
T-Fixup's code (layer6ai-labs/T-Fixup) is a fairseq fork, which does not install on this
stack: its rules are checked against their code's lines by ``tests/core/models/test_transformer_ln_free.py``.

``python -m tools.transformer_public_check --dyt DyT/dynamic_tanh.py --derf Derf/ViT/dynamic_erf.py``
(the project's environment: their files import timm, which ``make test`` installs), and, where
torchscale installs (``pip install torchscale``, which brings fairscale),
``PYTHONPATH=. python -m tools.transformer_public_check --deepnorm``.
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import inspect
import logging
import math

import torch
import torch.nn.functional as F
from torch import nn

import rescale_core
from rescale_core.init import TransformerStack, deepnorm_constants
from rescale_core.layers import PointwiseNorm

log = logging.getLogger("tools.transformer_public_check")
F64 = torch.float64
V, PAD = 60, 1


def _load(path: str, name: str) -> type:
    spec = importlib.util.spec_from_file_location(f"public_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _ours(scheme: str, d: int, layers: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = rescale_core.create_model("transformer_tiny", scheme=scheme, src_vocab_size=V, d_model=d,
                                      dim_feedforward=4 * d, nhead=4, num_encoder_layers=layers,
                                      num_decoder_layers=layers, dropout=0.0, attention_dropout=0.0,
                                      activation_dropout=0.0)  # no random masks: one function
    return rescale_core.set_plan(model.to(F64), "reference")


def _batches(steps: int, batch: int = 8, src_len: int = 9, tgt_len: int = 7):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        yield (torch.randint(3, V, (batch, src_len), generator=g), torch.randint(3, V, (batch, tgt_len), generator=g))


def _translation_loss(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    logits = model(src, tgt[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())


def _lockstep(a: nn.Module, b: nn.Module, loss_fn, steps: int, lr: float = 1e-3) -> float:
    """The largest relative difference of the two models' losses over ``steps`` Adam steps on the
    same batches (the first is the difference of their outputs at the same weights)."""
    opts = [torch.optim.Adam(m.parameters(), lr=lr, betas=(0.9, 0.98)) for m in (a, b)]
    worst, first, last = 0.0, None, None
    for batch in _batches(steps):
        losses = []
        for model, opt in zip((a, b), opts):
            opt.zero_grad()
            loss = loss_fn(model, *batch)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        first = losses if first is None else first
        last = losses
        worst = max(worst, abs(losses[0] - losses[1]) / abs(losses[1]))
    log.info("  %d steps: loss %.4f -> %.4f (ours) and %.4f -> %.4f (theirs); largest relative "
             "difference %.2e", steps, first[0], last[0], first[1], last[1], worst)
    return worst


# --------------------------------------------------------------- DyT and Derf
def _swap_pointwise(model: nn.Module, make) -> int:
    """Replace every PointwiseNorm by ``make(layer)`` holding its parameters; how many."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PointwiseNorm):
                public = make(child).to(F64)
                public.load_state_dict(child.state_dict())
                setattr(parent, name, public)
                count += 1
    return count


def check_pointwise(scheme: str, path: str, steps: int, d: int = 64, layers: int = 3) -> tuple[float, float]:
    """(the largest relative difference, the margin a control allows beyond ``--tolerance``)"""
    if scheme == "dyt":
        cls = _load(path, "DynamicTanh")
        make = lambda layer: cls(layer.num_features, channels_last=True,  # noqa: E731
                                 alpha_init_value=layer.alpha.item())
    else:  # ViT/ and DiT/ of the Derf checkout spell the features-last switch differently
        cls = _load(path, "Dynamic_erf")
        layout = ({"channels_last": True} if "channels_last" in inspect.signature(cls).parameters
                  else {"elementwise_affine": True})
        make = lambda layer: cls(layer.num_features, **layout, alpha_init_value=layer.alpha.item(),  # noqa: E731
                                 shift_init_value=layer.shift.item())
    ours = _ours(scheme, d, layers, seed=2)
    with torch.no_grad():  # move every pointwise parameter off its init, so that each one counts
        for layer in ours.modules():
            if isinstance(layer, PointwiseNorm):
                for p in layer.parameters():
                    p.add_(0.1 * torch.randn_like(p))
    theirs = copy.deepcopy(ours)
    swapped = _swap_pointwise(theirs, make)
    src, tgt = next(_batches(1))
    with torch.no_grad():
        a, b = ours(src, tgt), theirs(src, tgt)
    diff = ((a - b).abs().max() / b.abs().max()).item()
    log.info("%s: %d layers swapped for %s; largest output difference %.2e (relative)", scheme, swapped,
             cls.__name__, diff)
    return max(diff, _lockstep(ours, theirs, _translation_loss, steps)), 0.0


# --------------------------------------------------------------- DeepNorm
class _SoftmaxInInputDtype:
    """``torch.nn.functional`` for torchscale's attention, whose softmax it asks in float32
    (``component/multihead_attention.py``): in the input's dtype, so that float64 runs compare
    the functions, not float32's rounding (``--float32-softmax`` keeps theirs: outputs then agree
    to ~1e-8 and 300 steps' losses to ~1e-4)."""

    def __getattr__(self, name):
        return getattr(F, name)

    @staticmethod
    def softmax(x, dim=None, dtype=None, **kwargs):
        return F.softmax(x, dim=dim, **kwargs)


def _torchscale(d: int, layers: int, float32_softmax: bool = False):
    from torchscale.architecture.config import EncoderDecoderConfig
    from torchscale.architecture.encoder_decoder import EncoderDecoder
    from torchscale.component import multihead_attention

    if not float32_softmax:
        multihead_attention.F = _SoftmaxInInputDtype()

    cfg = EncoderDecoderConfig(deepnorm=True, encoder_layers=layers, decoder_layers=layers, vocab_size=V,
                               encoder_embed_dim=d, decoder_embed_dim=d, encoder_ffn_embed_dim=4 * d,
                               decoder_ffn_embed_dim=4 * d, encoder_attention_heads=4,
                               decoder_attention_heads=4, activation_fn="relu", dropout=0.0,
                               attention_dropout=0.0, activation_dropout=0.0, drop_path_rate=0.0)
    torch.manual_seed(0)
    model = EncoderDecoder(cfg, encoder_embed_tokens=nn.Embedding(V, d), decoder_embed_tokens=nn.Embedding(V, d))
    return model.to(F64)


_ATTN = ("q_proj", "k_proj", "v_proj", "out_proj")


def _map_deepnorm(theirs, ours) -> None:
    """Copy torchscale's encoder and decoder layers into our sublayers (same names inside)."""
    with torch.no_grad():
        for t, o in zip(theirs.encoder.layers, ours.encoder.layers):
            pairs = [(t.self_attn, o.self_attn.fn, _ATTN), (t.ffn, o.ffn.fn, ("fc1", "fc2")),
                     (t.self_attn_layer_norm, o.self_attn.post_norm, None), (t.final_layer_norm, o.ffn.post_norm, None)]
            _copy(pairs)
        for t, o in zip(theirs.decoder.layers, ours.decoder.layers):
            pairs = [(t.self_attn, o.self_attn.fn, _ATTN), (t.encoder_attn, o.cross_attn.fn, _ATTN),
                     (t.ffn, o.ffn.fn, ("fc1", "fc2")), (t.self_attn_layer_norm, o.self_attn.post_norm, None),
                     (t.encoder_attn_layer_norm, o.cross_attn.post_norm, None),
                     (t.final_layer_norm, o.ffn.post_norm, None)]
            _copy(pairs)


def _copy(pairs) -> None:
    for src, dst, names in pairs:
        for name in names or ("",):
            a, b = (getattr(src, name), getattr(dst, name)) if name else (src, dst)
            b.weight.copy_(a.weight)
            b.bias.copy_(a.bias)


class _Stacks(nn.Module):
    """Both stacks of one model on given (embedded) inputs: [B, S, d] source, [B, T, d] target."""

    def __init__(self, model: nn.Module, torchscale: bool):
        super().__init__()
        self.model, self.torchscale = model, torchscale

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.torchscale:
            for layer in self.model.encoder.layers:
                x = layer(x, encoder_padding_mask=None)[0]
            causal = torch.triu(torch.full((y.size(1), y.size(1)), float("-inf"), dtype=y.dtype), 1)
            for layer in self.model.decoder.layers:
                y = layer(y, encoder_out=x, self_attn_mask=causal)[0]
            return y
        for layer in self.model.encoder.layers:
            x = layer(x)
        for layer in self.model.decoder.layers:
            y = layer(y, x, is_causal=True)
        return y


def check_deepnorm(steps: int, d: int = 64, layers: int = 3,
                   float32_softmax: bool = False) -> tuple[float, float]:
    """(the largest relative difference, 100 times the control's drift)"""
    theirs = _torchscale(d, layers, float32_softmax)
    ours = _ours("deepnorm", d, layers)
    stack = {side: TransformerStack(side, layers, layers) for side in ("encoder", "decoder")}
    for side in ("encoder", "decoder"):
        alpha, beta = deepnorm_constants(stack[side])
        their_alpha = getattr(theirs, side).layers[0].alpha
        log.info("deepnorm %s alpha: ours %.6f, torchscale %.6f", side, alpha, their_alpha)
        if not math.isclose(alpha, their_alpha, rel_tol=1e-12):
            raise SystemExit(f"deepnorm: the {side} alpha differs")
        for role, names in (("attention", _ATTN), ("ffn", ("fc1", "fc2"))):
            t_layer = getattr(theirs, side).layers[0]
            t_mod = t_layer.self_attn if role == "attention" else t_layer.ffn
            o_layer = getattr(ours, side).layers[0]
            o_sub = o_layer.self_attn if role == "attention" else o_layer.ffn
            for name in names:
                log.info("  init std %s %s.%s: ours %.4f, torchscale %.4f", side, role, name,
                         getattr(o_sub.fn, name).weight.std().item(), getattr(t_mod, name).weight.std().item())
    _map_deepnorm(theirs, ours)
    a, b = _Stacks(ours, False), _Stacks(theirs, True)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 9, d, generator=g, dtype=F64), torch.randn(4, 7, d, generator=g, dtype=F64)
    with torch.no_grad():
        diff = ((a(x, y) - b(x, y)).abs().max()).item()
    log.info("deepnorm: both stacks, torchscale's weights in ours: largest output difference %.2e", diff)
    target = torch.randn(4, 7, d, generator=g, dtype=F64)

    def loss_fn(model, src, tgt):  # the stacks on fixed inputs, regressed to a fixed target
        return F.mse_loss(model(x + 0.01 * src[:4, :1, None].to(F64), y), target)

    initial = copy.deepcopy(theirs)
    worst = max(diff, _lockstep(a, b, loss_fn, steps, lr=3e-4))
    # torchscale rounds the feed-forward activation's input to float32 (feedforward_network.py:
    # ``activation_fn(x.float())``), so float64 runs differ by float32's rounding from the first
    # step on; the control: their stacks against a copy moved by 1e-8 of each weight, trained alike
    control = copy.deepcopy(initial)
    with torch.no_grad():
        for p in control.parameters():
            p.mul_(1 + 1e-8 * torch.randn(p.shape, generator=g, dtype=F64))
    drift = _lockstep(_Stacks(control, True), _Stacks(initial, True), loss_fn, steps, lr=3e-4)
    log.info("deepnorm: the control's drift %.2e; ours against theirs %.2e (%.1f times it)", drift, worst,
             worst / max(drift, 1e-300))
    return worst, 100 * drift


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_default_dtype(F64)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dyt", help="jiachenzhu/DyT's dynamic_tanh.py")
    p.add_argument("--derf", help="zlab-princeton/Derf's dynamic_erf.py (ViT/ or DiT/)")
    p.add_argument("--deepnorm", action="store_true", help="against torchscale (must import)")
    p.add_argument("--float32-softmax", action="store_true", help="torchscale's attention softmax as it is")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--tolerance", type=float, default=1e-6, help="largest relative difference allowed")
    args = p.parse_args(argv)
    results = {}
    if args.dyt:
        results["dyt"] = check_pointwise("dyt", args.dyt, args.steps)
    if args.derf:
        results["derf"] = check_pointwise("derf", args.derf, args.steps)
    if args.deepnorm:
        results["deepnorm"] = check_deepnorm(args.steps, float32_softmax=args.float32_softmax)
    if not results:
        p.error("nothing to check: give --dyt, --derf and/or --deepnorm")
    bad = {k for k, (worst, margin) in results.items() if not worst <= max(args.tolerance, margin)}
    for name, (worst, margin) in results.items():
        log.info("%s: largest relative difference %.2e, allowed %.2e (%s)", name, worst,
                 max(args.tolerance, margin), "FAILED" if name in bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
