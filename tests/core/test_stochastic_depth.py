"""Stochastic depth (``Scheme.stochdepth_rate``): the official NF-ResNet per-block rule, a per-sample
draw scaled by 1/keep in training, the identity in evaluation, on every conv family the block builds;
refused where no residual block reads it; at rate 0 the network of before."""
from __future__ import annotations

import math

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from rescale_core import create_model, get_scheme
from rescale_core.blocks import ResidualBlock
from rescale_core.layers import drop_path
from rescale_core.plans import running_plan
from rescale_core.schemes import SchemeOptionError

# each conv family the one block builds: (network, its options, an input)
FAMILIES = {
    "cifar basic": ("cifar_resnet", {"depth": 8, "base_width": 4}, (1, 8, 8)),
    "wide resnet": ("wide_resnet", {"depth": 10, "width": 1}, (3, 8, 8)),
    "imagenet bottleneck": ("resnet50", {"base_width": 2}, (3, 32, 32)),
    "3D video": ("r3d_18", {"base_width": 4}, (3, 2, 16, 16)),
}


def _net(family: str, scheme: str = "nf", **options) -> nn.Module:
    network, net_options, _ = FAMILIES[family]
    torch.manual_seed(0)
    return create_model(network, scheme=scheme, num_classes=3, in_channels=FAMILIES[family][2][0],
                        scheme_options=options or None, **net_options)


def _input(family: str, batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, *FAMILIES[family][2], generator=torch.Generator().manual_seed(1))


