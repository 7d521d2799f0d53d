"""`run_summary.json`: written by every `rescale fit`, read by `rescale compare` and the studies."""
from __future__ import annotations

import json
import math

import pytest

from rescale_core.schemes import definition, get_scheme
from rescale_tasks.cli import main
from wandb_runs import find_offline_runs, read_offline_run
from rescale_tasks.common.run import find_summaries, read_summary
from rescale_tasks.common.run.summary import scheme_changes, shown_changes


@pytest.fixture(autouse=True)
def _in_tmp(offline_in_tmp):
    """Each test in a folder of its own, W&B offline (tests/tasks/conftest.py)."""


def test_fit_writes_its_summary_next_to_its_config(tmp_path, run_config, suite_wandb_logger, summary_matches_wandb):
    config = run_config(tmp_path / "run.yaml", trainer={
        "limit_train_batches": 3, "log_every_n_steps": 1, "max_epochs": 2,
        "logger": suite_wandb_logger("rescale-test", "summary", group="digits-tiny")})
    assert main(["fit", "--config", config, "--seed_everything", "7", "--data.init_args.seed", "3"]) == 0
    (path,) = find_summaries("runs")
    (run_dir,) = find_offline_runs("runs")
    assert path.startswith(str(tmp_path / run_dir)) and (tmp_path / run_dir / "files/rescale_config.yaml").is_file()
    s = read_summary(path)
    assert (s["name"], s["project"], s["group"]) == ("summary", "rescale-test", "digits-tiny")
    assert (s["network"], s["scheme"], s["lr"], s["global_batch"]) == ("cifar_resnet", "rescale", 0.1, 64)
    assert (s["seed_everything"], s["data_seed"]) == (7, 3) and "seed" not in s  # each seed by its own name
    assert s["agc_clip"] is s["agc_eps"] is s["agc_clip_classifier"] is None  # no AGC: nothing of it
    assert s["status"] == "finished" and s["steps"] == 6 and s["epochs"] == 2 and s["diverged_step"] is None
    assert [step for step, _ in s["curves"]["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert [step for step, _ in s["curves"]["val/acc1"]] == [3, 6]  # one validation per epoch, at its step
    assert s["best"]["val/acc1"] == max(v for _, v in s["curves"]["val/acc1"])
    assert s["final"]["val/acc1"] == s["curves"]["val/acc1"][-1][1]
    assert s["samples_per_second"] > 0 and s["checkpoint"].endswith("last.ckpt")
    assert (s["throughput_unit"], s["samples"]) == ("images", 6 * 64)  # 2 epochs of 3 batches of 64 digits
    summary_matches_wandb("runs")  # the values W&B received, the throughput in images/s too
    config = read_offline_run(run_dir).config  # the run config W&B filters by: the code too, not only the YAML's
    assert config["code"] == s["code"] and config["seed_everything"] == 7
    assert config["data_fingerprint"] == s["data"] and s["data"]["class"] == "DigitsDataModule"  # the data too
    # the data order's seed by the summary's name: a flat `seed` of 3 read as the run's seed
    assert config["data_seed"] == 3 and "seed" not in config, sorted(config)


def test_under_gradient_accumulation_the_loss_curve_has_one_point_per_step_as_logged(tmp_path, run_config,
                                                                                    suite_wandb_logger, same_curve):
    """Two batches per optimizer step: one ``train/loss`` point per step, at its number, with the
    loss W&B received as ``train/loss_step`` (the batch's own, not Lightning's loss divided by 2)."""
    config = run_config(tmp_path / "run.yaml", trainer={
        "limit_train_batches": 6, "accumulate_grad_batches": 2, "log_every_n_steps": 1,
        "logger": suite_wandb_logger("rescale-test", "accumulate")})
    assert main(["fit", "--config", config, "--seed_everything", "7"]) == 0
    (path,) = find_summaries("runs")
    (run_dir,) = find_offline_runs("runs")
    s, history = read_summary(path), read_offline_run(run_dir).history
    logged = [[row["trainer/global_step"] + 1, row["train/loss_step"]] for row in history if "train/loss_step" in row]
    assert s["steps"] == 3 and [step for step, _ in logged] == [1, 2, 3]
    assert same_curve(s["curves"]["train/loss"], logged), (s["curves"]["train/loss"], logged)
    assert s["final"]["train/loss_step"] == s["curves"]["train/loss"][-1][1]
    assert all(value > 1.5 for _, value in s["curves"]["train/loss"])  # ten classes: about ln 10 at the start


def test_a_diverged_run_says_so(tmp_path, run_config):
    config = run_config(tmp_path / "run.yaml", model={"init_args": {
        "scheme": "none", "network_options": {"depth": 20, "base_width": 8},
        "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 1.0e6}}}},
        trainer={"limit_train_batches": 4, "logger": None})
    summary = str(tmp_path / "elsewhere/run_summary.json")
    assert main(["fit", "--config", config, "--divergence.raise_error", "false", "--run_summary.path", summary]) == 0
    s = read_summary(summary)
    assert s["status"] == "diverged" and s["diverged_step"] is not None
    assert math.isnan(s["final"]["train/loss_step"]) or not math.isfinite(s["curves"]["train/loss"][-1][1])
    json.loads(open(summary).read())  # strict JSON (NaN written as a string)


def test_a_run_without_a_logger_trains_and_still_writes_its_summary(tmp_path, run_config):
    """``trainer.logger: false``: the suite's learning-rate monitor stays quiet (Lightning's own
    refuses to start without a logger) and the summary goes to the root folder. The summary
    records the run's adaptive gradient clipping threshold, and the definition of the scheme it
    built (``scheme_fields``: the name alone did not say it once the code defined the scheme
    otherwise, as ``rezero``'s ``layer_gain``)."""
    config = run_config(tmp_path / "run.yaml", trainer={"default_root_dir": str(tmp_path / "root")},
                        model={"init_args": {"agc_clip": 0.02, "scheme_options": {"c": 3.0}}})
    assert main(["fit", "--config", config]) == 0  # TINY_RUN has logger: false
    s = read_summary(str(tmp_path / "root"))
    assert s["status"] == "finished" and s["steps"] == 2 and s["num_classes"] == 10 and s["agc_clip"] == 0.02
    assert (s["agc_eps"], s["agc_clip_classifier"], s["precision"], s["accumulate_grad_batches"]) == (1e-3, False,
                                                                                                    "32-true", 1)
    fields = s["scheme_fields"]
    assert (fields["merge"], fields["c"], fields["mean_shift"], fields["conv_dropout_stages"]) == ("rescale", 3.0,
                                                                                                 True, [3, 4])
    assert "name" not in fields and scheme_changes(s) == {}
    del fields["layer_gain"]  # a field added to Scheme after the run, at its default: the same definition
    assert scheme_changes(s) == {}
    fields["mean_shift"] = False  # the code defines rescale otherwise since the run
    assert shown_changes(scheme_changes(s)) == "mean_shift false (now true)"
    del s["scheme_fields"]  # a summary written before the record: nothing known to differ
    assert scheme_changes(s) == {}
    # rezero before its gain was shared per Transformer layer: a conv network reads no layer_gain
    s.update(scheme="rezero", scheme_options={}, scheme_fields={**definition(get_scheme("rezero")),
                                                                "layer_gain": False})
    assert scheme_changes(s) == {} and scheme_changes({**s, "network": "transformer_tiny"}) == {
        "layer_gain": (False, True)}


# --- every validation once, at its step, with the value the logger received ---------------------
# The tasks log their validation metrics three ways, all driven here by the real Lightning loop:
# a tensor reduced over the epoch (classification's and translation's val/loss), a torchmetrics
# object (classification's accuracy) and a float logged in on_validation_epoch_end (detection's
# COCO AP, video's multi-view accuracy, translation's BLEU). Lightning's CSVLogger is the logger.
class _Tiny:
    """A linear classifier of scikit-learn's digits (imported lazily: Lightning first)."""

    @staticmethod
    def module():
        import lightning.pytorch as L
        import torch
        import torchmetrics

        class Tiny(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.net = torch.nn.Linear(64, 10)
                self.acc = torchmetrics.classification.MulticlassAccuracy(10, average="micro")
                self.correct = 0

            def training_step(self, batch, batch_idx):
                x, y = batch
                return torch.nn.functional.cross_entropy(self.net(x), y)

            def on_validation_epoch_start(self) -> None:
                self.correct = 0

            def validation_step(self, batch, batch_idx):
                x, y = batch
                logits = self.net(x)
                self.log("val/loss", torch.nn.functional.cross_entropy(logits, y), on_epoch=True)
                self.acc(logits, y)
                self.log("val/acc1", self.acc, on_epoch=True)
                self.correct += int((logits.argmax(1) == y).sum())

            def on_validation_epoch_end(self) -> None:
                if not self.trainer.sanity_checking:
                    self.log("val/correct", float(self.correct))

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.05)

        return Tiny()

    @staticmethod
    def loaders():
        import torch
        from sklearn.datasets import load_digits
        from torch.utils.data import DataLoader, TensorDataset

        digits = load_digits()
        x = torch.tensor(digits.data[:256], dtype=torch.float32) / 16
        y = torch.tensor(digits.target[:256])
        return (DataLoader(TensorDataset(x[:192], y[:192]), batch_size=16),
                DataLoader(TensorDataset(x[192:], y[192:]), batch_size=32))


def _fit(fit_with_summary, folder, max_epochs: int, ckpt_path=None, **trainer_args) -> dict:
    import lightning.pytorch as L

    L.seed_everything(0)  # the same initial weights in every run
    train, val = _Tiny.loaders()
    return fit_with_summary(folder, _Tiny.module(), train, val, max_epochs=max_epochs, ckpt_path=ckpt_path,
                            limit_train_batches=4, **trainer_args)


@pytest.mark.parametrize("schedule, steps", [
    ({"check_val_every_n_epoch": 2}, [8, 16]),      # epochs 2 and 4 of 4 (no validation at 1 and 3)
    ({"val_check_interval": 2}, [2, 4, 6, 8]),      # twice per epoch, mid-epoch included
])
def test_each_validation_once_at_its_step_with_the_value_the_logger_received(tmp_path, schedule, steps,
                                                                            fit_with_summary, same_curve):
    run = _fit(fit_with_summary, tmp_path, max_epochs=4 if "check_val_every_n_epoch" in schedule else 2, **schedule)
    s, logged = run["summary"], run["logged"]
    assert set(logged) == {"val/loss", "val/acc1", "val/correct"}
    for key, points in logged.items():
        assert [step for step, _ in points] == steps, key
        assert same_curve(s["curves"][key], points), (key, s["curves"][key], points)
        assert s["final"][key] == pytest.approx(points[-1][1], rel=1e-6)
    assert s["best"]["val/acc1"] == max(v for _, v in s["curves"]["val/acc1"])
    assert s["best"]["val/loss"] == min(v for _, v in s["curves"]["val/loss"])


def test_a_resumed_runs_summary_holds_every_validation_once(tmp_path, fit_with_summary, same_curve):
    """2 epochs, then resumed from their checkpoint to 4: the same curves as 4 epochs in one go,
    and every validation of both segments (the logger of each segment received its own)."""
    whole = _fit(fit_with_summary, tmp_path / "whole", max_epochs=4)
    first = _fit(fit_with_summary, tmp_path / "first", max_epochs=2)
    (ckpt,) = (tmp_path / "first").rglob("*.ckpt")
    resumed = _fit(fit_with_summary, tmp_path / "resumed", max_epochs=4, ckpt_path=str(ckpt))
    for key, points in whole["logged"].items():
        assert [s for s, _ in points] == [4, 8, 12, 16]
        assert same_curve(resumed["summary"]["curves"][key], points), key
        assert same_curve(first["logged"][key] + resumed["logged"][key], points), key


def test_a_run_resumed_at_its_max_steps_counts_the_epochs_it_trained(tmp_path, fit_with_summary):
    """A checkpoint saved at ``max_steps`` (a study point whose summary was lost, run again):
    the resumed run trains nothing and reports the epochs of the run it resumes, not one fewer."""
    first = _fit(fit_with_summary, tmp_path / "first", max_epochs=5, max_steps=8)
    assert (first["summary"]["steps"], first["summary"]["epochs"]) == (8, 2)
    (ckpt,) = (tmp_path / "first").rglob("*.ckpt")
    resumed = _fit(fit_with_summary, tmp_path / "resumed", max_epochs=5, max_steps=8, ckpt_path=str(ckpt))
    assert (resumed["summary"]["steps"], resumed["summary"]["epochs"]) == (8, 2)
