"""The ``rescale`` command: Lightning's CLI for every task, plus the suite's own subcommands.

    rescale fit|validate|test|predict --config experiments/<task>/<run>.yaml [--key value ...]
    rescale demo [--epochs N] [--out DIR]
    rescale models [PATTERN] | rescale schemes [PATTERN]
    rescale --help                                  (every command, one line each)
    rescale --version                               (the suite's version; in a git checkout, its commit)
    rescale --quiet|--verbose <command> ...         (warnings and errors only | debug messages too)

This module holds the command table, the help and :func:`main`. How a Lightning command is built
and run: :mod:`rescale_tasks.common.cli.lightning_commands` (the ``_defaults.yaml`` layers of a run config:
:mod:`rescale_tasks.common.cli.config_layers`); how a command ends (one error line, an exit status):
:mod:`rescale_tasks.common.cli.command`.
"""
from __future__ import annotations

import fnmatch
import importlib
import logging
import sys
from typing import Callable, Optional

from .common.errors import UserArgumentParser, UserError
from .common.system import (command_logging, describe_code, keep_freed_memory, library_levels, log_level, output_closed,
                            write_output)

__all__ = ["main", "SUITE_COMMANDS", "COMMAND_HELP", "LOG_FLAGS"]

log = logging.getLogger("rescale_tasks.cli")  # the same name under `python -m rescale_tasks.cli`

# before the command: `rescale --quiet fit ...` (warnings and errors only), `rescale --verbose ...` (debug)
LOG_FLAGS = ("--quiet", "--verbose")


def _list_registered(command: str, what: str, argv: list[str], names: Callable[[], list[str]]) -> int:
    """``rescale models|schemes [PATTERN]``: the registered names matching a shell-style pattern or
    holding a part of the name, one a line; none: one error line saying so and how to list them
    all, exit status 1."""
    p = UserArgumentParser(prog=f"rescale {command}", description=COMMAND_HELP[command])
    p.add_argument("pattern", nargs="?", default="*",
                   help=f"a shell-style pattern, e.g. '{'rescale*' if command == 'models' else 'bn*'}', or a part of "
                        f"the name, e.g. {'resnet5' if command == 'models' else 'skip'} (default: all)")
    given = p.parse_args(argv).pattern
    pattern = given if any(c in given for c in "*?[") else f"*{given}*"  # no wildcard: a part of the name
    matched = [name for name in names() if fnmatch.fnmatchcase(name, pattern)]
    if not matched:
        log.error(f"error: no registered {what} matches {given!r}; `rescale {command}` lists them all")
        return 1
    for name in matched:
        write_output(name)
    return 0


def _cmd_models(argv: list[str]) -> int:
    def names() -> list[str]:
        import rescale_core  # torch: the commands that list its registries only (not --version, --help)
        return rescale_core.list_models()
    return _list_registered("models", "network", argv, names)


def _cmd_schemes(argv: list[str]) -> int:
    def names() -> list[str]:
        import rescale_core  # torch: the commands that list its registries only (not --version, --help)
        return rescale_core.list_schemes()
    return _list_registered("schemes", "scheme", argv, names)


def _run_module(module: str, argv: list[str]) -> int:
    """The ``main(argv)`` of ``module``, imported when its command runs: ``rescale --help`` and
    the light commands never load the studies, translation or video code."""
    return importlib.import_module(module).main(argv)


def _studies(module: str) -> Callable[[list[str]], int]:
    """``rescale analyze|study|compare``: the papers' studies (imported when called)."""
    return lambda argv: _run_module(f"rescale_tasks.studies.{module}", argv)


SUITE_COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "analyze": _studies("analyze"),
    "study": _studies("study"),
    "compare": _studies("compare"),
    "average-checkpoints": lambda argv: _run_module("rescale_tasks.common.checkpoints.averaging", argv),
    "export": lambda argv: _run_module("rescale_tasks.common.export.command", argv),
    "prepare-translation": lambda argv: _run_module("rescale_tasks.translation.prepare", argv),
    "translate": lambda argv: _run_module("rescale_tasks.translation.translate", argv),
    "prepare-video": lambda argv: _run_module("rescale_tasks.video.prepare", argv),
    "demo": lambda argv: _run_module("rescale_tasks.classification.demo", argv),
    "models": _cmd_models,
    "schemes": _cmd_schemes,
}


