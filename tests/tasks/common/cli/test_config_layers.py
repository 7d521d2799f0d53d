"""The keys of the config layers and where they are set: a key written with its ``init_args``
level and the same key written without it are one key, to the error that names its line and to
the refusal of an option a later ``--config`` sets again; the keys of a mapping argument a later
layer giving the whole mapping drops."""
from __future__ import annotations

import builtins
import inspect
import logging
import os
import typing
from pathlib import Path

import pytest

from rescale_tasks.classification.module import ClassificationModule
from rescale_tasks.common.cli import build_run, run_lightning
from rescale_tasks.common.cli.config_layers import (CONFIG_FLAGS, MAPPING_ARGUMENTS, carried_arguments, flag_values,
                                                    key_location, refuse_lost_overrides, replaced_mappings)
from rescale_tasks.common.errors import UserError
from rescale_tasks.common.module import RescaleTaskModule
from rescale_tasks.common.training import init_parameters
from rescale_tasks.detection.module import DetectionModule
from rescale_tasks.translation.module import TranslationModule
from rescale_tasks.video.module import VideoClassificationModule

SPELLINGS = {"with init_args": "trainer:\n  max_epochs: 1\nmodel:\n  class_path: M\n  init_args:\n    depth: 8\n"
                               "    scheme: bn\n",
             "without init_args": "trainer:\n  max_epochs: 1\nmodel:\n  class_path: M\n  depth: 8\n\n"
                                  "  scheme: bn\n"}


DIGITS = str(Path(__file__).resolve().parents[4] / "experiments" / "digits" / "rescale56.yaml")
DIGITS_LINE = f"classifier_gain ({DIGITS}:7)"


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("key", ["model.init_args.scheme", "model.scheme"])
def test_a_key_with_or_without_init_args_is_found_on_its_line(tmp_path, spelling, key):
    run = tmp_path / "run.yaml"
    run.write_text(SPELLINGS[spelling])
    assert key_location(key, [str(run)]) == f"{run}:7"
    assert key_location("model", [str(run)]) == f"{run}:3"  # a section: the line of its key
    with pytest.raises(UserError, match=rf"^--{key} comes before --config {run}, whose line 7 sets it again"):
        refuse_lost_overrides(["fit", f"--{key}", "gn", "--config", str(run)])
    refuse_lost_overrides(["fit", f"--{key.replace('scheme', 'width')}", "2", "--config", str(run)])


def test_a_mapping_option_before_a_config_is_refused_only_where_the_config_sets_one_of_its_keys(tmp_path):
    """``--model.init_args '{label_smoothing: 0.1}' --config overlay.yaml``: jsonargparse merges the
    overlay's other model keys with the option's, so the option is not lost and runs as given; an
    overlay that sets label_smoothing again is refused, as a dotted option before it is."""
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("model:\n  init_args:\n    network_options: {depth: 8, base_width: 4}\n")
    cli = build_run(["--config", DIGITS, "--model.init_args", "{label_smoothing: 0.1}", "--trainer", "{max_steps: 3}",
                     "--config", str(overlay)])
    init = cli.config["model"]["init_args"]
    assert init["label_smoothing"] == 0.1 and init["network_options"]["depth"] == 8  # both layers: merged
    assert cli.config["trainer"]["max_steps"] == 3
    overlay.write_text("model:\n  init_args:\n    label_smoothing: 0.2\n")
    for option in (["--model.init_args", "{label_smoothing: 0.1}"], ["--model", "{init_args: {label_smoothing: 0.1}}"],
                   ["--model.init_args", "{scheme_options: {c: 1}}"]):
        if "scheme_options" in option[1]:
            overlay.write_text("model:\n  init_args:\n    scheme_options: {shortcut_gain: 1.0}\n")
        with pytest.raises(UserError, match=rf"^--{option[0][2:]} comes before --config {overlay}, whose line 3 sets"):
            refuse_lost_overrides(["fit", "--config", DIGITS, *option, "--config", str(overlay)])



