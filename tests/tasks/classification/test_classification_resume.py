"""A run killed mid-epoch (SIGTERM or SIGKILL) resumes and ends exactly like an uninterrupted one.

Real processes of the `rescale` command, real signals, CIFAR pickles with random augmentation in
a worker process, dropout and mixup (so every random stream matters), the mean-shift measuring
phase spanning the kill, a warm-up + cosine schedule, offline W&B runs.
"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import forked
from wandb_runs import find_offline_runs, read_offline_run

pytestmark = [pytest.mark.slow]



@pytest.fixture(scope="module")
def cifar(tmp_path_factory, data_writers):
    root = tmp_path_factory.mktemp("cifar")
    data_writers.cifar(root, n_per_file=16, n_test=16)  # 80 training images: 10 steps/epoch
    return root


def _config(run_config, folder: Path, root: Path, name: str) -> str:
    """3 epochs x 10 steps on CIFAR pickles, with every random stream in play; a checkpoint
    every 2 steps (progress markers for the tests) and ``last.ckpt`` every 2 steps."""
    return run_config(
        folder / "run.yaml", seed_everything=7,
        model={"init_args": {
            "scheme_options": {"measure_batches": 6, "conv_dropout": 0.1}, "mixup_alpha": 0.2,
            "optimizer": {"class_path": "torch.optim.SGD",
                          "init_args": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0005}},
            "lr_scheduler": {"class_path": "rescale_tasks.common.training.WarmupCosineLR",
                             "init_args": {"warmup_epochs": 1}}}},
        data={"class_path": "rescale_tasks.classification.data.CIFARDataModule",
              "init_args": {"root": str(root), "batch_size": 8, "num_workers": 1, "persistent_workers": False,
                            "pin_memory": False}},
        trainer={"max_epochs": 3, "limit_train_batches": None, "limit_val_batches": None, "deterministic": True,
                 "log_every_n_steps": 1,
                 "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                                "init_args": {"every_n_train_steps": 2, "save_top_k": -1, "filename": "{step:03d}"}}],
                 "logger": {"class_path": "rescale_tasks.common.reporting.SuiteWandbLogger",
                            "init_args": {"project": "resume-test", "name": name, "save_dir": str(folder / "runs")}}},
        last_checkpoint={"every_n_train_steps": 2})


def _env():
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", OMP_NUM_THREADS="1",
               PYTHONHASHSEED="0")
    # runs of earlier tests in this process started a W&B service and advertise it to children;
    # a killed child's run would stay "in use" in that long-lived service
    env.pop("WANDB_SERVICE", None)
    return env


def _rescale(*args, cwd):
    return [sys.executable, "-m", "rescale_tasks.cli", *map(str, args)]


def _run(args, cwd: Path) -> subprocess.CompletedProcess:
    return forked.run(_rescale(*args, cwd=cwd), cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)


def _start_and_signal(args, cwd: Path, when: str, sig: int) -> subprocess.Popen:
    """Start a run, wait until the checkpoint file ``when`` exists, then send ``sig`` to its whole
    process group (data workers included), as a cluster scheduler does."""
    proc = forked.popen(_rescale(*args, cwd=cwd), cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 300
    while not glob.glob(str(cwd / "runs" / "resume-test" / "*" / "checkpoints" / when)):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "the run made no progress"
        time.sleep(0.05)
    os.killpg(proc.pid, sig)
    proc.wait(timeout=300)
    return proc


def _final(cwd: Path) -> dict:
    (path,) = glob.glob(str(cwd / "runs" / "resume-test" / "*" / "checkpoints" / "last.ckpt"))
    return torch.load(path, map_location="cpu", weights_only=True)


def _assert_same_training(a: dict, b: dict) -> None:
    assert a["global_step"] == b["global_step"] == 30 and a["epoch"] == b["epoch"]
    for key, value in a["state_dict"].items():  # weights, learned scalars, mean-shift state
        assert torch.equal(value, b["state_dict"][key]), key
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        assert torch.equal(sa["momentum_buffer"], sb["momentum_buffer"])
    assert a["lr_schedulers"] == b["lr_schedulers"]


@pytest.fixture(scope="module")
def uninterrupted(cifar, tmp_path_factory, run_config):
    cwd = tmp_path_factory.mktemp("uninterrupted")
    result = _run(["fit", "--config", _config(run_config, cwd, cifar, "whole")], cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return cwd


def test_sigterm_mid_epoch_saves_and_resumes_identically(cifar, uninterrupted, tmp_path, run_config):
    config = _config(run_config, tmp_path, cifar, "preempted")
    proc = _start_and_signal(["fit", "--config", config], tmp_path, "step=004.ckpt", signal.SIGTERM)
    err = proc.stderr.read()
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert proc.returncode != 0 and len(lines) == 1 and "SIGTERM" in lines[0], err[-3000:]
    (last,) = glob.glob(str(tmp_path / "runs" / "resume-test" / "*" / "checkpoints" / "last.ckpt"))
    saved = torch.load(last, weights_only=True)
    assert 4 <= saved["global_step"] < 30  # the preemption checkpoint, at the step it was stopped
    assert last in lines[0]  # the line says where the checkpoint is

    result = _run(["fit", "--config", config, "--ckpt_path", last], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    _assert_same_training(_final(uninterrupted), _final(tmp_path))

    # one W&B run, resumed: every offline segment carries the same run id
    runs = [read_offline_run(r) for r in find_offline_runs(str(tmp_path / "runs"))]
    assert len(runs) == 2 and len({r.run_id for r in runs}) == 1
    whole = read_offline_run(find_offline_runs(str(uninterrupted / "runs"))[0])
    resumed_val = runs[-1].metric("val/acc1")
    assert resumed_val and resumed_val[-1] == whole.metric("val/acc1")[-1]


def test_sigkill_resumes_from_the_last_checkpoint_identically(cifar, uninterrupted, tmp_path, run_config):
    config = _config(run_config, tmp_path, cifar, "killed")
    proc = _start_and_signal(["fit", "--config", config], tmp_path, "step=012.ckpt", signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    (last,) = glob.glob(str(tmp_path / "runs" / "resume-test" / "*" / "checkpoints" / "last.ckpt"))
    # last.ckpt is written after every other callback of the step (step=012.ckpt's first), so the kill
    # may land before its step-12 save: the resume point is then its save before
    assert 0 < torch.load(last, weights_only=True)["global_step"] < 30
    # a kill in the middle of a save leaves at most a temp file; last.ckpt loaded whole above

    result = _run(["fit", "--config", config, "--ckpt_path", last], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    _assert_same_training(_final(uninterrupted), _final(tmp_path))
    assert not glob.glob(str(Path(last).parent / "*.tmp-*"))  # the killed writer's temp is gone


def test_fixed_run_id_and_ckpt_path_last_is_one_command_for_start_and_requeue(cifar, tmp_path, monkeypatch, run_config):
    from rescale_tasks.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    config = _config(run_config, tmp_path, cifar, "requeued")
    command = ["fit", "--config", str(config), "--trainer.logger.init_args.id", "job42", "--ckpt_path", "last",
               "--trainer.max_epochs", "2"]
    # nothing to resume yet: starts afresh (and stops after one epoch, as a preempted job would)
    assert main(command + ["--trainer.max_steps", "10"]) == 0
    last = tmp_path / "runs" / "resume-test" / "job42" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 10
    assert main(command) == 0  # the requeued job: same command, resumes
    assert torch.load(last, weights_only=True)["global_step"] == 20
    assert {read_offline_run(r).run_id for r in find_offline_runs(str(tmp_path / "runs"))} == {"job42"}
