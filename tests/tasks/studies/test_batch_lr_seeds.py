"""``rescale study batch-lr`` over seeds: how many seeds diverged at each learning rate, and an
optimum chosen among the learning rates at which none did, as the tables say."""
from __future__ import annotations

import csv
import json

import pytest

from rescale_tasks.cli import main
from rescale_tasks.studies.grid import Grid


@pytest.fixture(autouse=True)
def _in_tmp(offline_in_tmp):
    """Each test in a folder of its own, W&B offline (tests/tasks/conftest.py)."""


def _table(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _summary(seed: int, acc) -> dict:
    diverged = acc is None
    return {"status": "diverged" if diverged else "finished", "seed": seed, "steps": 20,
            "diverged_step": 7 if diverged else None, "num_classes": 10,
            "final": {"val/acc1": "nan" if diverged else acc, "train/loss_epoch": "nan" if diverged else 0.1},
            "best": {} if diverged else {"val/acc1": acc},
            "curves": {"train/loss": [[1, 2.3], [20, 0.1]], "val/acc1": [] if diverged else [[20, acc]]}}


def test_the_tables_say_how_many_seeds_diverged_at_each_learning_rate(tmp_path, run_config):
    config = run_config(tmp_path / "tiny.yaml")
    assert main(["study", "batch-lr", "--config", config, "--schemes", "rescale", "--batch_sizes", "64", "--lrs",
                 "0.1", "0.2", "0.4", "--seeds", "3", "--out", "blr", "--engine", "slurm"]) == 0
    # lr 0.1: three seeds at 0.80; lr 0.2: two at 0.90 and one diverged; lr 0.4: all three diverged
    accs = {0.1: [0.8, 0.8, 0.8], 0.2: [0.9, 0.9, None], 0.4: [None, None, None]}
    grid = Grid.load("blr")
    for point in grid.points:
        folder = tmp_path / grid.point_dir(point)
        folder.mkdir(parents=True, exist_ok=True)
        acc = accs[point.params["lr"]][point.params["seed"]]
        (folder / "run_summary.json").write_text(json.dumps(_summary(point.params["seed"], acc)))
    assert main(["study", "aggregate", "blr", "--metric", "val/acc1"]) == 0
    points = {float(r["lr"]): r for r in _table(tmp_path / "blr/batch_lr_points.csv")}
    assert {lr: (r["status"], r["diverged"]) for lr, r in points.items()} == {
        0.1: ("trained", "0/3"), 0.2: ("partly diverged", "1/3"), 0.4: ("diverged", "3/3")}
    (summary,) = _table(tmp_path / "blr/batch_lr.csv")
    # lr 0.2's two surviving seeds have the best mean, yet a seed diverged there: neither optimal nor stable
    assert (summary["optimal_lr"], summary["largest_stable_lr"]) == ("0.1", "0.1")
    assert (summary["diverged"], summary["diverged_seeds"]) == ("2", "0.2: 1/3; 0.4: 3/3")
    title = (tmp_path / "blr/batch_lr.md").read_text().splitlines()[0]
    assert "the best mean among the learning rates at which no seed diverged" in title
