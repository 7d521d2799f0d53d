"""Which ``_defaults.yaml`` files a run config gets: its ``experiments`` tree's, never one from
an unrelated folder above it; ``--print_config`` names them. The same layers, read without
building the run, are what a study resolves its points' settings from."""
from __future__ import annotations

from pathlib import Path

import yaml

from rescale_tasks.cli import main
from rescale_tasks.common.cli import defaults_for, flag_values, yaml_layers


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


def test_the_layers_in_the_order_the_command_applies_them(tmp_path):
    """The defaults outermost first, then the configs; a file that cannot be read is left to the run."""
    outer = _touch(tmp_path / "experiments" / "_defaults.yaml", "trainer: {max_epochs: 1}\n")
    run = _touch(tmp_path / "experiments" / "task" / "run.yaml", "trainer: {max_epochs: 2}\n")
    overlay = _touch(tmp_path / "overlay.yaml", "trainer: [not: closed\n")
    assert list(yaml_layers([str(run), str(overlay)])) == [{"trainer": {"max_epochs": 1}},
                                                           {"trainer": {"max_epochs": 2}}]
    assert defaults_for([str(run)]) == [str(outer)]


def test_flag_values_reads_both_spellings_in_order():
    argv = ["fit", "-c", "a.yaml", "--config=b.yaml", "--trainer.logger", "false", "--config"]
    assert flag_values(argv, ("--config", "-c")) == ["a.yaml", "b.yaml"]  # the last one has no value
    assert flag_values(argv, ("--trainer.logger",)) == ["false"]
    assert flag_values(["--trainer.logger="], ("--trainer.logger",)) == [""]
