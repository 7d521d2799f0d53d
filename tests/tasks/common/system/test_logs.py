"""The suite's messages through ``logging``: ``rescale --quiet|--verbose`` and ``RESCALE_LOG_LEVEL``
(real runs of the ``rescale`` command; a logging configuration of one's own:
tests/tasks/translation/test_translation_prepare_progress.py)."""
from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import warnings

import forked
from rescale_tasks.cli import main
from rescale_tasks.common.system import quiet_dependency_warnings


def test_quiet_fit_prints_no_info_lines_but_the_error_line(tmp_path, monkeypatch, run_config, capsys, error_line):
    monkeypatch.chdir(tmp_path)
    config = run_config(tmp_path / "run.yaml", trainer={"max_epochs": 1, "limit_train_batches": 1,
                                                        "limit_val_batches": 1, "enable_progress_bar": False})
    assert main(["--quiet", "fit", "--config", config]) == 0
    captured = capsys.readouterr()
    assert "fit finished" not in captured.out and captured.out.strip() == "", captured.out
    assert main(["--quiet", "fit", "--config", config, "--trainer.max_epochs", "many"]) == 2
    assert "max_epochs" in error_line()
    assert main(["fit", "--config", config, "--trainer.max_epochs", "2", "--ckpt_path", "last"]) == 0  # unquiet
    assert "fit finished at step 2" in capsys.readouterr().out


def test_log_flags_before_a_lightning_command_typed_in_a_shell(tmp_path, monkeypatch, run_config, capsys):
    """``rescale --quiet fit ...`` as a shell runs it (``main()`` reads ``sys.argv``, which holds the
    flag): the flag sets the level and is no option of ``fit``."""
    monkeypatch.chdir(tmp_path)
    config = run_config(tmp_path / "run.yaml", trainer={"max_epochs": 1, "limit_train_batches": 1,
                                                        "limit_val_batches": 1, "enable_progress_bar": False})
    monkeypatch.setattr(sys, "argv", ["rescale", "--verbose", "fit", "--config", config,
                                      "--trainer.max_epochs", "many"])
    assert main() == 2
    captured = capsys.readouterr()
    assert "defaults applied (outermost first): " in captured.out
    assert "max_epochs" in captured.err and "--verbose" not in captured.err, captured.err
    monkeypatch.setattr(sys, "argv", ["rescale", "--quiet", "fit", "--config", config])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="LightningCLI.s args parameter")  # nor its warning about sys.argv
        assert main() == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "" and "error" not in captured.err, (captured.out, captured.err)