def test_an_optimizer_given_in_a_section_mapping_before_a_config_is_merged_not_refused(tmp_path):
    """``--model.init_args '{optimizer: {class_path: SGD, init_args: {lr: 0.7}}}' --config overlay.yaml``
    where the overlay sets the optimizer's momentum: jsonargparse merges a class's init_args, so the
    lr is kept and nothing is refused; an overlay setting the lr (or the class) again is refused."""
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("model:\n  init_args:\n    optimizer:\n      init_args: {momentum: 0.5}\n")
    option = ["--model.init_args", "{optimizer: {class_path: torch.optim.SGD, init_args: {lr: 0.7}}}"]
    refuse_lost_overrides(["fit", "--config", DIGITS, *option, "--config", str(overlay)])
    cli = build_run(["--config", DIGITS, *option, "--trainer", "{max_steps: 3}", "--config", str(overlay)])
    assert cli.config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.7
    assert cli.config["model"]["init_args"]["optimizer"]["init_args"]["momentum"] == 0.5
    overlay.write_text("model:\n  init_args:\n    optimizer:\n      init_args: {lr: 0.2}\n")
    with pytest.raises(UserError, match=rf"^--model.init_args comes before --config {overlay}, whose line 4 sets"):
        refuse_lost_overrides(["fit", "--config", DIGITS, *option, "--config", str(overlay)])

NF_RECIPE = str(Path(__file__).resolve().parents[4] / "experiments" / "imagenet" / "nf_resnet50.yaml")
RECIPE_LINE = f"stochdepth_rate ({NF_RECIPE}:24)"


@pytest.mark.parametrize("given,dropped", [
    (["--model.init_args.scheme_options", "{zero_gamma: false}"], True),
    (["--model.init_args.scheme_options=zero_gamma: false"], True),  # a block mapping, --key=value
    (["--model.init_args.scheme_options", "{zero_gamma: false, stochdepth_rate: 0.1, stochdepth_scale: false}"], False),
    (["--model.init_args.scheme_options.zero_gamma", "false"], False),  # one key: merged
    (["--model.scheme_options.zero_gamma", "false", "--model.scheme_options", "{stochdepth_rate: 0.1}"], True),
])
def test_a_mapping_given_whole_says_which_keys_set_before_it_it_drops(given, dropped):
    """The recipe's stochastic depth is lost to ``scheme_options: {zero_gamma: false}`` (jsonargparse
    replaces a mapping argument): the run says so, naming the key and the line that set it."""
    lines = replaced_mappings(["fit", "--config", NF_RECIPE, *given])
    assert len(lines) == dropped and (not dropped or (RECIPE_LINE in lines[0] or "zero_gamma (--model" in lines[0]))
    if dropped and given[0].endswith("{zero_gamma: false}"):
        assert lines[0] == (f"--model.init_args.scheme_options gives model.scheme_options whole, which replaces the "
                            f"mapping set before it and drops {RECIPE_LINE}: repeat the dropped keys in it, or "
                            "change one key alone with --model.init_args.scheme_options.KEY VALUE")


def test_a_config_file_giving_the_mapping_after_another_is_logged_and_the_run_is_what_it_says(tmp_path, caplog):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("model:\n  init_args:\n    scheme_options: {zero_gamma: false}\n")
    with caplog.at_level(logging.WARNING):
        cli = build_run(["--config", NF_RECIPE, "--config", str(overlay), "--model.init_args.network_options",
                         "{base_width: 4}"])
    assert cli.model.net.scheme.stochdepth_rate == 0.0  # what the line says: dropped
    assert f"{overlay} gives model.scheme_options whole" in caplog.text and RECIPE_LINE in caplog.text


def test_a_mapping_given_whole_inside_a_section_given_on_the_command_line_is_named_as_jsonargparse_applies_it(caplog):
    """``--model.init_args '{scheme_options: {...}}'``: jsonargparse merges ``init_args`` key by key
    (the config's scheme and optimizer stay) and replaces the ``scheme_options`` inside it, dropping
    the config's classifier_gain: the run says so, and no more (network_options gives every key)."""
    given = "{scheme_options: {shortcut_gain: 2.0}, network_options: {depth: 8, base_width: 4}}"
    with caplog.at_level(logging.WARNING):
        cli = build_run(["--config", DIGITS, "--model.init_args", given])
    init = cli.config["model"]["init_args"]
    assert dict(init["scheme_options"]) == {"shortcut_gain": 2.0}  # replaced
    assert init["scheme"] == "rescale" and init["optimizer"]["init_args"]["lr"] == 0.05  # merged
    warned = [r.getMessage() for r in caplog.records if "whole" in r.getMessage()]
    assert warned == [f"--model.init_args gives model.scheme_options whole, which replaces the mapping set before "
                      f"it and drops {DIGITS_LINE}: repeat the dropped keys in it, or change one key alone with "
                      "--model.init_args.scheme_options.KEY VALUE"]


