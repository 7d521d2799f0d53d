"""Ctrl-C and a second writer, on a real ``rescale fit`` process.

One run in its own process group (a data worker included, as a terminal's Ctrl-C reaches every
process of the group): while it trains, a second ``rescale fit`` of the same run id starts in
this process and must be refused; then the group gets SIGINT, which must save ``last.ckpt`` and
end with the one resume line, as SIGTERM does (whose resume is compared tensor by tensor in
``tests/tasks/classification/test_classification_resume.py``; its SIGKILL test resumes a run whose
killed process left the run folder's lock file behind).
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from rescale_tasks.cli import main
import forked
from wandb_runs import find_offline_runs, read_offline_run
from rescale_tasks.common.run import find_summaries, read_summary

RUN_ID = "ctrlc1"


def _env() -> dict:
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", OMP_NUM_THREADS="1")
    env.pop("WANDB_SERVICE", None)  # this process's W&B service, advertised to children
    return env


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, run_config, suite_wandb_logger):
    """Run, refuse a second writer, Ctrl-C; what each process said."""
    folder = tmp_path_factory.mktemp("ctrl-c")
    config = run_config(folder / "run.yaml", data={"init_args": {"num_workers": 1}}, trainer={
        "max_epochs": None, "max_steps": 100000, "limit_val_batches": 0, "num_sanity_val_steps": 0,
        "logger": suite_wandb_logger("lifecycle", "ctrl-c"),
        "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",  # progress markers
                       "init_args": {"every_n_train_steps": 2, "save_top_k": -1, "filename": "step{step:03d}",
                                     "auto_insert_metric_name": False}}]})
    command = ["fit", "--config", config, "--trainer.logger.init_args.id", RUN_ID]
    # forked from the suite's zygote (tests/forked.py), which gives the child the Ctrl-C handler of
    # a terminal's foreground job even when this suite runs in the background (which ignores SIGINT)
    proc = forked.popen([sys.executable, "-m", "rescale_tasks.cli", *command], cwd=folder, env=_env(),
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    checkpoints = folder / "runs" / "lifecycle" / RUN_ID / "checkpoints"
    try:
        deadline = time.time() + 300
        while not (checkpoints / "step004.ckpt").exists():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.time() < deadline, "the run made no progress"
            time.sleep(0.05)
        second_err = io.StringIO()
        old = os.getcwd()
        os.chdir(folder)
        try:
            with contextlib.redirect_stderr(second_err), contextlib.redirect_stdout(io.StringIO()):
                second = main([*command, "--trainer.max_steps", "2"])  # not refused: over at once
        finally:
            os.chdir(old)
        assert proc.poll() is None, "the first run ended before it could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return {"folder": folder, "command": command, "pid": proc.pid, "returncode": proc.returncode, "err": err,
            "out": out, "second": second, "second_err": second_err.getvalue(), "last": checkpoints / "last.ckpt"}


def test_ctrl_c_while_training_saves_last_ckpt_and_prints_the_resume_line(interrupted):
    err = interrupted["err"]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert interrupted["returncode"] == 128 + signal.SIGINT, err[-3000:]
    assert len(lines) == 1 and "stopped by Ctrl-C (SIGINT) at step" in lines[0], err[-3000:]
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err[-3000:]
    last = interrupted["last"]
    assert f"--ckpt_path {last}" in lines[0]
    step = int(re.search(r"at step (\d+)", lines[0]).group(1))
    assert step >= 4 and torch.load(last, weights_only=True)["global_step"] == step  # saved after that step
    (run,) = find_offline_runs(str(interrupted["folder"] / "runs"))
    assert read_offline_run(run).run_id == RUN_ID
    (summary,) = [read_summary(p) for p in find_summaries(str(interrupted["folder"] / "runs"))]
    assert summary["status"] == "interrupted" and summary["error"] == lines[0][len("error: "):]


def test_a_fit_prints_no_library_notices(interrupted):
    """Lightning's advert, a dependency's deprecation warning and its SIGTERM notice (which would
    name SIGTERM for a Ctrl-C) are not the user's concern."""
    err = interrupted["err"]
    for notice in ("Tip:", "litlogger", "LeafSpec", "Received SIGTERM"):
        assert notice not in err, err[-3000:]


