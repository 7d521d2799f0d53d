"""``rescale --help`` lists every command of the suite, one line each, and ``rescale <command>
--help`` works for each."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rescale_tasks.cli import SUITE_COMMANDS, main
from rescale_tasks.common.cli import TRAINER_SUBCOMMANDS

COMMANDS = ("fit", "validate", "test", "predict", "demo", "models", "schemes", "prepare-translation",
            "prepare-video", "translate", "average-checkpoints", "export", "analyze", "study", "compare")


def _listed(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines() if line.startswith("  ") and line.split()]


def test_rescale_help_lists_every_command_one_line_each():
    """The installed ``rescale`` entry point, as a user runs it."""
    rescale = Path(sys.executable).with_name("rescale")
    done = subprocess.run([str(rescale), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert _listed(done.stdout) == list(COMMANDS)
    # and no command of the CLI is missing from the list
    assert set(COMMANDS) == set(TRAINER_SUBCOMMANDS) | set(SUITE_COMMANDS)


def test_no_arguments_prints_the_same_list(capsys):
    assert main([]) == 0
    assert _listed(capsys.readouterr().out) == list(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_its_own_help(command, capsys):
    try:
        code = main([command, "--help"])
    except SystemExit as exit_:  # argparse's and jsonargparse's help
        code = exit_.code
    assert code in (0, None)
    out = capsys.readouterr().out
    assert out.startswith("usage:") and command in out.splitlines()[0]
    assert "options" in out


def test_models_and_schemes_refuse_unknown_arguments_in_one_line(capsys):
    assert main(["schemes", "--verbose"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: rescale schemes: unrecognized arguments: --verbose (see rescale schemes --help)"
    assert main(["models", "rescale5*"]) == 0
    assert capsys.readouterr().out.split() == ["rescale50"]


def test_models_matches_a_part_of_the_name_and_says_when_nothing_matches(capsys):
    """`rescale models resnet5` (no wildcard) lists the names holding it; it printed nothing."""
    assert main(["models", "resnet5"]) == 0
    names = capsys.readouterr().out.split()
    assert "resnet50" in names and all("resnet5" in n for n in names)
    assert main(["models", "nosuchnet"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip() == (
        "error: no registered network matches 'nosuchnet'; `rescale models` lists them all")


def test_schemes_match_a_pattern_as_models_do(capsys):
    """`rescale schemes skip` lists the schemes holding it; no match is the same one line as
    `rescale models` (it refused any pattern: "unrecognized arguments")."""
    assert main(["schemes", "skip"]) == 0
    names = capsys.readouterr().out.split()
    assert "skipinit" in names and all("skip" in n for n in names)
    assert main(["schemes", "bn*"]) == 0
    assert all(n.startswith("bn") for n in capsys.readouterr().out.split())
    assert main(["schemes", "nosuch"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip() == (
        "error: no registered scheme matches 'nosuch'; `rescale schemes` lists them all")


@pytest.mark.parametrize("given, line", [
    ("fitt", "unknown command 'fitt'; did you mean fit? (rescale --help lists every command)"),
    ("--versio", "unknown option '--versio'; did you mean --version or --verbose? (rescale --help lists every "
                 "command)"),
    ("bogus", "unknown command 'bogus' (rescale --help lists every command)"),
])
def test_an_unknown_command_is_one_line_among_every_command(given, line, capsys):
    """Lightning's parser listed its four commands (fit, validate, test, predict) or its own keys."""
    assert main([given]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {line}"]


SUITE_PARSED = ("demo", "prepare-translation", "prepare-video", "translate", "average-checkpoints", "export",
                "analyze signal", "study depth", "compare")


@pytest.mark.parametrize("command", SUITE_PARSED)
def test_every_suite_command_refuses_an_unknown_option_in_one_line(command, capsys):
    """compare, average-checkpoints and the two prepare commands printed argparse's usage dump."""
    words = command.split()
    assert main([*words, "--bogus"]) == 2
    line, = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: rescale {words[0]}") and line.endswith(" --help)")


@pytest.mark.parametrize("command, abbreviated", [("average-checkpoints", "--out"), ("compare", "--wandb_proj"),
                                                  ("prepare-translation", "--src_l"), ("prepare-video", "--short")])
def test_an_abbreviated_option_is_refused_not_taken_for_another(command, abbreviated, capsys):
    assert main([command, "x", "y", abbreviated, "1"]) == 2
    assert abbreviated in capsys.readouterr().err


@pytest.mark.parametrize("command", ["average-checkpoints", "analyze", "compare", "export", "translate"])
def test_help_shows_descriptions_without_rest_quotes(command, capsys):
    try:
        main([command, "--help"])
    except SystemExit:
        pass
    out = capsys.readouterr().out
    assert "``" not in out and f"rescale {command}" in out
