"""WeightEMA, the average of the weights of the official NF code: a depth-8 NF-ResNet on 32 of
scikit-learn's embedded digits, 6 optimizer steps of 2 accumulated batches, a validation after
step 4 (the averaged weights are what it evaluates); the average equals the official formula
computed by hand from the weights after each step, and a run resumed from its step-3 checkpoint
ends with the same average and training weights, to the bit, as the uninterrupted run."""
from __future__ import annotations

import functools
import subprocess
import sys

import lightning.pytorch as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from rescale_tasks.classification.module import ClassificationModule
from rescale_tasks.common.checkpoints.averaging import average_checkpoints
from rescale_tasks.common.errors import ConfigError
from rescale_tasks.common.training import WeightEMA, ema_decay_at

DECAY = 0.3  # the warm-up's (1 + t) / (10 + t) below it for t = 0-2, above from t = 3: both are taken


def _digits() -> TensorDataset:
    digits = load_digits()
    images = torch.tensor(digits.images[:32], dtype=torch.float32).unsqueeze(1) / 16.0
    return TensorDataset(images, torch.tensor(digits.target[:32]))


def _module() -> ClassificationModule:
    L.seed_everything(0)
    return ClassificationModule("cifar_resnet", "nf", network_options={"depth": 8, "base_width": 4}, num_classes=10, in_channels=1,
                                optimizer=lambda p: torch.optim.SGD(p, lr=0.2, momentum=0.9))


class _Weights(L.Callback):
    """The training weights after each optimizer step, and the weights each validation sees."""

    def __init__(self) -> None:
        self.after_step: dict[int, dict] = {}
        self.validated: list[tuple[int, dict]] = []

    def on_train_start(self, trainer, pl_module) -> None:
        self.after_step[0] = _copy(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.after_step.setdefault(trainer.global_step, _copy(pl_module))

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.validated.append((trainer.global_step, _copy(pl_module)))

    def on_validation_batch_end(self, trainer, pl_module, *args) -> None:
        # a checkpoint written inside a validation, as a stop signal there writes last.ckpt
        trainer.save_checkpoint(trainer.default_root_dir + "/in_validation.ckpt")


def _copy(module) -> dict:
    return {k: v.detach().clone() for k, v in module.net.state_dict().items()}


def _fit(tmp_path, callbacks, max_steps: int, ckpt_path=None, shuffle: bool = True) -> L.Trainer:
    data = _digits()
    trainer = L.Trainer(max_steps=max_steps, accumulate_grad_batches=2, accelerator="cpu", devices=1,
                        logger=False, callbacks=callbacks, default_root_dir=str(tmp_path), enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=1,
                        val_check_interval=8, deterministic=True)
    L.seed_everything(1)
    trainer.fit(_module(), DataLoader(data, batch_size=4, shuffle=shuffle), DataLoader(data, batch_size=8),
                ckpt_path=ckpt_path)
    return trainer


def _hand_average(after_step: dict, steps: int) -> dict:
    """The official code's tf1_ema over the weights after steps 1..steps, from the initial ones."""
    ema = {k: v.double() for k, v in after_step[0].items()}
    for t in range(steps):  # t: the optimizer step's 0-based index, as the official global_step
        d = min(DECAY, (1.0 + t) / (10.0 + t))
        ema = {k: d * ema[k] + (1 - d) * after_step[t + 1][k].double() for k in ema}
    return ema


def test_average_follows_the_official_formula_and_validation_sees_it(tmp_path):
    weights = _Weights()
    trainer = _fit(tmp_path, [WeightEMA(decay=DECAY), weights], max_steps=6)
    assert sorted(weights.after_step) == list(range(7))
    assert ema_decay_at(2, DECAY) == 0.25 and ema_decay_at(3, DECAY) == DECAY == ema_decay_at(0, DECAY, warmup=False)
    # validation after step 4 evaluated the average of steps 1-4, the training weights are back after it
    ((step, seen),) = weights.validated
    assert step == 4
    expected = _hand_average(weights.after_step, 4)
    for key, value in expected.items():
        torch.testing.assert_close(seen[key].double(), value, rtol=1e-5, atol=1e-6, msg=key)
    moved = [k for k in expected if not torch.allclose(weights.after_step[4][k].double(), expected[k], atol=1e-4)]
    assert moved  # the average differs from the training weights
    # a checkpoint written inside the validation holds the average and the training weights in their places
    saved = torch.load(tmp_path / "in_validation.ckpt", weights_only=True)
    for key, value in expected.items():
        torch.testing.assert_close(saved["state_dict"]["net." + key].double(), value, rtol=1e-5, atol=1e-6, msg=key)
        assert torch.equal(saved["current_model_state"]["net." + key], weights.after_step[4][key]), key
    # when fit ends the module holds the average of the 6 steps
    final = _hand_average(weights.after_step, 6)
    for key, value in _copy(trainer.lightning_module).items():
        torch.testing.assert_close(value.double(), final[key], rtol=1e-5, atol=1e-6, msg=key)


def test_resume_continues_the_average_to_the_bit(tmp_path):
    """Resumed at the end of the first epoch (4 steps; a plain loader in order, which resumes
    there exactly), with a validation before and after."""
    def saver(folder):
        return ModelCheckpoint(dirpath=folder, every_n_train_steps=4, save_top_k=-1, filename="{step}")

    _fit(tmp_path / "whole", [WeightEMA(decay=DECAY), saver(tmp_path / "a")], max_steps=8, shuffle=False)
    mid = torch.load(tmp_path / "a" / "step=4.ckpt", weights_only=True)
    assert mid["averaging_state"]["n_averaged"] == 5  # the initial weights and 4 steps
    assert mid["callbacks"]["WeightEMA"]["latest_update_step"] == 4
    _fit(tmp_path / "resumed", [WeightEMA(decay=DECAY), saver(tmp_path / "b")], max_steps=8, shuffle=False,
         ckpt_path=str(tmp_path / "a" / "step=4.ckpt"))
    a, b = (torch.load(tmp_path / f / "step=8.ckpt", weights_only=True) for f in "ab")
    assert a["global_step"] == b["global_step"] == 8
    for part in ("state_dict", "current_model_state"):  # the average, the training weights
        assert a[part].keys() == b[part].keys()
        for key, value in a[part].items():
            assert torch.equal(value, b[part][key]), (part, key)
    assert not torch.equal(a["state_dict"]["net.fc.weight"], a["current_model_state"]["net.fc.weight"])
    # average-checkpoints averages the averaged weights, and keeps no training weights beside them
    out = average_checkpoints([str(tmp_path / "a" / "step=4.ckpt"), str(tmp_path / "a" / "step=8.ckpt")])
    torch.testing.assert_close(out["state_dict"]["net.fc.weight"],
                               (mid["state_dict"]["net.fc.weight"] + a["state_dict"]["net.fc.weight"]) / 2)
    assert "current_model_state" not in out and "averaging_state" not in out


def test_resuming_an_averaged_checkpoint_without_the_average_is_refused(tmp_path):
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1, filename="{step}")
    _fit(tmp_path / "first", [WeightEMA(decay=DECAY), saver], max_steps=2)
    with pytest.raises(ConfigError, match=r"ema\.decay 0\.3.*resume it with the same --ema\.decay"):
        _fit(tmp_path / "again", [WeightEMA()], max_steps=4, ckpt_path=str(tmp_path / "ckpt" / "step=2.ckpt"))


