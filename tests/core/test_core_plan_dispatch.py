"""The dispatch of execution plans (``rescale_core.plans.dispatch``): which plan computes a
module now, each module type's registered implementations, one ``plan`` attribute per module,
and modules pickled with the flags of the earlier layout."""
from __future__ import annotations

import pickle
from typing import NamedTuple

import pytest
import torch
from torch import nn

import rescale_core
from rescale_core import ResidualBlock, ResidualSublayer, get_scheme
from rescale_core.models.resnet import ResNet
from rescale_core.models.vgg import VGG
from rescale_core.plans import folded, frozen, lean, running_plan


def _tiny(scheme: str = "rescale", **kwargs):
    torch.manual_seed(0)
    return rescale_core.create_model("resnet18", scheme=scheme, base_width=4, num_classes=3,
                                     scheme_options={"measure_batches": 1}, **kwargs)


def test_every_module_type_registers_both_fast_plans_and_the_frozen_one():
    for cls in (ResidualBlock, ResidualSublayer, ResNet, VGG):
        impls = cls.plan_implementations
        assert set(impls) == {"folded", "lean", "frozen"}, cls
        assert impls["folded"].run.__module__ == folded.__name__ and impls["lean"].run.__module__ == lean.__name__
        assert impls["frozen"].run.__module__ == frozen.__name__


def test_the_running_plan_follows_plan_measuring_and_hooks():
    model = _tiny(plan="lean").train()
    x = torch.randn(2, 3, 16, 16)
    assert running_plan(model, x) == "folded"  # measuring: the lean plan declines
    model(x).sum().backward()
    assert running_plan(model, x) == "lean" and running_plan(model.layer1[0], x) == "lean"
    handle = model.layer1[0].conv1.register_forward_hook(lambda *a: None)
    assert running_plan(model, x) == "folded" and running_plan(model.layer1[0], x) == "reference"
    handle.remove()
    rescale_core.set_plan(model, "auto")
    assert running_plan(model, x) == "folded"  # auto on a CPU tensor
    with rescale_core.reference_path(model):
        assert running_plan(model, x) == "reference"
    assert running_plan(model, x) == "folded"


@pytest.mark.parametrize("plan, training", [("reference", True), ("folded", True), ("lean", True), ("auto", False)])
def test_a_hook_on_a_merge_gain_fires_with_what_the_gain_computes(plan, training):
    """The merge calls its gain as a module (the branch times the learned multiplier and the
    branch scale): a hook on it sees that product, on every plan (the frozen one: evaluation
    without autograd), and the output is unchanged."""
    model = _tiny("skipinit", plan=plan).train(training)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, rescale_core.layers.Gain):
                m.weight.fill_(0.5)
    x = torch.randn(2, 3, 16, 16)
    with torch.set_grad_enabled(training):
        expected = model(x)
        merge, seen = model.layer1[0].merge, []
        handle = merge.gain.register_forward_hook(lambda mod, args, out: seen.append((args[0], out)))
        torch.testing.assert_close(model(x), expected)
        handle.remove()
    (branch, out), = seen
    torch.testing.assert_close(out, branch * 0.5 * merge.branch_scale)

def test_one_plan_attribute_and_fused_as_its_view():
    model = _tiny()
    assert "fused" not in vars(model)  # a view of ``plan``
    model.fused = False
    assert model.plan == "reference" and not model.fused
    model.fused = True
    assert model.plan == "auto" and model.fused
    rescale_core.set_plan(model, "lean")
    model.fused = True  # a fast plan stays as set
    assert model.plan == "lean"


def test_modules_pickled_with_the_earlier_flags_keep_their_path():
    """``fused`` False (the reference) and ``_fast_ok`` False (a scheme the fast plans do not
    implement) were instance attributes: they still select the reference."""
    x = torch.randn(2, 3, 16, 16)
    for flags in ({"fused": False, "_fast_ok": True}, {"fused": True, "_fast_ok": False}):
        model = _tiny("skipinit").eval()
        state = dict(model.__dict__, plan="lean", **flags)
        restored = ResNet.__new__(ResNet)
        restored.__setstate__(state)
        assert running_plan(restored, x) == "reference", flags
        again = pickle.loads(pickle.dumps(restored))
        assert running_plan(again, x) == "reference", flags
    fast = ResNet.__new__(ResNet)
    fast.__setstate__(dict(_tiny("skipinit").__dict__, fused=True, plan="lean"))
    assert fast.plan == "lean" and fast.fused


def test_a_scheme_the_plans_do_not_implement_stays_on_the_reference():
    scheme = get_scheme("rescale")
    block = ResidualBlock(scheme, 8, 8)
    block._fast_ok = False  # as check_scheme records for an unimplemented scheme
    rescale_core.set_plan(block, "folded")
    assert running_plan(block, torch.randn(1, 8, 4, 4)) == "reference" and not block.fused


class _LayerWithAct(NamedTuple):
    """A branch layer with one more field than every plan computes."""

    shift: nn.Module
    conv: nn.Module
    post: nn.Module
    act: nn.Module


def test_a_new_branch_layer_fails_loudly_on_every_plan(monkeypatch):
    """The block's branch is read through ``branch_layers()`` only (no attribute names looked
    up by the plans): a layer given one more field fails at once, in the reference and in each
    plan, training and evaluating, instead of being silently skipped by the plans."""
    block = _tiny().layer2[0]
    x = torch.randn(2, block.conv1.in_channels, 8, 8)
    layers = block.branch_layers()
    assert [type(layer.conv) for layer in layers] == [nn.Conv2d] * 2 and layers[0].shift is block.shift1
    monkeypatch.setattr(type(block), "branch_layers",
                        lambda self: tuple(_LayerWithAct(*layer, nn.Identity()) for layer in layers))
    for plan in ("reference", "folded", "lean"):
        rescale_core.set_plan(block, plan)
        for train in (True, False):
            block.train(train)
            with pytest.raises(ValueError, match="too many values to unpack"):
                block(x)
            with torch.no_grad(), pytest.raises(ValueError, match="too many values to unpack"):
                block(x)  # the frozen plan, where evaluating
