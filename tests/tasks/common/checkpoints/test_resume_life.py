"""A run stopped by a signal and resumed reports exactly what an uninterrupted run reports.

Real ``rescale fit`` runs (in this process, and as two DDP processes over gloo) of a digits
ResNet validating every 3 steps, with offline W&B runs, step checkpoints and a best-so-far
checkpoint; a probe callback (``tests/signal_probe.py``) sends SIGTERM to the run itself in
training (between steps, or inside a gradient-accumulation window), in the middle of a validation,
or in the validation at an epoch's end. The resumed run's ``run_summary.json`` (every validation,
best and final values, steps, samples), its checkpoint files and weights, and its W&B history
(every validation, every training epoch's means) must be the uninterrupted run's. Resuming mid-epoch with
another batch size is refused in one line and changes nothing.
"""
from __future__ import annotations

import csv
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rescale_tasks.cli import main
import forked
from wandb_runs import find_offline_runs, read_offline_run
from rescale_tasks.common.run import find_summaries, read_summary

TESTS = Path(__file__).resolve().parents[3]  # signal_probe.py, for the DDP processes
RUN_ID = "life1"
# where the signal comes: after training step 4; as the 2nd batch of the validation at step 3
# (mid-epoch) or at step 6 (the epoch's end); as the last batch of the validation at step 3 (it
# ends, then the run stops)
CUTS = {"training": {"where": "train", "step": 4},
        "validation": {"where": "val", "step": 3},
        "epoch-end validation": {"where": "val", "step": 6},
        "last validation batch": {"where": "val", "step": 3, "val_batch": 2}}
# what differs between two identical runs: wall-clock figures and where the files are
TIMING = ("train_seconds", "samples_per_second", "path", "checkpoint", "error")


def _config(run_config, suite_wandb_logger, folder: Path, cut: dict | None = None, **trainer) -> str:
    callbacks = [
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
         "init_args": {"every_n_train_steps": 2, "save_top_k": -1, "filename": "step{step:03d}",
                       "auto_insert_metric_name": False}},
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
         "init_args": {"monitor": "val/acc1", "mode": "max", "save_top_k": 1, "filename": "best{step:03d}",
                       "auto_insert_metric_name": False}}]
    if cut is not None:
        callbacks.append({"class_path": "signal_probe.SignalAt",
                          "init_args": {**cut, "marker": str(folder / "signalled")}})
    return run_config(folder / "run.yaml", seed_everything=3, data={"init_args": {"batch_size": 16}},
                      trainer={"max_epochs": 2, "limit_train_batches": 6, "limit_val_batches": 3,
                               "val_check_interval": 3, "log_every_n_steps": 1, "callbacks": callbacks,
                               "logger": [suite_wandb_logger("life", "digits", save_dir=str(folder / "runs"), id=RUN_ID),
                                          {"class_path": "lightning.pytorch.loggers.CSVLogger",
                                           "init_args": {"save_dir": str(folder / "csv"), "name": "life",
                                                         "version": RUN_ID}}],
                               **trainer})


def _fit(folder: Path, *args: str) -> int:
    old = os.getcwd()
    os.chdir(folder)
    try:
        return main(["fit", *args])
    finally:
        os.chdir(old)


def _newest_summary(folder: Path) -> str:
    """The newest segment's summary file (a resumed run writes one per segment). Last written,
    not last by name: W&B names a segment started in the same second as the one before it
    ``<that folder's name>-1``, which sorts first."""
    return max(find_summaries(str(folder)), key=os.path.getmtime)


def _summary(folder: Path) -> dict:
    return read_summary(_newest_summary(folder / "runs" / "wandb"))


def _comparable(summary: dict) -> dict:
    out = {k: v for k, v in summary.items() if k not in TIMING}
    out["final"] = {k: v for k, v in summary["final"].items() if not k.startswith("throughput/")}
    return out


def _checkpoints(folder: Path) -> Path:
    return folder / "runs" / "life" / RUN_ID / "checkpoints"


def _epoch_history(folder: Path) -> dict[tuple[str, int], float]:
    """The validations' val/acc1 and the training epochs' means (train/loss_epoch, train/acc1:
    an epoch a signal cut averages its batches from before the resume too) by key and W&B step,
    over every offline segment of the run."""
    rows = [row for run in find_offline_runs(str(folder / "runs")) for row in read_offline_run(run).history]
    return {(key, row["trainer/global_step"]): row[key] for row in rows
            for key in ("val/acc1", "train/loss_epoch", "train/acc1") if key in row}


