"""I3D inflation (Carreira & Zisserman 2017) of a 2D checkpoint into the video ResNets: on a video
of one frame repeated, the inflated network computes the 2D network's function; RescaleNet's
mean-shift state, gains and BN statistics carry over; a checkpoint of another network is
refused in one line."""
from __future__ import annotations

from dataclasses import replace

import lightning.pytorch as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import rescale_core
from rescale_core.models.resnet import VIDEO_RESNETS, ResNet
from rescale_core.testing import randomise_
from rescale_tasks.classification.module import ClassificationModule
from rescale_tasks.common.errors import ConfigError
from rescale_tasks.video.inflation import inflate_checkpoint, inflate_tensor

OPTIONS = {"bn": None, "rescale": {"measure_batches": 2}, "fixup": None}


def _trained_2d(scheme: str, arch: str = "resnet50", base_width: int = 8, num_classes: int = 5,
                seed: int = 0) -> torch.nn.Module:
    """A tiny 2D network after a few SGD steps (BN statistics and mean-shift ``mu0`` measured,
    Fixup's scalars and the gains moved off their init), in eval mode."""
    torch.manual_seed(seed)
    model = rescale_core.create_model(arch, scheme=scheme, base_width=base_width, num_classes=num_classes,
                                      scheme_options=OPTIONS.get(scheme))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(3):
        x = torch.randn(4, 3, 32, 32) + 0.5
        loss = torch.nn.functional.cross_entropy(model(x), torch.arange(4) % num_classes)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def _lightning_style(model: torch.nn.Module, **hparams) -> dict:
    return {"state_dict": {f"net.{k}": v for k, v in model.state_dict().items()}, "hyper_parameters": hparams}


def _repeat(frame: torch.Tensor, frames: int) -> torch.Tensor:
    return frame.unsqueeze(2).expand(-1, -1, frames, -1, -1).contiguous()


