"""The suite's messages through ``logging``: ``rescale --quiet|--verbose`` and ``RESCALE_LOG_LEVEL``
(real runs of the ``rescale`` command; a logging configuration of one's own:
tests/tasks/translation/test_translation_prepare_progress.py)."""
from __future__ import annotations

from rescale_tasks.cli import main


def test_quiet_fit_prints_no_info_lines_but_the_error_line(tmp_path, monkeypatch, run_config, capsys, error_line):
    monkeypatch.chdir(tmp_path)
    config = run_config(tmp_path / "run.yaml", trainer={"max_epochs": 1, "limit_train_batches": 1,
                                                        "limit_val_batches": 1, "enable_progress_bar": False})
    assert main(["--quiet", "fit", "--config", config]) == 0
    captured = capsys.readouterr()
    assert "fit finished" not in captured.out and captured.out.strip() == "", captured.out
    assert main(["--quiet", "fit", "--config", config, "--trainer.max_epochs", "many"]) == 2
    assert "max_epochs" in error_line()
    assert main(["fit", "--config", config, "--trainer.max_epochs", "2"]) == 0  # unquiet: the closing line
    assert "fit finished at step 2" in capsys.readouterr().out


def test_verbose_shows_debug_messages(tmp_path, monkeypatch, run_config, capsys):
    monkeypatch.chdir(tmp_path)
    config = run_config(tmp_path / "run.yaml")
    assert main(["--verbose", "fit", "--config", config, "--trainer.max_epochs", "many"]) == 2
    assert "defaults applied (outermost first): " in capsys.readouterr().out
    assert main(["fit", "--config", config, "--trainer.max_epochs", "many"]) == 2
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
