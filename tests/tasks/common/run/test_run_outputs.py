"""What a run writes and says: its closing line, checkpoints named by what they hold, folders that
cannot be written refused before the run starts, and ``--ckpt_path last`` without a run id.

Real ``rescale fit``/``test`` commands on the embedded digits (offline W&B runs), a few steps each.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import shlex
import warnings
from pathlib import Path

import pytest

from rescale_tasks.cli import main
from rescale_tasks.common.checkpoints import safe_load


@contextlib.contextmanager
def _in(folder: Path):
    old = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, run_config, suite_wandb_logger):
    """A fit of 3 steps over epochs of 2: the first epoch completes, the second is cut short."""
    folder = tmp_path_factory.mktemp("finished")
    config = run_config(folder / "run.yaml", trainer={"max_epochs": 2, "max_steps": 3, "limit_val_batches": 0,
                                                      "num_sanity_val_steps": 0,
                                                      "logger": suite_wandb_logger("outputs", "finished")})
    out = io.StringIO()
    with _in(folder), contextlib.redirect_stdout(out):
        os.environ.setdefault("WANDB_MODE", "offline")
        assert main(["fit", "--config", config, "--model.init_args.network_options", "{depth: 8, base_width: 4}"]) == 0
    (last,) = (folder / "runs" / "outputs").glob("*/checkpoints/last.ckpt")
    return {"folder": folder, "config": config, "out": out.getvalue(), "last": last}


def test_fit_ends_with_its_run_folder_checkpoint_and_the_next_command(finished):
    line = finished["out"].strip().splitlines()[-1]
    relative = os.path.relpath(finished["last"], finished["folder"])
    assert line.startswith("fit finished at step 3: run folder runs/wandb/offline-run-"), line
    run_folder = line.split("run folder ", 1)[1].split(";", 1)[0]
    assert (finished["folder"] / run_folder / "rescale_config.yaml").is_file()
    assert (finished["folder"] / run_folder / "run_summary.json").is_file()
    assert f"; checkpoint {relative}; next: rescale test --config {finished['config']} " in line
    # the network changed on the command line is built again, so the printed command loads the weights
    next_command = shlex.split(line.split("; next: ", 1)[1])
    assert next_command[-2:] == ["--ckpt_path", relative] and "{depth: 8, base_width: 4}" in next_command
    out = io.StringIO()
    with _in(finished["folder"]), contextlib.redirect_stdout(out), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(next_command[1:]) == 0
    assert not [str(w.message) for w in caught if "dirpath has changed" in str(w.message)]
    assert not [str(w.message) for w in caught if "LeafSpec" in str(w.message)]
    tested = out.getvalue().strip().splitlines()[-1]
    assert tested.startswith("test finished: run folder runs/wandb/offline-run-") and tested.endswith(
        "next: rescale compare runs (the trained runs there, by what their fits validated)")


@pytest.mark.parametrize("command, then", [("validate", "next: rescale test --config "),
                                           ("predict", "next: rescale compare runs")], ids=["validate", "predict"])
def test_validate_and_predict_end_with_their_run_folder_and_the_next_command(finished, command, then):
    out = io.StringIO()
    with _in(finished["folder"]), contextlib.redirect_stdout(out):
        assert main([command, "--config", finished["config"], "--ckpt_path", str(finished["last"]),
                     "--model.init_args.network_options", "{depth: 8, base_width: 4}"]) == 0
    line = out.getvalue().strip().splitlines()[-1]
    assert line.startswith(f"{command} finished: run folder runs/wandb/offline-run-") and then in line, line


def test_an_evaluation_beside_no_trained_run_suggests_no_compare(finished):
    """``rescale compare`` reads trained runs' summaries: where the evaluation's folder holds none,
    its closing line names no command that would only fail."""
    out = io.StringIO()
    with _in(finished["folder"]), contextlib.redirect_stdout(out):
        assert main(["predict", "--config", finished["config"], "--ckpt_path", str(finished["last"]),
                     "--model.init_args.network_options", "{depth: 8, base_width: 4}",
                     "--trainer.logger.init_args.save_dir", "evals"]) == 0
    line = out.getvalue().strip().splitlines()[-1]
    assert line.startswith("predict finished: run folder evals/wandb/offline-run-") and "next:" not in line, line


def test_epoch_checkpoints_are_written_for_completed_epochs_only(finished):
    folder = finished["last"].parent
    assert sorted(p.name for p in folder.glob("*.ckpt")) == ["epoch000.ckpt", "last.ckpt"]
    assert safe_load(folder / "epoch000.ckpt")["global_step"] == 2  # the whole first epoch
    assert safe_load(finished["last"])["global_step"] == 3  # the second epoch, cut short, only here


def test_ckpt_path_last_without_a_run_id_names_the_run_to_resume(finished, error_line):
    with _in(finished["folder"]):
        assert main(["fit", "--config", finished["config"], "--ckpt_path", "last"]) == 2
    message = error_line()
    relative = os.path.relpath(finished["last"], finished["folder"])
    assert message.startswith("--ckpt_path last resumes the last.ckpt of this run's id, and this run has a new id")
    assert f"the only earlier run beside it is {relative} " in message and f"--ckpt_path {relative}," in message


def test_an_evaluation_without_a_checkpoint_says_what_it_evaluates(finished, capsys):
    with _in(finished["folder"]):
        assert main(["validate", "--config", finished["config"]]) == 0
    printed = capsys.readouterr()
    assert ("rescale validate without --ckpt_path evaluates the network as the config builds it (untrained, unless "
            "the config loads weights)") in printed.out + printed.err


@pytest.mark.parametrize("command", ["fit", "test"])
def test_a_checkpoint_path_that_is_no_file_is_refused_before_lightning_restores_from_it(finished, caplog, error_line,
                                                                                        command):
    with _in(finished["folder"]), caplog.at_level(logging.INFO):
        assert main([command, "--config", finished["config"], "--ckpt_path", "nowhere.ckpt"]) == 2
    assert not [r for r in caplog.records if "Restoring states" in r.getMessage()]
    assert error_line().startswith("checkpoint not found: nowhere.ckpt (--ckpt_path)")


def test_fit_from_best_is_refused_in_one_line(finished, error_line):
    with _in(finished["folder"]):
        assert main(["fit", "--config", finished["config"], "--ckpt_path", "best"]) == 2
    assert error_line().startswith("--ckpt_path best is the best checkpoint of a fit in the same process, which "
                                   "rescale fit has not run")


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_an_evaluation_of_last_or_best_without_that_checkpoint_is_refused(finished, error_line, command):
    """Lightning evaluates the untrained network when ``last`` finds no checkpoint, and ``best``
    names a fit in the same process: both are one line, the earlier run's checkpoint named."""
    relative = os.path.relpath(finished["last"], finished["folder"])
    with _in(finished["folder"]):
        assert main([command, "--config", finished["config"], "--ckpt_path", "last"]) == 2
        message = error_line()
        assert message.startswith("--ckpt_path last: no last.ckpt in runs/outputs/"), message
        assert f"so there is no network to {command} (this run has a new id" in message
        assert f"the only earlier run beside it is {relative} " in message and f"--ckpt_path {relative}," in message
        assert main([command, "--config", finished["config"], "--ckpt_path", "best"]) == 2
        assert error_line().startswith(f"--ckpt_path best is the best checkpoint of a fit in the same process, "
                                       f"which rescale {command} has not run")