def _csv_history(folder: Path) -> dict[tuple[str, int], float]:
    """The same values as the CSV logger's ``metrics.csv`` has them."""
    with open(folder / "csv" / "life" / RUN_ID / "metrics.csv", newline="") as f:
        return {(key, int(row["step"])): float(row[key]) for row in csv.DictReader(f)
                for key in ("val/acc1", "train/loss_epoch", "train/acc1") if row.get(key)}


def _assert_same_run(whole: Path, resumed: Path, steps: int = 12, cut_means_at: int | None = None) -> None:
    """``cut_means_at``: the W&B step where the resumed run's first segment, which ended inside an
    epoch without a signal (max_steps), logged that part epoch's means; they are its own, and no
    uninterrupted run has them."""
    assert _comparable(_summary(resumed)) == _comparable(_summary(whole))
    assert sorted(os.listdir(_checkpoints(resumed))) == sorted(os.listdir(_checkpoints(whole)))
    a, b = (torch.load(_checkpoints(f) / "last.ckpt", weights_only=True) for f in (whole, resumed))
    assert a["global_step"] == b["global_step"] == steps
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    history = _epoch_history(whole)
    assert {key for key, _ in history} == {"val/acc1", "train/loss_epoch", "train/acc1"}
    histories = [_epoch_history(resumed), _csv_history(resumed)]
    if cut_means_at is not None:
        for h in histories:
            for key in ("train/loss_epoch", "train/acc1"):
                assert (key, cut_means_at) not in history and h.pop((key, cut_means_at), None) is not None, key
    assert histories[0] == history
    assert histories[1] == _csv_history(whole)  # the segment before the resume kept in metrics.csv


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, run_config, suite_wandb_logger) -> Path:
    folder = tmp_path_factory.mktemp("whole")
    os.environ.setdefault("WANDB_MODE", "offline")
    assert _fit(folder, "--config", _config(run_config, suite_wandb_logger, folder)) == 0
    return folder


@pytest.mark.parametrize("cut", list(CUTS))
def test_a_run_stopped_and_resumed_reports_what_an_uninterrupted_run_does(cut, uninterrupted, tmp_path,
                                                                          run_config, suite_wandb_logger):
    config = _config(run_config, suite_wandb_logger, tmp_path, CUTS[cut])
    assert _fit(tmp_path, "--config", config) == 143
    stopped = _summary(tmp_path)
    assert stopped["status"] == "interrupted" and stopped["steps"] == CUTS[cut]["step"]
    assert _fit(tmp_path, "--config", config, "--ckpt_path", "last") == 0
    _assert_same_run(uninterrupted, tmp_path)
    # one run, however many segments: compare counts it once, with the whole run's best value
    assert main(["compare", str(tmp_path / "runs"), "--out", str(tmp_path / "cmp")]) == 0
    table = (tmp_path / "cmp" / "compare.csv").read_text().splitlines()
    assert len(table) == 2 and ",1,val/acc1," in table[1], table
    assert float(table[1].split(",val/acc1,")[1].split(",")[0]) == _summary(uninterrupted)["best"]["val/acc1"]
    if cut == "validation":  # the offline W&B segments too: one run, its history theirs together
        assert main(["compare", "--wandb_project", "life", "--wandb_dir", str(tmp_path / "runs"),
                     "--out", str(tmp_path / "cmp-wandb")]) == 0
        assert (tmp_path / "cmp-wandb" / "compare.csv").read_text().splitlines()[1:] == table[1:]


def test_ckpt_path_last_resumes_with_the_model_arguments_the_run_was_started_with(tmp_path, run_config,
                                                                                  suite_wandb_logger):
    """A model argument set off its default when the run started (AGC) and not repeated on resume:
    ``--ckpt_path last`` takes it from the checkpoint, as a checkpoint's path does."""
    whole, cut = _whole_and_resumed(tmp_path, run_config, suite_wandb_logger, "--model.init_args.agc_clip", "0.01")
    assert _summary(cut)["agc_clip"] == _summary(whole)["agc_clip"] == 0.01


