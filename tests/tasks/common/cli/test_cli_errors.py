"""Bad config keys and values end the `rescale` command with one `error: ...` line and exit 2:
no usage text, no jsonargparse report, no traceback; the line names the key, what is wrong and
the closest valid keys. The one-line errors that existed before (missing data path, unknown
network or scheme, missing config file) keep working."""
from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch

from rescale_tasks.cli import main
from rescale_tasks.common.cli import build_run, trainer_config_errors
from rescale_tasks.common.errors import ConfigError

REPO = Path(__file__).resolve().parents[4]
RESCALE50 = str(REPO / "experiments/imagenet/rescale50.yaml")
RESNET50_BN = str(REPO / "experiments/imagenet/resnet50_bn.yaml")
CPU = ["--trainer.accelerator", "cpu", "--trainer.devices", "1"]



@pytest.fixture(autouse=True)
def _in_tmp(offline_in_tmp):
    """Each test in a folder of its own, W&B offline (tests/tasks/conftest.py)."""


@pytest.fixture
def digits_config(tmp_path, run_config):
    """``digits_config(old, new)``: the tiny digits run config with the text ``old`` replaced by
    ``new`` (a typo planted in the YAML file itself)."""
    def write(old: str = "", new: str = "") -> str:
        path = Path(run_config(tmp_path / "digits.yaml"))
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))
        return str(path)
    return write


@pytest.mark.parametrize("args,expected", [
    (["--model.init_args.no_such_key", "3"],
     ["unknown config key model.init_args.no_such_key", "ClassificationModule has no parameter 'no_such_key'",
      "valid keys under model.init_args: network, scheme"]),
    (["--model.init_args.netwrk", "resnet50"], ["model.init_args.netwrk", "did you mean model.init_args.network?"]),
    (["--model.init_args.optimizer.init_args.lrr", "0.1"],
     ["unknown config key model.init_args.optimizer.init_args.lrr", "SGD has no parameter 'lrr'",
      "did you mean model.init_args.optimizer.init_args.lr"]),
    (["--trainer.max_epochs", "abc"], ["bad value for trainer.max_epochs: expected int or null, got 'abc'"]),
    (["--trainer.precision", "banana"], ["bad value for trainer.precision: expected one of", "'bf16-mixed'",
                                         "got 'banana'"]),
    (["--model.init_args.label_smoothing", "x"],
     ["bad value for model.init_args.label_smoothing: expected float, got 'x'"]),
    (["--model.init_args.lr_scheduler.init_args.milestones", "abc"],
     ["bad value for model.init_args.lr_scheduler.init_args.milestones: expected list, got 'abc'"]),
    (["--trainer.maxepochs", "3"], ["unknown option --trainer.maxepochs; did you mean --trainer.max_epochs"]),
    (["--trainer.max_epoch", "3"], ["unknown option --trainer.max_epoch; did you mean --trainer.max_epochs"]),
    (["--trainer.callbacks+=NoSuchCallback"], ["bad value for trainer.callbacks: 'NoSuchCallback' is not an "
                                               "importable class"]),
    (["--data.init_args.batch_size", "-1"], ["data.batch_size must be at least 1, got -1."]),
    (["--model.init_args", "bn"], ["bad value for model.init_args: expected a mapping of the class's arguments, as "
                                   "--model.init_args '{name: value}' or --model.init_args.NAME VALUE (a file of the "
                                   "whole section: --model FILE)"]),
])
def test_bad_override_is_one_line(args, expected, error_line):
    code = main(["fit", "--config", RESCALE50, *args, *CPU])
    line = error_line()
    assert code == 2
    for text in expected:
        assert text in line