def test_ckpt_path_last_without_a_run_id_or_an_earlier_run_says_how_to_start(tmp_path, run_config,
                                                                             suite_wandb_logger, error_line):
    config = run_config(tmp_path / "run.yaml", trainer={"logger": suite_wandb_logger("outputs", "none")})
    with _in(tmp_path):
        assert main(["fit", "--config", config, "--ckpt_path", "last"]) == 2
    message = error_line()
    assert "no earlier run beside it (runs/outputs) has a last.ckpt; drop --ckpt_path last" in message
    assert not list(tmp_path.glob("runs/outputs/*"))  # refused before the run began


@pytest.mark.parametrize("args, what", [
    (["--trainer.logger.init_args.save_dir", "file/runs"], "the W&B run folder (trainer.logger.init_args.save_dir)"),
    (["--last_checkpoint.dirpath", "file/checkpoints"], "the checkpoint folder"),
    (["--run_summary.path", "file/summary.json"], "the run summary folder"),
], ids=["logger", "checkpoints", "summary"])
def test_a_folder_that_cannot_be_written_is_refused_before_fit_starts(tmp_path, run_config, suite_wandb_logger,
                                                                      error_line, args, what):
    """A part of the path is a file: no folder can be made there, for root as for anyone."""
    (tmp_path / "file").write_text("")
    config = run_config(tmp_path / "run.yaml", trainer={"logger": suite_wandb_logger("outputs", "unwritable")})
    with _in(tmp_path):
        assert main(["fit", "--config", config, *args]) == 2
    message = error_line()
    assert message.startswith(f"cannot write {what} {tmp_path / 'file'}") and "is a file, not a folder" in message
    assert not list(tmp_path.glob("runs/wandb/*run-*"))  # no W&B run began, here or elsewhere


