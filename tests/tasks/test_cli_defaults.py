"""Which ``_defaults.yaml`` files a run config gets: its ``experiments`` tree's, never one from
an unrelated folder above it; ``--print_config`` names them."""
from __future__ import annotations

from pathlib import Path

import yaml

from rescale_tasks.cli import defaults_for, main


def _touch(path: Path, text: str = "{}\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_stop_at_the_experiments_folder(tmp_path):
    stray = _touch(tmp_path / "_defaults.yaml")
    outer = _touch(tmp_path / "experiments" / "_defaults.yaml")
    inner = _touch(tmp_path / "experiments" / "task" / "_defaults.yaml")
    run = _touch(tmp_path / "experiments" / "task" / "run.yaml")
    assert defaults_for([str(run)]) == [str(outer), str(inner)]
    assert str(stray) not in defaults_for([str(run)])


def test_outside_an_experiments_tree_only_the_configs_own_folder(tmp_path):
    _touch(tmp_path / "_defaults.yaml")  # e.g. in a home or scratch folder
    own = _touch(tmp_path / "mine" / "_defaults.yaml")
    run = _touch(tmp_path / "mine" / "run.yaml")
    lone = _touch(tmp_path / "other" / "run.yaml")
    assert defaults_for([str(run)]) == [str(own)]
    assert defaults_for([str(lone)]) == []


def test_print_config_names_the_defaults_applied(tmp_path, capsys, run_config):
    tree = tmp_path / "experiments" / "digits"
    defaults = _touch(tree / "_defaults.yaml", yaml.safe_dump({"trainer": {"max_epochs": 3}}))
    run = run_config(tree / "run.yaml", trainer={"max_epochs": None})
    try:
        main(["fit", "--config", run, "--print_config"])
    except SystemExit:
        pass
    out, err = capsys.readouterr()
    assert f"# defaults applied (outermost first): {defaults}" in err
    assert yaml.safe_load(out)["trainer"]["max_epochs"] == 3