def test_a_decay_outside_0_1_is_one_line():
    with pytest.raises(ConfigError, match="ema.decay must be between 0 and 1"):
        WeightEMA(decay=1.0)


class _Line(L.LightningModule):
    """One weight, trained in the Trainer's precision: each step lowers it by lr x 1."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1, bias=False)
        torch.nn.init.constant_(self.lin.weight, 1.0)

    def training_step(self, batch, batch_idx):
        return self.lin(batch[0]).mean() / 4

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_a_half_precision_module_is_averaged_in_float32(tmp_path):
    """Under bf16-true the module's weights are bfloat16 after setup, the average's float32: the
    average follows the weights' bfloat16 values exactly in float32 (it crashed on the dtypes)."""
    weights, ema = [], WeightEMA(decay=0.5, warmup=False)

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args) -> None:
            weights.append(pl_module.lin.weight.detach().float().clone())

    trainer = L.Trainer(max_steps=5, precision="bf16-true", accelerator="cpu", devices=1, logger=False,
                        callbacks=[Record(), ema], enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.fit(_Line(), DataLoader(TensorDataset(torch.ones(8, 4)), batch_size=1))
    average = ema._average_model.module.lin.weight
    assert average.dtype == torch.float32
    expected = torch.ones(1, 4)
    for w in weights:
        expected = 0.5 * expected + 0.5 * w
    assert torch.equal(average.detach(), expected)
    assert weights[-1][0, 0] < 0.95  # it trained


def test_the_average_copies_the_module_not_what_its_optimizer_factory_reaches(tmp_path):
    """The CLI's optimizer factory reaches its parser and through it the Trainer; under DDP started
    by Lightning's launcher (``--trainer.devices 2 --trainer.strategy ddp`` from the command line)
    the Trainer holds the handles of the processes it started, which cannot be copied (the average
    crashed at setup, a TypeError about a lock): the average is a copy of the module's weights."""
    with subprocess.Popen([sys.executable, "-c", "pass"]) as process:  # a handle Python cannot copy
        factory = functools.partial(_sgd, process)
        L.seed_everything(0)
        module = ClassificationModule("cifar_resnet", "nf", network_options={"depth": 8, "base_width": 4},
                                      num_classes=10, in_channels=1, optimizer=factory)
        ema = WeightEMA(decay=0.5)
        trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, callbacks=[ema],
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            limit_val_batches=0, default_root_dir=str(tmp_path))
        trainer.fit(module, DataLoader(_digits(), batch_size=8))
    assert module.optimizer_factory is factory and trainer.global_step == 2
    assert ema._average_model.n_averaged == 3  # the initial weights and 2 steps


def _sgd(process, params):
    return torch.optim.SGD(params, lr=0.1)


@pytest.mark.parametrize("device, expected", [
    ("foo", r"^ema\.device 'foo' is not a device: give cpu"),
    ("cuda", r"^ema\.device cuda: this run trains on cpu; the average lives on cpu"),
])
def test_a_device_the_run_cannot_hold_the_average_on_is_one_line(tmp_path, device, expected):
    """A misspelt ema.device, or an accelerator the run does not train on, is one line, not a
    traceback from torch (at setup, for a device this machine lacks: no NVIDIA driver)."""
    with pytest.raises(ConfigError, match=expected):
        _fit(tmp_path, [WeightEMA(decay=DECAY, device=device)], max_steps=1)