@pytest.mark.parametrize("old,new,expected", [
    ("  max_epochs: 1", "  max_epoch: 1", "unknown config key trainer.max_epoch; did you mean trainer.max_epochs"),
    ("    network: cifar_resnet", "    netwrk: cifar_resnet",
     "unknown config key model.init_args.netwrk: ClassificationModule has no parameter 'netwrk'; did you mean "
     "model.init_args.network?"),
    ("    batch_size: 64", "    batch_sise: 64", "did you mean data.init_args.batch_size?"),
    ("trainer:", "seed: 3\ntrainer:", "unknown config key seed; valid keys: seed_everything, trainer, model, data"),
    ("    batch_size: 64", "    batch_size: 0", "data.batch_size must be at least 1, got 0."),
])
def test_bad_key_or_value_in_yaml_is_one_line(digits_config, old, new, expected, error_line):
    code = main(["fit", "--config", digits_config(old, new)])
    assert expected in error_line() and code == 2


@pytest.mark.parametrize("overlay,extra,expected", [
    ("trainer:\n  max_epoch: 3\n", [], "overlay.yaml:2: unknown config key trainer.max_epoch; did you mean "
                                        "trainer.max_epochs"),
    ("trainer:\n  max_epoch: 3\n", ["--print_config"], "overlay.yaml:2: unknown config key trainer.max_epoch; "
                                                          "did you mean trainer.max_epochs"),
    ("data:\n  init_args:\n    batch_sise: 3\n", [], "overlay.yaml:3: unknown config key data.init_args.batch_sise"),
    ("# max_epochs\ntrainer: {max_epochs: abc}\n", [], "overlay.yaml:2: bad value for trainer.max_epochs: expected "
                                                        "int or null, got 'abc'"),
])
def test_a_bad_key_in_a_config_file_names_the_file_and_line(tmp_path, digits_config, overlay, extra, expected,
                                                             error_line):
    """With several config files, the line says which one holds the bad key (the last to set it)."""
    (tmp_path / "overlay.yaml").write_text(overlay)
    assert main(["fit", "--config", digits_config(), "--config", str(tmp_path / "overlay.yaml"), *extra]) == 2
    line = error_line()
    assert line.startswith(str(tmp_path)) and expected in line, line


def test_bad_trainer_setting_is_one_line(digits_config, error_line):
    code = main(["fit", "--config", digits_config(), "--trainer.accelerator", "tpux"])
    line = error_line()
    assert code == 2 and "bad trainer setting" in line and "accelerator='tpux'" in line and "cpu" in line


@pytest.mark.parametrize("args,expected", [
    (["--optimizer", "Adam", "--optimizer.lr", "0.001"],
     "optimizer: Adam at the top level (--optimizer) is Lightning's own option, which would replace "
     "ClassificationModule's optimizer, its parameter groups and model.init_args.lr_scheduler; set "
     "model.init_args.optimizer instead (--model.init_args.optimizer Adam"),
    (["--lr_scheduler", "torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size", "3"],
     "lr_scheduler: StepLR at the top level (--lr_scheduler) is Lightning's own option, which would be ignored by "
     "ClassificationModule"),
])
def test_lightnings_own_optimizer_option_is_refused(digits_config, args, expected, error_line):
    """Lightning's CLI would put its own configure_optimizers in the module's place (the parameter
    groups and the configured schedule dropped) or ignore a lone --lr_scheduler; a saved
    rescale_config.yaml's top-level ``optimizer: null`` passes."""
    config = digits_config("trainer:", "optimizer: null\nlr_scheduler: null\ntrainer:")
    assert main(["fit", "--config", config, *args]) == 2
    assert expected in error_line()


@pytest.mark.parametrize("command", ["fit", "validate"])
def test_checkpointing_turned_off_is_one_line_that_says_why(tmp_path, run_config, digits_config, error_line, command):
    """Before: 'bad trainer setting ...: Trainer was configured with enable_checkpointing=False but found
    ModelCheckpoint in callbacks list', a callback the user never gave."""
    expected = ("trainer.enable_checkpointing false: every run of the suite writes last.ckpt and epoch<NNN>.ckpt "
                "(always-on callbacks")
    assert main([command, "--config", digits_config(), "--trainer.enable_checkpointing", "false"]) == 2
    assert error_line().startswith(expected)
    config = run_config(tmp_path / "off.yaml", trainer={"enable_checkpointing": False})
    assert main([command, "--config", config]) == 2
    line = error_line()
    assert line.startswith(f"{config}:") and expected in line, line


