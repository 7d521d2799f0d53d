"""``--last_k K``: each run's mean of its last K epoch-end validations (the RescaleNet paper's "mean
over the last 5 epochs"), then mean and std over seeds; computed here by hand from the per-epoch
history tiny digits runs kept, a resumed one among them."""
from __future__ import annotations

import csv
import logging
import statistics

import pytest

from rescale_tasks.cli import main
from rescale_tasks.common.run import read_summary
from rescale_tasks.common.errors import UserError
from rescale_tasks.studies.compare import compare_rows, last_k_mean, run_from_wandb


@pytest.fixture(autouse=True)
def _in_tmp(offline_in_tmp):
    """Each test in a folder of its own, W&B offline (tests/tasks/conftest.py)."""


def _fit(run_config, folder, epochs: int, seed: int, *extra: str, **trainer) -> dict:
    config = run_config(folder / "run.yaml", trainer={"max_epochs": epochs, "limit_val_batches": 2, **trainer})
    assert main(["fit", "--config", config, "--seed_everything", str(seed), "--trainer.default_root_dir",
                 str(folder), "--run_summary.path", str(folder / "run_summary.json"), *extra]) == 0
    return read_summary(str(folder))


def _table(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_compare_last_k_is_the_mean_of_each_runs_last_epochs_then_over_seeds(tmp_path, run_config, caplog):
    whole = _fit(run_config, tmp_path / "runs/whole", 4, seed=1)
    _fit(run_config, tmp_path / "runs/resumed", 2, seed=2)
    first = read_summary(str(tmp_path / "runs/resumed"))
    resumed = _fit(run_config, tmp_path / "runs/resumed", 4, 2, "--ckpt_path", first["checkpoint"])
    short = _fit(run_config, tmp_path / "runs/short", 2, seed=3)
    # one validation per epoch (2 steps each), the resumed run's too: none of them twice
    for run in (whole, resumed):
        assert run["val_epoch_ends"] == [2, 4, 6, 8]
        assert [step for step, _ in run["curves"]["val/acc1"]] == [2, 4, 6, 8]
    by_hand = [statistics.fmean(v for _, v in run["curves"]["val/acc1"][-3:]) for run in (whole, resumed)]
    with caplog.at_level(logging.WARNING):
        assert main(["compare", str(tmp_path / "runs"), "--metric", "val/acc1", "--last_k", "3", "--out", "cmp"]) == 0
    (row,) = _table(tmp_path / "cmp/compare.csv")
    assert (row["runs"], row["last3 n"]) == ("3", "2")  # the short run is left out, and said so
    assert float(row["last3 mean"]) == pytest.approx(statistics.fmean(by_hand), abs=1e-12)
    assert float(row["last3 std"]) == pytest.approx(statistics.stdev(by_hand), abs=1e-12)
    said = [r.getMessage() for r in caplog.records if "last3" in r.getMessage()]
    assert len(said) == 1 and "validated val/acc1 at the end of 2 epochs, fewer than --last_k 3" in said[0], said
    assert short["val_epoch_ends"] == [2, 4]


def test_only_the_validations_at_an_epochs_end_count_as_the_logged_history_says_too(tmp_path, run_config):
    """A validation every step (two per epoch): only each epoch's last is one of its epochs; the
    history the loggers received (Lightning's rows, as W&B's history holds them) marks the same ones
    (the epoch's loss logged at their step)."""
    csv_logger = {"class_path": "lightning.pytorch.loggers.CSVLogger",
                  "init_args": {"save_dir": str(tmp_path), "name": "csv", "version": 0}}
    run = _fit(run_config, tmp_path, 3, 0, val_check_interval=1, log_every_n_steps=1, logger=csv_logger)
    assert [step for step, _ in run["curves"]["val/acc1"]] == [1, 2, 3, 4, 5, 6]
    assert run["val_epoch_ends"] == [2, 4, 6]
    rows = [{("trainer/global_step" if k == "step" else k): float(v) for k, v in row.items() if v != ""}
            for row in _table(tmp_path / "csv/version_0/metrics.csv")]
    from_history = run_from_wandb(config={}, summary={}, history=rows)
    assert from_history["val_epoch_ends"] == [2, 4, 6]
    at_ends = [v for s, v in run["curves"]["val/acc1"] if s in (4, 6)]
    assert last_k_mean(run, "val/acc1", 2) == (pytest.approx(statistics.fmean(at_ends)), None)
    assert last_k_mean(from_history, "val/acc1", 2)[0] == pytest.approx(statistics.fmean(at_ends))


def test_a_summary_without_epoch_ends_and_a_bad_k_are_each_one_line(tmp_path, error_line):
    old = {"status": "finished", "curves": {"val/acc1": [[2, 0.5], [4, 0.6]]}}
    assert last_k_mean(old, "val/acc1", 1)[0] is None and "recorded no epoch-end" in last_k_mean(old, "val/acc1", 1)[1]
    assert last_k_mean({**old, "status": "diverged", "val_epoch_ends": [2, 4]}, "val/acc1", 1) == (None, None)
    (tmp_path / "runs").mkdir()
    assert main(["compare", str(tmp_path / "runs"), "--last_k", "0"]) == 2
    assert "--last_k 0" in error_line()


def test_last_k_of_a_metric_no_validation_logs_is_refused_in_one_line():
    """Not "validated train/loss_epoch at the end of 0 epochs" for every run: the metric is named."""
    run = {"status": "finished", "curves": {"train/loss_epoch": [[2, 0.5]]}, "val_epoch_ends": [2],
           "final": {"train/loss_epoch": 0.5}, "best": {"train/loss_epoch": 0.5}}
    with pytest.raises(UserError, match=r"--last_k 1 averages the last epoch-end validations, and train/loss_epoch "
                                        r"is not a validation metric") as err:
        compare_rows([run], "train/loss_epoch", last_k=1)
    assert "\n" not in str(err.value)


def test_study_aggregate_last_k_over_the_seeds_of_a_study(tmp_path, run_config, caplog):
    config = run_config(tmp_path / "tiny.yaml", trainer={"max_epochs": 3, "log_every_n_steps": 1})
    assert main(["study", "seeds", "--config", config, "--seeds", "2", "--out", "seeds", "--engine", "slurm"]) == 0
    for index in ("0", "1"):
        assert main(["study", "run-point", "seeds", index, "--in_process"]) == 0
    with caplog.at_level(logging.WARNING):
        assert main(["study", "aggregate", "seeds", "--metric", "val/acc1", "--last_k", "2"]) == 0
        assert not [r for r in caplog.records if "last2" in r.getMessage()]  # every point had 3 epochs
        assert main(["study", "aggregate", "seeds", "--metric", "val/acc1", "--last_k", "4", "--out", "k4"]) == 0
    summaries = [read_summary(str(path.parent)) for path in sorted((tmp_path / "seeds/points").rglob("run_summary.json"))]
    assert [s["val_epoch_ends"] for s in summaries] == [[2, 4, 6]] * 2
    by_hand = [statistics.fmean(v for _, v in s["curves"]["val/acc1"][-2:]) for s in summaries]
    points = _table(tmp_path / "seeds/seeds_points.csv")
    assert sorted(float(p["last2 val/acc1"]) for p in points) == pytest.approx(sorted(by_hand), abs=1e-12)
    (row,) = [r for r in _table(tmp_path / "seeds/seeds.csv") if (r["metric"], r["use"]) == ("val/acc1", "last2")]
    assert (row["n"], float(row["mean"])) == ("2", pytest.approx(statistics.fmean(by_hand), abs=1e-12))
    assert float(row["std"]) == pytest.approx(statistics.stdev(by_hand), abs=1e-12)
    fewer = [r.getMessage() for r in caplog.records if "fewer than --last_k 4" in r.getMessage()]
    assert len(fewer) == 2, fewer  # one line per point, none averaged over fewer epochs
    assert all(p["last4 val/acc1"] == "" for p in _table(tmp_path / "k4/seeds_points.csv"))


def test_over_seeds_a_settings_last_k_is_the_mean_and_std_of_its_runs():
    from rescale_tasks.studies.seeded import collapse_seeds

    rows = [{"scheme": "bn", "status": "trained", "final val/acc1": 0.5, "best val/acc1": 0.5, "last5 val/acc1": v,
             "train_loss": 1.0, "steps_to_90": 1, "throughput": 1.0} for v in (0.25, 0.75)]
    (row,) = collapse_seeds(rows, ["scheme"], "val/acc1")
    assert (row["last5 val/acc1"], row["last5 val/acc1 n"]) == (0.5, 2)
    assert row["last5 val/acc1 std"] == pytest.approx(statistics.stdev([0.25, 0.75]))


def test_a_setting_whose_first_seed_did_not_run_keeps_its_last_k(tmp_path, run_config):
    """Seed 0 of the point not run, seeds 1 and 2 trained: the setting's last-k is theirs, not lost
    with the first row's missing column."""
    config = run_config(tmp_path / "tiny.yaml", trainer={"max_epochs": 2})
    study = ["study", "depth", "--config", config, "--depths", "8", "--schemes", "rescale", "--seeds", "3",
             "--out", "depth", "--engine", "slurm", "--metric", "val/acc1"]
    assert main([*study, "--last_k", "0"]) == 2 and not (tmp_path / "depth").exists()  # refused before the grid
    assert main([*study, "--last_k", "2"]) == 0
    for index in ("1", "2"):
        assert main(["study", "run-point", "depth", index, "--in_process"]) == 0
    assert main(["study", "aggregate", "depth"]) == 0  # the study's --last_k
    summaries = [read_summary(str(path.parent)) for path in sorted((tmp_path / "depth/points").rglob("run_summary.json"))]
    by_hand = [statistics.fmean(v for _, v in s["curves"]["val/acc1"][-2:]) for s in summaries]
    (row,) = _table(tmp_path / "depth/depth.csv")
    assert (row["not_done"], row["last2 val/acc1 n"]) == ("1", "2")
    assert float(row["last2 val/acc1"]) == pytest.approx(statistics.fmean(by_hand), abs=1e-12)
