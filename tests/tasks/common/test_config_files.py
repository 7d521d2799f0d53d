"""A ``--config`` (or an applied ``_defaults.yaml``) that cannot be a config ends the command with
one line naming the file: binary, not UTF-8, a folder, or YAML that is no mapping of sections."""
from __future__ import annotations

from pathlib import Path

import pytest

from rescale_tasks.cli import main


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")


@pytest.mark.parametrize("content,expected", [
    (bytes(range(256)), "bad.yaml is a binary file, not a YAML config (--config)"),
    ("model:\n  init_args:\n    scheme: rescale  # café\n".encode("latin-1"),
     "config file bad.yaml is not UTF-8 text: byte 0xe9 at line 3, column 27 (--config); save it as UTF-8"),
    (b"just some words\n", "config file bad.yaml holds a single str value ('just some words'), not a mapping of "
                           "sections (model:, data:, trainer: ...) (--config)"),
    (b"- model\n- data\n", "config file bad.yaml holds a YAML list, not a mapping of sections"),
    (b"# nothing yet\n", "config file bad.yaml holds no settings (it is empty or only comments)"),
])
def test_a_file_that_is_no_config_is_one_line(content, expected, error_line):
    Path("bad.yaml").write_bytes(content)
    assert main(["fit", "--config", "bad.yaml"]) == 2
    assert error_line().startswith(expected)


def test_a_folder_is_not_reported_missing(error_line):
    Path("runs.yaml").mkdir()
    assert main(["fit", "--config", "runs.yaml"]) == 2
    assert error_line().startswith("runs.yaml is a folder, not a config file (--config); give one of its YAML files")


def test_an_applied_defaults_file_is_named(run_config, error_line):
    config = run_config(Path("experiments/digits/run.yaml"))
    Path("experiments/_defaults.yaml").write_bytes("trainer: {max_epochs: 1}  # \xe9\n".encode("latin-1"))
    assert main(["fit", "--config", config]) == 2
    assert error_line().startswith(f"config file {Path('experiments/_defaults.yaml').resolve()} is not UTF-8 text: "
                                   "byte 0xe9 at line 1, column 29 (the _defaults.yaml applied to the run configs "
                                   "below its folder)")