def test_unknown_command_is_one_line(error_line):
    assert main(["fitt", "--config", RESCALE50]) == 2
    assert error_line() == "unknown command 'fitt'; did you mean fit? (rescale --help lists every command)"


# --- the one-line errors that existed before ------------------------------------------------------

def test_a_command_without_a_config_says_to_give_one(error_line):
    assert main(["fit"]) == 2
    assert error_line() == ("no data and no model given: give a run config, --config experiments/<task>/<run>.yaml "
                            "(e.g. experiments/digits/rescale56.yaml), which sets them, or --data and --model")


def test_missing_config_file(error_line):
    assert main(["fit", "--config", "experiments/imagenet/nope.yaml"]) == 2
    assert error_line().startswith("config file not found: experiments/imagenet/nope.yaml")


@pytest.mark.parametrize("override,expected", [
    (["--model.init_args.network", "resnet5"], "unknown model 'resnet5'. Did you mean resnet50"),
    (["--model.init_args.scheme", "rescal"], "unknown scheme 'rescal'. Did you mean rescale"),
])
def test_unknown_network_or_scheme(override, expected, error_line):
    code = main(["fit", "--config", RESNET50_BN, *override, *CPU])
    line = error_line()
    assert code == 2 and line.startswith("cannot build network") and expected in line


def test_missing_data_path(error_line):
    code = main(["fit", "--config", RESNET50_BN, "--data.root", "/does/not/exist",
                 "--model.init_args.network_options", "{base_width: 8}", "--trainer.logger", "false", *CPU])
    line = error_line()
    assert code == 2 and line.startswith("ImageNet folder not found: /does/not/exist (data.root)")