# ``rescale --help``: one line per command, every command of the suite (tested)
COMMAND_HELP: dict[str, str] = {
    "fit": "train a model: --config experiments/<task>/<run>.yaml [--key value ...]",
    "validate": "one evaluation pass over the validation set (--config ... --ckpt_path FILE)",
    "test": "one evaluation pass over the test set (--config ... --ckpt_path FILE)",
    "predict": "a checkpoint's predictions on the test split (--config ... --ckpt_path FILE)",
    "demo": "train one deep ResNet under bn/rescale/skipinit/fixup/none on embedded digits",
    "models": "list the registered networks [PATTERN]",
    "schemes": "list the registered residual schemes [PATTERN]",
    "prepare-translation": "SentencePiece model and encoded corpus of a parallel text folder, once",
    "prepare-video": "re-encode a video data set (short side, keyframes) for clip decoding, once",
    "translate": "translate text with a translation checkpoint (beam search)",
    "average-checkpoints": "average the weights of a run's last N checkpoints",
    "export": "a checkpoint's network as ONNX, ExportedProgram or TorchScript, checked on real inputs",
    "analyze": "probes of runs: signal propagation, learned scalars, dead ReLUs",
    "study": "the papers' studies as grids of fit runs: depth, batch-lr, seeds",
    "compare": "each normalization-free run against its normalized baseline: table, plots",
}


def print_help() -> None:
    width = max(map(len, COMMAND_HELP))
    lines = ["usage: rescale [--quiet|--verbose] <command> [options]    (rescale <command> --help: its options)",
             "", "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, text in COMMAND_HELP.items()]
    lines += ["", "rescale --version: the suite's version (and commit, run from a git checkout).",
              "New here? `rescale demo`, then the commands it prints; the README's quick start."]
    write_output("\n".join(lines))


def main(argv: Optional[list[str]] = None) -> int:
    """``rescale [--quiet|--verbose] <command> [options]``: the exit status; an error is one line on
    stderr. The command's messages go through ``logging`` (:mod:`rescale_tasks.common.system.logs`)."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    levels = {flag: False for flag in LOG_FLAGS}
    while argv and argv[0] in LOG_FLAGS:
        levels[argv.pop(0)] = True
    try:
        level = log_level(quiet=levels["--quiet"], verbose=levels["--verbose"])
    except UserError as err:
        with command_logging():  # the level the flags asked for is the error
            log.error("error: %s", err)
        return err.exit_code
    with command_logging(level):
        try:
            return _main(argv, from_command_line)
        except BrokenPipeError:  # whoever read the output stopped reading: not an error of the command
            return output_closed()


def _main(argv: list[str], from_command_line: bool) -> int:
    keep_freed_memory()  # a CPU step then reuses its tensors' pages (common/system/allocator.py)
    if not argv or argv[0] in ("-h", "--help"):
        print_help()
        return 0
    if argv[0] == "--version":
        write_output(f"rescale {describe_code()}")
        return 0
    if argv[0] not in COMMAND_HELP:  # Lightning's parser would list its four commands, or its own keys
        with command_logging():
            log.error("error: %s", _unknown_command(argv[0]))
        return UserError.exit_code
    # how a command ends: Lightning loads with it (~6 s), never for --help and --version
    from .common.cli import run_command

    library_levels()  # Lightning's import set its loggers to INFO: --quiet silences them again
    if argv[0] in SUITE_COMMANDS:
        return run_command(lambda: SUITE_COMMANDS[argv[0]](argv[1:]))
    return run_command(lambda: _lightning(argv, from_command_line))


def _unknown_command(given: str) -> str:
    """``unknown command 'fitt'; did you mean fit? ...``: the commands and flags ``rescale`` takes first."""
    import difflib

    known = [*COMMAND_HELP, "--help", "--version", *LOG_FLAGS]
    close = difflib.get_close_matches(given, known, n=2, cutoff=0.6)
    what = "option" if given.startswith("-") else "command"
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"unknown {what} {given!r}{hint} (rescale --help lists every command)"


def _lightning(argv: list[str], from_command_line: bool) -> None:
    from .common.cli import run_lightning  # Lightning, for a Lightning command only

    run_lightning(argv, from_command_line=from_command_line)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