def test_a_second_fit_of_a_run_id_in_training_is_refused_in_one_line(interrupted):
    lines = [line for line in interrupted["second_err"].splitlines() if line.strip()]
    assert interrupted["second"] == 2 and len(lines) == 1, interrupted["second_err"]
    folder = interrupted["folder"] / "runs" / "lifecycle" / RUN_ID
    assert lines[0].startswith(f"error: run folder {folder} is in use by pid {interrupted['pid']} "), lines[0]
    assert "--trainer.logger.init_args.id" in lines[0]
    assert len(find_offline_runs(str(interrupted["folder"] / "runs"))) == 1  # one W&B run of that id


class _CtrlCInWorker(torch.utils.data.Dataset):
    """Each item sends Ctrl-C's signal to the process reading it, as a terminal does to its group."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        os.kill(os.getpid(), signal.SIGINT)
        return index


def test_data_workers_leave_ctrl_c_to_the_main_process():
    """A worker forked before training began (a persistent validation worker) would end at Ctrl-C,
    and the loader with it, before the main process could finish its step and save."""
    from rescale_tasks.common.data import sigterm_safe_worker_init

    loader = torch.utils.data.DataLoader(_CtrlCInWorker(), num_workers=1, worker_init_fn=sigterm_safe_worker_init())
    assert [int(batch) for batch in loader] == [0, 1, 2, 3]


def test_a_closed_terminal_stops_the_run_as_sigterm_does(tmp_path, run_config, suite_wandb_logger):
    """A run in the terminal of an ssh session that closes: the kernel hangs the terminal up and
    sends SIGHUP; every later write to it fails. The run (its progress bar on that terminal, a data
    worker in its group) finishes its step, saves ``last.ckpt``, writes its summary and exits 129."""
    import glob
    import pty
    import select

    config = run_config(tmp_path / "run.yaml", data={"init_args": {"num_workers": 1}}, trainer={
        "max_epochs": None, "max_steps": 100000, "limit_val_batches": 0, "num_sanity_val_steps": 0,
        "enable_progress_bar": True, "logger": suite_wandb_logger("lifecycle", "hangup"),
        "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",  # progress markers
                       "init_args": {"every_n_train_steps": 2, "save_top_k": -1, "filename": "step{step:03d}",
                                     "auto_insert_metric_name": False}}]})
    terminal, session_side = pty.openpty()
    # its own session, the terminal its controlling terminal (a login shell's job)
    proc = forked.popen([sys.executable, "-m", "rescale_tasks.cli", "fit", "--config", config,
                         "--trainer.logger.init_args.id", "hangup1"], cwd=tmp_path, env=_env(),
                        stdin=session_side, stdout=session_side, stderr=session_side, controlling_terminal=True)
    os.close(session_side)
    checkpoints = tmp_path / "runs" / "lifecycle" / "hangup1" / "checkpoints"
    try:
        deadline = time.time() + 300
        while not (checkpoints / "step004.ckpt").exists():
            assert proc.poll() is None and time.time() < deadline, "the run ended or made no progress"
            if select.select([terminal], [], [], 0.05)[0]:
                os.read(terminal, 65536)  # the terminal shows what the run prints
        os.close(terminal)  # the ssh session closes
        assert proc.wait(timeout=300) == 128 + signal.SIGHUP
    finally:
        if proc.poll() is None:
            proc.kill()
    step = torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"]
    (summary,) = [read_summary(p) for p in find_summaries(str(tmp_path / "runs"))]
    assert step >= 4 and summary["status"] == "interrupted" and summary["steps"] == step
    assert summary["error"].startswith(f"stopped by SIGHUP at step {step}; saved {checkpoints / 'last.ckpt'}")
    assert not glob.glob(str(checkpoints / "*.tmp-*"))