def test_an_output_dir_that_cannot_be_written_is_refused_before_test_starts(finished, error_line, tmp_path):
    (tmp_path / "file").write_text("")
    with _in(finished["folder"]):
        assert main(["test", "--config", finished["config"], "--ckpt_path", str(finished["last"]),
                     "--model.init_args.network_options", "{depth: 8, base_width: 4}",
                     "--output_dir", str(tmp_path / "file" / "results")]) == 2
    assert error_line().startswith(f"cannot write --output_dir {tmp_path / 'file' / 'results'}: ")


def test_fit_trained_in_processes_it_started_reports_their_checkpoints_step(finished):
    """Under ``ddp_spawn`` the processes that trained keep the step; the Trainer of the command
    that started them is back at 0: the closing line takes the step from their checkpoint."""
    import lightning.pytorch as L
    from rescale_tasks.common.checkpoints import LastCheckpoint
    from rescale_tasks.common.run import fit_report

    last = LastCheckpoint()
    last.saved_path = str(finished["last"])
    trainer = L.Trainer(callbacks=[last], logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(finished["folder"]))
    assert trainer.global_step == 0
    assert fit_report(trainer, ["fit"]).startswith("fit finished at step 3: ")


@pytest.mark.parametrize("args", [["--trainer.logger.init_args.id", "job2", "--ckpt_path", "last"], []])
def test_on_slurm_another_runs_requeue_checkpoint_is_not_taken_for_this_run(finished, tmp_path, monkeypatch,
                                                                            error_line, args):
    """Lightning's SLURM requeue (SIGUSR1) leaves ``hpc_ckpt_<N>.ckpt`` in the working folder, and on
    SLURM Lightning resumes any later command that has no checkpoint from it: a new run of another
    id (the requeue-safe command's first start) or seed would silently continue the other run's
    weights. Refused in one line naming the file; nothing trained, nothing written."""
    for name, value in {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "42", "SLURM_PROCID": "0",
                        "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost"}.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "hpc_ckpt_1.ckpt").write_bytes(finished["last"].read_bytes())
    same_network = ["--model.init_args.network_options", "{depth: 8, base_width: 4}"]
    with _in(tmp_path):
        assert main(["fit", "--config", finished["config"], *same_network, "--seed_everything", "5", *args]) == 2
        message = error_line()
        assert message.startswith("hpc_ckpt_1.ckpt is a checkpoint Lightning's SLURM requeue saved (on SIGUSR1)"), message
        assert "--ckpt_path hpc_ckpt_1.ckpt if it is this run's, or move it out of the working folder" in message
        assert not list(tmp_path.glob("runs/**/*.ckpt"))
        assert main(["validate", "--config", finished["config"], *same_network]) == 2
        assert "Lightning would validate its weights" in error_line()


