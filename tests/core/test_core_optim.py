"""Optimizer parameter groups: weight decay on conv/linear weights only, none on gains and biases
(RescaleNet, Shao et al. 2020); Fixup's scalars at lr/10 (Zhang et al. 2019)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import rescale_core
from rescale_core import Gain, MeanShiftBias, ScalarBias, param_groups


def _model(name, scheme=None, **kw):
    torch.manual_seed(0)
    extra = {} if scheme is None else {"scheme": scheme}
    kw.setdefault("base_width", 8)
    return rescale_core.create_model(name, num_classes=5, **extra, **kw)


def _group_of(groups) -> dict[int, dict]:
    owner = {}
    for g in groups:
        for p in g["params"]:
            assert id(p) not in owner, "parameter in two groups"
            owner[id(p)] = g
    return owner


CASES = [("resnet18", "rescale"), ("resnet50", "fixup"), ("resnet18", "bn"), ("resnet18", "gn"),
         ("resnet18", "skipinit_reg"), ("resnet18", "bn_head"), ("vgg11", "rescale"), ("vgg11", "none"),
         ("resnet18", "rezero")]


@pytest.mark.parametrize("name, scheme", CASES)
def test_groups_partition_and_decay_rules(name, scheme):
    kw = {"hidden_dim": 32} if name.startswith("vgg") else {}
    model = _model(name, scheme, **kw)
    groups = param_groups(model, weight_decay=1e-4, lr=0.2)
    owner = _group_of(groups)
    params = [p for p in model.parameters() if p.requires_grad]
    assert len(owner) == len(params) and all(id(p) in owner for p in params)
    assert all(g["params"] for g in groups)
    factor = 0.1 if scheme == "fixup" else 1.0
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            g = owner[id(p)]
            where = f"{type(module).__name__}.{pname}"
            if isinstance(module, (Gain, ScalarBias)):
                assert g["name"] == "scalars" and g["weight_decay"] == 0.0, where
                assert g["lr"] == pytest.approx(0.2 * factor) and g["lr_factor"] == factor, where
            elif isinstance(module, MeanShiftBias) or pname == "bias":
                assert g["name"] == "biases" and g["weight_decay"] == 0.0 and g["lr"] == 0.2, where
            elif isinstance(module, (nn.Conv2d, nn.Linear)):
                assert g["name"] == "weights" and g["weight_decay"] == 1e-4 and g["lr"] == 0.2, where
            else:
                assert isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm)), where
                assert g["name"] == "norm" and g["weight_decay"] == 1e-4, where


def test_fixup_scalars_at_a_tenth_of_the_lr():
    groups = {g["name"]: g for g in param_groups(_model("fixup50"), lr=0.4)}
    assert groups["scalars"]["lr"] == pytest.approx(0.04) and groups["scalars"]["lr_factor"] == 0.1
    assert groups["weights"]["lr"] == 0.4 and groups["weights"]["lr_factor"] == 1.0
    n_scalars = sum(isinstance(m, (Gain, ScalarBias)) for m in _model("fixup50").modules())
    assert len(groups["scalars"]["params"]) == n_scalars > 16


def test_the_scheme_of_a_wrapped_network_sets_the_scalars_lr():
    """A wrapper (a head added, a detector around a backbone) keeps Fixup's lr/10; two networks
    asking for other factors cannot share one scalars group."""
    fixup = rescale_core.create_model("cifar_resnet", depth=8, base_width=4, scheme="fixup")
    groups = {g["name"]: g for g in param_groups(nn.Sequential(fixup, nn.LogSoftmax(-1)), lr=0.1)}
    assert groups["scalars"]["lr"] == pytest.approx(0.01)
    rescale = rescale_core.create_model("cifar_resnet", depth=8, base_width=4, scheme="rescale")
    with pytest.raises(ValueError, match=r"scalar learning-rate factors \[0.1, 1.0\]"):
        param_groups(nn.ModuleList([fixup, rescale]))


def test_norm_weight_decay_override():
    groups = {g["name"]: g for g in param_groups(_model("resnet18", "bn"), weight_decay=5e-4,
                                                 norm_weight_decay=0.0)}
    assert groups["norm"]["weight_decay"] == 0.0 and groups["weights"]["weight_decay"] == 5e-4


@pytest.mark.parametrize("name, scheme, norm", [("cifar_resnet", "bn", nn.BatchNorm2d), ("cifar_resnet", "dyt", None),
                                                ("transformer_tiny", "pre_ln", nn.LayerNorm),
                                                ("transformer_tiny", "dyt", None), ("transformer_tiny", "derf", None)])
def test_a_pointwise_norm_is_decayed_as_the_norm_it_replaces(name, scheme, norm):
    """DyT and Derf stand in for BatchNorm / LayerNorm: their per-feature ``weight`` is the norm's
    affine weight, in the ``norm`` group (``norm_weight_decay``, by default the weights' decay), and
    their ``alpha`` and ``shift`` (scalars) and ``bias`` are not decayed, as the norm's bias."""
    from rescale_core.layers import PointwiseNorm

    kw = {"depth": 8, "base_width": 4, "num_classes": 3} if name == "cifar_resnet" else {"src_vocab_size": 20}
    model = rescale_core.create_model(name, scheme=scheme, **kw)
    owner = _group_of(param_groups(model, weight_decay=5e-4, norm_weight_decay=1e-5))
    layers = [m for m in model.modules() if isinstance(m, norm or PointwiseNorm)]
    assert layers
    for layer in layers:
        assert owner[id(layer.weight)]["name"] == "norm" and owner[id(layer.weight)]["weight_decay"] == 1e-5
        others = [layer.bias] + [getattr(layer, k) for k in ("alpha", "shift") if getattr(layer, k, None) is not None]
        assert all(owner[id(p)]["name"] == "biases" and owner[id(p)]["weight_decay"] == 0.0 for p in others)


def test_frozen_parameters_are_left_out():
    model = _model("resnet18", "rescale")
    model.fc.requires_grad_(False)
    ids = {id(p) for g in param_groups(model) for p in g["params"]}
    assert id(model.fc.weight) not in ids and id(model.fc.bias) not in ids
    assert len(ids) == sum(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("name, scheme", [("resnet18", "rescale"), ("resnet50", "fixup"), ("resnet18", "bn")])
def test_usable_by_sgd(name, scheme):
    model = _model(name, scheme)
    opt = torch.optim.SGD(param_groups(model, weight_decay=1e-4, lr=0.1), lr=0.1, momentum=0.9)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3])).backward()
        opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert sum(not torch.equal(a, p) for a, p in zip(before, model.parameters())) > 0.9 * len(before)
    # weight decay acts where the groups say: a zero-gradient step shrinks the decayed
    # parameters by (1 - lr * wd) and leaves gains and biases alone
    groups = param_groups(model, weight_decay=0.5, lr=0.1)
    opt = torch.optim.SGD(groups, lr=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    before = {g["name"]: [p.detach().clone() for p in g["params"]] for g in groups}
    opt.step()
    assert {g["name"] for g in groups if g["weight_decay"] == 0} >= {"biases"}
    for g in groups:
        for p, p0 in zip(g["params"], before[g["name"]]):
            expected = p0 * (1 - 0.1 * g["weight_decay"])
            torch.testing.assert_close(p.detach(), expected, rtol=1e-6, atol=0)
