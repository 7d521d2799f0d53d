"""A ``--config`` (or an applied ``_defaults.yaml``) that cannot be a config ends the command with
one line naming the file: binary, not UTF-8, a folder, YAML that is no mapping of sections, or a
mapping that gives a key twice (also in YAML given on the command line)."""
from __future__ import annotations

from pathlib import Path

import pytest

from rescale_tasks.cli import main
from rescale_tasks.common.cli import load_yaml
from rescale_tasks.common.cli.config_files import check_config_file, files_read_once, load_file
from rescale_tasks.common.cli.config_layers import key_location


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


# --- a key given twice in one mapping: refused, naming the file and both lines ----------------------

@pytest.mark.parametrize("old,new,expected", [
    ("trainer:\n", "trainer:\n  max_epochs: 3\ntrainer:\n", "key 'trainer' is given twice in the same mapping"),
    ("    scheme: rescale\n", "    scheme: rescale\n    scheme: bn\n",
     "key 'scheme' is given twice in the same mapping"),
    ("  max_epochs: 1\n", "  max_epochs: 1\n  logger: false\n  max_epochs: 2\n",
     "key 'max_epochs' is given twice in the same mapping"),
])
def test_a_key_given_twice_is_one_line_naming_both_lines(run_config, old, new, expected, error_line):
    """The last one would win: a second `trainer:` block drops the first whole, a second `scheme:`
    silently trains another scheme."""
    path = Path(run_config(Path("run.yaml")))
    text = path.read_text()
    assert old in text
    text = text.replace(old, new, 1)
    path.write_text(text)
    lines = text.splitlines()
    key = expected.split("'")[1]
    first, second = [i + 1 for i, line in enumerate(lines) if line.strip().startswith(f"{key}:")][:2]
    assert main(["fit", "--config", "run.yaml"]) == 2
    assert error_line() == f"run.yaml:{second}: {expected} (first at line {first}); keep one"


def test_a_key_given_twice_in_an_applied_defaults_file_is_named(run_config, error_line):
    config = run_config(Path("experiments/digits/run.yaml"))
    Path("experiments/_defaults.yaml").write_text("trainer:\n  max_epochs: 1\n  max_epochs: 2\n")
    assert main(["fit", "--config", config]) == 2
    assert error_line() == (f"{Path('experiments/_defaults.yaml').resolve()}:3: key 'max_epochs' is given twice "
                            "in the same mapping (first at line 2); keep one")


def test_a_key_given_twice_in_yaml_on_the_command_line_is_one_line(run_config, error_line):
    code = main(["fit", "--config", run_config(Path("run.yaml")), "--model.init_args.scheme_options",
                 "{c: 1, c: 2}"])
    assert code == 2
    assert error_line() == "the YAML value '{c: 1, c: 2}': key 'c' is given twice in the same mapping; keep one"


def test_a_study_refuses_a_config_with_a_key_given_twice_before_any_point(run_config, error_line):
    path = Path(run_config(Path("run.yaml")))
    path.write_text(path.read_text() + "model:\n  init_args: {scheme: bn}\n")
    assert main(["study", "depth", "--config", "run.yaml", "--depths", "8", "--schemes", "bn", "--out", "study",
                 "--dry_run"]) == 2
    line = error_line()
    assert line.startswith("run.yaml:") and "key 'model' is given twice in the same mapping" in line
    assert not Path("study").exists()


def test_keys_repeated_only_across_mappings_or_over_a_merge_still_load(run_config, capsys):
    """`init_args:` under model and data, `<<: *anchor` then a key it brings: no duplicate."""
    text = "base: &base {lr: 0.1, momentum: 0.9}\nsgd:\n  <<: *base\n  lr: 0.2\nother: {lr: 0.3}\n"
    assert load_yaml(text, "x.yaml") == {"base": {"lr": 0.1, "momentum": 0.9}, "sgd": {"lr": 0.2, "momentum": 0.9},
                                         "other": {"lr": 0.3}}
    with pytest.raises(SystemExit) as done:  # --print_config prints the parsed config and exits
        main(["fit", "--config", run_config(Path("run.yaml")), "--model.init_args.scheme_options",
              "{c: 1, gain: vector}", "--print_config"])
    printed = capsys.readouterr().out
    assert done.value.code == 0 and "scheme: rescale" in printed and "gain: vector" in printed


def test_a_file_over_a_merge_read_once_for_a_command_loads_as_often_as_asked(tmp_path):
    """Within a command each file is composed once; loading it again (a check, a layer) gives the
    same mapping, the key after a merge no duplicate, and its keys are those written."""
    path = tmp_path / "run.yaml"
    path.write_text("base: &base {lr: 0.1, momentum: 0.9}\nsgd:\n  <<: *base\n  lr: 0.2\n")
    with files_read_once():
        for _ in range(2):
            check_config_file(str(path))
            assert load_file(str(path)) == {"base": {"lr": 0.1, "momentum": 0.9}, "sgd": {"lr": 0.2, "momentum": 0.9}}
        assert key_location("sgd.lr", [str(path)]) == f"{path}:4"  # the line written, not the anchor's


def test_a_config_of_another_experiments_folder_is_refused_in_one_line(tmp_path, monkeypatch, error_line):
    """Its folder's _defaults.yaml (the digits' data, network and recipe) would replace the first
    config's: ImageNet's network trained on the digits."""
    repo = Path(__file__).resolve().parents[4]
    imagenet, digits = repo / "experiments/imagenet/rescale50.yaml", repo / "experiments/digits/recipes/rescale.yaml"
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", str(imagenet), "--config", str(digits), "--print_config"]) == 2
    assert error_line() == (f"--config {digits}: it lies under {digits.parent.parent}, whose _defaults.yaml would "
                            f"replace what {imagenet}'s folder sets (data, network, recipe); give configs of one "
                            "experiments folder, or an overlay from a folder without a _defaults.yaml")
    # an overlay beside no _defaults.yaml (the cluster overlays) and a recipe below the first's folder are layers
    with pytest.raises(SystemExit) as printed:  # --print_config prints and exits
        main(["fit", "--config", str(repo / "experiments/digits/rescale56.yaml"), "--config", str(digits),
              "--config", str(repo / "experiments/cluster/multinode_ddp.yaml"), "--print_config"])
    assert printed.value.code in (0, None)


@pytest.mark.parametrize("text, line", [
    ("trainer:\n  # max_epochs: 3\n", "section 'trainer:' is empty (--config); give it keys, or remove the line"),
    ("model:\n  init_args:\n", "'model: init_args:' is empty (--config); give it keys, or remove the line"),
], ids=["section", "init_args"])
def test_a_section_left_empty_is_refused_in_one_line_naming_the_file(text, line, tmp_path, monkeypatch, run_config,
                                                                     error_line):
    """Every key under a section commented out leaves a null, which jsonargparse reported without the file."""
    monkeypatch.chdir(tmp_path)
    Path("overlay.yaml").write_text(text)
    assert main(["fit", "--config", run_config(tmp_path / "run.yaml"), "--config", "overlay.yaml"]) == 2
    assert error_line().startswith(f"config file overlay.yaml: {line}")