@pytest.mark.parametrize("scheme", ["bn", "rescale", "fixup", "nf", "nf_skipinit"])
def test_repeated_frame_video_gives_the_2d_logits(scheme):
    """The I3D property (NF-ResNets: each Scaled WS weight repeated undivided, its gain divided by
    ``sqrt(kt)``). Without temporal padding (every time kernel 1: no border effects) the
    whole clip's logits are the frame's; with SlowOnly's 3x1x1 convs (9 of them in res4/res5),
    the features of a frame 9 frames from both ends are the 2D features, and the head on them
    gives the 2D logits."""
    net2d = _trained_2d(scheme)
    if scheme.startswith("nf"):  # branches far from their init (NF's start at zero): the borders differ
        randomise_(net2d)
    frame = torch.randn(2, 3, 32, 32) + 0.3
    with torch.no_grad():
        want_logits, want_feats = net2d(frame), net2d.forward_features(frame)
    # no temporal padding: a 1x7x7 stem and 1x1x1 first convs everywhere (a C2D network)
    c2d = replace(VIDEO_RESNETS["slow_r50"], conv1_temporal=((1,),) * 4, widths=(8, 16, 32, 64), stem_width=8)
    torch.manual_seed(1)
    net3d = ResNet(c2d, scheme, scheme_options=OPTIONS.get(scheme), num_classes=5).eval()
    inflate_checkpoint(net3d, _lightning_style(net2d, network="resnet50", scheme=scheme))
    with torch.no_grad():
        torch.testing.assert_close(net3d(_repeat(frame, 4)), want_logits, rtol=1e-4, atol=1e-5)
    # SlowOnly itself: exact away from the clip's borders
    torch.manual_seed(1)
    slow = rescale_core.create_model("slow_r50", scheme=scheme, base_width=8, num_classes=5,
                                     scheme_options=OPTIONS.get(scheme)).eval()
    report = inflate_checkpoint(slow, _lightning_style(net2d, network="resnet50", scheme=scheme))
    assert report.reinitialised == [] and "layer3.0.conv1.weight" in report.loaded
    with torch.no_grad():
        feats = slow.forward_features(_repeat(frame, 19))
        torch.testing.assert_close(feats[:, :, 9], want_feats, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(slow.forward_head(feats[:, :, 9:10]), want_logits, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(feats[:, :, 0], feats[:, :, 9], atol=1e-4)  # the border differs: the test sees it


def test_weights_are_repeated_over_time_and_divided():
    net2d = _trained_2d("rescale")
    slow = rescale_core.create_model("slow_r50", scheme="rescale", base_width=8, num_classes=5,
                                     scheme_options={"measure_batches": 2})
    inflate_checkpoint(slow, _lightning_style(net2d))
    w2 = net2d.layer3[0].conv1.weight.detach()
    w3 = slow.layer3[0].conv1.weight.detach()
    assert w3.shape == w2.shape[:2] + (3,) + w2.shape[2:]
    for t in range(3):
        torch.testing.assert_close(w3[:, :, t], w2 / 3)
    torch.testing.assert_close(slow.conv1.weight[:, :, 0], net2d.conv1.weight)  # 1x7x7: kt = 1
    # mean-shift state: (1, C, 1, 1) -> (1, C, 1, 1, 1), the measurement stays finished
    for (name, a), b in zip(((n, m) for n, m in net2d.named_modules() if isinstance(m, rescale_core.MeanShiftBias)),
                            rescale_core.mean_shift_layers(slow)):
        assert b.mu0.shape == a.mu0.shape + (1,) and torch.equal(b.mu0[..., 0], a.mu0), name
        assert torch.equal(b.bias[..., 0], a.bias) and int(b.count) == int(a.count) == 2
        assert not b.measuring and b._count == 2
    torch.testing.assert_close(slow.layer4[2].merge.gain.weight, net2d.layer4[2].merge.gain.weight)
    assert inflate_tensor(torch.ones(4, 2, 3, 3), (4, 2, 3, 5, 5)) is None  # only time may be added
    assert inflate_tensor(torch.ones(8), (1, 8, 1, 1, 1)) is None


def test_scaled_ws_weights_standardize_to_the_2d_ones_repeated_and_divided():
    """A Scaled WS conv's raw weight is repeated undivided and its gain divided by ``sqrt(kt)``:
    the 3D standardized weight is the 2D one repeated over time and divided by ``kt``, exactly
    (float64; ``eps`` included); with ``kt = 1`` the gain is kept."""
    net2d = _trained_2d("nf").double()
    slow = rescale_core.create_model("slow_r50", scheme="nf", base_width=8, num_classes=5).double()
    inflate_checkpoint(slow, net2d.state_dict())
    conv2, conv3 = net2d.layer3[0].conv1, slow.layer3[0].conv1
    assert conv3.weight.shape[2] == 3
    torch.testing.assert_close(conv3.weight[:, :, 1], conv2.weight, rtol=0, atol=0)
    torch.testing.assert_close(conv3.gain, conv2.gain / 3 ** 0.5, rtol=1e-15, atol=0)
    w2, w3 = conv2.standardized_weight().detach(), conv3.standardized_weight().detach()
    for t in range(3):
        torch.testing.assert_close(w3[:, :, t], w2 / 3, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(slow.conv1.gain, net2d.conv1.gain, rtol=0, atol=0)  # 1x7x7: kt = 1


def test_classifier_kept_or_left_as_built():
    net2d = _trained_2d("bn")
    torch.manual_seed(5)
    other = rescale_core.create_model("slow_r50", scheme="bn", base_width=8, num_classes=7)
    built = other.fc.weight.detach().clone()
    report = inflate_checkpoint(other, _lightning_style(net2d))
    assert sorted(report.reinitialised) == ["fc.bias", "fc.weight"] and torch.equal(other.fc.weight, built)
    same = rescale_core.create_model("slow_r50", scheme="bn", base_width=8, num_classes=5)
    assert "fc.weight" in inflate_checkpoint(same, _lightning_style(net2d)).loaded
    torch.testing.assert_close(same.fc.weight, net2d.fc.weight)
    torch.manual_seed(5)
    fresh = rescale_core.create_model("slow_r50", scheme="bn", base_width=8, num_classes=5)
    built = fresh.fc.weight.detach().clone()
    inflate_checkpoint(fresh, _lightning_style(net2d), keep_classifier=False)
    assert torch.equal(fresh.fc.weight, built)
    torch.testing.assert_close(fresh.layer1[0].bn1.running_var, net2d.layer1[0].bn1.running_var)


def _one_line_error(model, checkpoint, *fragments):
    with pytest.raises(ConfigError) as err:
        inflate_checkpoint(model, checkpoint, network="slow_r50")
    message = str(err.value)
    assert "\n" not in message and "inflate_from" in message and "To fix" in message
    for fragment in fragments:
        assert fragment in message, message


def test_mismatching_checkpoints_are_refused_in_one_line():
    slow = rescale_core.create_model("slow_r50", scheme="rescale", base_width=8, num_classes=5)
    before = {k: v.clone() for k, v in slow.state_dict().items()}
    with torch.device("meta"):
        def net(arch, scheme, width=8):
            return rescale_core.create_model(arch, scheme=scheme, base_width=width, num_classes=5)
        other_depth, other_scheme = net("resnet18", "rescale"), net("resnet50", "bn")
        other_width = net("resnet50", "rescale", 16)
        same_keys = net("resnet50", "skipinit")
    _one_line_error(slow, _lightning_style(other_depth), "missing from the checkpoint",
                    "layer1.0.conv1.weight has shape (8, 8, 3, 3) in the checkpoint but (8, 8, 1, 1) here")
    _one_line_error(slow, _lightning_style(other_scheme), "missing from the checkpoint: bn1.mu0",
                    "not in this network: bn1.weight, bn1.running_mean")
    _one_line_error(slow, _lightning_style(other_width),
                    "has shape (16, 3, 7, 7) in the checkpoint but (8, 3, 7, 7) here")
    rezero = rescale_core.create_model("slow_r50", scheme="rezero", base_width=8, num_classes=5)
    _one_line_error(rezero, _lightning_style(same_keys, network="resnet50", scheme="skipinit"),
                    "scheme=skipinit", "scheme=rezero")
    _one_line_error(slow, {"state_dict": {"model.w": torch.zeros(1)}}, "net.*")
    after = slow.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing half-loaded


def test_rescale_fit_checkpoint_by_path(tmp_path):
    """A checkpoint written by Lightning for the classification module (``net.*``, hyper-
    parameters), read safely from disk, inflates into R3D-18; its measurement stays finished."""
    torch.manual_seed(0)
    module = ClassificationModule("resnet18", scheme="rescale", network_options={"base_width": 8},
                                  scheme_options={"measure_batches": 2}, num_classes=4)
    data = TensorDataset(torch.randn(8, 3, 32, 32), torch.arange(8) % 4)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(module, DataLoader(data, batch_size=4))
    path = tmp_path / "2d.ckpt"
    trainer.save_checkpoint(path)
    r3d = rescale_core.create_model("r3d_18", scheme="rescale", base_width=8, num_classes=4,
                                    scheme_options={"measure_batches": 2})
    report = inflate_checkpoint(r3d, str(path))
    assert report.reinitialised == [] and len(report.loaded) == len(r3d.state_dict())
    src = module.net
    torch.testing.assert_close(r3d.layer2[0].conv1.weight.sum(2), src.layer2[0].conv1.weight)
    assert all(not m.measuring and m._count == 2 for m in rescale_core.mean_shift_layers(r3d))
    torch.testing.assert_close(r3d.pool_shift.mu0.flatten(), src.pool_shift.mu0.flatten())
    with pytest.raises(ConfigError, match="scheme=rescale but this network uses scheme=bn"):
        inflate_checkpoint(rescale_core.create_model("r3d_18", scheme="bn", base_width=8, num_classes=4), path)


@pytest.mark.parametrize("arch2d, arch3d", [("resnet50", "i3d_r50"), ("resnet50", "r3d_50"),
                                            ("resnet18", "resnet3d_18")])
def test_every_video_resnet_has_its_2d_counterpart(arch2d, arch3d):
    """Same parameter names as the 2D network (I3D's temporal pool is a child of its own, not a
    member of ``layer2``): every entry inflates; the 5x7x7 / 3x7x7 stems sum back to the 2D stem."""
    net2d = _trained_2d("rescale", arch2d)
    net3d = rescale_core.create_model(arch3d, scheme="rescale", base_width=8, num_classes=5)
    report = inflate_checkpoint(net3d, _lightning_style(net2d, network=arch2d, scheme="rescale"))
    assert len(report.loaded) == len(net3d.state_dict()) and not report.reinitialised
    torch.testing.assert_close(net3d.conv1.weight.sum(2), net2d.conv1.weight)