def _blocks(net: nn.Module) -> list[ResidualBlock]:
    return [m for m in net.modules() if isinstance(m, ResidualBlock)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_block_gets_the_official_rate_and_evaluation_is_the_network_without_it(family):
    net = _net(family, stochdepth_rate=0.9, zero_gamma=False)  # branches that are not zero at init
    blocks = _blocks(net)
    L = len(blocks)
    # deepmind-research nfnets/nf_resnet.py: stochdepth_rate * index / num_blocks, index from 0
    assert [b.drop_rate for b in blocks] == [0.9 * i / L for i in range(L)]
    assert "drop_rate" not in repr(blocks[0]) and f"drop_rate={blocks[-1].drop_rate:.4g}" in repr(blocks[-1])
    plain = _net(family, zero_gamma=False)
    plain.load_state_dict(net.state_dict())
    x = _input(family, 16)
    net.eval(), plain.eval()
    with torch.no_grad():  # the frozen plan
        assert running_plan(net, x) == "frozen"
        assert torch.equal(net(x), plain(x))
    assert torch.equal(net(x), plain(x))  # evaluation with autograd: the reference
    net.train()
    torch.manual_seed(5)
    first = net(x)
    torch.manual_seed(6)
    assert not torch.equal(first, net(x))  # training draws


@pytest.mark.parametrize("scheme", ["bn", "rescale", "fixup", "nf"])
def test_at_rate_0_the_network_is_the_one_of_before_and_draws_nothing(scheme):
    """No random number drawn (the dropout and augmentation streams stay as they were), the fast
    plans kept, the same function."""
    x = _input("cifar basic", 8)
    plain, zero = _net("cifar basic", scheme), _net("cifar basic", scheme, stochdepth_rate=0.0)
    assert all(b.drop_rate == 0.0 for b in _blocks(zero))
    assert running_plan(zero, x) == running_plan(plain, x)
    state = torch.get_rng_state()
    out = zero(x)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(out, plain(x))


@pytest.mark.parametrize("scheme", ["rescale", "fixup"])
def test_a_rate_runs_the_reference_in_training_and_the_frozen_plan_in_evaluation(scheme):
    x = _input("cifar basic")
    plain, net = _net("cifar basic", scheme), _net("cifar basic", scheme, stochdepth_rate=0.5)
    assert running_plan(plain, x) == "folded"
    assert running_plan(net, x) == "reference"
    net.eval(), plain.eval()
    with torch.no_grad():
        assert running_plan(net, x) == "frozen"
        assert torch.equal(net(x), plain(x))


@pytest.mark.parametrize("scheme", ["none", "nf"])
def test_a_block_drops_its_branch_per_sample_at_its_rate_and_scales_the_kept_ones(scheme):
    """Each sample's output is the block's with its branch either zero or divided by the keep
    probability; the number dropped is binomial(n, rate) (a fixed seed: within 4 sigma)."""
    torch.manual_seed(0)
    rate, n = 0.3, 2000
    options = {"zero_gamma": False} if scheme == "nf" else {}  # a branch that is not zero at init
    block = ResidualBlock(get_scheme(scheme, stochdepth_rate=0.6, **options), 4, 4, k=2, L=2)  # 0.6 * 1 / 2
    assert block.drop_rate == pytest.approx(rate)
    x = torch.randn(n, 4, 3, 3)
    with torch.no_grad():
        h = torch.relu(x) * block.input_scale if block.preact else x
        branch = block.branch(h)

        def merged(b):
            out = block.merge(x, b)
            return out if block.preact else torch.relu(out)

        dropped, kept = merged(torch.zeros_like(branch)), merged(branch / (1 - rate))
        torch.manual_seed(1)
        out = block.train()(x)
    is_dropped = torch.isclose(out, dropped, atol=1e-6).flatten(1).all(1)
    is_kept = torch.isclose(out, kept, atol=1e-6).flatten(1).all(1)
    assert bool((is_dropped ^ is_kept).all())  # every sample is exactly one of the two
    mean, sigma = n * rate, math.sqrt(n * rate * (1 - rate))
    assert abs(int(is_dropped.sum()) - mean) < 4 * sigma
    assert torch.equal(block.eval()(x), merged(branch))  # evaluation: the identity


def test_unscaled_stochastic_depth_keeps_the_kept_branches_as_they_are():
    """stochdepth_scale false (the official NF-ResNet StochDepth): a kept branch is the branch itself,
    a dropped one zero; evaluation is the same network."""
    block = ResidualBlock(get_scheme("nf", stochdepth_rate=0.8, stochdepth_scale=False,
                                     zero_gamma=False), 4, 4, k=2, L=2)  # drops at 0.4
    x = torch.randn(400, 4, 3, 3)
    with torch.no_grad():
        branch = block.branch(torch.relu(x) * block.input_scale)
        kept, dropped = block.merge(x, branch), block.merge(x, torch.zeros_like(branch))
        torch.manual_seed(2)
        out = block.train()(x)
        is_kept = torch.isclose(out, kept, atol=1e-6).flatten(1).all(1)
        is_dropped = torch.isclose(out, dropped, atol=1e-6).flatten(1).all(1)
        assert bool((is_kept ^ is_dropped).all()) and 0 < int(is_dropped.sum()) < 400
        assert torch.allclose(block.eval()(x), kept, atol=1e-6)
    torch.manual_seed(0)
    y = drop_path(torch.ones(1000, 1, 2), 0.25, True, scale_by_keep=False)
    assert set(y.unique().tolist()) == {0.0, 1.0}


def test_drop_path_keeps_the_input_where_it_does_not_draw():
    x = torch.randn(3, 2)
    assert drop_path(x, 0.0, True) is x and drop_path(x, 0.5, False) is x
    torch.manual_seed(0)
    y = drop_path(torch.ones(4000, 1, 2), 0.25, True)
    assert set(y.unique().tolist()) <= {0.0, torch.tensor(1 / 0.75).item()} and torch.equal(y[:, :, 0], y[:, :, 1])


@pytest.mark.parametrize("network,options,expected", [
    ("vgg11", {"base_width": 4}, "an option VGG builds"),
    ("transformer_tiny", {}, "an option of a Transformer"),
])
def test_a_network_without_residual_conv_blocks_refuses_it_in_one_line(network, options, expected):
    scheme = "bn" if network.startswith("vgg") else "pre_ln"
    with pytest.raises(SchemeOptionError, match=expected) as err:
        create_model(network, scheme=scheme, scheme_options={"stochdepth_rate": 0.1}, **options)
    assert "stochdepth_rate" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("rate", [1.0, -0.1, float("nan")])
def test_a_rate_outside_0_1_is_refused(rate):
    with pytest.raises(SchemeOptionError, match=r"stochdepth_rate: .* is not a rate in \[0, 1\)"):
        get_scheme("nf", stochdepth_rate=rate)


def test_a_tiny_network_still_overfits_with_a_high_rate():
    digits = load_digits()
    x = torch.tensor(digits.images[:16], dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target[:16])
    torch.manual_seed(0)
    net = create_model("cifar_resnet", scheme="nf", num_classes=10, in_channels=1, depth=8, base_width=8,
                       scheme_options={"stochdepth_rate": 0.5})
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    for _ in range(60):
        optimizer.zero_grad()
        nn.functional.cross_entropy(net.train()(x), y).backward()
        optimizer.step()
    with torch.no_grad():
        assert (net.eval()(x).argmax(1) == y).float().mean() == 1.0
