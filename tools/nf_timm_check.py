"""Our ``nf`` ResNets against timm's ``NormFreeNet`` (NF-ResNet, Brock, De & Smith, ICLR 2021), in
float64 on real images: the fidelity check of docs/nf_resnets.md, at length.

- ``compare``: timm's weights moved off their init and mapped into ours
  (:func:`rescale_core.testing.load_timm_normfree_`); the largest difference of the logits and of
  every parameter's gradient, relative to the largest value, on sklearn's two sample photos.
- ``lockstep``: both trained side by side from timm's init on the same batches of the embedded
  digits (Nesterov SGD); the loss of each step. Two implementations that order their float64
  operations differently drift apart as training amplifies rounding; the control (timm's network
  against a copy of it moved by 1e-15 of each weight) shows how far training alone carries such
  a difference, and the check asks the losses to agree to 1e-6 relative or within 100 times the
  control's drift.

``python -m tools.nf_timm_check`` runs both for ``nf`` and ``nf_skipinit`` on the tiny network the
tests use (``resnet50(base_width=8)`` against timm's ``nf_resnet50`` config at the same widths,
300 steps) and ``compare`` on the full ``nf_resnet50`` at 224x224 (``--no-full`` skips it);
``tests/core/test_nf_resnet.py`` runs the same functions, shorter. Needs timm and scikit-learn
(``make test`` installs both)."""
from __future__ import annotations

import argparse
import copy
import dataclasses
import time

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits, load_sample_images
from timm.models.nfnet import NormFreeNet, model_cfgs
from torch import nn

import rescale_core
from rescale_core.testing import load_timm_normfree_, timm_normfree_names

F64 = torch.float64
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def timm_net(scheme: str, in_chans: int = 3, num_classes: int = 10, full: bool = False) -> NormFreeNet:
    """timm's ``nf_resnet50`` (``full``), or its config at our ``resnet50(base_width=8)``'s widths:
    stages of 32/64/128/256 channels and an 8-channel stem; ``skipinit`` for ``nf_skipinit``."""
    cfg = model_cfgs["nf_resnet50"]
    if not full:
        cfg = dataclasses.replace(cfg, channels=(32, 64, 128, 256), stem_chs=8)
    cfg = dataclasses.replace(cfg, skipinit=scheme == "nf_skipinit")
    return NormFreeNet(cfg, num_classes=num_classes, in_chans=in_chans).to(F64)


def our_net(scheme: str, in_channels: int = 3, num_classes: int = 10, full: bool = False) -> nn.Module:
    """Our ``resnet50`` under ``scheme`` at timm's widths (:func:`timm_net`)."""
    widths = {} if full else {"base_width": 8}
    return rescale_core.create_model("resnet50", scheme=scheme, num_classes=num_classes,
                                     in_channels=in_channels, **widths).to(F64)


def photos(size: int = 32) -> torch.Tensor:
    """sklearn's two sample photos (a temple in China, a flower), resized to ``size`` x ``size``,
    normalised with the ImageNet statistics, and their mirror images: a batch of 4."""
    images = torch.tensor(np.stack(load_sample_images().images), dtype=F64).permute(0, 3, 1, 2) / 255
    images = F.interpolate(images, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    mean = torch.tensor(IMAGENET_MEAN, dtype=F64)[:, None, None]
    std = torch.tensor(IMAGENET_STD, dtype=F64)[:, None, None]
    images = (images - mean) / std
    return torch.cat([images, images.flip(-1)])


def digits(size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 embedded 8x8 digits, upsampled to ``size`` x ``size``, standardized; labels 0-9."""
    data = load_digits()
    x = torch.tensor(data.images, dtype=F64).unsqueeze(1)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return (x - x.mean()) / x.std(), torch.tensor(data.target)


def compare(scheme: str, full: bool = False, size: int = 32, seed: int = 0) -> dict[str, float]:
    """timm's network with every parameter moved by N(0, 0.1^2) (its zero-initialised gains made
    non-zero), mapped into ours; on :func:`photos` the largest |difference| of the logits and of
    each parameter's gradient (cross-entropy against fixed labels), each relative to the largest
    |value| of timm's (``output``, ``grad``: the worst parameter; ``grad_param``: which)."""
    torch.manual_seed(seed)
    num_classes = 1000 if full else 10
    theirs = timm_net(scheme, num_classes=num_classes, full=full)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=F64))
    ours = load_timm_normfree_(our_net(scheme, num_classes=num_classes, full=full), theirs.state_dict())
    x, y = photos(size), torch.tensor([0, 3, 5, 9])
    out_theirs, out_ours = theirs(x), ours(x)
    result = {"output": float((out_ours - out_theirs).detach().abs().max() / out_theirs.detach().abs().max())}
    F.cross_entropy(out_theirs, y).backward()
    F.cross_entropy(out_ours, y).backward()
    params, names = dict(ours.named_parameters()), timm_normfree_names(ours)
    if len(names) != len(params) or len(params) != len(list(theirs.parameters())):
        raise AssertionError("the parameters do not correspond one to one")
    worst, worst_name = 0.0, ""
    for name, p in theirs.named_parameters():
        mine = params[names[name]].grad
        want = p.grad.reshape(mine.shape)
        if want.abs().max() == 0:
            raise AssertionError(f"{name}: zero gradient, the comparison would be void")
        rel = float((mine - want).abs().max() / want.abs().max())
        if rel >= worst:
            worst, worst_name = rel, name
    result.update(grad=worst, grad_param=worst_name, parameters=len(params))
    return result


