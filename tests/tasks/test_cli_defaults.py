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


def test_an_option_that_a_later_config_sets_again_is_refused(tmp_path, run_config, error_line):
    """jsonargparse applies the command line in order: the later --config would silently win."""
    run = run_config(tmp_path / "run.yaml")
    assert main(["fit", "--model.init_args.scheme", "bn", "--config", run]) == 2
    line = error_line()
    assert line == (f"--model.init_args.scheme comes before --config {run}, whose line 5 sets it again and is "
                    "applied after it, so the option would be lost: give options after the last --config")
    for before in (["--data.init_args.batch_size=8"], ["--trainer.logger", "null"],
                   ["--model.init_args.network_options", "{depth: 8}"]):
        assert main(["fit", *before, "--config", run]) == 2
        assert error_line().startswith(f"--{before[0][2:].partition('=')[0]} comes before --config {run}")


def test_an_option_before_a_config_that_leaves_it_alone_is_kept(tmp_path, run_config, capsys):
    run = run_config(tmp_path / "run.yaml")
    overlay = _touch(tmp_path / "overlay.yaml", "model: {init_args: {scheme: bn}}\n")
    try:  # a key the overlay does not set; the class whose arguments it sets
        main(["fit", "--config", run, "--trainer.max_steps", "3", "--model",
              "rescale_tasks.classification.module.ClassificationModule", "--config", str(overlay), "--print_config"])
    except SystemExit:
        pass
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["max_steps"] == 3 and printed["model"]["init_args"]["scheme"] == "bn"
