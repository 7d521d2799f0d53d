"""Shared helpers for the ``rescale_core`` tests: tiny model configs, inputs and the checks that
every registered model must pass under every scheme of its family (handed out as a fixture)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import rescale_core
from rescale_core.models.vgg import VGG_SCHEMES
from rescale_core.registry import model_entry

NUM_CLASSES = 5
CONV_FAMILIES = ("resnet", "resnet3d", "cifar_resnet", "wide_resnet")


def tiny_kwargs(name: str) -> dict:
    """The smallest sensible config of a registered model (32x32 inputs)."""
    family = model_entry(name).family
    kwargs = {"num_classes": NUM_CLASSES}
    if name == "cifar_resnet":
        kwargs.update(depth=8, base_width=8)
    elif name == "wide_resnet":
        kwargs.update(depth=16, width=1, base_width=8)
    elif family in ("resnet", "resnet3d"):
        arch = model_entry(name).defaults["arch"]
        # ResNeXt-50 32x4d: int(planes * 4 / 64) * 32 channels; planes=8 would give 0 channels.
        kwargs.update(base_width=16 if arch == "resnext50_32x4d" else 8)
    elif family == "vgg":
        kwargs.update(base_width=8, hidden_dim=32)
    else:
        raise AssertionError(f"no tiny config for {name!r} (family {family!r})")
    return kwargs


def schemes_of(name: str) -> list[str]:
    """The schemes a registered model is built with: its fixed one, or all of its family's."""
    entry = model_entry(name)
    if "scheme" in entry.defaults:
        return [entry.defaults["scheme"]]
    if entry.family == "vgg":
        return list(VGG_SCHEMES)
    return rescale_core.list_schemes("conv")


def cases(families: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(name, scheme) for name in rescale_core.list_models()
            if model_entry(name).family in families for scheme in schemes_of(name)]


def make_input(name: str, batch: int = 2, dtype=torch.float32) -> torch.Tensor:
    if model_entry(name).family == "resnet3d":
        return torch.randn(batch, 3, 4, 32, 32, dtype=dtype)
    return torch.randn(batch, 3, 32, 32, dtype=dtype)


def build(name: str, scheme: str, seed: int = 0, **extra) -> torch.nn.Module:
    torch.manual_seed(seed)
    return rescale_core.create_model(name, scheme=scheme, **{**tiny_kwargs(name), **extra})


def branch_parameter_names(model: torch.nn.Module) -> list[str]:
    """Parameters inside residual branches (not the merge gain, not the shortcut)."""
    names = []
    for block_name, block in rescale_core.analysis.residual_blocks(model):
        for pname, _ in block.named_parameters():
            if not pname.startswith(("merge.", "downsample.")):
                names.append(f"{block_name}.{pname}")
    return names


def redundant_parameter_names(model: torch.nn.Module, scheme: str) -> set[str]:
    """Parameters whose gradient is zero by construction in training mode.

    ``bn_merge`` (BN on the branch plus a BN after the merge): the bias of each branch's last BN
    and of the shortcut's BN only add a per-channel constant before the merge BN, which
    subtracts the batch mean again. Measured: |grad| <= 3e-17 x the largest gradient (rounding
    noise) against >= 4e-9 for every other parameter of every model and scheme.
    """
    if scheme != "bn_merge":
        return set()
    names = set()
    for block_name, block in rescale_core.analysis.residual_blocks(model):
        names.add(f"{block_name}.bn{block.num_convs}.bias")
        if block.downsample is not None:
            names.add(f"{block_name}.downsample.1.bias")
    return names


GRAD_NOISE = 1e-12  # relative to the step's largest gradient: below this, a gradient is rounding noise