def lockstep(scheme: str, steps: int, lr: float = 0.02, batch: int = 16, seed: int = 0,
             control: bool = False) -> list[tuple[float, float]]:
    """timm's tiny network at its init and ours with its weights, trained side by side in float64 on
    the same digit batches (Nesterov SGD, momentum 0.9, weight decay 5e-5 on every parameter,
    constant ``lr``): the (timm, ours) training loss of each step. ``control``: instead of ours, a
    copy of timm's with every weight moved by 1e-15 of itself (about 5 ulps), to see how far
    training alone carries a rounding-sized difference."""
    torch.manual_seed(seed)
    theirs = timm_net(scheme, in_chans=1)
    if control:
        ours = copy.deepcopy(theirs)
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in ours.parameters():
                p.add_(p * 1e-15 * torch.randn(p.shape, generator=g, dtype=F64))
    else:
        ours = load_timm_normfree_(our_net(scheme, in_channels=1), theirs.state_dict())
    x, y = digits()
    optimizers = [torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-5)
                  for m in (theirs, ours)]
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, len(x), (batch,), generator=g)
        pair = []
        for model, opt in zip((theirs, ours), optimizers):
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            pair.append(loss.item())
        losses.append((pair[0], pair[1]))
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.nf_timm_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="lockstep SGD steps (default 300)")
    parser.add_argument("--lr", type=float, default=0.02, help="lockstep learning rate (default 0.02)")
    parser.add_argument("--no-full", dest="full", action="store_false",
                        help="skip the full nf_resnet50 at 224x224")
    args = parser.parse_args(argv)
    ok = True
    for scheme in ("nf", "nf_skipinit"):
        start = time.perf_counter()
        c = compare(scheme)
        print(f"{scheme} tiny, 4 photos 32x32: logits {c['output']:.1e}, worst gradient {c['grad']:.1e} "
              f"({c['grad_param']}, of {c['parameters']} parameters)  [{time.perf_counter() - start:.1f} s]")
        ok &= c["output"] <= 1e-6 and c["grad"] <= 1e-6
        start = time.perf_counter()
        losses = np.array(lockstep(scheme, args.steps, lr=args.lr))
        control = np.array(lockstep(scheme, args.steps, lr=args.lr, control=True))
        diff, drift = (np.abs(a[:, 0] - a[:, 1]) / np.abs(a[:, 0]) for a in (losses, control))
        marks = [m for m in (10, 50, 100, 200, 300, 500, 1000) if m <= args.steps]
        print(f"{scheme} lockstep, {args.steps} steps lr {args.lr}: loss {losses[0, 0]:.4f} -> timm "
              f"{losses[-1, 0]:.12f}, ours {losses[-1, 1]:.12f}  [{time.perf_counter() - start:.1f} s]")
        print("  relative |loss difference| at step " + ", ".join(
            f"{m}: {diff[:m].max():.0e} (control {drift[:m].max():.0e})" for m in marks))
        ok &= bool(diff.max() <= max(1e-6, 100 * drift.max()))
    if args.full:
        start = time.perf_counter()
        c = compare("nf", full=True, size=224)
        print(f"nf_resnet50 full, 4 photos 224x224: logits {c['output']:.1e}, worst gradient {c['grad']:.1e} "
              f"({c['grad_param']}, of {c['parameters']} parameters)  [{time.perf_counter() - start:.1f} s]")
        ok &= c["output"] <= 1e-6 and c["grad"] <= 1e-6
    print("same function as timm" if ok else "DIFFERENT from timm")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