def test_a_run_without_a_logger_is_refused_while_another_trains_into_its_checkpoint_folder(tmp_path, run_config,
                                                                                          error_line, recwarn):
    """No logger, no run id: two ``rescale fit`` in one ``default_root_dir`` (a requeued job while
    the first still runs) would write over each other's ``last.ckpt`` and run summary. The first
    holds ``checkpoints/.lock`` (taken here as that run takes it); the second is refused in one
    line, writing nothing; once it is free a run starts there without a warning about it."""
    from rescale_tasks.common.system import folder_lock

    config = run_config(tmp_path / "run.yaml", trainer={"max_epochs": 1, "limit_val_batches": 0,
                                                        "num_sanity_val_steps": 0})
    with _in(tmp_path):
        with folder_lock(str(tmp_path / "checkpoints"), "checkpoint folder"):
            assert main(["fit", "--config", config]) == 2
        message = error_line()
        assert message.startswith(f"checkpoint folder {tmp_path / 'checkpoints'} is in use by pid {os.getpid()} ")
        assert "--trainer.default_root_dir" in message
        assert sorted(p.name for p in tmp_path.rglob("*")) == [".lock", "checkpoints", "run.yaml"]
        assert main(["fit", "--config", config]) == 0
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert not [w for w in recwarn if "exists and is not empty" in str(w.message)]


def test_a_run_without_a_logger_after_one_that_diverged_in_its_folder_is_refused_not_written_over(tmp_path, run_config,
                                                                                                  error_line):
    """No logger: one after the other in one ``default_root_dir``. The first diverges at its first
    step and leaves no ``last.ckpt``, only its ``run_summary.json`` (status diverged, a result) and
    ``rescale_config.yaml``; a second ``fit`` there silently wrote over both. It is refused in one
    line naming the file, and leaves them as they were; in another folder it runs."""
    config = run_config(tmp_path / "run.yaml", trainer={"limit_val_batches": 0, "num_sanity_val_steps": 0})
    with _in(tmp_path):
        assert main(["fit", "--config", config, "--model.init_args.optimizer",
                     "{class_path: torch.optim.SGD, init_args: {lr: 1.0e+8}}"]) != 0
        written = {name: (tmp_path / name).read_bytes() for name in ("run_summary.json", "rescale_config.yaml")}
        assert not (tmp_path / "checkpoints" / "last.ckpt").exists()
        error_line()
        assert main(["fit", "--config", config]) == 2
        message = error_line()
        assert message.startswith("run_summary.json holds an earlier run's summary (diverged at step "), message
        assert "--trainer.default_root_dir" in message
        assert {name: (tmp_path / name).read_bytes() for name in written} == written
        assert main(["fit", "--config", config, "--trainer.default_root_dir", "other"]) == 0
    assert (tmp_path / "other" / "checkpoints" / "last.ckpt").is_file()


def test_fit_from_an_averaged_checkpoint_is_refused_in_one_line(finished, caplog, error_line, tmp_path):
    """An average of checkpoints holds weights only (it is for evaluation): resuming training from
    it is one line saying so and what to resume from instead, not Lightning's KeyError."""
    average = tmp_path / "avg.ckpt"
    with _in(finished["folder"]):
        assert main(["average-checkpoints", str(finished["last"].parent), "--output", str(average)]) == 0
        with caplog.at_level(logging.INFO):
            assert main(["fit", "--config", finished["config"], "--ckpt_path", str(average),
                         "--model.init_args.network_options", "{depth: 8, base_width: 4}"]) == 2
    assert not [r for r in caplog.records if "Restoring states" in r.getMessage()]
    message = error_line()
    assert message.startswith(f"checkpoint {average} holds the network's weights but no training state to resume "
                              "(no optimizer_states, lr_schedulers, loops")
    assert message.endswith(f"or evaluate this one with rescale test --ckpt_path {average}")


@pytest.mark.parametrize("command", ["fit", "test"])
def test_a_checkpoint_of_weights_alone_is_refused_in_one_line(finished, error_line, tmp_path, command):
    """``torch.save({"state_dict": ...})`` is no Lightning checkpoint: one line, not a KeyError."""
    import torch

    plain = tmp_path / "plain.ckpt"
    torch.save({"state_dict": safe_load(finished["last"])["state_dict"]}, plain)
    with _in(finished["folder"]):
        assert main([command, "--config", finished["config"], "--ckpt_path", str(plain),
                     "--model.init_args.network_options", "{depth: 8, base_width: 4}"]) == 2
    assert error_line().startswith(f"checkpoint {plain} is no checkpoint of a Lightning run (it holds no "
                                   f"pytorch-lightning_version), so rescale {command} cannot restore a network from it")