class Harness:
    """The model checks, as a fixture so that test modules need not import this conftest."""

    NUM_CLASSES = NUM_CLASSES
    tiny_kwargs = staticmethod(tiny_kwargs)
    schemes_of = staticmethod(schemes_of)
    make_input = staticmethod(make_input)
    build = staticmethod(build)
    branch_parameter_names = staticmethod(branch_parameter_names)
    redundant_parameter_names = staticmethod(redundant_parameter_names)

    @staticmethod
    def forward_backward_at_init(name: str, scheme: str) -> None:
        model = build(name, scheme).train()
        x = make_input(name)
        out = model(x)
        assert out.shape == (x.shape[0], NUM_CLASSES)
        assert torch.isfinite(out).all(), f"{name}/{scheme}: non-finite output at init"
        F.cross_entropy(out, torch.arange(x.shape[0]) % NUM_CLASSES).backward()
        for pname, p in model.named_parameters():
            assert p.grad is not None, f"{name}/{scheme}: {pname} received no gradient"
            assert torch.isfinite(p.grad).all(), f"{name}/{scheme}: non-finite gradient in {pname}"
        grads = {n: p.grad for n, p in model.named_parameters()}
        # What the zero-initialised schemes promise: the branches are cut off at init.
        if scheme in ("skipinit", "skipinit_reg", "rezero"):
            for pname in branch_parameter_names(model):
                assert torch.count_nonzero(grads[pname]) == 0, pname
            gains = [n for n in grads if n.endswith("merge.gain.weight")]
            assert gains and any(torch.count_nonzero(grads[n]) for n in gains)
        if scheme == "fixup":  # zero classifier: only the classifier itself learns at step 1
            nonzero = {n for n, g in grads.items() if torch.count_nonzero(g)}
            assert nonzero == {"fc.weight", "fc.bias"}, sorted(nonzero)

    @staticmethod
    def sgd_steps_change_every_parameter(name: str, scheme: str, steps: int = 3) -> None:
        """3 plain SGD steps (lr 0.1) on random data must move every parameter.

        float64, so that a small but non-zero update (Fixup's gains get their first gradient in
        step 3, too small to move 1.0 in float32) is not rounded away; every parameter must also have seen a finite
        gradient above rounding noise in some step. The parameters that are redundant by
        construction (``redundant_parameter_names``) must show only noise, and are not required
        to move.
        """
        model = build(name, scheme).double().train()
        torch.manual_seed(1)
        x = make_input(name, batch=4, dtype=torch.float64)
        y = torch.randint(0, NUM_CLASSES, (x.shape[0],))
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        redundant = redundant_parameter_names(model, scheme)
        got_grad = dict.fromkeys(before, False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            finite = {n: p.grad.abs().max().item() for n, p in model.named_parameters()
                      if torch.isfinite(p.grad).all()}
            noise = GRAD_NOISE * max(finite.values(), default=0.0)
            for n, g in finite.items():
                got_grad[n] |= g > noise
            opt.step()
        no_grad = sorted(n for n, ok in got_grad.items() if not ok)
        assert no_grad == sorted(redundant), (
            f"{name}/{scheme}: no finite gradient above noise in {steps} steps: {set(no_grad) - redundant}")
        unchanged = [n for n, p in model.named_parameters()
                     if n not in redundant and torch.equal(p.detach(), before[n])]
        assert not unchanged, f"{name}/{scheme}: unchanged after {steps} SGD steps: {unchanged}"
        if scheme != "none":  # plain x + F(x) diverges at lr 0.1 from depth 34 on: that's the point
            bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
            assert not bad, f"{name}/{scheme}: non-finite after {steps} SGD steps: {bad}"

    @staticmethod
    def state_dict_round_trip(name: str, scheme: str) -> None:
        """Train briefly (so BN running stats and mean-shift statistics are measured), save, load
        into a fresh model of the same config (other seed): identical eval outputs."""
        model = build(name, scheme, seed=0).train()
        torch.manual_seed(2)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(2):
            x = make_input(name, batch=4)
            opt.zero_grad()
            F.cross_entropy(model(x), torch.randint(0, NUM_CLASSES, (4,))).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        state = copy.deepcopy(model.state_dict())
        fresh = build(name, scheme, seed=123)
        x = make_input(name, batch=3)
        model.eval()
        fresh.eval()
        with torch.no_grad():
            expected = model(x)
            assert not torch.allclose(fresh(x), expected), "fresh model already agrees: test is void"
            fresh.load_state_dict(state)
            got = fresh(x)
        assert torch.isfinite(expected).all()
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        for a, b in zip(rescale_core.mean_shift_layers(model), rescale_core.mean_shift_layers(fresh)):
            assert a.measuring == b.measuring and a._count == b._count == 2


@pytest.fixture
def harness() -> type[Harness]:
    return Harness


class CastCounter(TorchDispatchMode):
    """The dtype conversions dispatched inside it (``casts``: ``(from, to)`` per cast), as
    ``aten._to_copy`` (under ``torch.no_grad``) or as ``aten.to`` (under
    ``torch.inference_mode``, where autocast's casts reach the dispatcher whole)."""

    def __init__(self):
        super().__init__()
        self.casts: list[tuple[torch.dtype, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (func._schema.name in ("aten::_to_copy", "aten::to") and isinstance(out, torch.Tensor)
                and out.dtype != args[0].dtype):
            self.casts.append((args[0].dtype, out.dtype))
        return out


@pytest.fixture
def count_casts():
    """``with count_casts() as probe: ...`` then ``probe.casts``: the casts launched inside it."""
    return CastCounter


def pytest_generate_tests(metafunc) -> None:
    """``model_case``: every (model, scheme) of the ResNet families and VGG."""
    for argname, families in (("model_case", CONV_FAMILIES + ("vgg",)),):
        if argname in metafunc.fixturenames:
            params = cases(families)
            metafunc.parametrize(argname, params, ids=[f"{n}-{s}" for n, s in params])
