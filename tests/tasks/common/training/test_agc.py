"""``model.init_args.agc_clip`` (adaptive gradient clipping, ``rescale_core.agc``) of every task
module: the optimizer steps with the clipped gradients (timm's ``adaptive_clip_grad`` of the
gradients backward left, the output layer left alone unless ``agc_clip_classifier``), in fp32
with gradient accumulation, under bf16 autocast and under fp16 with a GradScaler (clipped after
unscaling, a fused optimizer's too); each task's output layers; a sharded strategy refused in
one line. The 2-process DDP run with AGC is in ``test_plans_and_compile.py``."""
from __future__ import annotations

import lightning.pytorch as L
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy
from timm.utils.agc import adaptive_clip_grad

from rescale_tasks.classification.data import DigitsDataModule
from rescale_tasks.classification.module import ClassificationModule
from rescale_tasks.common.errors import ConfigError
from rescale_tasks.common.training import check_agc_options
from rescale_tasks.detection.module import DetectionModule
from rescale_tasks.translation.module import TranslationModule
from rescale_tasks.video.module import VideoClassificationModule


class StepGradients(L.Callback):
    """Every optimizer step's weights and gradients as backward left them (this callback's
    ``on_before_optimizer_step`` runs before the module's clipping hook), and the gradients the
    optimizer stepped with (a step post-hook: the update is done, the gradients not yet zeroed)."""

    def __init__(self) -> None:
        self.weights: list[dict] = []
        self.raw: list[dict] = []
        self.scales: list[float] = []  # fp16 AMP's loss scale at each step (1 without a GradScaler)
        self.stepped: dict[int, dict] = {}  # by step: a GradScaler skips the step of non-finite gradients

    @staticmethod
    def grads(module) -> dict:
        return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}

    def on_train_start(self, trainer, pl_module) -> None:
        trainer.optimizers[0].register_step_post_hook(
            lambda *_: self.stepped.setdefault(len(self.raw) - 1, self.grads(pl_module)))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.weights.append({n: p.detach().clone() for n, p in pl_module.named_parameters()})
        self.raw.append(self.grads(pl_module))
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        self.scales.append(1.0 if scaler is None else scaler.get_scale())


def fit(steps: int = 2, plugins=None, accumulate: int = 1, precision="32-true", fused: bool = False,
        **module_args):
    torch.manual_seed(0)
    module = ClassificationModule("cifar_resnet", scheme="skipinit", num_classes=10, in_channels=1,
                                  network_options={"depth": 8, "base_width": 8},
                                  optimizer=lambda p: torch.optim.SGD(p, lr=0.1, fused=fused), **module_args)
    record = StepGradients()
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0,
                        enable_model_summary=False, callbacks=[record], plugins=plugins,
                        precision=None if plugins else precision, accumulate_grad_batches=accumulate)
    trainer.fit(module, DigitsDataModule(batch_size=32))
    return module, record


def timm_agc(grads: dict, weights: dict, clip: float, skip: tuple[str, ...]) -> dict:
    """timm's AGC of ``grads`` against ``weights`` (by name), but for the names starting with ``skip``."""
    out = {}
    for name, g in grads.items():
        p = torch.nn.Parameter(weights[name].clone())
        p.grad = g.clone()
        if not name.startswith(skip):
            adaptive_clip_grad([p], clip_factor=clip, eps=1e-3)
        out[name] = p.grad
    return out


@pytest.mark.parametrize("setting", ["fp32, accumulating 2 batches", "bf16-mixed", "fp16 with a GradScaler",
                                     "classifier clipped too"])
def test_the_optimizer_steps_with_clipped_gradients(setting):
    kwargs = {"fp32, accumulating 2 batches": {"accumulate": 2}, "bf16-mixed": {"precision": "bf16-mixed"},
              "fp16 with a GradScaler": {"plugins": [MixedPrecision("16-mixed", "cpu")]},
              "classifier clipped too": {"agc_clip_classifier": True}}[setting]
    module, record = fit(steps=2, agc_clip=0.01, **kwargs)
    assert len(record.raw) == 2 and record.stepped
    skip = () if setting == "classifier clipped too" else ("net.fc.",)
    for step, stepped in record.stepped.items():
        raw = record.raw[step]
        want = timm_agc(raw, record.weights[step], 0.01, skip)
        for name, g in stepped.items():
            torch.testing.assert_close(g, want[name], rtol=1e-5, atol=1e-9, msg=name)
    clipped = sum(not torch.equal(g, raw[name]) for name, g in stepped.items())
    assert 0 < clipped < len(stepped)
    assert torch.equal(stepped["net.fc.weight"], raw["net.fc.weight"]) == (setting != "classifier clipped too")
    if setting == "fp16 with a GradScaler":  # the raw gradients were unscaled before the hooks saw them
        assert module.trainer.precision_plugin.scaler.get_scale() > 1
        assert max(g.abs().max().item() for g in raw.values()) < 100