@pytest.mark.parametrize("given,dropped", [
    (["--model", "{init_args: {scheme_options: {shortcut_gain: 2.0}}}"], "--model"),
    (["--model.init_args=scheme_options: {shortcut_gain: 2.0}"], "--model.init_args"),
    (["--model.init_args", "{scheme: bn}"], None),  # around the mapping, without it: merged
    (["--model.init_args", "{scheme_options: {shortcut_gain: 2.0, classifier_gain: 1.0}}"], None),
    # the dropped key given again after it: not lost
    (["--model.init_args", "{scheme_options: {shortcut_gain: 2.0}}", "--model.init_args.scheme_options.classifier_gain",
      "1.0"], None),
    (["--model.init_args.scheme_options", "{shortcut_gain: 2.0}", "--model.init_args.scheme_options.classifier_gain",
      "1.0"], None),
])
def test_a_mapping_given_whole_inside_a_bigger_one_is_named_only_where_it_drops_a_key(given, dropped):
    lines = replaced_mappings(["fit", "--config", DIGITS, *given])
    assert lines == ([f"{dropped} gives model.scheme_options whole, which replaces the mapping set before it and "
                      f"drops {DIGITS_LINE}: repeat the dropped keys in it, or change one key alone with "
                      "--model.init_args.scheme_options.KEY VALUE"] if dropped else [])


def test_a_mapping_given_whole_in_the_file_of_a_section_option_is_named(tmp_path):
    """``--model model.yaml``: jsonargparse reads the section from the file, and replaces the
    ``scheme_options`` it gives as any layer would."""
    part = tmp_path / "model.yaml"
    part.write_text("init_args:\n  scheme_options: {shortcut_gain: 2.0}\n")
    assert replaced_mappings(["fit", "--config", DIGITS, "--model.init_args", str(part)]) == []  # refused: no file
    assert replaced_mappings(["fit", "--config", DIGITS, "--model", str(part)]) == [
        f"{part} gives model.scheme_options whole, which replaces the mapping set before it and drops {DIGITS_LINE}: "
        "repeat the dropped keys in it, or change one key alone with --model.init_args.scheme_options.KEY VALUE"]


def test_a_config_printed_without_its_defaults_says_where_it_builds_the_run(capsys):
    """``--print_config=skip_default`` leaves out what the ``_defaults.yaml`` set (jsonargparse
    counts them as defaults): the network, the optimizer, the data; saved elsewhere, the printed
    config would build another run, so stderr says where it builds this one."""
    with pytest.raises(SystemExit):
        run_lightning(["fit", "--config", DIGITS, "--print_config=skip_default"], run=False)
    printed = capsys.readouterr()
    assert "cifar_resnet" not in printed.out and "DigitsDataModule" not in printed.out
    assert ("# skip_default leaves out what these defaults set too (network, optimizer, data ...): the printed config "
            f"builds this run only as a --config in {Path(DIGITS).parent}, where they apply") in printed.err


def test_a_config_given_as_c_with_its_path_attached_gets_its_defaults():
    """``-cexperiments/digits/rescale56.yaml`` (argparse's short option with its value attached) is
    a --config like any other: its _defaults.yaml applies, and the file is checked."""
    assert flag_values(["fit", "-ca.yaml", "-c=b.yaml", "-c", "c.yaml", "--config=d.yaml"], CONFIG_FLAGS) == [
        "a.yaml", "b.yaml", "c.yaml", "d.yaml"]
    cli = build_run(["-c" + DIGITS, "--model.init_args.network_options", "{depth: 8, base_width: 4}"])
    assert cli.config["model"]["init_args"]["network"] == "cifar_resnet"  # from experiments/digits/_defaults.yaml