def test_console_script_prints_one_line_without_usage(tmp_path):
    """The installed `rescale` command itself (argv from sys.argv, a fresh process)."""
    rescale = Path(sys.executable).with_name("rescale")
    env = dict(os.environ, WANDB_MODE="offline", OMP_NUM_THREADS="1")
    done = subprocess.run([str(rescale), "fit", "--config", RESCALE50, "--model.init_args.no_such_key", "3"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: unknown config key model.init_args.no_such_key")


class BrokenStateKey(L.Callback):
    """A callback with a bug the Trainer meets while it is built (Lightning reads the state key of
    every stateful callback in ``Trainer.__init__``)."""

    def state_dict(self):
        return {}

    @property
    def state_key(self):
        raise ValueError("a bug in a callback, not a trainer setting")


def test_a_bug_met_while_the_trainer_is_built_keeps_its_traceback(digits_config):
    with pytest.raises(ValueError, match="a bug in a callback") as caught:
        main(["fit", "--config", digits_config(), f"--trainer.callbacks+={__name__}.BrokenStateKey"])
    assert "state_key" in "".join(traceback.format_tb(caught.value.__traceback__))


def test_only_lightnings_own_checks_are_translated():
    with pytest.raises(ConfigError, match=r"bad trainer setting .*accelerator='tpux'"):
        with trainer_config_errors():
            L.Trainer(accelerator="tpux")
    with pytest.raises(ValueError, match="^not Lightning's$"):
        with trainer_config_errors():
            raise ValueError("not Lightning's")


def test_rescale_traceback_shows_what_a_translated_line_hides(digits_config, monkeypatch, capsys):
    monkeypatch.setenv("RESCALE_TRACEBACK", "1")
    assert main(["fit", "--config", digits_config(), "--trainer.accelerator", "tpux"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "accelerator_connector.py" in err
    assert err.strip().splitlines()[-1].startswith("error: bad trainer setting")


@pytest.mark.parametrize("text,where,what", [
    ("trainer:\n  max_epochs: {1\nmodel:\n  x: 1\n", ":3:6:", "while parsing a flow mapping"),
    ("a: 1\n b: 2\n", ":2:3:", "mapping values are not allowed"),  # libyaml: "in this context"
])
def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path, text, where, what, error_line):
    config = tmp_path / "broken.yaml"
    config.write_text(text)
    assert main(["fit", "--config", str(config)]) == 2
    line = error_line()
    assert line.startswith(f"YAML syntax error in {config}{where}") and what in line


def test_a_yaml_syntax_error_in_a_defaults_file_names_that_file(tmp_path, error_line):
    folder = tmp_path / "experiments" / "mine"
    folder.mkdir(parents=True)
    (folder / "_defaults.yaml").write_text("trainer: [1,\n")
    (folder / "run.yaml").write_text("trainer:\n  max_epochs: 1\n")
    assert main(["fit", "--config", str(folder / "run.yaml")]) == 2
    assert error_line().startswith(f"YAML syntax error in {folder / '_defaults.yaml'}:2:1:")


def test_a_callback_argument_by_list_index_names_what_was_typed_and_how_to_set_it(error_line):
    """jsonargparse cannot set a list entry by its index and reported only `--0.init_args...`."""
    code = main(["fit", "--config", RESCALE50, "--trainer.callbacks.0.init_args.every_n_train_steps", "30", *CPU])
    line = error_line()
    assert code == 2
    assert line.startswith("unknown option --trainer.callbacks.0.init_args.every_n_train_steps: ")
    assert "config file's trainer.callbacks list (- class_path: ModelCheckpoint, init_args: " \
           "{every_n_train_steps: 30})" in line
    assert "--trainer.callbacks+=ModelCheckpoint --trainer.callbacks.every_n_train_steps 30" in line
    assert "--last_checkpoint.every_n_train_steps 30" in line


def test_the_form_the_callback_message_suggests_is_accepted(capsys):
    with pytest.raises(SystemExit) as done:  # --print_config prints and exits
        main(["fit", "--config", RESCALE50, "--trainer.callbacks+=ModelCheckpoint",
              "--trainer.callbacks.every_n_train_steps", "30", "--print_config"])
    printed = capsys.readouterr().out
    assert done.value.code == 0 and "class_path: lightning.pytorch.callbacks.ModelCheckpoint" in printed
    assert "every_n_train_steps: 30" in printed


@pytest.mark.parametrize("key,value,hint", [
    ("network_options", "{base_width:8}", "'{base_width: 8}'"),
    ("scheme_options", "{conv_dropout:0.1}", "'{conv_dropout: 0.1}'"),
])
def test_a_flow_mapping_without_a_space_after_the_colon_says_so(key, value, hint, error_line):
    code = main(["fit", "--config", RESCALE50, f"--model.init_args.{key}", value, *CPU])
    line = error_line()
    assert code == 2 and line.startswith(f"bad value for model.init_args.{key}: expected dict[str, Any] or null")
    assert f"a YAML mapping needs a space after each colon: {hint}" in line


@pytest.mark.parametrize("key,value,glued", [
    ("network_options", "{depth: 8, base_width:8}", "base_width:8"),
    ("scheme_options", "{conv_bias: false, classifier_dropout:0.3}", "classifier_dropout:0.3"),
])
def test_a_glued_key_inside_a_flow_mapping_says_so(tmp_path, run_config, key, value, glued, error_line):
    """`{depth: 8, base_width:8}` parses, as {depth: 8, 'base_width:8': null}."""
    code = main(["fit", "--config", run_config(tmp_path / "digits.yaml"), f"--model.init_args.{key}", value])
    line = error_line()
    assert code == 2 and line.startswith("cannot build network 'cifar_resnet'")
    fixed = glued.replace(":", ": ")
    assert f"a YAML mapping needs a space after each colon: '{fixed}', not '{glued}'" in line


def test_a_mapping_written_right_gets_no_colon_hint(error_line):
    code = main(["fit", "--config", RESCALE50, "--model.init_args.network_options", "[1, 2]", *CPU])
    assert code == 2 and "colon" not in error_line()


# --- scheme options are typed ---------------------------------------------------------------------

@pytest.mark.parametrize("option,value,yaml_value,expected", [
    ("mean_shift", "flase", "flase", '"flase" is not a boolean (true or false)'),
    ("shortcut_gain", "two", "two", '"two" is not a number or null'),
    ("conv_dropout", "high", "high", '"high" is not a number'),
    ("c", "[1]", [1], "[1] is not a number or null"),
])
@pytest.mark.parametrize("given", ["command line", "config file"])
def test_a_scheme_option_of_the_wrong_type_is_one_line(tmp_path, run_config, option, value, yaml_value, expected,
                                                       given, error_line):
    """Before: "flase" turned mean_shift on (and was recorded), "two" and "high" ended in a traceback."""
    if given == "command line":
        args = ["--config", run_config(tmp_path / "digits.yaml"), f"--model.init_args.scheme_options.{option}", value]
    else:
        args = ["--config", run_config(tmp_path / "digits.yaml",
                                       model={"init_args": {"scheme_options": {option: yaml_value}}})]
    assert main(["fit", *args]) == 2
    assert error_line() == f"model.init_args.scheme_options.{option}: {expected} for scheme rescale"


def test_a_scheme_option_the_network_cannot_build_is_one_line(tmp_path, run_config, error_line):
    """Before: the CIFAR ResNet took norm ln and trained without any norm layer."""
    config = run_config(tmp_path / "digits.yaml")
    assert main(["fit", "--config", config, "--model.init_args.scheme_options", "{norm: ln}"]) == 2
    assert error_line() == 'model.init_args.scheme_options.norm: "ln" is not a norm a conv network builds ' \
                           '(one of "bn", "gn", "dyt", "derf" or null) for scheme rescale'


@pytest.mark.parametrize("arg", ["--model.init_args.num_classes", "--model.num_classes"])
def test_a_model_argument_the_data_sets_is_refused_in_one_line(tmp_path, run_config, error_line, arg):
    """Before: a 10-class head was trained while --model.init_args.num_classes 5 was silently dropped."""
    config = run_config(tmp_path / "digits.yaml")
    assert main(["fit", "--config", config, arg, "5"]) == 2
    assert error_line().startswith("model.init_args.num_classes is set from the data module (data.num_classes), "
                                   "and a value given for it is not used: drop --model.init_args.num_classes")


def test_a_linked_argument_a_config_file_or_a_mapping_sets_is_refused(tmp_path, run_config, error_line):
    """Before: num_classes: 5 in a config file (or in --model.init_args '{...}') was silently replaced
    by the data's 10; the data's own value, or the class's default, passes."""
    config = run_config(tmp_path / "digits.yaml", model={"init_args": {"num_classes": 5}})
    assert main(["fit", "--config", config]) == 2
    line = Path(config).read_text().splitlines().index("    num_classes: 5") + 1
    assert error_line() == (f"{config}:{line}: model.init_args.num_classes: 5 is set from the data module, which gives 10 "
                            "(data.num_classes), and the value given is not used: drop model.init_args.num_classes "
                            "(the data decides it: its classes, channels or vocabulary)")
    plain = run_config(tmp_path / "plain.yaml")
    assert main(["fit", "--config", plain, "--model.init_args", "{in_channels: 2}"]) == 2
    assert error_line().startswith("model.init_args.in_channels: 2 is set from the data module, which gives 1")
    assert main(["fit", "--config", plain, "--model.init_args", "{in_channels: 3}"]) == 2  # the class's default too
    assert error_line().startswith("model.init_args.in_channels: 3 is set from the data module, which gives 1")
    assert build_run(["--config", plain, "--model.init_args", "{label_smoothing: 0.1}"]).model.hparams.in_channels == 1
    agreeing = run_config(tmp_path / "agreeing.yaml", model={"init_args": {"num_classes": 10}})
    assert build_run(["--config", agreeing]).model.hparams.num_classes == 10
    assert build_run(["--config", plain, "--model", "ClassificationModule"]).model.hparams.num_classes == 10


def test_a_scheme_option_is_checked_against_the_networks_default_scheme(tmp_path, run_config, error_line):
    config = run_config(tmp_path / "digits.yaml", model={"init_args": {"scheme": None}})
    assert main(["fit", "--config", config, "--model.init_args.scheme_options.zero_gamma", "maybe"]) == 2
    assert error_line() == 'model.init_args.scheme_options.zero_gamma: "maybe" is not a boolean (true or false) ' \
                           "for scheme bn"


def test_scheme_options_as_the_command_line_and_yaml_give_them_are_accepted(tmp_path, run_config):
    config = run_config(tmp_path / "digits.yaml", model={"init_args": {"scheme_options": {"shortcut_gain": "2"}}})
    cli = build_run(["--config", config, "--model.init_args.scheme_options.mean_shift", "false",
                     "--model.init_args.scheme_options.c", "2", "--model.init_args.scheme_options.gain_init", "0.5"])
    scheme = cli.model.net.scheme
    assert (scheme.mean_shift, scheme.c, scheme.shortcut_gain, scheme.gain_init) == (False, 2.0, 2.0, 0.5)


def test_a_logger_whose_package_is_not_installed_is_one_line(digits_config, error_line):
    """Lightning's TensorBoardLogger without ``tensorboard`` (not a dependency of the suite): the class
    and what its library says to install, not jsonargparse's report and a traceback."""
    import importlib.util

    assert importlib.util.find_spec("tensorboard") is None and importlib.util.find_spec("tensorboardX") is None, \
        "tensorboard is installed: this test needs an environment without it"
    assert main(["fit", "--config", digits_config(), "--trainer.logger", "TensorBoardLogger",
                 "--trainer.logger.init_args.save_dir", "tb"]) == 2
    line = error_line()
    assert line.startswith("cannot build lightning.pytorch.loggers.TensorBoardLogger: ") and "pip install" in line, line


@pytest.mark.parametrize("key,expected", [
    # what the logger hands WandbLogger itself: the line says so and how to set it instead
    ("offline", "SuiteWandbLogger sets 'offline' itself: the mode is online when you are logged in to W&B, "
                "offline otherwise; the environment variable WANDB_MODE"),
    ("mode", "SuiteWandbLogger sets 'mode' itself: "),
    # a close name: never one the logger refuses
    ("offlin", "SuiteWandbLogger has no parameter 'offlin'; valid keys under trainer.logger.init_args: name, "),
])
def test_a_logger_argument_the_suite_sets_names_how_to_set_it_not_itself(tmp_path, run_config, suite_wandb_logger,
                                                                         key, expected, error_line):
    config = run_config(tmp_path / "run.yaml", trainer={"logger": suite_wandb_logger("p", "n", str(tmp_path))})
    assert main(["fit", "--config", config, f"--trainer.logger.init_args.{key}", "true"]) == 2
    line = error_line()
    assert line.startswith(f"unknown config key trainer.logger.init_args.{key}: ") and expected in line, line
    assert "did you mean" not in line, line


OWN_MODULE = '''
from torch import nn
from rescale_tasks.classification.module import ClassificationModule


class OwnNetClassification(ClassificationModule):
    """A task module of one's own whose network is not in rescale_core's registry."""

    def build_network(self, network, num_classes, in_channels, **options):
        return nn.Sequential(nn.Conv2d(in_channels, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(4, num_classes))
'''


def test_a_task_module_of_ones_own_builds_a_network_outside_the_registry(tmp_path, run_config, monkeypatch,
                                                                          error_line):
    """A task module outside the suite that overrides ``build_network`` (as the task modules'
    base says a task does) is given its own ``network`` name: the CLI's check of registered
    names before anything is built leaves it to the module. The suite's modules keep the check."""
    (tmp_path / "own_module.py").write_text(OWN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = run_config(tmp_path / "own.yaml", model={"class_path": "own_module.OwnNetClassification",
                                                      "init_args": {"network": "own_net", "scheme": None}})
    net = build_run(["--config", config]).model.net
    assert isinstance(net, torch.nn.Sequential) and net[-1].out_features == 10
    assert main(["fit", "--config", config, "--model", "ClassificationModule"]) == 2
    assert error_line().startswith("cannot build network 'own_net'")