def test_a_fused_optimizer_under_fp16_steps_with_the_unscaled_gradients_clipped():
    """A fused optimizer unscales in its own step, so Lightning leaves the gradients scaled for the
    clipping hook: AGC clips them at lambda x the scale, and the step takes AGC of the true
    gradients (AGC at lambda of the scaled ones left every clipped unit 65536 times too small)."""
    module, record = fit(steps=2, agc_clip=0.01, fused=True, plugins=[MixedPrecision("16-mixed", "cpu")])
    assert record.stepped and all(scale > 1 for scale in record.scales)
    for step, stepped in record.stepped.items():  # the fused step unscaled the gradients in place
        unscaled = {n: g / record.scales[step] for n, g in record.raw[step].items()}
        want = timm_agc(unscaled, record.weights[step], 0.01, ("net.fc.",))
        for name, g in stepped.items():
            torch.testing.assert_close(g, want[name], rtol=1e-5, atol=1e-9, msg=name)
        assert sum(not torch.equal(g, unscaled[name]) for name, g in stepped.items()) > 0


def test_without_agc_the_gradients_are_backwards():
    _, record = fit(steps=1)
    assert record.raw and all(torch.equal(record.stepped[0][n], g) for n, g in record.raw[0].items())


@pytest.mark.parametrize("make,names", [
    (lambda: ClassificationModule("resnet18", "skipinit", network_options={"base_width": 4}, num_classes=3),
     {"net.fc"}),
    (lambda: ClassificationModule("vgg11", "rescale", network_options={"base_width": 4, "hidden_dim": 8},
                                  num_classes=3), {"net.classifier.9"}),  # after a mean-shift bias
    (lambda: VideoClassificationModule("r3d_18", "rescale", network_options={"base_width": 4}, num_classes=3),
     {"net.fc"}),
    (lambda: TranslationModule("transformer_tiny", "rescale", vocab_size=40), {"net.output_projection"}),
    (lambda: DetectionModule("resnet18", "rescale", network_options={"base_width": 8}, num_classes=3,
                             backbone_checkpoint=None),
     {"net.rpn.head.cls_logits", "net.rpn.head.bbox_pred", "net.roi_heads.box_predictor.cls_score",
      "net.roi_heads.box_predictor.bbox_pred", "net.roi_heads.mask_predictor.mask_fcn_logits"}),
    (lambda: DetectionModule("resnet18", "rescale", network_options={"base_width": 8}, num_classes=3,
                             detector="retinanet", backbone_checkpoint=None),
     {"net.head.classification_head.cls_logits", "net.head.regression_head.bbox_reg"}),
], ids=["resnet", "vgg", "video", "translation", "maskrcnn", "retinanet"])
def test_each_task_names_its_output_layers(make, names):
    module = make()
    found = {f"net.{n}" for n, m in module.net.named_modules() if any(m is o for o in module.output_layers())}
    assert found == names


def test_a_sharded_strategy_is_refused_and_ddp_is_not():
    with pytest.raises(ConfigError, match=r"^model.init_args.agc_clip: adaptive gradient clipping needs whole "
                                          r"parameters on every rank, and FSDPStrategy shards them"):
        ClassificationModule._check_agc_strategy(FSDPStrategy())
    ClassificationModule._check_agc_strategy(DDPStrategy())
    ClassificationModule._check_agc_strategy(SingleDeviceStrategy("cpu"))


@pytest.mark.parametrize("clip,eps,key", [(0, 1e-3, "agc_clip"), (-0.01, 1e-3, "agc_clip"),
                                          (float("nan"), 1e-3, "agc_clip"), (True, 1e-3, "agc_clip"),
                                          (0.01, 0, "agc_eps"), (None, -1.0, "agc_eps")])
def test_a_bad_value_is_one_line_naming_its_key(clip, eps, key):
    with pytest.raises(ConfigError, match=rf"^bad value for model.init_args.{key}: .* \(a positive number: "):
        check_agc_options(clip, eps)
    check_agc_options(None)
    check_agc_options(0.01, 1e-3)