def test_quiet_fit_in_a_fresh_interpreter_prints_nothing_of_lightning(tmp_path, run_config):
    """In a fresh interpreter the command imports Lightning after ``--quiet`` set its loggers, and that
    import sets them to INFO: they are set again. Nor is there the Rich model summary, which prints
    straight to stdout."""
    config = run_config(tmp_path / "run.yaml", trainer={"enable_model_summary": True, "log_every_n_steps": 1})
    done = subprocess.run([sys.executable, "-m", "rescale_tasks", "--quiet", "fit", "--config", config], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "" and done.stderr.strip() == "", (done.stdout, done.stderr)


def test_a_warning_of_the_suite_is_one_line_on_the_console(tmp_path, run_config):
    """A warning the suite raises through Lightning's ``rank_zero_warn`` (files in the data folders
    that are not read) is one ``warning: ...`` line, as the docs say, without Python's file, line and
    source line; in a process of its own (pytest records the warnings of the tests' own process)."""
    from PIL import Image

    for split in ("train", "val"):
        for name in ("a", "b"):
            (tmp_path / "data" / split / name).mkdir(parents=True)
            Image.new("RGB", (8, 8), (40, 90, 200)).save(tmp_path / "data" / split / name / "0.png")
    (tmp_path / "data" / "train" / "a" / "notes.txt").write_text("not an image")
    config = run_config(tmp_path / "run.yaml", data={
        "class_path": "rescale_tasks.classification.data.ImageFolderDataModule",
        "init_args": {"root": str(tmp_path / "data"), "num_classes": 2, "image_size": 8, "eval_resize": 8,
                      "batch_size": 2, "num_workers": 0, "persistent_workers": False, "pin_memory": False}},
        trainer={"limit_train_batches": 1, "log_every_n_steps": 1})
    done = forked.run([sys.executable, "-m", "rescale_tasks", "--quiet", "fit", "--config", config], cwd=tmp_path,
                      capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: data: 1 file(s) under ") and "notes.txt" in lines[0], lines


def test_verbose_shows_debug_messages(tmp_path, monkeypatch, run_config, capsys):
    monkeypatch.chdir(tmp_path)
    config = run_config(tmp_path / "run.yaml")
    assert main(["--verbose", "fit", "--config", config, "--trainer.max_epochs", "many"]) == 2
    assert "defaults applied (outermost first): " in capsys.readouterr().out
    assert main(["fit", "--config", config, "--trainer.max_epochs", "many"]) == 2
    assert "defaults applied" not in capsys.readouterr().out


def test_verbose_lines_of_the_command_come_from_the_first_process_only(tmp_path, monkeypatch, run_config, capsys):
    """Under DDP Lightning's launcher runs the command again for each other rank (``LOCAL_RANK`` set,
    which Lightning's ``rank_zero_only.rank`` is read from): the command's debug lines, once a run."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    monkeypatch.chdir(tmp_path)
    config = run_config(tmp_path / "run.yaml")
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    assert main(["--verbose", "fit", "--config", config, "--trainer.max_epochs", "many"]) == 2
    assert "defaults applied" not in capsys.readouterr().out


def test_a_bad_log_level_is_one_error_line(monkeypatch, error_line):
    monkeypatch.setenv("RESCALE_LOG_LEVEL", "LOUD")
    assert main(["schemes"]) == 2
    assert error_line().startswith("RESCALE_LOG_LEVEL='LOUD' is not a logging level")


def test_a_command_s_result_is_written_whatever_the_log_level(capsys):
    """`--quiet` silences the messages, not what the command was asked for (``write_output``)."""
    assert main(["--quiet", "schemes"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "rescale" in out and "bn" in out
    assert main(["--quiet", "--version"]) == 0
    assert capsys.readouterr().out.startswith("rescale ")


@contextlib.contextmanager
def stdout_to_a_closed_pipe(monkeypatch):
    """``sys.stdout`` writing into a pipe whose reader is gone (``rescale schemes | head -1`` once
    ``head`` has its line): a write that reaches the pipe raises BrokenPipeError. Entered in the
    test itself: pytest's capture puts its own stdout back when the test's call begins."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = os.fdopen(write_end, "w")
    monkeypatch.setattr(sys, "stdout", stream)
    try:
        yield stream
    finally:
        stream.close()


def test_a_reader_that_stops_reading_ends_the_command_without_a_traceback(monkeypatch, capfd):
    """The command ends with status 1 and no traceback, and its stdout now points at the null
    device, so the interpreter's last flush cannot fail again."""
    with stdout_to_a_closed_pipe(monkeypatch) as stream:
        assert main(["schemes"]) == 1
        stream.write("what is left\n")
        stream.flush()  # the null device now: no second error
    assert "Traceback" not in capfd.readouterr().err


def test_messages_to_a_reader_that_stopped_reading_are_dropped_and_the_work_goes_on(monkeypatch, capfd):
    """An INFO message (on stdout) into the pipe: no "--- Logging error ---" report, no exception
    into the command; the messages after it go to the null device."""
    from rescale_tasks.common.system import command_logging

    with stdout_to_a_closed_pipe(monkeypatch), command_logging(logging.INFO):
        logging.getLogger("rescale_tasks.test").info("into a closed pipe")
        logging.getLogger("rescale_tasks.test").info("and after it")
    assert capfd.readouterr().err == ""


def _raised_by_lightning() -> list[str]:
    """The warnings Lightning raises from inside itself on every run: building a pytree leaf
    (its own ``_tree_flatten``) and gathering across ranks (a one-process gloo group)."""
    import tempfile

    import torch
    import torch.distributed as dist
    from lightning.fabric.utilities.distributed import _all_gather_ddp_if_available
    from lightning.pytorch.utilities._pytree import _tree_flatten

    with warnings.catch_warnings(record=True) as caught:
        _tree_flatten(1)
        with tempfile.TemporaryDirectory() as folder:
            dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
            try:
                _all_gather_ddp_if_available(torch.ones(2))
            finally:
                dist.destroy_process_group()
    return [str(w.message) for w in caught]


def test_the_dependencies_deprecation_warnings_are_dropped():
    """Lightning's deprecated LeafSpec and all_gather warn on every (DDP) run: dropped by the
    command, and by the module's ``setup`` in each ``ddp_spawn`` rank (a fresh interpreter)."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        raised = _raised_by_lightning()
        assert any("LeafSpec" in m for m in raised) and any("all_gather is deprecated" in m for m in raised), raised
        quiet_dependency_warnings()
        assert _raised_by_lightning() == []
