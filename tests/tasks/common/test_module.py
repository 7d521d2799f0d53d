"""The shared task module: what every task's LightningModule inherits."""
from __future__ import annotations

import functools

import pytest
import torch

from rescale_tasks.common.errors import ConfigError
from rescale_tasks.common.module import RescaleTaskModule, accepts
from rescale_tasks.common.training import WarmupCosineLR


def tiny(**kwargs) -> RescaleTaskModule:
    return RescaleTaskModule("cifar_resnet", scheme="rescale", network_options={"depth": 8, "base_width": 8},
                             network_kwargs={"num_classes": 3, "in_channels": 1}, **kwargs)


def test_the_network_is_built_by_name_with_the_tasks_sizes():
    module = tiny()
    assert module.scheme_name == "rescale" and module.net.fc.out_features == 3
    x = torch.randn(2, 1, 8, 8)
    (inputs,) = module.network_inputs((x, torch.zeros(2)))
    assert inputs is x and module.net(inputs).shape == (2, 3)


def test_channels_last_reaches_the_inputs():
    module = tiny(channels_last=True)
    (inputs,) = module.network_inputs((torch.randn(2, 1, 8, 8),))
    assert inputs.is_contiguous(memory_format=torch.channels_last)


def test_a_module_without_an_optimizer_says_so():
    """Every task trains with SGD unless told otherwise (``default_sgd``); ``optimizer: null``
    leaves a module without one, which says so when training starts."""
    with pytest.raises(ConfigError, match="has no optimizer: set model.init_args.optimizer"):
        tiny(optimizer=None).configure_optimizers()


def test_accepts_sees_through_jsonargparse_partials():
    assert accepts(functools.partial(WarmupCosineLR, warmup_epochs=1), "steps_per_epoch")
    assert not accepts(functools.partial(torch.optim.lr_scheduler.StepLR, step_size=3), "steps_per_epoch")


def test_max_steps_does_not_squeeze_the_epochs_of_the_schedule(tmp_path):
    """A run cut short by ``max_steps`` keeps the schedule of its epochs: 8 batches an epoch and a
    1-epoch warm-up reach the base rate after 8 steps, whatever ``max_steps`` says (a schedule
    taking ``max_steps / max_epochs`` as an epoch would end the warm-up after one step here)."""
    import lightning.pytorch as L
    from torch.utils.data import DataLoader, TensorDataset

    class Probe(RescaleTaskModule):
        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).logsumexp(1).mean()

    module = Probe("cifar_resnet", scheme="rescale", network_options={"depth": 8, "base_width": 8},
                   network_kwargs={"num_classes": 3, "in_channels": 1},
                   optimizer=functools.partial(torch.optim.SGD, lr=0.8),
                   lr_scheduler=functools.partial(WarmupCosineLR, warmup_epochs=1))
    data = DataLoader(TensorDataset(torch.randn(16, 1, 8, 8)), batch_size=2)
    trainer = L.Trainer(max_epochs=20, max_steps=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, data)
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.steps_per_epoch == 8
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.8 * 4 / 8)  # warm-up: 4th step of 8


def test_fullgraph_before_a_rescalenet_has_measured_is_one_line_before_compiling(tmp_path, monkeypatch, run_config,
                                                                                 error_line):
    """``compile_options: {fullgraph: true}`` on a RescaleNet whose first steps measure: one error
    line saying why and what to do, before dynamo compiles (it raised its ``Unsupported`` with a
    page of traceback at the first step); a network without mean-shift layers is not refused."""
    from rescale_tasks.cli import main

    monkeypatch.chdir(tmp_path)
    fullgraph = ["--model.init_args.compile", "true", "--model.init_args.compile_options", "{fullgraph: true}"]
    config = run_config(tmp_path / "run.yaml", model={"init_args": {"scheme_options": {"measure_batches": 2}}})
    assert main(["fit", "--config", config, *fullgraph]) == 2
    line = error_line()
    assert line.startswith("model.init_args.compile_options fullgraph: true cannot compile this run's first steps")
    assert "Drop fullgraph" in line and "--ckpt_path" in line
    module = RescaleTaskModule("cifar_resnet", scheme="bn", network_options={"depth": 8, "base_width": 8},
                               network_kwargs={"num_classes": 3, "in_channels": 1}, compile=True,
                               compile_options={"fullgraph": True})
    module._refuse_fullgraph_while_measuring()  # nothing measures: no refusal


def test_a_resume_on_other_data_is_refused_unless_asked(tmp_path, monkeypatch, run_config, fit_checkpoint, error_line,
                                                        caplog):
    """Every checkpoint records which data its run read; ``fit --ckpt_path`` on other data (here another
    split of the digits) is refused in one line naming both, leaving the checkpoint as it was, unless
    ``--resume_other_data true``; evaluating it on other data, and resuming a checkpoint written
    before checkpoints carried a fingerprint, go on."""
    import logging

    from rescale_tasks.cli import main

    config = run_config(tmp_path / "run.yaml")
    ckpt = fit_checkpoint(tmp_path, ["--config", config])
    saved = torch.load(ckpt, weights_only=True)
    assert saved["data_fingerprint"]["splits"]["train"]["count"] == 1257
    before = ckpt.read_bytes()
    monkeypatch.chdir(tmp_path)
    other = ["--data.init_args.val_fraction", "0.3"]
    resume = ["fit", "--config", config, "--trainer.max_epochs", "2", *other]
    assert main([*resume, "--ckpt_path", str(ckpt)]) != 0
    message = error_line()
    assert "was trained on other data than this run reads (DigitsDataModule[" in message, message
    assert "train 1257 #" in message and "train 988 #" in message and "--resume_other_data true" in message, message
    assert ckpt.read_bytes() == before

    assert main(["validate", "--config", config, *other, "--ckpt_path", str(ckpt)]) == 0

    with caplog.at_level(logging.INFO):
        assert main([*resume, "--ckpt_path", str(ckpt), "--resume_other_data", "true"]) == 0
    assert "resuming on this run's data (--resume_other_data)" in caplog.text

    old = tmp_path / "old.ckpt"
    torch.save({k: v for k, v in saved.items() if k != "data_fingerprint"}, old)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert main([*resume, "--ckpt_path", str(old)]) == 0
    assert "records no data fingerprint" in caplog.text


def test_a_torch_scheduler_given_by_class_path_steps_every_epoch(tmp_path, run_config, monkeypatch):
    """jsonargparse's factory of ``torch.optim.lr_scheduler.StepLR`` wraps the class in a generic
    ``**kwargs`` function: it is still a plain torch schedule (no ``steps_per_epoch``, which StepLR
    refused with a TypeError), stepped once per epoch."""
    from rescale_tasks.cli import main

    monkeypatch.chdir(tmp_path)
    config = run_config(tmp_path / "run.yaml", trainer={"max_epochs": 2, "limit_val_batches": 0, "logger": False})
    assert main(["fit", "--config", config, "--trainer.default_root_dir", str(tmp_path),
                 "--model.init_args.lr_scheduler", "torch.optim.lr_scheduler.StepLR",
                 "--model.init_args.lr_scheduler.init_args.step_size", "1",
                 "--model.init_args.lr_scheduler.init_args.gamma", "0.5"]) == 0
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    [schedule] = checkpoint["lr_schedulers"]
    initial = checkpoint["optimizer_states"][0]["param_groups"][0]["initial_lr"]
    assert schedule["last_epoch"] == 2 and schedule["_last_lr"][0] == pytest.approx(initial * 0.25)
