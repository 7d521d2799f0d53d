"""FPN backbones from the suite's ResNets: the features the FPN sees are the core model's own stage
outputs (fast and reference path), freezing by stage, FrozenBN, and checkpoint initialisation."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.ops.misc import FrozenBatchNorm2d

import rescale_core
from rescale_core.layers import MeanShiftBias
from rescale_tasks.common.errors import ConfigError
from rescale_tasks.detection.backbones import resnet_fpn_backbone

SCHEMES = ["bn", "gn", "rescale", "fixup", "skipinit", "none", "nf"]
TINY = {"base_width": 8}


def _perturb(model: nn.Module) -> None:
    """Non-trivial weights: zero-initialised gains/convs/biases (Fixup, SkipInit) made non-zero,
    mean-shift statistics measured (finished), BN statistics away from 0/1."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
        for m in model.modules():
            if isinstance(m, MeanShiftBias):
                m.mu0.normal_(0, 0.1, generator=g)
                m.finish_measuring()
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1, generator=g)
                m.running_var.uniform_(0.5, 1.5, generator=g)


def _close(a, b):
    scale = max(b.abs().max().item(), 1e-6)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_fpn_sees_the_models_stage_outputs(scheme):
    torch.manual_seed(0)
    backbone = resnet_fpn_backbone("resnet18", scheme, network_options=TINY, out_channels=16,
                                   trainable_layers=5)
    model = backbone.body  # IntermediateLayerGetter: the model's stem modules and layer1..4
    ref = rescale_core.create_model("resnet18", scheme=scheme, num_classes=0, **TINY)
    ref.load_state_dict(backbone.body.state_dict(), strict=False)  # same weights, full model
    _perturb(ref)
    model.load_state_dict(ref.state_dict(), strict=False)
    ref.eval(), backbone.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        for reference in (False, True):
            with rescale_core.reference_path(ref, reference), rescale_core.reference_path(backbone, reference):
                expected = ref.stage_outputs(x)
                # the stage outputs are the model's forward: its pooled features come out of the last
                _close(ref.forward_head(expected[-1]), ref(x))
                got = backbone.body(x)
            assert list(got) == ["0", "1", "2", "3"]
            for k, e in enumerate(expected):
                _close(got[str(k)], e)
    if scheme == "rescale":
        assert ref.fused and ref._fast_ok  # the fast path was exercised, not only the reference


def test_widths_levels_and_gn_fpn():
    backbone = resnet_fpn_backbone("resnet50", "rescale", network_options=TINY, returned_layers=(2, 3, 4),
                                   fpn_norm="gn", out_channels=32)
    assert isinstance(backbone, BackboneWithFPN)
    assert backbone.body.return_layers == {"layer2": "0", "layer3": "1", "layer4": "2"}
    assert [b[0].in_channels for b in backbone.fpn.inner_blocks] == [64, 128, 256]  # bottleneck x4
    assert any(isinstance(m, nn.GroupNorm) and m.num_groups == 32 for m in backbone.fpn.modules())
    assert "fc" not in dict(backbone.body.named_children()) and "pool_shift" not in dict(backbone.body.named_children())
    out = backbone(torch.randn(1, 3, 64, 64))
    assert list(out) == ["0", "1", "2", "pool"] and all(v.shape[1] == 32 for v in out.values())
    with pytest.raises(ConfigError):
        resnet_fpn_backbone("resnet18", "bn", network_options=TINY, trainable_layers=6)
    with pytest.raises(ConfigError, match="not a 2D"):
        resnet_fpn_backbone("cifar_resnet", "bn", network_options={"depth": 8})


@pytest.mark.parametrize("layers,trainable", [(0, []), (3, ["layer2", "layer3", "layer4"]),
                                              (5, ["stem", "layer1", "layer2", "layer3", "layer4"])])
def test_trainable_layers_freeze_by_stage(layers, trainable):
    backbone = resnet_fpn_backbone("resnet18", "rescale", network_options=TINY, trainable_layers=layers)
    body = backbone.body
    groups = {"stem": [body.conv1, body.bn1], **{f"layer{i}": [getattr(body, f"layer{i}")] for i in range(1, 5)}}
    for name, modules in groups.items():
        flags = {p.requires_grad for m in modules for p in m.parameters()}
        assert flags == {name in trainable}, name
    assert all(p.requires_grad for p in backbone.fpn.parameters())
    # a frozen stage's mean-shift layers still measure (buffers untouched, state as built)
    shifts = [m for m in body.layer1.modules() if isinstance(m, MeanShiftBias)] + [body.bn1]
    assert shifts and all(m.measuring and int(m.count) == 0 for m in shifts)
    backbone.train()
    backbone(torch.randn(2, 3, 64, 64))
    assert all(int(m.count) == 1 for m in shifts)


