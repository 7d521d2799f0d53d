"""`rescale compare --wandb_project` on the offline W&B runs of real `rescale fit` runs: the same
table as from their run folders' run_summary.json files, read from those files (never from W&B's
own run files); a table logged to an offline run named by its folder."""
from __future__ import annotations

import csv
import glob
import os
import shutil

import pytest

from rescale_tasks.cli import main
from rescale_tasks.common.run import find_summaries, read_summary
from wandb_runs import find_offline_runs, read_offline_run


@pytest.fixture(autouse=True)
def _in_tmp(offline_in_tmp):
    """Each test in a folder of its own, W&B offline (tests/tasks/conftest.py)."""


@pytest.fixture(scope="module")
def wandb_runs(tmp_path_factory, run_config, suite_wandb_logger):
    """Two tiny fits (bn, rescale) of one group in project rescale-test, one of another project,
    all with the suite's W&B logger (offline) under runs/."""
    import os

    folder = tmp_path_factory.mktemp("wandb_runs")
    old, mode = os.getcwd(), os.environ.get("WANDB_MODE")
    os.chdir(folder)
    os.environ["WANDB_MODE"] = "offline"
    try:
        for project, scheme in (("rescale-test", "bn"), ("rescale-test", "rescale"), ("other", "skipinit")):
            config = run_config(folder / f"{project}-{scheme}.yaml", model={"init_args": {"scheme": scheme}},
                                trainer={"log_every_n_steps": 1, "limit_train_batches": 3,
                                         "logger": suite_wandb_logger(project, scheme, group="digits-tiny")})
            assert main(["fit", "--config", config]) == 0
    finally:
        os.chdir(old)
        if mode is None:
            os.environ.pop("WANDB_MODE", None)
        else:
            os.environ["WANDB_MODE"] = mode
    return folder


def _table(path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_compare_reads_the_offline_wandb_runs_of_a_project(wandb_runs, capsys):
    runs = str(wandb_runs / "runs")
    assert main(["compare", "--wandb_project", "rescale-test", "--wandb_dir", runs, "--out", "from_wandb"]) == 0
    assert main(["compare", "--wandb_project", "me/rescale-test", "--wandb_dir", runs, "--out", "entity"]) == 0
    # the run folders of the same project, for reference
    folders = [p for p in find_summaries(runs) if read_summary(p)["project"] == "rescale-test"]
    assert len(folders) == 2, folders
    assert main(["compare", *folders, "--out", "from_folders"]) == 0

    wandb, entity, summaries = _table("from_wandb/compare.csv"), _table("entity/compare.csv"), \
        _table("from_folders/compare.csv")
    assert wandb == entity
    assert [(r["experiment"], r["variant"], r["role"], r["runs"], r["metric"]) for r in wandb] == [
        ("digits-tiny", "bn", "baseline", "1", "val/acc1"), ("digits-tiny", "rescale", "", "1", "val/acc1")]
    for mine, theirs in zip(wandb, summaries):  # what W&B received is what the summaries hold
        for key in ("experiment", "variant", "role", "runs", "metric", "diverged"):
            assert mine[key] == theirs[key], key
        for key in ("mean", "vs_baseline", "train_loss", "samples_per_s"):
            assert float(mine[key]) == pytest.approx(float(theirs[key]), rel=1e-5), key
    assert float(wandb[0]["samples_per_s"]) > 0
    out = capsys.readouterr().out
    assert "| digits-tiny | rescale |" in out


def test_compare_a_project_with_no_offline_runs_is_one_line(wandb_runs, capsys):
    assert main(["compare", "--wandb_project", "me/nothing", "--wandb_dir", str(wandb_runs / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert "no run_summary.json of project nothing under" in err[0] and "wandb login" in err[0], err[0]


def test_compare_of_a_project_reads_the_run_summaries_not_wandbs_run_files(wandb_runs, tmp_path):
    """The project's offline runs with W&B's binary run files removed: the same table, from the
    run_summary.json each run keeps in its W&B run folder."""
    copy = tmp_path / "runs"
    shutil.copytree(wandb_runs / "runs", copy)
    for path in glob.glob(str(copy / "wandb" / "offline-run-*" / "*.wandb")):
        os.remove(path)
    runs = str(wandb_runs / "runs")
    assert main(["compare", "--wandb_project", "rescale-test", "--wandb_dir", runs, "--out", "with_files"]) == 0
    assert main(["compare", "--wandb_project", "rescale-test", "--wandb_dir", str(copy), "--out", "without"]) == 0
    assert _table("without/compare.csv") == _table("with_files/compare.csv")
    assert [r["variant"] for r in _table("without/compare.csv")] == ["bn", "rescale"]
    # a run found both among the folders and under --wandb_dir counts once
    assert main(["compare", str(copy), "--wandb_project", "rescale-test", "--wandb_dir", str(copy),
                 "--out", "both"]) == 0
    assert {r["variant"]: r["runs"] for r in _table("both/compare.csv")} == {"bn": "1", "rescale": "1", "skipinit": "1"}


def test_compare_logs_its_table_to_the_run_its_folder_names(wandb_runs, tmp_path):
    """``--wandb_run <offline run folder>``: the table goes to that run (its id, its project)."""
    copy = tmp_path / "runs"
    shutil.copytree(wandb_runs / "runs", copy)
    folder = next(f for f in find_offline_runs(str(copy))
                  if "rescale-test" in open(os.path.join(f, "files", "rescale_config.yaml")).read())
    first = read_offline_run(folder)
    assert main(["compare", str(copy), "--out", "logged", "--wandb_run", folder]) == 0
    (again,) = [f for f in find_offline_runs(str(copy)) if f.endswith(f"-{first.run_id}") and f != folder]
    logged = read_offline_run(again)
    assert logged.run_id == first.run_id
    assert logged.project == first.project == "rescale-test"
    assert logged.metric("tables/compare/_type") == ["table-file"]
    assert logged.metric("plots/digits-tiny_curves/_type") == ["image-file"]