def test_an_optimizer_of_another_class_says_which_arguments_of_the_recipes_it_keeps(caplog):
    """``--model.init_args.optimizer torch.optim.Adam`` after the digits recipe's SGD: jsonargparse
    keeps the recipe's lr and weight_decay (Adam takes both), so Adam trains at SGD's lr 0.05; the
    run says so, naming where each was set."""
    with caplog.at_level(logging.WARNING):
        cli = build_run(["--config", DIGITS, "--model.init_args.network_options", "{depth: 8, base_width: 4}",
                         "--model.init_args.optimizer", "torch.optim.Adam"])
    optimizer = cli.config["model"]["init_args"]["optimizer"]
    assert optimizer["class_path"] == "torch.optim.Adam"
    assert (optimizer["init_args"]["lr"], optimizer["init_args"]["weight_decay"]) == (0.05, 0.0005)  # kept
    defaults = f"{Path(DIGITS).parent / '_defaults.yaml'}:13"
    assert [r.getMessage() for r in caplog.records if "jsonargparse keeps" in r.getMessage()] == [
        "--model.init_args.optimizer gives model.optimizer the class torch.optim.Adam in place of torch.optim.SGD, and "
        "jsonargparse keeps the arguments set for torch.optim.SGD that torch.optim.Adam takes too: lr=0.05 "
        f"({defaults}), weight_decay=0.0005 ({defaults}); give them again "
        "(--model.init_args.optimizer.init_args.KEY VALUE) to change them"]


@pytest.mark.parametrize("given,kept", [
    (["--model.init_args", "{optimizer: {class_path: torch.optim.AdamW, init_args: {lr: 0.001}}}"], ["weight_decay"]),
    (["--model.init_args.optimizer", "AdamW", "--model.init_args.optimizer.weight_decay", "0.01"], ["lr"]),
    (["--model.init_args.optimizer", "torch.optim.SGD"], []),  # the same class: merged
    (["--model.init_args.optimizer", "{class_path: AdamW, init_args: {lr: 0.01, weight_decay: 0.01}}"], []),
])
def test_the_arguments_an_optimizer_of_another_class_keeps_are_those_set_before_and_not_again(given, kept):
    final = {"model.optimizer": {"lr": 0.05, "weight_decay": 0.0005, "betas": (0.9, 0.999)}}
    lines = carried_arguments(["fit", "--config", DIGITS, *given], final)
    assert len(lines) == bool(kept) and all(f" {k}=" in lines[0] for k in kept)
    assert not lines or all(f" {k}=" not in lines[0] for k in {"lr", "weight_decay"} - set(kept))


def test_a_command_reads_each_config_file_once(tmp_path, monkeypatch):
    """The file checks, the options a later --config would override (one look per option before
    it), the mappings a layer drops: one read of each file for the command (jsonargparse's own
    reading aside), so all of them see the same text."""
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("model:\n  init_args:\n    network_options: {depth: 8, base_width: 4}\n")
    opened: list[str] = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        caller = inspect.currentframe().f_back.f_globals["__name__"]
        if str(file).endswith(".yaml") and caller.startswith("rescale_tasks."):  # jsonargparse reads them too
            opened.append(os.path.abspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    cli = build_run(["--config", DIGITS, "--trainer.max_steps", "1", "--data.init_args.batch_size", "8",
                     "--config", str(overlay)])
    assert cli.config["model"]["init_args"]["network_options"]["depth"] == 8
    defaults = str(Path(DIGITS).parent / "_defaults.yaml")
    assert sorted(opened) == sorted([defaults, DIGITS, str(overlay)])


def test_every_mapping_argument_of_the_task_modules_is_listed():
    mappings = set()
    for module in (ClassificationModule, DetectionModule, TranslationModule, VideoClassificationModule):
        hints = {**typing.get_type_hints(RescaleTaskModule.__init__), **typing.get_type_hints(module.__init__)}
        for name in init_parameters(module):
            hint = hints.get(name)
            if dict in (typing.get_origin(hint), *map(typing.get_origin, typing.get_args(hint))):
                mappings.add(f"model.{name}")
    assert mappings == set(MAPPING_ARGUMENTS)
