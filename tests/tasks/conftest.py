"""What the task tests share: the smallest real run config (a depth-8 CIFAR ResNet on the embedded
digits, two steps, on the CPU), written as YAML with per-test overrides."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

TINY_RUN: dict[str, Any] = {
    "model": {
        "class_path": "rescale_tasks.classification.module.ClassificationModule",
        "init_args": {"network": "cifar_resnet", "scheme": "rescale",
                      "network_options": {"depth": 8, "base_width": 8}},
    },
    "data": {"class_path": "rescale_tasks.classification.data.DigitsDataModule",
             "init_args": {"batch_size": 64}},
    "trainer": {"max_epochs": 1, "limit_train_batches": 2, "limit_val_batches": 1, "accelerator": "cpu",
                "devices": 1, "enable_progress_bar": False, "enable_model_summary": False, "logger": False},
}


def merged(base: dict, overrides: dict) -> dict:
    """``base`` with ``overrides`` merged in (nested mappings merged, anything else replaced;
    a value of ``None`` removes the key)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def write_run_config(path: Path, **overrides: Any) -> str:
    """Write :data:`TINY_RUN` with ``overrides`` (top-level sections) to ``path``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(merged(TINY_RUN, overrides), sort_keys=False))
    return str(path)


@pytest.fixture(scope="session")
def run_config():
    """``run_config(path, model={"init_args": {...}}, trainer={...}) -> str``: see :func:`write_run_config`."""
    return write_run_config


def wandb_logger(project: str, name: str, save_dir: str = "runs", **extra: Any) -> dict:
    """The trainer's ``logger`` section for an offline W&B run of the suite."""
    return {"class_path": "rescale_tasks.common.wandb_logger.SuiteWandbLogger",
            "init_args": {"project": project, "name": name, "save_dir": str(save_dir), **extra}}


@pytest.fixture(scope="session")
def suite_wandb_logger():
    return wandb_logger


@pytest.fixture
def error_line(capsys):
    """``error_line()``: asserts stderr holds exactly one non-empty line, an ``error: ...`` line
    without traceback or usage dump, and returns its message (without ``error: ``)."""
    def read() -> str:
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, err
        assert lines[0].startswith("error: ") and "Traceback" not in err and "usage:" not in err, err
        return lines[0][len("error: "):]
    return read


@pytest.fixture
def classification_checkpoint(tmp_path):
    """``make(network, **options) -> (net, path)``: a 2D network whose RescaleNet mean-shift means are
    random and finished measuring, saved as ``rescale fit`` saves it (``state_dict`` of ``net.*``),
    the starting point the detection backbones and the video inflation load."""
    import torch

    from rescale_core import create_model
    from rescale_core.layers import MeanShiftBias

    def make(network: str, **options: Any):
        net = create_model(network, **options)
        for m in net.modules():
            if isinstance(m, MeanShiftBias):
                m.mu0.normal_()
                m.finish_measuring()
        path = tmp_path / f"{network}.ckpt"
        torch.save({"state_dict": {f"net.{k}": v for k, v in net.state_dict().items()}}, path)
        return net, path

    return make


@pytest.fixture
def rescale_processes():
    """``run(args, devices) -> CompletedProcess``: the ``rescale`` command in a fresh Python
    process on ``devices`` CPU processes (``ddp`` over gloo when more than one; one thread each),
    for tests comparing a multi-process run with a single-process one."""
    import os
    import subprocess
    import sys

    def run(args: list[str], devices: int = 1) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "rescale_tasks.cli", *args, "--trainer.devices", str(devices)]
        if devices > 1:
            command += ["--trainer.strategy", "ddp"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    return run


@pytest.fixture
def fit_then_validate():
    """``run(module, data, steps) -> metrics``: ``steps`` training steps on the CPU (seed 0, no
    logger, checkpoint or validation while training), then one validation; for the tests that
    show a task's model learns its few samples."""
    import lightning.pytorch as L

    def run(module, data, steps: int) -> dict:
        L.seed_everything(0)
        trainer = L.Trainer(max_steps=steps, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                            accelerator="cpu", num_sanity_val_steps=0, check_val_every_n_epoch=1000)
        trainer.fit(module, data)
        return trainer.validate(module, data, verbose=False)[0]

    return run
