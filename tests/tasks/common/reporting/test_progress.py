"""Progress where the output is a file (SLURM, CI, `> log.txt`): a line every N steps with step,
loss, throughput in the task's unit and ETA, not carriage-return redraws; a terminal keeps the bar."""
from __future__ import annotations

import io
import os
import pty
import re

import lightning.pytorch as L
import pytest
from lightning.pytorch.callbacks import TQDMProgressBar

from rescale_tasks.cli import main
from rescale_tasks.common.reporting import LineProgress, use_line_progress


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RESCALE_PROGRESS", raising=False)


LINE = re.compile(r"^epoch (\d)/2  step (\d)/6  train/loss \S+  \S+ images/s  elapsed \d+:\d\d:\d\d  ETA \d+:\d\d:\d\d$")


def test_fit_into_a_file_prints_a_line_every_n_steps(tmp_path, run_config, capfd):
    config = run_config(tmp_path / "run.yaml", trainer={"enable_progress_bar": True, "log_every_n_steps": 2,
                                                        "limit_train_batches": 3, "max_epochs": 2})
    assert main(["fit", "--config", config]) == 0
    out, err = capfd.readouterr()
    assert "\r" not in out and "\r" not in err  # no redraws in the log
    lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    # every 2 steps and at the end of each epoch: steps 2, 3 (epoch 1 ends), 4, 6
    assert [LINE.match(line).group(1, 2) for line in lines] == [("1", "2"), ("1", "3"), ("2", "4"), ("2", "6")], out
    assert lines[-1].endswith("ETA 0:00:00")
    validations = [line for line in out.splitlines() if line.startswith("validation at step ")]
    assert [v.split(":")[0] for v in validations] == ["validation at step 3", "validation at step 6"], out
    assert all("val/acc1 " in v and "val/loss " in v for v in validations)
    ordered = [line.split("  ")[1] if line.startswith("epoch ") else line.split(":")[0]
               for line in out.splitlines() if line.startswith(("epoch ", "validation "))]
    assert ordered == ["step 2/6", "step 3/6", "validation at step 3", "step 4/6", "step 6/6",
                       "validation at step 6"], out


def _trainer() -> L.Trainer:
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_model_summary=False)


def test_a_terminal_keeps_the_bar_a_file_gets_lines(monkeypatch):
    main_fd, tty_fd = pty.openpty()
    try:
        with open(tty_fd, "w", closefd=False) as tty:
            monkeypatch.setattr("sys.stdout", tty)
            monkeypatch.setattr("sys.stderr", tty)
            default_bar = type(_trainer().progress_bar_callback)  # TQDM's, or Rich's where rich is installed
            assert type(use_line_progress(_trainer()).progress_bar_callback) is default_bar
            monkeypatch.setattr("sys.stdout", io.StringIO())  # `> log.txt`
            assert type(use_line_progress(_trainer()).progress_bar_callback) is LineProgress
            monkeypatch.setattr("sys.stdout", tty)
            monkeypatch.setattr("sys.stderr", io.StringIO())  # `2> log.txt`, SLURM's default output
            assert type(use_line_progress(_trainer()).progress_bar_callback) is LineProgress
            no_bar = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
            assert use_line_progress(no_bar).progress_bar_callback is None
    finally:
        os.close(main_fd)
        os.close(tty_fd)
