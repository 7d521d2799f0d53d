"""`rescale study`: grids of ordinary `rescale fit` runs, run here one after another (resuming where
they stopped) or handed to SLURM / a W&B sweep, and their tables.

- the depth study on the embedded digits: a plain network (`none`) trains when shallow and
  diverges when deep, where `rescale` and `skipinit` train; the divergence is a row of the table;
- an interrupted study run again skips its finished point, resumes the interrupted one from its
  `last.ckpt` and runs the rest (in this process: `--in_process`, to keep the test short);
- the SLURM array script and the W&B sweep reach every point, and `run-point` runs one (the
  installed `rescale fit` in a subprocess, as the local engine runs every point by default);
- the seeds table of run summaries with known values is exactly mean and sample std.
"""
from __future__ import annotations

import csv
import json
import os
import shlex
import signal
from pathlib import Path

import lightning.pytorch as L
import pytest
import yaml

from rescale_core.schemes import definition, get_scheme
from rescale_tasks.cli import main
import forked
from wandb_runs import find_offline_runs, read_offline_run
from rescale_tasks.common.run import read_summary
from rescale_tasks.studies.grid import Grid
from rescale_tasks.studies.points import parse_lr_grid
from rescale_tasks.studies.study import build_parser


@pytest.fixture(autouse=True)
def _in_tmp(offline_in_tmp, monkeypatch):
    """Each test in a folder of its own, W&B offline (tests/tasks/conftest.py)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the subprocess runs: one thread each, as this process


SGD = {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1, "momentum": 0.9}}


def tiny(run_config, path: Path, **trainer) -> str:
    """The tests' digits config (2 steps of a depth-8 CIFAR ResNet), logging to an offline W&B run
    (the study points it at the point's folder)."""
    return run_config(path, model={"init_args": {"optimizer": SGD}},
                      trainer={"logger": None, "log_every_n_steps": 1, **trainer})


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_depth_study_none_diverges_deep_where_rescale_and_skipinit_train(tmp_path, run_config, capsys):
    # 3 epochs of 15 SGD steps (lr 0.1, momentum 0.9), validation on the whole val split
    config = run_config(tmp_path / "depth.yaml", model={"init_args": {"optimizer": SGD}},
                        trainer={"logger": None, "max_epochs": 3, "limit_train_batches": 15,
                                 "limit_val_batches": None, "log_every_n_steps": 5})
    code = main(["study", "depth", "--config", config, "--depths", "8", "44", "--schemes", "none", "rescale",
                 "skipinit", "--out", "depth", "--in_process"])
    assert code == 0, capsys.readouterr()
    rows = {(r["scheme"], int(r["depth"])): r for r in read_csv(tmp_path / "depth/depth.csv")}
    assert len(rows) == 6
    # a plain network trains when shallow (no normalisation needed at 3 blocks) ...
    assert rows["none", 8]["status"] == "trained" and float(rows["none", 8]["final val/acc1"]) > 0.5
    # ... and diverges at depth 44 within its first steps: a result, not a crash
    deep = rows["none", 44]
    assert deep["status"] == f"diverged at step {deep['diverged_step']}" and int(deep["diverged_step"]) <= 3
    assert deep["final val/acc1"] == "" and deep["val_loss"] == ""  # a non-finite model's validation is no result
    for scheme in ("rescale", "skipinit"):  # the normalisation-free schemes train at the same depth and lr
        row = rows[scheme, 44]
        assert row["status"] == "trained" and int(row["steps"]) == 45 and float(row["final val/acc1"]) > 0.3, row
        assert float(row["train_loss"]) < 2.0
        assert row["throughput_unit"] == "images" and float(row["throughput"]) > 0  # training images/s
    wide = {r["scheme"]: r for r in read_csv(tmp_path / "depth/depth_grid.csv")}
    assert list(wide) == ["none", "rescale", "skipinit"]
    assert wide["none"]["depth 44"] == f"diverged@{deep['diverged_step']}"
    assert (tmp_path / "depth/depth.png").stat().st_size > 10_000 and (tmp_path / "depth/depth.md").is_file()
    out = capsys.readouterr().out
    assert "| none | " in out and "points: 6 run, 0 resumed, 0 already done, 0 failed" in out
    # every point is an ordinary fit with its own summary, checkpoint and W&B run in its folder
    grid = Grid.load(str(tmp_path / "depth"))
    point = grid.point("d44-rescale")
    assert grid.status(point) == "done" and grid.last_checkpoint(point)
    assert list((tmp_path / "depth/points/d44-rescale/wandb").glob("offline-run-*"))


def test_an_interrupted_study_resumes_without_repeating_finished_runs(tmp_path, run_config, capsys):
    config = tiny(run_config, tmp_path / "seeds.yaml", max_epochs=2, limit_train_batches=3)
    study = ["study", "seeds", "--config", config, "--seeds", "3", "--out", "seeds"]
    assert main([*study, "--engine", "slurm"]) == 0  # writes the grid (and the script), runs nothing
    grid = Grid.load("seeds")
    first, second, third = grid.points
    # point 1 finished; point 2 was stopped after its first epoch: a last.ckpt, no summary
    assert main(grid.point_argv(first)) == 0
    assert main([*grid.point_argv(second), "--trainer.max_epochs", "1"]) == 0
    (tmp_path / "seeds/points/seed1/run_summary.json").unlink()
    assert [grid.status(p) for p in grid.points] == ["done", "partial", "todo"]
    checkpoint = grid.last_checkpoint(second)
    assert grid.point_argv(second)[-2:] == ["--ckpt_path", checkpoint]
    done_before = (tmp_path / "seeds/points/seed0/run_summary.json")
    stamp, content = done_before.stat().st_mtime_ns, done_before.read_text()
    capsys.readouterr()

    assert main([*study, "--in_process"]) == 0  # (the default, a subprocess per point: run-point below)
    out = capsys.readouterr().out
    assert "[1/3] seed0: done (finished), skipped" in out
    assert f"[2/3] seed1: resuming from {checkpoint}" in out and "[3/3] seed2: running" in out
    assert "points: 1 run, 1 resumed, 1 already done, 0 failed" in out
    assert done_before.stat().st_mtime_ns == stamp and done_before.read_text() == content
    assert not (tmp_path / "seeds/points/seed0/log.txt").exists()  # never started by the study
    log = (tmp_path / "seeds/points/seed1/log.txt").read_text()
    assert f"resume from {checkpoint}" in log and f"--ckpt_path {checkpoint}" in log
    resumed, fresh = read_summary("seeds/points/seed1"), read_summary("seeds/points/seed2")
    assert resumed["status"] == fresh["status"] == "finished"
    assert resumed["steps"] == fresh["steps"] == 6 and (resumed["seed_everything"], fresh["seed_everything"]) == (1, 2)
    assert [s for s, _ in resumed["curves"]["train/loss"]] == [1, 2, 3, 4, 5, 6]  # both segments
    rows = {(r["metric"], r["use"]): r for r in read_csv(tmp_path / "seeds/seeds.csv")}
    assert rows["val/acc1", "final"]["n"] == "3" and rows["val/acc1", "final"]["diverged"] == "0"

    capsys.readouterr()
    assert main([*study, "--in_process"]) == 0  # once more: nothing left to run
    assert "points: 0 run, 0 resumed, 3 already done, 0 failed" in capsys.readouterr().out


def expand_sweep_command(command: list[str], program: str, index: int) -> list[str]:
    """What `wandb agent` runs for the sweep's run with ``point=index`` (its own expansion of the
    ``${...}`` macros; ``${env}`` is /usr/bin/env)."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    macros = create_sweep_command_args({"args": {"point": {"value": index}}})
    macros.update(env=["/usr/bin/env"], program=[program], interpreter=["python"])
    out = []
    for item in command:
        out += macros[item[2:-1]] if item.startswith("${") and item.endswith("}") else [item]
    return out


def test_slurm_array_and_wandb_sweep_reach_every_point(tmp_path, run_config, capsys):
    config = tiny(run_config, tmp_path / "tiny.yaml")
    study = ["study", "batch-lr", "--config", config, "--schemes", "rescale", "skipinit", "--batch_sizes", "32", "64",
             "--lrs", "0.05", "0.1", "--out", "blr"]
    assert main([*study, "--engine", "slurm", "--partition", "gpu", "--time", "02:00:00", "--max_parallel", "4",
                 "--sbatch=--account=abc"]) == 0
    assert "submit: sbatch " in capsys.readouterr().out
    grid = Grid.load("blr")
    n = len(grid.points)
    assert n == 8 and grid.point(3).params == {"scheme": "rescale", "batch_size": 64, "lr": 0.1}
    assert grid.point_argv(grid.point(3))[-6:] == ["--model.init_args.scheme", "rescale", "--data.init_args.batch_size",
                                                   "64", "--model.init_args.optimizer.init_args.lr", "0.1"]

    script = (tmp_path / "blr/slurm.sbatch").read_text().splitlines()
    assert script[0] == "#!/bin/bash"
    options = [line.split(None, 1)[1] for line in script if line.startswith("#SBATCH ")]
    assert f"--array=0-{n - 1}%4" in options and "--partition=gpu" in options and "--time=02:00:00" in options
    assert "--gres=gpu:1" in options and "--account=abc" in options and "--requeue" in options
    assert "--signal=TERM@120" in options
    (launch,) = [shlex.split(line) for line in script if line.startswith("srun ")]
    assert launch[-1] == "$SLURM_ARRAY_TASK_ID" and os.path.isabs(launch[-2])
    # the step gets the job's cores: since SLURM 22.05 srun does not inherit --cpus-per-task
    assert "--cpus-per-task=8" in options and launch[1] == "--cpus-per-task=8"
    assert any("scontrol requeue" in line for line in script)
    for index in range(n):  # every array task id names its own point
        argv = [*launch[:-1], str(index)]
        args = build_parser().parse_args(argv[argv.index("study") + 1:])
        assert args.command == "run-point" and Grid.load(args.study_dir).point(args.index) == grid.points[index]

    assert main([*study, "--engine", "wandb"]) == 0  # the same grid, for `wandb agent`
    assert "wandb sweep --project " in capsys.readouterr().out
    sweep = yaml.safe_load((tmp_path / "blr/sweep.yaml").read_text())
    assert sweep["method"] == "grid" and sweep["parameters"] == {"point": {"values": list(range(n))}}
    assert sweep["project"] == "rescale" and os.access(sweep["program"], os.X_OK)
    for index in range(n):
        argv = expand_sweep_command(sweep["command"], sweep["program"], index)
        assert argv[:2] == ["/usr/bin/env", sweep["program"]]
        args = build_parser().parse_args(argv[argv.index("study") + 1:])
        assert Grid.load(args.study_dir).point(args.point) == grid.points[index]

    # run-point runs that one point (the installed `rescale fit` in a subprocess, its output shown
    # and kept in the point's log); run again (a requeue, a second agent) it has nothing to do
    capsys.readouterr()
    assert main(["study", "run-point", str(tmp_path / "blr"), "--point=5"]) == 0
    assert "`Trainer.fit` stopped: `max_epochs=1` reached." in capsys.readouterr().out
    assert "`Trainer.fit` stopped" in (tmp_path / "blr/points/skipinit-b32-lr0.1/log.txt").read_text()
    assert [grid.status(p) for p in grid.points] == ["todo"] * 5 + ["done"] + ["todo"] * 2
    summary = read_summary("blr/points/skipinit-b32-lr0.1")
    assert (summary["scheme"], summary["batch_size"], summary["lr"]) == ("skipinit", 32, 0.1)
    capsys.readouterr()
    assert main(["study", "run-point", str(tmp_path / "blr"), "5", "--in_process"]) == 0
    assert "nothing to run" in capsys.readouterr().out
    assert read_summary("blr/points/skipinit-b32-lr0.1") == summary

    # the tables say what is missing instead of failing
    assert main(["study", "aggregate", "blr"]) == 0
    table = {(r["scheme"], r["batch_size"]): r for r in read_csv(tmp_path / "blr/batch_lr.csv")}
    assert table["skipinit", "32"]["largest_stable_lr"] == "0.1" and table["skipinit", "32"]["not_done"] == "1"
    assert table["rescale", "64"]["largest_stable_lr"] == "" and table["rescale", "64"]["not_done"] == "2"
    assert (tmp_path / "blr/batch_lr.png").is_file() and (tmp_path / "blr/batch_lr_metric.png").is_file()


def summary(status: str, acc: float, loss: float, train_loss: float, seed: int) -> dict:
    return {"status": status, "seed": seed, "steps": 100, "diverged_step": 37 if status == "diverged" else None,
            "final": {"val/acc1": acc, "val/loss": loss, "train/loss_epoch": train_loss, "lr-SGD": 0.1,
                      "scalars/stage1.block0": 0.5},
            "best": {"val/acc1": acc, "val/loss": loss},
            "curves": {"train/loss": [[1, 2.3], [100, train_loss]], "val/acc1": [[0, acc]]}}


def test_seed_table_is_mean_and_sample_std(tmp_path, run_config):
    config = tiny(run_config, tmp_path / "tiny.yaml")
    assert main(["study", "seeds", "--config", config, "--seeds", "4", "--out", "seeds", "--engine", "slurm"]) == 0
    known = [summary("finished", 0.5, 2.0, 0.25, 0), summary("finished", 0.75, 4.0, 0.5, 1),
             summary("finished", 1.0, 6.0, 0.75, 2), summary("diverged", float("nan"), float("nan"), float("nan"), 3)]
    for i, s in enumerate(known):  # as the runs would have written them, NaN as a string
        folder = tmp_path / f"seeds/points/seed{i}"
        folder.mkdir(parents=True)
        text = json.dumps(s).replace("NaN", '"nan"')
        (folder / "run_summary.json").write_text(text)
    assert main(["study", "aggregate", "seeds", "--wandb_run", "seedtable", "--wandb_project", "rescale-test"]) == 0
    # 3 finite values each (the diverged seed counted apart); std = sample std (n-1)
    assert (tmp_path / "seeds/seeds.csv").read_text().splitlines() == [
        "metric,use,n,mean,std,min,max,runs,diverged",
        "train/loss_epoch,final,3,0.5,0.25,0.25,0.75,4,1",
        "val/acc1,final,3,0.75,0.25,0.5,1.0,4,1",
        "val/acc1,best,3,0.75,0.25,0.5,1.0,4,1",
        "val/loss,final,3,4.0,2.0,2.0,6.0,4,1",
        "val/loss,best,3,4.0,2.0,2.0,6.0,4,1",
    ]
    assert "sample standard deviation (ddof=1, n-1)" in (tmp_path / "seeds/seeds.md").read_text()
    points = {r["seed"]: r["status"] for r in read_csv(tmp_path / "seeds/seeds_points.csv")}
    assert points == {"0": "trained", "1": "trained", "2": "trained", "3": "diverged at step 37"}
    assert (tmp_path / "seeds/seeds.png").is_file()
    (run_dir,) = find_offline_runs(str(tmp_path))  # the tables and the plot, logged to the run named
    logged = read_offline_run(run_dir)
    (row,) = logged.history
    assert logged.run_id == "seedtable" and row["plots/seeds/_type"] == "image-file"
    assert row["tables/seeds/_type"] == "table-file"
    assert (row["tables/seeds/nrows"], row["tables/seeds_points/nrows"]) == (5, 4)


def test_a_metric_no_point_logged_is_one_line_not_empty_tables(tmp_path, run_config, error_line):
    """A misspelt --metric made tables of blanks and a warning that the runs had not validated yet."""
    config = tiny(run_config, tmp_path / "tiny.yaml")
    assert main(["study", "seeds", "--config", config, "--seeds", "2", "--out", "seeds", "--engine", "slurm"]) == 0
    for i in range(2):
        (tmp_path / f"seeds/points/seed{i}").mkdir(parents=True)
        (tmp_path / f"seeds/points/seed{i}/run_summary.json").write_text(json.dumps(summary("finished", 0.5, 2.0,
                                                                                            0.25, i)))
    assert main(["study", "aggregate", "seeds", "--metric", "val/acc9"]) == 2
    assert error_line() == "--metric val/acc9: no point of the study logged it; they logged val/acc1, val/loss"
    assert not (tmp_path / "seeds/seeds.csv").exists()
    assert main(["study", "aggregate", "seeds", "--metric", "val/loss"]) == 0


def test_a_top5_accuracy_at_chance_is_failed_to_learn(tmp_path, run_config):
    """Chance of a top-5 accuracy is 5 in classes: 0.5 on the 10 digits is a run that learned nothing
    (its top-1 at 0.1), not one that trained."""
    config = tiny(run_config, tmp_path / "tiny.yaml")
    assert main(["study", "seeds", "--config", config, "--seeds", "2", "--out", "seeds", "--engine", "slurm"]) == 0
    for i, (acc1, acc5) in enumerate([(0.1, 0.5), (0.6, 0.9)]):
        run = {**summary("finished", acc1, 2.3, 2.3, i), "num_classes": 10}
        run["final"]["val/acc5"] = run["best"]["val/acc5"] = acc5
        (tmp_path / f"seeds/points/seed{i}").mkdir(parents=True)
        (tmp_path / f"seeds/points/seed{i}/run_summary.json").write_text(json.dumps(run))
    for metric in ("val/acc1", "val/acc5"):
        assert main(["study", "aggregate", "seeds", "--metric", metric]) == 0
        rows = read_csv(tmp_path / "seeds/seeds_points.csv")
        assert [r["status"] for r in rows] == ["failed to learn", "trained"], metric


def test_points_that_ran_on_other_code_are_named_in_one_warning(tmp_path, run_config, caplog):
    """A study resumed after a pull mixes two versions of the suite in its tables: one warning line
    says which points ran on which (a study on one version says nothing)."""
    config = tiny(run_config, tmp_path / "tiny.yaml")
    assert main(["study", "seeds", "--config", config, "--seeds", "3", "--out", "seeds", "--engine", "slurm"]) == 0
    commits = ["a" * 40, "a" * 40, "b" * 40]
    for i, commit in enumerate(commits):
        run = {**summary("finished", 0.5, 2.0, 0.25, i), "code": {"version": "0.1.0", "commit": commit, "dirty": False}}
        (tmp_path / f"seeds/points/seed{i}").mkdir(parents=True)
        (tmp_path / f"seeds/points/seed{i}/run_summary.json").write_text(json.dumps(run))
    assert main(["study", "aggregate", "seeds"]) == 0
    (warning,) = [r.getMessage() for r in caplog.records if "versions of the code" in r.getMessage()]
    assert warning.startswith("warning: the points of this study ran on 2 versions of the code (0.1.0 (commit "
                              "aaaaaaa): seed0, seed1 (2); 0.1.0 (commit bbbbbbb): seed2 (1))")
    caplog.clear()
    (tmp_path / "seeds/points/seed2/run_summary.json").unlink()
    assert main(["study", "aggregate", "seeds"]) == 0
    assert not [r for r in caplog.records if "versions of the code" in r.getMessage()]


def test_a_cell_says_which_seeds_are_not_done_or_never_measured(tmp_path, run_config, caplog):
    """Over 2 seeds: rescale's seed 1 not run yet, bn's seed 1 finished before its first
    validation (no val/acc1): each cell says so instead of a bare n, and the study warns about
    the finished runs that logged no metric."""
    config = tiny(run_config, tmp_path / "tiny.yaml")
    assert main(["study", "depth", "--config", config, "--depths", "8", "--schemes", "bn", "rescale",
                 "--seeds", "2", "--out", "depth", "--engine", "slurm"]) == 0
    unvalidated = summary("finished", 0.5, 2.0, 0.25, 1)
    unvalidated["final"] = {k: v for k, v in unvalidated["final"].items() if not k.startswith("val/")}
    unvalidated["best"] = {}
    for name, s in {"d8-bn-s0": summary("finished", 0.5, 2.0, 0.25, 0), "d8-bn-s1": unvalidated,
                    "d8-rescale-s0": summary("finished", 0.75, 2.0, 0.25, 0)}.items():
        folder = tmp_path / f"depth/points/{name}"
        folder.mkdir(parents=True)
        (folder / "run_summary.json").write_text(json.dumps(s))
    with caplog.at_level("WARNING"):
        assert main(["study", "aggregate", "depth", "--metric", "val/acc1"]) == 0
    assert "warning: 1 finished point(s) logged no val/acc1 (d8-bn-s1)" in caplog.text
    cells = {r["scheme"]: r["depth 8"] for r in read_csv(tmp_path / "depth/depth_grid.csv")}
    assert cells == {"bn": "0.500 (1/2 without val/acc1; 90% at 0)", "rescale": "0.750 (1/2 not done; 90% at 0)"}


def test_without_a_chance_level_learning_is_the_loss_curve_falling_not_one_batch(tmp_path, run_config):
    """BLEU has no chance level: a run learned when the last fifth of its logged training losses
    lies below the first fifth. A first batch that happened to be easy (5.5) does not make a
    falling curve 'failed to learn'; a flat curve is."""
    config = tiny(run_config, tmp_path / "tiny.yaml")
    assert main(["study", "depth", "--config", config, "--depths", "8", "--schemes", "dyt", "derf",
                 "--out", "depth", "--engine", "slurm"]) == 0
    falling = [5.5, 6.4, 6.3, 6.1, 6.0, 5.9, 5.8, 5.8, 5.7, 5.7]
    flat = [6.0, 6.1, 6.0, 6.1, 6.0, 6.1, 6.0, 6.1, 6.1, 6.1]
    for name, losses in {"d8-derf": falling, "d8-dyt": flat}.items():
        folder = tmp_path / f"depth/points/{name}"
        folder.mkdir(parents=True)
        (folder / "run_summary.json").write_text(json.dumps({
            "status": "finished", "steps": 50, "final": {"val/bleu": 0.13, "train/loss_epoch": losses[-1]},
            "best": {"val/bleu": 0.13}, "curves": {"train/loss": [[5 * i + 1, v] for i, v in enumerate(losses)]}}))
    assert main(["study", "aggregate", "depth", "--metric", "val/bleu"]) == 0
    status = {r["scheme"]: r["status"] for r in read_csv(tmp_path / "depth/depth.csv")}
    assert status == {"derf": "trained", "dyt": "failed to learn"}


def test_bad_input_is_one_line(tmp_path, run_config, error_line):
    config = tiny(run_config, tmp_path / "tiny.yaml")
    assert main(["study", "depth", "--config", config, "--depths", "x"]) == 2
    assert "argument --depths: invalid int value: 'x'" in error_line()
    assert main(["study", "aggregate", "nowhere"]) == 2
    assert "nowhere is not a study folder" in error_line()
    for option, value in (("--max_parallel", "0"), ("--cpus_per_task", "0"), ("--max_parallel", "-2")):
        # an array other than asked (0: no limit at all) is refused before the grid is written
        assert main(["study", "seeds", "--config", config, "--out", "s", "--engine", "slurm", option, value]) == 2
        assert error_line().startswith(f"{option} {value}: give 1 or more")
        assert not (tmp_path / "s").exists()
    assert main(["study", "seeds", "--config", config, "--seeds", "2", "--out", "s", "--engine", "slurm"]) == 0
    assert main(["study", "seeds", "--config", config, "--seeds", "2", "--out", "s", "--engine", "slurm",
                 "--", "--trainer.max_epochs", "3"]) == 0  # no point has run yet: the grid is replaced
    (tmp_path / "s/points/seed0").mkdir(parents=True)
    assert main(["study", "seeds", "--config", config, "--seeds", "2", "--out", "s", "--engine", "slurm"]) == 2
    assert "already holds point seed0 run with other settings" in error_line()
    assert parse_lr_grid("0.0125:0.1:2") == [0.0125, 0.025, 0.05, 0.1]


def test_grid_values_no_point_can_run_are_one_line_before_the_grid_is_written(tmp_path, run_config, error_line):
    """A depth below 1 or one the network cannot be built at (its own rule: a CIFAR ResNet is 6n+2,
    through a recipe or an override too), a batch size below 1, a learning rate not above 0:
    refused before grid.json is written (each point failed in turn, or a slurm array was written)."""
    config = tiny(run_config, tmp_path / "tiny.yaml")  # cifar_resnet depth 8
    depth = ["study", "depth", "--config", config, "--out", "s", "--engine", "slurm", "--schemes", "bn", "--depths"]
    for depths, expected in ((["0", "8"], "--depths 0: a depth is at least 1"),
                             (["8", "21"], "cannot build network 'cifar_resnet' (--depths 21): CIFAR ResNet depth "
                                           "must be 6n+2 with n >= 1 (8, 20, 32, 44, 56, 110, ...), got 21")):
        assert main([*depth, *depths]) == 2
        assert error_line() == expected
    # the network an override after -- builds: a Wide-ResNet is 6n+4
    assert main([*depth, "10", "20", "--", "--model.init_args.network", "wide_resnet"]) == 2
    assert error_line().startswith("cannot build network 'wide_resnet' (--depths 20): Wide-ResNet depth must be 6n+4")
    batch_lr = ["study", "batch-lr", "--config", config, "--out", "s", "--engine", "slurm", "--schemes", "bn"]
    assert main([*batch_lr, "--batch_sizes", "0", "8", "--lrs", "0.1"]) == 2
    assert error_line() == "--batch_sizes 0: a batch size is at least 1"
    assert main([*batch_lr, "--batch_sizes", "8", "--lrs", "-0.1", "0", "0.1"]) == 2
    assert error_line() == "--lrs -0.1 0: a learning rate is above 0"
    assert not (tmp_path / "s").exists()
    # a depth that is no network option is only checked to be at least 1
    assert main([*depth, "1", "2", "--depth_key", "trainer.max_epochs"]) == 0
    assert main([*depth, "8", "20", "--", "--trainer.max_epochs", "1"]) == 0
    assert [p.params["depth"] for p in Grid.load("s").points] == [8, 20]


@pytest.mark.parametrize("text, why", [('{"points": [', "invalid JSON (Expecting value: line 2)"),
                                       ("[]", "TypeError: list indices must be integers"),
                                       ('{"points": [{"nam": 1}]}', "TypeError: GridPoint.__init__() got an")])
def test_a_grid_file_that_is_no_grid_is_one_line_in_every_command(tmp_path, run_config, error_line, text, why):
    """A grid.json cut short, edited by hand or of another tool: one line naming it (it was a traceback)."""
    config = tiny(run_config, tmp_path / "tiny.yaml")
    (tmp_path / "s").mkdir()
    (tmp_path / "s/grid.json").write_text(text + "\n")
    for command in (["study", "aggregate", "s"], ["study", "run-point", "s", "0"],
                    ["study", "seeds", "--config", config, "--out", "s", "--engine", "slurm"]):
        assert main(command) == 2
        path, _, rest = error_line().partition(" is not the grid file of a study (")
        assert path in (os.path.join("s", "grid.json"), str(tmp_path / "s/grid.json")) and rest.startswith(why)
    assert (tmp_path / "s/grid.json").read_text() == text + "\n"  # kept as it was


@pytest.mark.parametrize("kind", ["seeds", "depth"])
def test_no_seeds_is_one_line_and_a_seed_listed_twice_runs_once(kind, tmp_path, run_config, error_line):
    """--seeds 0 is no study over seeds (the seeds study wrote empty tables, a depth study ran one
    unseeded run per point); a seed listed twice is one seed, in every kind of study."""
    config = tiny(run_config, tmp_path / "tiny.yaml")
    study = ["study", kind, "--config", config, "--out", "s", *(["--depths", "8", "--schemes", "rescale"]
                                                               if kind == "depth" else [])]
    for seeds in ("0", "-1"):
        assert main([*study, "--seeds", seeds]) == 2
        assert error_line() == f"--seeds {seeds}: give at least 1"
    assert not (tmp_path / "s").exists()
    assert main([*study, "--seed_list", "1", "1", "2", "--engine", "slurm"]) == 0
    assert [p.params["seed"] for p in Grid.load("s").points] == [1, 2]


@pytest.mark.parametrize("command", [
    ["compare", "runs", "--out", "afile/out"],
    ["study", "aggregate", "seeds", "--out", "afile/out"],
    ["analyze", "signal", "--config", "tiny.yaml", "--input", "gaussian", "--out", "afile/out"],
    ["study", "depth", "--config", "tiny.yaml", "--depths", "8", "--schemes", "rescale", "--out", "afile/out"],
], ids=["compare", "study aggregate", "analyze signal", "study depth"])
def test_an_output_folder_under_a_file_is_one_line_and_nothing_is_written(command, tmp_path, run_config,
                                                                           error_line):
    tiny(run_config, tmp_path / "tiny.yaml")
    assert main(["study", "seeds", "--config", "tiny.yaml", "--seeds", "2", "--out", "seeds", "--engine", "slurm"]) == 0
    (tmp_path / "runs/a").mkdir(parents=True)
    (tmp_path / "runs/a/run_summary.json").write_text(json.dumps(summary("finished", 0.5, 2.0, 0.25, 0)))
    (tmp_path / "afile").touch()
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert main(command) == 2
    message = error_line()
    assert message.startswith("cannot write ") and message.endswith(
        f"{tmp_path / 'afile/out'}: {tmp_path / 'afile'} is a file, not a folder; give --out a folder you can write")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_a_config_edited_after_points_ran_is_refused_a_comment_is_not(tmp_path, run_config, error_line):
    """The grid records what its configs say: a value edited after a point ran would mix two
    settings in one study, so writing the grid again and running a point are refused in one line;
    a comment or the layout is no setting."""
    config = Path(tiny(run_config, tmp_path / "tiny.yaml"))
    study = ["study", "seeds", "--config", str(config), "--seeds", "2", "--out", "s", "--engine", "slurm"]
    assert main(study) == 0
    (tmp_path / "s/points/seed0").mkdir(parents=True)  # seed0 ran with the config as it was
    text = config.read_text()
    assert "log_every_n_steps: 1\n" in text
    config.write_text("# the digits, two steps\n" + text)
    assert main(study) == 0
    config.write_text(text.replace("log_every_n_steps: 1\n", "log_every_n_steps: 2\n"))
    assert main(["study", "run-point", "s", "1"]) == 2
    assert error_line().startswith("the configs of grid point seed1 changed since")
    assert main(study) == 2
    assert "already holds point seed0 run with other settings" in error_line()
    config.write_text(text)  # put back: the study goes on
    assert main(study) == 0


def test_a_point_run_under_another_definition_of_its_scheme_is_refused_one_without_the_record_is_not(
        tmp_path, run_config, error_line):
    """`rezero` came to share one gain per Transformer layer (`layer_gain`) with its configs unchanged:
    a point whose summary records the definition before was reused as the new network. It is refused
    in one line, writing the grid again and in `run-point`; a summary without the record (written
    before it was kept) is reused as ever, and so is one recording the same definition."""
    config = tiny(run_config, tmp_path / "tiny.yaml")
    study = ["study", "seeds", "--config", config, "--seeds", "2", "--out", "s", "--engine", "slurm"]
    assert main(study) == 0
    older = {**summary("finished", 0.5, 2.0, 0.25, 0), "scheme": "rezero", "scheme_options": {}}
    fields = definition(get_scheme("rezero"))
    for i, run in enumerate([older, {**older, "scheme_fields": fields}]):
        (tmp_path / f"s/points/seed{i}").mkdir(parents=True)
        (tmp_path / f"s/points/seed{i}/run_summary.json").write_text(json.dumps(run))
    assert main(study) == 0
    (tmp_path / "s/points/seed1/run_summary.json").write_text(json.dumps(
        {**older, "scheme_fields": {**fields, "layer_gain": False}}))
    refusal = (f"{tmp_path / 's'} already holds point seed1 run under another definition of scheme rezero "
               f"(layer_gain false (now true)); give the study another --out folder, or delete "
               f"{tmp_path / 's/points/seed1'} to run it again")
    assert main(study) == 2
    assert error_line() == refusal
    assert main(["study", "run-point", "s", "1"]) == 2
    assert error_line() == refusal


def test_points_of_one_scheme_run_under_two_definitions_of_it_are_not_tabulated_as_one(tmp_path, run_config,
                                                                                        error_line):
    """A seed run before `rezero` shared its gain per Transformer layer and one run after were
    averaged as one scheme by `study aggregate`: refused in one line naming the earlier points,
    before anything is written; a point without the record is left alone, as when reused."""
    config = tiny(run_config, tmp_path / "tiny.yaml")
    assert main(["study", "seeds", "--config", config, "--seeds", "3", "--out", "s", "--engine", "slurm"]) == 0
    now = definition(get_scheme("rezero"))
    runs = [{"scheme_fields": {**now, "layer_gain": False}}, {"scheme_fields": now}, {}]
    for i, extra in enumerate(runs):
        (tmp_path / f"s/points/seed{i}").mkdir(parents=True)
        (tmp_path / f"s/points/seed{i}/run_summary.json").write_text(json.dumps(
            {**summary("finished", 0.5, 2.0, 0.25, i), "scheme": "rezero", "scheme_options": {}, **extra}))
    assert main(["study", "aggregate", "s"]) == 2
    assert error_line() == (
        f"{tmp_path / 's'}: its points of scheme rezero ran under 2 definitions of it (layer_gain false (now true): "
        f"seed0; as the code defines it now: seed1), which its tables would average as one; delete the points of "
        f"the earlier ones from {tmp_path / 's/points'} (seed0) and run the study again")
    assert not (tmp_path / "s/seeds.csv").exists()
    (tmp_path / "s/points/seed0/run_summary.json").unlink()
    assert main(["study", "aggregate", "s"]) == 0


def test_an_overlay_after_the_double_dash_is_one_of_the_configs(tmp_path, run_config, error_line):
    """`-- --config overlay.yaml` applies a config to every point as --config does: an edited value in
    it is refused as one in the configs (the points that ran read the old value), and the logger it
    sets logs into each point's folder."""
    config = run_config(tmp_path / "tiny.yaml", trainer={"logger": False})
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("model: {init_args: {optimizer: {class_path: torch.optim.SGD, init_args: {lr: 0.05}}}}\n"
                       "trainer: {logger: {class_path: lightning.pytorch.loggers.CSVLogger}}\n")
    study = ["study", "seeds", "--config", config, "--seeds", "2", "--out", "s", "--engine", "slurm",
             "--", "--config", "overlay.yaml"]
    assert main(study) == 0
    grid = Grid.load("s")
    argv = grid.point_argv(grid.point(0))
    assert argv[argv.index("--trainer.logger.init_args.save_dir") + 1] == grid.point_dir(grid.point(0))
    (tmp_path / "s/points/seed0").mkdir(parents=True)  # seed0 ran with lr 0.05
    overlay.write_text(overlay.read_text().replace("lr: 0.05", "lr: 0.5"))
    assert main(["study", "run-point", "s", "1"]) == 2
    message = error_line()
    assert message.startswith("the configs of grid point seed1 changed since") and str(overlay) in message
    assert main(study) == 2
    assert "already holds point seed0 run with other settings" in error_line()
    # an overlay that is no config is one line before a point runs or a script is written, as --config's
    assert main([*study[:study.index("--out") + 1], "s2", *study[study.index("--out") + 2:-1], "gone.yaml"]) == 2
    assert error_line().startswith("config file not found: gone.yaml (--config (after --))")
    assert not (tmp_path / "s2").exists()


def test_a_study_run_again_from_another_folder_is_refused(tmp_path, run_config, error_line, monkeypatch):
    """The points run where the study was made: relative paths (data.root: data/cifar10, an overlay)
    name files there. Run again from elsewhere, the points still to run would read other files
    than those that ran: refused in one line naming the folder; before any point ran it is free."""
    config = tiny(run_config, tmp_path / "tiny.yaml")
    study = ["study", "seeds", "--config", config, "--seeds", "2", "--out", str(tmp_path / "s"), "--engine", "slurm"]
    assert main(study) == 0
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(study) == 0  # no point has run: the grid is written again, from here
    assert Grid.load(str(tmp_path / "s")).cwd == str(tmp_path / "elsewhere")
    (tmp_path / "s/points/seed0").mkdir(parents=True)  # seed0 ran from elsewhere/
    monkeypatch.chdir(tmp_path)
    assert main(study) == 2
    assert error_line() == (f"{tmp_path / 's'} holds points run from {tmp_path / 'elsewhere'} (the folder relative "
                            f"paths such as data.root are read from), not from {tmp_path}: run the study from "
                            f"{tmp_path / 'elsewhere'}, or give it another --out folder")
    assert Grid.load(str(tmp_path / "s")).cwd == str(tmp_path / "elsewhere")


def test_a_second_study_on_the_same_folder_is_refused_naming_the_first(tmp_path, run_config, error_line):
    """Two `rescale study` processes on one --out would run the same points at once: the second is
    refused in one line naming the first (its pid), and the folder stays the first's alone."""
    import subprocess
    import sys
    import time

    config = tiny(run_config, tmp_path / "seeds.yaml")
    study = ["study", "seeds", "--config", config, "--seeds", "2", "--out", "seeds", "--in_process"]
    first = forked.popen([sys.executable, "-m", "rescale_tasks.cli", *study], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lock, deadline = tmp_path / "seeds" / ".lock", time.monotonic() + 120
        while not (lock.is_file() and f"pid {first.pid} " in lock.read_text()):
            assert first.poll() is None and time.monotonic() < deadline, "the first study never took its folder"
            time.sleep(0.05)
        assert main(study) == 2
        message = error_line()
        assert message.startswith(f"study folder {tmp_path / 'seeds'} is in use by pid {first.pid} on "), message
        assert "rescale_tasks.cli study seeds" in message or "cli.py study seeds" in message, message
    finally:
        output = first.communicate(timeout=300)[0]
    assert first.returncode == 0, output
    for seed in ("seed0", "seed1"):  # each point ran once, by the first study
        log = (tmp_path / "seeds" / "points" / seed / "log.txt").read_text()
        assert log.count("=== ") == 2 and read_summary(f"seeds/points/{seed}")["status"] == "finished"


def test_a_point_running_elsewhere_is_neither_run_again_nor_waited_for(tmp_path, run_config, capsys, error_line):
    """The points of a SLURM array share the study folder; each locks its own point folder, and a
    point whose lock is held (here by this process, as another run-point would hold it) is refused
    by run-point and skipped by a local study, which runs the others."""
    from rescale_tasks.common.system import folder_lock

    config = tiny(run_config, tmp_path / "seeds.yaml")
    study = ["study", "seeds", "--config", config, "--seeds", "2", "--out", "seeds"]
    assert main([*study, "--engine", "slurm"]) == 0
    grid = Grid.load("seeds")
    capsys.readouterr()
    with folder_lock(grid.point_dir(grid.point(0))):
        assert main(["study", "run-point", "seeds", "0", "--in_process"]) == 2
        assert f"grid point seed0 at {grid.point_dir(grid.point(0))} is in use by pid {os.getpid()} " in error_line()
        assert main([*study, "--in_process"]) == 0
        out = capsys.readouterr().out
        assert f"[1/2] seed0: running in another process (pid {os.getpid()} " in out
        assert "points: 1 run, 0 resumed, 0 already done, 0 failed, 1 running elsewhere" in out
    assert [grid.status(p) for p in grid.points] == ["todo", "done"]


def test_a_study_over_seeds_runs_seed_by_seed(tmp_path, run_config, capsys, error_line):
    """The local engine runs every point's first seed before any second seed (a study stopped
    half-way has whole tables of its first seeds); --workers it cannot run is one line."""
    config = tiny(run_config, tmp_path / "tiny.yaml")
    study = ["study", "depth", "--config", config, "--depths", "8", "14", "--schemes", "none", "rescale",
             "--seeds", "2", "--out", "depth"]
    assert main([*study, "--dry-run"]) == 0
    out = capsys.readouterr().out
    names = [line.split("] ")[1].split(":")[0] for line in out.splitlines() if line.startswith("[")]
    assert names == ["d8-none-s0", "d14-none-s0", "d8-rescale-s0", "d14-rescale-s0",
                     "d8-none-s1", "d14-none-s1", "d8-rescale-s1", "d14-rescale-s1"]
    assert main([*study, "--workers", "2", "--in_process"]) == 2
    assert error_line() == "--workers 2 runs each point as a subprocess: drop --in_process (one process trains " \
                           "one point at a time)"
    assert main([*study, "--workers", "0"]) == 2
    assert error_line() == "--workers 0: give 1 or more"
    assert not (tmp_path / "depth").exists()  # refused before anything was written


class CrashAt(L.Callback):
    """A run that crashes at a training step (as one out of memory would)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step >= self.step:
            raise RuntimeError(f"boom at step {trainer.global_step}")


class SignalAt(L.Callback):
    """SIGTERM to this process at a training step (a scheduler's, a kill from another shell)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_study_in_process_stops_at_a_signal_as_one_of_subprocesses_does(tmp_path, run_config, capsys):
    """SIGTERM stopped the point run --in_process (its last.ckpt saved) and the study went on with the
    next point, counting the stopped one failed; it stops the study, as with a subprocess per point."""
    config = tiny(run_config, tmp_path / "tiny.yaml", max_epochs=2)
    study = ["study", "seeds", "--config", config, "--seeds", "2", "--out", "s", "--in_process"]
    assert main([*study, "--", f"--trainer.callbacks+={__name__}.SignalAt",
                 "--trainer.callbacks.init_args.step", "3"]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert "error: study interrupted while running seed0 (its last.ckpt is kept); run the same command again" in err
    grid = Grid.load("s")
    assert [grid.status(p) for p in grid.points] == ["partial", "todo"]
    assert not (tmp_path / "s/points/seed1").exists()  # never started


def test_a_point_that_crashed_after_its_first_checkpoint_says_why_in_the_table(tmp_path, run_config, capsys):
    """A point that crashed after its first last.ckpt is resumable, and its row says why it
    stopped, as the study said, not only where it can resume."""
    config = tiny(run_config, tmp_path / "tiny.yaml", max_epochs=2)
    assert main(["study", "seeds", "--config", config, "--seeds", "1", "--out", "s", "--in_process", "--",
                 f"--trainer.callbacks+={__name__}.CrashAt", "--trainer.callbacks.init_args.step", "3"]) == 1
    assert "[1/1] seed0: failed (exit status 1): RuntimeError: boom at step 3" in capsys.readouterr().out
    (row,) = read_csv(tmp_path / "s/seeds_points.csv")
    checkpoint = Grid.load("s").last_checkpoint(Grid.load("s").point(0))
    assert row["status"] == "interrupted" and checkpoint
    assert row["error"] == f"RuntimeError: boom at step 3; resumable from {checkpoint}"


def test_a_stop_signal_that_comes_as_a_point_ends_says_its_result_is_kept(tmp_path, run_config):
    """A signal reaching the study while its point closes (summary written, process not yet gone)
    was told as 'stopped before its first checkpoint: it starts again'; the point is done."""
    from rescale_tasks.studies.study import _where_stopped

    config = tiny(run_config, tmp_path / "tiny.yaml")
    assert main(["study", "seeds", "--config", config, "--seeds", "1", "--out", "s", "--engine", "slurm"]) == 0
    grid = Grid.load("s")
    assert _where_stopped(grid, "seed0") == "stopped before its first checkpoint: it starts again"
    (tmp_path / "s/points/seed0").mkdir(parents=True)
    (tmp_path / "s/points/seed0/run_summary.json").write_text(json.dumps(summary("diverged", 0.1, 9.0, 9.0, 0)))
    assert _where_stopped(grid, "seed0") == "it had ended (diverged) as the signal came: its result is kept"


def test_a_point_killed_by_a_signal_it_did_not_handle_is_told_so_not_by_its_last_output_line(tmp_path):
    """The out-of-memory killer's SIGKILL leaves no error line: the outcome names the signal, not the
    last line the run happened to print."""
    import io
    import sys

    from rescale_tasks.studies.engines import _error_line, _run_subprocess

    log = io.StringIO()
    child = [sys.executable, "-c", "import os, signal; print('TPU available: False', flush=True); "
             "os.kill(os.getpid(), signal.SIGKILL)"]
    code = _run_subprocess(child, log, cwd=str(tmp_path), echo=False)
    assert code == -9 and "TPU available" in log.getvalue()
    assert _error_line(log.getvalue(), code) == "killed by SIGKILL (out of memory? or killed from outside)"
    assert _error_line("error: CUDA out of memory\n", 1) == "CUDA out of memory"


def test_a_point_killed_before_it_could_save_is_told_as_a_signal_and_the_study_exits_as_signalled(tmp_path):
    """A point that dies of the forwarded SIGTERM (no handler yet: still starting) is recorded with
    exit status 143, not Popen's -15; the study's own status is 128 + the signal it got (130)."""
    import io
    import signal
    import sys

    from rescale_tasks.studies.engines import StudyInterrupted, _Forwarder, _run_subprocess

    child = [sys.executable, "-c", "import os, signal, time; os.kill(os.getppid(), signal.SIGINT); time.sleep(30)"]
    forwarder = _Forwarder()
    with pytest.raises(StudyInterrupted) as stop, forwarder.installed():
        _run_subprocess(child, io.StringIO(), cwd=str(tmp_path), echo=False, forwarder=forwarder)
    assert (stop.value.returncode, stop.value.child) == (128 + signal.SIGINT, 128 + signal.SIGTERM)


def test_workers_get_equal_shares_of_the_gpus(monkeypatch):
    from rescale_tasks.studies.engines import visible_gpus, worker_devices

    eight = [str(i) for i in range(8)]
    assert worker_devices(4, eight)[0] == ["0,1", "2,3", "4,5", "6,7"]
    chosen, line = worker_devices(3, eight)
    assert chosen == ["0,1", "2,3", "4,5"] and "unused: 6,7" in line  # equal shares: no point on 3 GPUs
    chosen, line = worker_devices(3, ["0", "1"])
    assert chosen == ["0", "1", "0"] and "3 workers share 2 GPUs" in line
    assert worker_devices(1, eight) == ([None], None)  # one worker: every GPU, as it is
    assert worker_devices(2, []) == ([None, None], None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ab12, 3,-1,5")
    assert visible_gpus() == ["GPU-ab12", "3"]  # as CUDA reads it: up to the first entry hiding the rest
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_run_points_at_once_and_a_signal_stops_and_resumes_them_all(tmp_path, run_config, monkeypatch,
                                                                           capsys, workers):
    """--workers 2: two points train at the same time, each a ``rescale fit`` process (forked from
    the suite's zygote, as the engine's ``subprocess.Popen`` would start it); the probe makes both
    meet at step 3 (they never would one after another) and then sends SIGTERM to the study, which
    passes it to both: each saves its last.ckpt at step 3 and the study ends with 143. The same
    command resumes both to the end. Each worker is given its share of the GPUs named in
    CUDA_VISIBLE_DEVICES (the probe writes down what its run saw; a GPU-less host runs the same
    on its CPU). --workers 1 (the default): the same with one point, which sees them all."""
    import signal
    import subprocess
    import types

    from rescale_tasks.studies import engines

    monkeypatch.setattr(engines, "subprocess", types.SimpleNamespace(**{**vars(subprocess), "Popen": forked.popen}))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[2]))  # signal_probe.py, for the points' processes
    meet = tmp_path / "meet"
    meet.mkdir()
    probe = {"class_path": "signal_probe.SignalAt",
             "init_args": {"step": 3, "marker": str(meet / "sent"), "parties": workers, "pid": os.getpid(),
                           "linger": 2.0}}
    config = tiny(run_config, tmp_path / "seeds.yaml", max_epochs=2, limit_train_batches=6, callbacks=[probe])
    study = ["study", "seeds", "--config", config, "--seeds", str(workers), "--out", "seeds"]
    handler = signal.getsignal(signal.SIGTERM)

    with monkeypatch.context() as gpus:  # the points' GPUs, not this process's (the resume below)
        gpus.setenv("CUDA_VISIBLE_DEVICES", "4,7")
        assert main([*study, "--workers", str(workers)]) == 128 + signal.SIGTERM
    out = capsys.readouterr()
    at_once = "2 points, 2 at once" if workers == 2 else "1 points, one after another"
    assert f"{at_once} (each a rescale fit subprocess)" in out.out
    assert "error: study interrupted while running seed" in out.err
    assert "its last.ckpt is kept" in out.err and ("the points running beside it kept theirs" in out.err) == (workers == 2)
    assert signal.getsignal(signal.SIGTERM) is handler  # the study's forwarding is gone with it
    assert sorted(mark.read_text() for mark in meet.glob("at-*")) == (["4", "7"] if workers == 2 else ["4,7"])
    assert (meet / "sent").is_file()
    assert ("GPUs (CUDA_VISIBLE_DEVICES) per worker: 1: 4; 2: 7 (1 each)" in out.out) == (workers == 2)
    grid = Grid.load("seeds")
    assert [grid.status(p) for p in grid.points] == ["partial"] * workers
    for point in grid.points:
        import torch

        assert torch.load(grid.last_checkpoint(point), weights_only=True)["global_step"] == 3
        log = (tmp_path / "seeds" / "points" / point.name / "log.txt").read_text()
        assert log.count("=== ") == 2 and "stopped by a signal (exit status 143)" in log, log

    assert main([*study, "--in_process"]) == 0
    assert f"points: 0 run, {workers} resumed, 0 already done, 0 failed" in capsys.readouterr().out
    for point in grid.points:
        done = read_summary(f"seeds/points/{point.name}")
        assert done["status"] == "finished" and done["steps"] == 12
        assert [s for s, _ in done["curves"]["train/loss"]] == list(range(1, 13))  # both segments

    handed = []  # finished points are said in order by the study, not handed to its workers
    monkeypatch.setattr(engines, "_in_parallel", lambda items, *args: handed.extend(items))
    assert main([*study, "--workers", "2"]) == 0
    said = [line.split("]")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert handed == [] and said == [f"[{k}/{workers}" for k in range(1, workers + 1)]


def test_a_point_running_while_the_study_is_aggregated_is_running_not_interrupted(tmp_path, run_config):
    """A SLURM array aggregated while its tasks train: a point whose folder's lock is held (here by
    this process, as its run-point holds it) is ``running``, whether or not it has saved a
    ``last.ckpt`` yet; once its lock is let go, a point with a ``last.ckpt`` is ``interrupted``."""
    from rescale_tasks.common.system import folder_lock
    from rescale_tasks.studies.results import point_rows

    config = tiny(run_config, tmp_path / "seeds.yaml")
    assert main(["study", "seeds", "--config", config, "--seeds", "3", "--out", "seeds", "--engine", "slurm"]) == 0
    grid = Grid.load("seeds")
    (Path(grid.point_dir(grid.point(0))) / "checkpoints").mkdir(parents=True)
    (Path(grid.point_dir(grid.point(0))) / "checkpoints" / "last.ckpt").write_bytes(b"saved")
    Path(grid.point_dir(grid.point(2))).mkdir(parents=True)
    (Path(grid.point_dir(grid.point(2))) / "run_summary.json").write_text(json.dumps(summary("finished", 0.5, 2.0, 0.25, 2)))
    with folder_lock(grid.point_dir(grid.point(0))), folder_lock(grid.point_dir(grid.point(1))):
        rows, _ = point_rows(grid, "val/acc1")
        assert [r["status"] for r in rows] == ["running", "running", "trained"]
        assert rows[0]["error"].startswith(f"running: pid {os.getpid()} on ")
        assert main(["study", "aggregate", "seeds", "--out", "tables"]) == 0
    rows, _ = point_rows(grid, "val/acc1")
    assert [r["status"] for r in rows] == ["interrupted", "not run", "trained"]