def test_predictions_that_cannot_be_written_are_one_line_and_leave_the_earlier_file(tmp_path, run_config,
                                                                                   fit_checkpoint):
    """The disk fills as ``predict`` writes its file (here: a real ``rescale predict`` process whose
    files may not grow past 4 KB, so the write fails in the operating system as on a full disk):
    one line naming the file, not a traceback, and an earlier file there as it was."""
    import resource
    import sys

    import forked

    config = run_config(tmp_path / "run.yaml", trainer={"max_epochs": 1, "limit_val_batches": 0,
                                                        "num_sanity_val_steps": 0})
    ckpt = fit_checkpoint(tmp_path, ["--config", config])
    earlier = tmp_path / "out" / "predictions.test.csv"
    earlier.parent.mkdir()
    earlier.write_text("an earlier prediction")
    done = forked.run([sys.executable, "-m", "rescale_tasks.cli", "predict", "--config", config, "--ckpt_path",
                       str(ckpt), "--output_dir", str(earlier.parent)], cwd=tmp_path,
                      env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300,
                      rlimits={"RLIMIT_FSIZE": (4096, resource.RLIM_INFINITY)})
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert errors[0].startswith(f"error: cannot write {earlier}: File too large ([Errno 27]); nothing of it was "
                                "written (an earlier file there is as it was)")
    assert [p.name for p in earlier.parent.iterdir()] == [earlier.name]
    assert earlier.read_text() == "an earlier prediction"


@pytest.mark.parametrize("args", [["--ckpt_path", "last"], []], ids=["ckpt_path-last", "no-ckpt_path"])
def test_a_last_checkpoint_linked_to_a_missing_file_is_refused_not_started_afresh(tmp_path, run_config, error_line,
                                                                                  args):
    """``last.ckpt`` a symbolic link into a scratch file system this node has not mounted: the
    requeued run said "no last.ckpt yet", trained from step 0 and wrote a new file over the link."""
    config = run_config(tmp_path / "run.yaml")
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.parent.mkdir()
    last.symlink_to(tmp_path / "scratch" / "last.ckpt")
    with _in(tmp_path):
        assert main(["fit", "--config", config, *args]) == 2
    assert error_line() == (f"checkpoints/last.ckpt is a symbolic link to {tmp_path / 'scratch' / 'last.ckpt'}, which "
                            "does not exist (a file system not mounted here, or cleaned up): make it reachable and run "
                            "the same command again, pass another checkpoint with --ckpt_path, or remove the link to "
                            "start this run afresh")
    assert last.is_symlink() and {p.name for p in last.parent.iterdir()} <= {".lock", "last.ckpt"}  # nothing written


def test_predict_into_a_results_folder_that_cannot_be_written_is_refused_before_predicting(finished, caplog,
                                                                                          error_line, tmp_path):
    """Without ``--output_dir`` predict writes beside the checkpoint's run, once the whole split is
    predicted: a folder there that cannot be written (here a file in its way, for root as for
    anyone) is one line before a batch is predicted, not after."""
    import shutil

    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    last.parent.mkdir(parents=True)
    shutil.copy(finished["last"], last)
    (tmp_path / "run" / "results").write_text("")
    with _in(finished["folder"]), caplog.at_level(logging.INFO):
        assert main(["predict", "--config", finished["config"], "--ckpt_path", str(last),
                     "--model.init_args.network_options", "{depth: 8, base_width: 4}"]) == 2
    assert not [r for r in caplog.records if "Loaded model weights" in r.getMessage()]
    assert error_line().startswith(f"cannot write the results folder beside the checkpoint "
                                   f"{tmp_path / 'run' / 'results' / 'last'}: {tmp_path / 'run' / 'results'} is a file")
