"""Stochastic depth's draws are part of the training stream: a digits run with
``scheme_options.stochdepth_rate`` stopped by SIGTERM mid-epoch and resumed from its ``last.ckpt``
ends with the weights of the uninterrupted run, to the bit."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from rescale_tasks.cli import main

RUN_ID = "sd1"


def _config(run_config, suite_wandb_logger, folder: Path, signal_at: int | None = None) -> str:
    callbacks = []
    if signal_at is not None:  # tests/signal_probe.py: SIGTERM to the run itself after that step
        callbacks.append({"class_path": "signal_probe.SignalAt",
                          "init_args": {"step": signal_at, "where": "train", "marker": str(folder / "signalled")}})
    return run_config(folder / "run.yaml", seed_everything=3,
                      model={"init_args": {"scheme": "nf", "scheme_options": {"stochdepth_rate": 0.5}}},
                      data={"init_args": {"batch_size": 16}},
                      trainer={"max_epochs": 2, "limit_train_batches": 4, "limit_val_batches": 1, "log_every_n_steps": 1,
                               "callbacks": callbacks,
                               "logger": suite_wandb_logger("sd", "digits", save_dir=str(folder / "runs"), id=RUN_ID)})


def _fit(folder: Path, *args: str) -> int:
    old = os.getcwd()
    os.chdir(folder)
    try:
        return main(["fit", *args])
    finally:
        os.chdir(old)


def _last(folder: Path) -> dict:
    return torch.load(folder / "runs" / "sd" / RUN_ID / "checkpoints" / "last.ckpt", weights_only=True)


def test_a_run_resumed_mid_epoch_draws_what_the_uninterrupted_run_draws(tmp_path, run_config, suite_wandb_logger,
                                                                        monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()
    assert _fit(whole, "--config", _config(run_config, suite_wandb_logger, whole)) == 0
    config = _config(run_config, suite_wandb_logger, cut, signal_at=3)
    assert _fit(cut, "--config", config) == 143
    assert _last(cut)["global_step"] == 3  # mid-epoch (4 steps an epoch)
    assert _fit(cut, "--config", config, "--ckpt_path", "last") == 0
    a, b = _last(whole), _last(cut)
    assert a["global_step"] == b["global_step"] == 8
    assert a["hyper_parameters"]["scheme_options"] == {"stochdepth_rate": 0.5}
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