def _fit_checkpoint(tmp_path, scheme, finished=True, **extra):
    """A checkpoint as ``rescale fit`` writes it: Lightning's dict, network weights under ``net.``."""
    net = rescale_core.create_model("resnet18", scheme=scheme, num_classes=10, **TINY)
    _perturb(net)
    if not finished:
        for m in net.modules():
            if isinstance(m, MeanShiftBias):
                m._count = 3
                m.count.fill_(3)
    state = {f"net.{k}": v for k, v in net.state_dict().items()}
    state.update(extra)
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": state, "hyper_parameters": {"network": "resnet18", "scheme": scheme},
                "epoch": 3, "global_step": 100}, path)
    return path, net


def test_checkpoint_brings_mean_shift_state_and_gains(tmp_path):
    path, net = _fit_checkpoint(tmp_path, "rescale")
    backbone = resnet_fpn_backbone("resnet18", "rescale", network_options=TINY, checkpoint=str(path))
    body, want = backbone.body, net.state_dict()
    for k, v in body.state_dict().items():
        torch.testing.assert_close(v, want[k], rtol=0, atol=0)
    shifts = [m for m in body.modules() if isinstance(m, MeanShiftBias)]
    assert shifts and all(int(m.count) == m.measure_batches and not m.measuring for m in shifts)
    # the first detection batches do not measure again
    mu0 = [m.mu0.clone() for m in shifts]
    backbone.train()
    backbone(torch.randn(2, 3, 64, 64))
    assert all(torch.equal(a, m.mu0) for a, m in zip(mu0, shifts))
    # unfinished measurement comes along as unfinished
    path, _ = _fit_checkpoint(tmp_path, "rescale", finished=False)
    body = resnet_fpn_backbone("resnet18", "rescale", network_options=TINY, checkpoint=str(path)).body
    assert all(int(m.count) == 3 and m.measuring for m in body.modules() if isinstance(m, MeanShiftBias))


def test_bn_checkpoint_gives_frozen_bn(tmp_path):
    path, net = _fit_checkpoint(tmp_path, "bn")
    backbone = resnet_fpn_backbone("resnet18", "bn", network_options=TINY, checkpoint=str(path))
    body = backbone.body
    assert not any(isinstance(m, nn.BatchNorm2d) for m in body.modules())
    frozen = [m for m in body.modules() if isinstance(m, FrozenBatchNorm2d)]
    assert len(frozen) == sum(isinstance(m, nn.BatchNorm2d) for m in net.modules())
    # FrozenBN computes what the checkpoint's BN computes in eval mode
    net.eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        _close(body(x)["3"], net.stage_outputs(x)[3])
    # from scratch: trainable BatchNorm2d; frozen_bn overrides either way
    scratch = resnet_fpn_backbone("resnet18", "bn", network_options=TINY).body
    assert any(isinstance(m, nn.BatchNorm2d) for m in scratch.modules())
    assert not any(isinstance(m, FrozenBatchNorm2d) for m in scratch.modules())
    trainable = resnet_fpn_backbone("resnet18", "bn", network_options=TINY, checkpoint=str(path), frozen_bn=False)
    assert any(isinstance(m, nn.BatchNorm2d) for m in trainable.body.modules())


def test_frozen_settings_without_a_checkpoint_are_warned(caplog):
    """FrozenBN and frozen stages are the ImageNet recipe's: without a backbone checkpoint they would
    keep BN at identity and random stages frozen, each said in one warning line naming its setting;
    the defaults say nothing, nor does frozen_bn on a network without BN."""
    from rescale_tasks.detection.module import DetectionModule

    tiny = dict(network="resnet18", network_options=TINY, detector="fasterrcnn", num_classes=3, fpn_channels=16)
    with caplog.at_level("WARNING", logger="rescale_tasks.detection.module"):
        DetectionModule(scheme="bn", **tiny)
        DetectionModule(scheme="rescale", frozen_bn=True, **tiny)
        assert not caplog.records
        DetectionModule(scheme="bn", frozen_bn=True, trainable_layers=3, **tiny)
    frozen_bn, frozen_stages = [r.getMessage() for r in caplog.records]
    assert frozen_bn.startswith("frozen_bn true without a backbone checkpoint") and "model.init_args.frozen_bn" in frozen_bn
    assert frozen_stages.startswith("trainable_layers 3 without a backbone checkpoint: the stages it freezes")


def test_checkpoint_mismatch_is_one_line(tmp_path):
    path, _ = _fit_checkpoint(tmp_path, "rescale")
    with pytest.raises(ConfigError) as err:
        resnet_fpn_backbone("resnet18", "fixup", network_options=TINY, checkpoint=str(path))
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "missing from the checkpoint" in msg
    path, _ = _fit_checkpoint(tmp_path, "rescale", **{"net.extra.weight": torch.zeros(1)})
    with pytest.raises(ConfigError, match="not in this network: extra.weight"):
        resnet_fpn_backbone("resnet18", "rescale", network_options=TINY, checkpoint=str(path))
    torch.save({"state_dict": {"model.w": torch.zeros(1)}}, tmp_path / "other.ckpt")
    with pytest.raises(ConfigError, match="no network weights"):
        resnet_fpn_backbone("resnet18", "rescale", network_options=TINY, checkpoint=str(tmp_path / "other.ckpt"))
