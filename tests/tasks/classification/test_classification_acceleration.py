"""``model.channels_last`` and ``model.compile`` of the classification module: the same function
as the plain module, and a real compiled channels_last run through the CLI whose checkpoint
loads into a plain module."""
from __future__ import annotations

import glob

import pytest
import torch

from rescale_tasks.classification.module import ClassificationModule
from rescale_tasks.cli import main


def _module(**kw) -> ClassificationModule:
    torch.manual_seed(0)
    return ClassificationModule("cifar_resnet", scheme="rescale", num_classes=10,
                                network_options={"depth": 8, "base_width": 8},
                                scheme_options={"measure_batches": 1}, **kw)


def test_channels_last_module_computes_the_same_function():
    plain, fast = _module(), _module(channels_last=True)
    fast.load_state_dict(plain.state_dict())  # loads into the channels_last layout
    assert fast.net.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    x, y = torch.randn(8, 3, 32, 32), torch.arange(8) % 10
    for step in range(2):  # a measuring step, then an ordinary one
        losses = []
        for module in (plain, fast):
            module.train()
            loss = torch.nn.functional.cross_entropy(module(x), y)
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=1e-5)
        for (name, a), b in zip(plain.named_parameters(), fast.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-5, msg=name)
            a.grad = b.grad = None


@pytest.mark.slow
def test_compiled_channels_last_run_through_the_cli(tmp_path, run_config, monkeypatch):
    """``rescale fit`` with both switches on and bf16 autocast (real inductor on the CPU): the run
    trains past the measuring steps, and its checkpoint has the plain module's keys and loads
    into one."""
    monkeypatch.chdir(tmp_path)
    torch._dynamo.reset()
    config = run_config(tmp_path / "fast.yaml",
                        model={"init_args": {"channels_last": True, "compile": True,
                                             "scheme_options": {"measure_batches": 1}}},
                        trainer={"limit_train_batches": 3, "default_root_dir": str(tmp_path / "out"),
                                 "precision": "bf16-mixed",
                                 "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                                            "init_args": {"save_dir": str(tmp_path / "out")}}})
    from torch._dynamo.utils import counters

    counters.clear()
    assert main(["fit", "--config", config]) == 0
    assert counters["stats"]["unique_graphs"] >= 1  # the network really ran compiled
    ckpts = glob.glob(str(tmp_path / "out" / "**" / "*.ckpt"), recursive=True)
    assert ckpts
    ckpt = torch.load(ckpts[0], map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 3
    state = ckpt["state_dict"]
    plain = _module(in_channels=1)  # the digits are grey
    assert set(state) == set(plain.state_dict())
    plain.load_state_dict(state)
    assert all(torch.isfinite(p).all() for p in plain.parameters())
    torch._dynamo.reset()


def test_mixed_precision_fit(fit_at_precision, precision_run, run_config, tmp_path, monkeypatch):
    """A channels_last RescaleNet trained past its measuring step under autocast (bf16; on a GPU also
    fp16 with gradient scaling), eager and compiled: finite losses, validation and weights; the
    NF-ResNet with AGC eager."""
    monkeypatch.chdir(tmp_path)
    config = run_config(tmp_path / "run.yaml",
                        model={"init_args": {"channels_last": True, "scheme_options": {"measure_batches": 1}}},
                        trainer={"limit_train_batches": 3, "limit_val_batches": 1})
    fit_at_precision(["--config", config], steps=3)
    if not precision_run.compiled:
        fit_at_precision(["--config", config, "--model.init_args.scheme", "nf", "--model.init_args.scheme_options",
                          "{}", "--model.init_args.agc_clip", "0.01"], steps=3, name="nf-agc")
