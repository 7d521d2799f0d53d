"""`cli_errors` reads jsonargparse's message text with regular expressions. Here the installed
(pinned, `<5` in pyproject.toml) jsonargparse produces each raw message the module reads, from a
small parser of its own, and every regular expression must still find its message and the one
line must come out right. An upgrade that rewords a message fails here, not in a user's run."""
from __future__ import annotations

import re
from typing import Callable, Literal, Optional

import jsonargparse
import pytest
import torch
from jsonargparse import ActionConfigFile, ArgumentParser

from rescale_tasks.common.cli import parse_errors as cli_errors
from rescale_tasks.common.cli.parse_errors import _chain, _first_line, describe_argument_error


class Net:
    def __init__(self, depth: int = 3, kind: Literal["a", "b"] = "a") -> None:
        pass


def command() -> ArgumentParser:
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--limit", type=Optional[int], default=None)
    parser.add_argument("--net", type=Optional[Net], default=None)
    parser.add_argument("--optimizer", type=Callable[[list], torch.optim.Optimizer], default=None)
    return parser


def needs_a_net() -> ArgumentParser:
    parser, sub = ArgumentParser(exit_on_error=False), ArgumentParser(exit_on_error=False)
    sub.add_subclass_arguments(Net, "net", required=True)
    parser.add_subcommands().add_subcommand("fit", sub)
    return parser


def suite() -> ArgumentParser:
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subcommands().add_subcommand("fit", command())
    return parser


NET = f"{__name__}.Net"
SGD_TYPO = '{"class_path": "torch.optim.SGD", "init_args": {"lrr": 1}}'

# the pattern's name in cli_errors, the parser and arguments that make jsonargparse say it, the
# one line the suite prints for it
RAW = {
    "_PARSER_KEY": (command, ["--epochs", "x"], "bad value for epochs: expected int, got 'x'"),
    "_EXPECTED": (command, ["--epochs", "x"], "bad value for epochs: expected int, got 'x'"),
    "_SUBTYPES": (command, ["--limit", "x"], "bad value for limit: expected int or null, got 'x'"),
    "_GIVEN": (command, ["--limit", "x"], "bad value for limit: expected int or null, got 'x'"),
    "_CLASS_PATH": (command, ["--net", NET, "--net.init_args.dept", "3"],
                    "unknown config key net.init_args.dept: Net has no parameter 'dept'; did you mean "
                    "net.init_args.depth?"),
    "_UNKNOWN_OPTION": (command, ["--net", NET, "--net.init_args.dept", "3"],
                        "unknown config key net.init_args.dept: Net has no parameter 'dept'"),
    "_CALLABLE": (command, ["--optimizer", SGD_TYPO],
                  "unknown config key optimizer.init_args.lrr: SGD has no parameter 'lrr'; did you mean "
                  "optimizer.init_args.lr?"),
    "_GIVEN_CLASS": (command, ["--optimizer", SGD_TYPO], "optimizer.init_args.lrr"),
    "_UNRECOGNIZED": (command, ["--zzz", "3"], "unknown option --zzz"),
    "_INVALID_CHOICE": (suite, ["fitt"], "unknown command 'fitt'; did you mean fit?"),
    "_BAD_IMPORT": (command, ["--net", "Nett"], "bad value for net: 'Nett' is not an importable class"),
    "_NO_VALUE": (command, ["--epochs", "-1e-4"], "option --epochs or a key under it got no value: write --key VALUE"),
    "_REQUIRED": (needs_a_net, ["fit"], "no net given: give a run config, --config experiments/<task>/<run>.yaml"),
    "_NOT_A_MAPPING": (command, ["--net", NET, "--net.init_args", "3"],
                       "bad value for net.init_args: expected a mapping of the class's arguments"),
}


def raw_error(make, args) -> BaseException:
    with pytest.raises(Exception) as caught:  # noqa: PT011 - which kind is the point of the test
        make().parse_args(args)
    return caught.value


def test_the_pin_holds():
    assert int(jsonargparse.__version__.split(".")[0]) == 4


# patterns read what the user typed (an option's name, a value), not jsonargparse's wording: their
# messages are tested through the real CLI in test_cli_errors.py
USER_TEXT = {"_LIST_INDEX", "_FLOW_MAPPING_NO_SPACE"}


def test_every_pattern_of_cli_errors_has_a_raw_message_here():
    patterns = {name for name, value in vars(cli_errors).items() if isinstance(value, re.Pattern)}
    # _UNKNOWN_KEY, _UNKNOWN_IN_GROUP: a config file's key, below
    assert patterns == set(RAW) | {"_UNKNOWN_KEY", "_UNKNOWN_IN_GROUP"} | USER_TEXT


@pytest.mark.parametrize("name", sorted(RAW))
def test_the_raw_message_of_the_pinned_version_is_read(name):
    make, args, line = RAW[name]
    err = raw_error(make, args)
    pattern = getattr(cli_errors, name)
    texts = [str(e) for e in _chain(err)]
    assert any(pattern.search(t) or pattern.match(_first_line(e)) for t, e in zip(texts, _chain(err))), texts
    assert line in describe_argument_error(err, make())


def test_an_unknown_key_in_a_subcommand_config_file(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("zzz: 1\n")
    err = raw_error(suite, ["fit", "--config", str(config)])
    assert cli_errors._UNKNOWN_KEY.match(_first_line(err)), str(err)
    assert describe_argument_error(err, command()).startswith("unknown config key zzz; valid keys: ")


class Trainer:
    def __init__(self, max_epochs: int = 1) -> None:
        pass


def test_an_unknown_key_in_a_config_files_class_group(tmp_path):
    """What jsonargparse says of a bad key under a class's group (``trainer:``), e.g. under
    ``--print_config``."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_class_arguments(Trainer, "trainer")
    config = tmp_path / "run.yaml"
    config.write_text("trainer:\n  max_epoch: 3\n")
    err = raw_error(lambda: parser, ["--config", str(config), "--print_config"])
    assert cli_errors._UNKNOWN_IN_GROUP.match(_first_line(err)), str(err)
    assert describe_argument_error(err, parser) == ("unknown config key trainer.max_epoch; did you mean "
                                                    "trainer.max_epochs?")
