"""The suite's W&B logger against the installed wandb (a real offline run)."""
from __future__ import annotations

import wandb

from rescale_tasks.common.reporting import SuiteWandbLogger


def test_a_run_starts_without_wandbs_deprecation_warnings(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = SuiteWandbLogger(name="quiet", save_dir=str(tmp_path / "runs"), project="rescale-test")
    try:
        run = logger.experiment
        assert run.offline and run.name == "quiet"
    finally:
        wandb.finish()
    out, err = capfd.readouterr()
    assert "anonymous" not in out + err and "will be removed" not in out + err, out + err


def _offline_runs(root):
    from wandb_runs import find_offline_runs

    return find_offline_runs(str(root)) if root.is_dir() else []


def test_a_command_failing_its_checks_leaves_no_wandb_run(tmp_path, monkeypatch, run_config, suite_wandb_logger,
                                                         error_line):
    """The W&B run begins after the data, module and checkpoint checks, not while Lightning sets
    up: a command failing them leaves no run (no empty run marked interrupted with 0 steps); a good
    command's run still gets its config, and its checkpoints the run's id."""
    import torch

    from rescale_tasks.cli import main
    from wandb_runs import read_offline_run
    from rescale_tasks.common.run import find_summaries, read_summary

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = {"logger": suite_wandb_logger("rescale-test", "checks")}
    missing = run_config(tmp_path / "missing.yaml", trainer=logger, data={
        "class_path": "rescale_tasks.classification.data.ImageFolderDataModule",
        "init_args": {"root": str(tmp_path / "nowhere"), "batch_size": 4}})
    assert main(["fit", "--config", missing]) == 2
    assert "ImageNet folder not found" in error_line()
    assert _offline_runs(tmp_path / "runs") == [] and find_summaries(str(tmp_path)) == []

    # a checkpoint whose weights do not fit the network: refused when Lightning restores it
    good = run_config(tmp_path / "good.yaml", trainer={**logger, "log_every_n_steps": 1})
    assert main(["fit", "--config", good]) == 0
    (run_dir,) = _offline_runs(tmp_path / "runs")
    run = read_offline_run(run_dir)
    (ckpt,) = (tmp_path / "runs" / "rescale-test" / run.run_id / "checkpoints").glob("last.ckpt")
    assert (tmp_path / run_dir / "files" / "rescale_config.yaml").is_file()
    assert read_summary(find_summaries(str(tmp_path / "runs"))[0])["run_id"] == run.run_id
    broken = torch.load(ckpt, weights_only=False)
    broken["state_dict"] = {k: v for k, v in broken["state_dict"].items() if "fc" not in k}
    torch.save(broken, tmp_path / "broken.ckpt")
    assert main(["validate", "--config", good, "--ckpt_path", str(tmp_path / "broken.ckpt")]) == 2
    message = error_line()
    assert "broken.ckpt" in message and "missing" in message, message
    assert len(_offline_runs(tmp_path / "runs")) == 1  # no second run


def test_a_sweep_agents_run_id_is_the_runs_id_throughout(tmp_path, monkeypatch, run_config, suite_wandb_logger):
    """``wandb agent`` names the run it starts in WANDB_RUN_ID: the W&B run, the run summary, the
    checkpoint folder and the run's lock all take it (the checkpoints went to a folder of an id
    of the suite's own, so two runs given one W&B id were not caught)."""
    from rescale_tasks.cli import main
    from rescale_tasks.common.run import find_summaries, read_summary

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_RUN_ID", "agentrun1")
    config = run_config(tmp_path / "run.yaml", trainer={"logger": suite_wandb_logger("rescale-test", "sweep"),
                                                        "max_steps": 1, "limit_val_batches": 0})
    assert main(["fit", "--config", config]) == 0
    assert [p.name for p in (tmp_path / "runs" / "rescale-test").iterdir()] == ["agentrun1"]
    assert (tmp_path / "runs" / "rescale-test" / "agentrun1" / "checkpoints" / "last.ckpt").is_file()
    assert read_summary(find_summaries(str(tmp_path / "runs"))[0])["run_id"] == "agentrun1"