def test_stochastic_depth_draws_on_resume_what_the_uninterrupted_run_draws(tmp_path, run_config, suite_wandb_logger):
    """NF-ResNet with stochastic depth (``scheme_options.stochdepth_rate``): its per-sample draws
    come from the checkpointed random streams, so the run stopped mid-epoch and resumed is the
    uninterrupted one."""
    nf = ("--model.init_args.scheme", "nf", "--model.init_args.scheme_options", "{stochdepth_rate: 0.5}")
    # the config names another scheme: the resume repeats the one of the checkpoint
    whole, cut = _whole_and_resumed(tmp_path, run_config, suite_wandb_logger, *nf, on_resume=nf)
    saved = torch.load(_checkpoints(cut) / "last.ckpt", weights_only=True)["hyper_parameters"]
    assert saved["scheme_options"] == {"stochdepth_rate": 0.5}


def _whole_and_resumed(tmp_path: Path, run_config, suite_wandb_logger, *args: str,
                       on_resume: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """An uninterrupted run with the arguments ``args`` and one stopped by SIGTERM after training
    step 4 (mid-epoch) and resumed with ``--ckpt_path last`` and ``on_resume``; asserts they are
    the same run and returns their folders."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    cut.mkdir()
    assert _fit(whole, "--config", _config(run_config, suite_wandb_logger, whole), *args) == 0
    config = _config(run_config, suite_wandb_logger, cut, CUTS["training"])
    assert _fit(cut, "--config", config, *args) == 143
    assert _fit(cut, "--config", config, "--ckpt_path", "last", *on_resume) == 0
    _assert_same_run(whole, cut)
    return whole, cut


def test_a_signal_inside_an_accumulation_window_stops_after_the_step_that_closes_it(tmp_path, run_config,
                                                                                   suite_wandb_logger):
    """Two batches a step (4 steps an epoch, a validation every 2): SIGTERM after the first batch
    of step 3 stops the run after its second, and the resumed run is the uninterrupted one."""
    accumulating = {"accumulate_grad_batches": 2, "limit_train_batches": 8, "val_check_interval": 4,
                    "limit_val_batches": 2}
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    cut.mkdir()
    assert _fit(whole, "--config", _config(run_config, suite_wandb_logger, whole, **accumulating)) == 0
    config = _config(run_config, suite_wandb_logger, cut, {"where": "accumulating", "step": 2}, **accumulating)
    assert _fit(cut, "--config", config) == 143
    stopped = _summary(cut)
    assert stopped["status"] == "interrupted" and stopped["steps"] == 3
    assert _fit(cut, "--config", config, "--ckpt_path", "last") == 0
    _assert_same_run(whole, cut, steps=8)


@pytest.mark.parametrize("max_steps", [4, 3])
def test_a_run_that_max_steps_ends_mid_epoch_resumes_where_an_uninterrupted_run_goes_on(max_steps, uninterrupted,
                                                                                    tmp_path, run_config,
                                                                                    suite_wandb_logger):
    """``--trainer.max_steps 4`` stops the run after the 4th of the epoch's 6 batches (3: after the
    3rd and its validation); resumed with the full length it trains the rest of the epoch (not a
    new epoch) and is the uninterrupted run (the schedule counts epochs from the loader, not from
    max_steps), but for the means of the batches the first segment logged when it ended. Resuming it with another
    batch size is refused, as after a signal."""
    config = _config(run_config, suite_wandb_logger, tmp_path)
    assert _fit(tmp_path, "--config", config, "--trainer.max_steps", str(max_steps)) == 0
    assert _summary(tmp_path)["steps"] == max_steps
    # inside the epoch: another layout is refused, as after a signal (nothing written)
    assert _fit(tmp_path, "--config", config, "--ckpt_path", "last", "--data.init_args.batch_size", "32") == 2
    assert _fit(tmp_path, "--config", config, "--ckpt_path", "last") == 0
    _assert_same_run(uninterrupted, tmp_path, cut_means_at=max_steps - 1)


def test_resuming_mid_epoch_with_another_batch_size_or_starting_over_is_refused_in_one_line(tmp_path, run_config,
                                                                          suite_wandb_logger, capsys):
    config = _config(run_config, suite_wandb_logger, tmp_path, CUTS["training"])
    assert _fit(tmp_path, "--config", config) == 143
    before = {p: Path(p).read_bytes() for p in glob.glob(str(tmp_path / "runs" / "**" / "*.*"), recursive=True)
              if p.endswith((".ckpt", "run_summary.json")) and "latest-run" not in p}
    segments = find_offline_runs(str(tmp_path / "runs"))
    capsys.readouterr()
    assert _fit(tmp_path, "--config", config, "--ckpt_path", "last", "--data.init_args.batch_size", "32") == 2
    # the refusal came once the W&B run had started: no segment of it is left (its config, batch
    # size 32, would be the run's once synced), and latest-run is the run's own
    assert find_offline_runs(str(tmp_path / "runs")) == segments
    assert (tmp_path / "runs" / "wandb" / "latest-run").resolve() == Path(segments[-1]).resolve()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, lines
    assert "in the middle of epoch 0" in lines[0] and "4 batches into it with batch_size 16" in lines[0]
    assert "this run has batch_size 32" in lines[0] and "--data.init_args.batch_size 16" in lines[0]
    after = {p: Path(p).read_bytes() for p in before}
    assert after == before  # nothing written over: the checkpoints and the run's summary are as they were
    assert [p for p in find_summaries(str(tmp_path / "runs")) if p not in before] == []
    # the same run id started again without --ckpt_path would train from scratch over its last.ckpt
    assert _fit(tmp_path, "--config", config) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "last.ckpt holds this run's checkpoint at step 4" in lines[0], lines
    assert "resume it with --ckpt_path last" in lines[0]
    assert {p: Path(p).read_bytes() for p in before} == before


def test_after_an_epoch_end_the_batch_size_may_change(tmp_path, run_config, suite_wandb_logger):
    config = _config(run_config, suite_wandb_logger, tmp_path)
    assert _fit(tmp_path, "--config", config, "--trainer.max_epochs", "1") == 0
    assert _fit(tmp_path, "--config", config, "--ckpt_path", "last", "--data.init_args.batch_size", "32") == 0
    assert _summary(tmp_path)["status"] == "finished"


def _rescale(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``rescale fit *args`` in a process of its own (for a signal that would end this one)."""
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    env.pop("WANDB_SERVICE", None)  # this process's W&B service: the runs get their own
    return forked.run([sys.executable, "-m", "rescale_tasks.cli", "fit", *args], cwd=cwd, env=env,
                      capture_output=True, text=True, timeout=300)


def _rescale_ddp(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return _rescale([*args, "--trainer.devices", "2", "--trainer.strategy", "ddp"], cwd)


@pytest.mark.parametrize("cut, every, saved", [({"where": "train", "step": 5}, 2, 4),
                                               ({"where": "val", "step": 3}, 3, 3),
                                               ({"where": "val", "step": 6}, 3, 6)],
                         ids=["training", "validation", "epoch-end validation"])
def test_a_run_killed_outright_resumes_from_its_step_checkpoint_to_what_an_uninterrupted_run_reports(
        cut, every, saved, uninterrupted, tmp_path, run_config, suite_wandb_logger):
    """SIGKILL (no handler, nothing saved) after step 5 of a run writing last.ckpt every 2 steps,
    or during the validation of step 3 (6, the epoch's last) of one writing it every 3: the resume
    starts from the file written at step 4 (3, 6), which holds what every callback recorded of
    that step (the run summary's loss point and sample count) and, when a validation follows the
    step, makes the resume run it, and at an epoch's last step the epoch's end after it (its
    training means were never logged: Lightning took the file for one of an ended epoch); so the
    resumed run's summary (every validation), weights and metrics.csv (every training epoch's
    means) are the uninterrupted run's. (The killed segment's W&B records are W&B's to keep.)"""
    config = _config(run_config, suite_wandb_logger, tmp_path, {**cut, "signum": 9})
    every_n = ("--last_checkpoint.every_n_train_steps", str(every))
    killed = _rescale(["--config", config, *every_n], tmp_path)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert torch.load(_checkpoints(tmp_path) / "last.ckpt", weights_only=True)["global_step"] == saved
    assert _fit(tmp_path, "--config", config, *every_n, "--ckpt_path", "last") == 0
    assert _comparable(_summary(tmp_path)) == _comparable(_summary(uninterrupted))
    a, b = (torch.load(_checkpoints(f) / "last.ckpt", weights_only=True) for f in (uninterrupted, tmp_path))
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    assert _csv_history(tmp_path) == _csv_history(uninterrupted)


@pytest.mark.slow
@pytest.mark.ddp
def test_under_ddp_a_validation_cut_by_sigterm_is_done_again_on_resume(tmp_path, run_config, suite_wandb_logger):
    """SIGTERM to the main process in the middle of a validation (Lightning forwards it to the
    process it started): both processes stop, the resumed pair reruns that validation."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    cut.mkdir()
    done = _rescale_ddp(["--config", _config(run_config, suite_wandb_logger, whole)], whole)
    assert done.returncode == 0, done.stderr[-3000:]
    config = _config(run_config, suite_wandb_logger, cut, CUTS["validation"])
    stopped = _rescale_ddp(["--config", config], cut)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    resumed = _rescale_ddp(["--config", config, "--ckpt_path", "last"], cut)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_same_run(whole, cut)
    assert json.loads(Path(_newest_summary(cut / "runs" / "wandb")).read_text())["world_size"] == 2


def test_a_resume_from_a_step_checkpoint_a_validation_follows_runs_that_validation(uninterrupted, tmp_path, run_config,
                                                                                  suite_wandb_logger):
    """A run killed outright (SIGKILL) in the validation of step 6 leaves ``step006.ckpt``, saved by
    Lightning's ModelCheckpoint(every_n_train_steps=2) at the end of step 6, before that validation.
    Resumed from it, the run skipped the validation (Lightning took the file for one saved after it)
    and logged the next steps one too high; it now runs it, as a resume from last.ckpt does, and
    reports what the uninterrupted run does."""
    config = _config(run_config, suite_wandb_logger, tmp_path, {"where": "val", "step": 6, "signum": 9})
    killed = _rescale(["--config", config], tmp_path)
    assert killed.returncode == -9, killed.stderr[-3000:]
    step = _checkpoints(tmp_path) / "step006.ckpt"
    assert torch.load(step, weights_only=True)["global_step"] == 6
    assert _fit(tmp_path, "--config", config, "--ckpt_path", str(step)) == 0
    assert _comparable(_summary(tmp_path)) == _comparable(_summary(uninterrupted))
    a, b = (torch.load(_checkpoints(f) / "last.ckpt", weights_only=True) for f in (uninterrupted, tmp_path))
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    history = _csv_history(tmp_path)
    assert history == _csv_history(uninterrupted) and ("val/acc1", 5) in history and ("train/acc1", 5) in history


@pytest.mark.parametrize("no_val", [("--trainer.limit_val_batches", "0"), ("--trainer.check_val_every_n_epoch", "2")],
                         ids=["no validation", "validation every 2nd epoch"])
def test_a_resume_from_a_step_checkpoint_at_an_epoch_end_no_validation_follows_ends_that_epoch(no_val, tmp_path,
                                                                                             run_config,
                                                                                             suite_wandb_logger):
    """Without validation (or with one every 2nd epoch only), ``step006.ckpt`` (ModelCheckpoint every
    2 steps) is saved at the end of the first epoch's last step, before that epoch's end: a run
    killed outright there resumes from it. The resume skipped the epoch's end (Lightning took the
    file for one of an ended epoch: its training means never logged, a plateau schedule not
    stepped); now it runs it, once, trains the 6 batches of the second epoch and reports what the
    uninterrupted run does."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    cut.mkdir()
    assert _fit(whole, "--config", _config(run_config, suite_wandb_logger, whole), *no_val) == 0
    step = cut / "step006.ckpt"
    shutil.copy(_checkpoints(whole) / "step006.ckpt", step)
    assert torch.load(step, weights_only=True)["global_step"] == 6
    assert _fit(cut, "--config", _config(run_config, suite_wandb_logger, cut), *no_val, "--ckpt_path", str(step)) == 0
    assert _comparable(_summary(cut)) == _comparable(_summary(whole))
    a, b = (torch.load(_checkpoints(f) / "last.ckpt", weights_only=True) for f in (whole, cut))
    assert a["global_step"] == b["global_step"] == 12
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    history = _csv_history(cut)
    assert history == _csv_history(whole) and ("train/acc1", 5) in history and ("train/acc1", 11) in history
