"""One-line messages for bad config keys and values.

jsonargparse reports a bad key or value as the whole usage text plus a nested, multi-line
"Does not validate against any of the Union subtypes" report, and wraps errors raised while
instantiating classes (our own one-line :class:`~..errors.UserError` included) in the same
report plus a traceback. The ``rescale`` parsers are built with ``exit_on_error=False`` so they
raise ``argparse.ArgumentError`` instead of printing and exiting; :func:`config_errors` turns
that error, by walking its chain of causes, into one :class:`~..errors.ConfigError` line that
names the full key, what is wrong and the closest valid keys.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import inspect
import os
import re
import traceback
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Optional

from ..errors import ConfigError, UserError
from ..training import init_parameters

__all__ = ["config_errors", "trainer_config_errors", "describe_argument_error", "user_error_in", "flatten"]

_PARSER_KEY = re.compile(r'^Parser key "([^"]+)"')
_CLASS_PATH = re.compile(r"^Problem with given class_path '([^']+)'")
_CALLABLE = re.compile(r"^Type .* expects a function or a callable class")
_GIVEN_CLASS = re.compile(r"class_path='([^']+)'")
_UNKNOWN_OPTION = re.compile(r"^Option '([^']+)' is not accepted")
_UNKNOWN_KEY = re.compile(r"^Subcommand '([^']+)' does not accept option '([^']+)'")
_UNKNOWN_IN_GROUP = re.compile(r"^Group '([^']+)' does not accept option '([^']+)'")  # under --print_config
_UNRECOGNIZED = re.compile(r"^unrecognized arguments: (.*)")
_NO_VALUE = re.compile(r"^argument (--\S+): expected one argument$")
_INVALID_CHOICE = re.compile(r"^argument subcommand: invalid choice: '([^']+)'")
_EXPECTED = re.compile(r"^Expected an? (.+?)(?:\. Got value: (.*))?$")
_BAD_IMPORT = re.compile(r"^Expected a dot import path string: (\S+)")
_SUBTYPES = re.compile(r"^\s*Subtypes: \[(.*)\]\s*$", re.M)
_GIVEN = re.compile(r"^\s*Given value: (.*)$", re.M)
_NO_HELP = {"help", "config", "print_config"}
_LIST_INDEX = re.compile(r"^--\d+\.\S")
_REQUIRED = re.compile(r"^the following arguments are required: (.+)$")
_NOT_A_MAPPING = re.compile(r"^'\w+' object has no attribute 'keys'$")  # init_args given a scalar
_FLOW_MAPPING_NO_SPACE = re.compile(r"^\{.*[\w\]\"']:[^\s/].*\}$")


def flatten(text: str) -> str:
    """All whitespace runs (newlines included) as single spaces."""
    return " ".join(str(text).split())


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes (``raise ... from``, else the exception being handled), outermost first."""
    out, seen = [], set()
    while exc is not None and id(exc) not in seen:
        out.append(exc)
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return out


def user_error_in(exc: BaseException) -> Optional[UserError]:
    """The first :class:`UserError` in ``exc``'s chain of causes (``exc`` itself included)."""
    return next((e for e in _chain(exc) if isinstance(e, UserError)), None)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _pretty_type(text: str) -> str:
    """``<class 'int'>`` -> ``int``, ``list[pkg.mod.Callback]`` -> ``list[Callback]``, NoneType -> null."""
    text = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", text.strip())
    text = re.sub(r"\b(?:[a-z_]\w*\.)+(\w+)", r"\1", text)  # drop module paths (typing.Any -> Any)
    return "null" if text == "NoneType" else text


def _split_top_level(text: str) -> list[str]:
    """Split ``a, b[c, d], e`` at the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [p.strip() for p in parts + [current] if p.strip()]


def _expected_types(subtypes: str) -> str:
    """``int or null``; the values of every Literal gathered into one ``one of ...`` list."""
    kinds, literals, nullable = [], [], False
    for raw in _split_top_level(subtypes):
        literal = re.fullmatch(r"(?:typing\.)?Literal\[(.*)\]", raw.strip())
        if literal:
            literals += _split_top_level(literal.group(1))
        elif _pretty_type(raw) == "null":
            nullable = True
        else:
            kinds.append(_pretty_type(raw))
    if literals:
        kinds.append("one of " + ", ".join(dict.fromkeys(literals)))
    return " or ".join(list(dict.fromkeys(kinds)) + (["null"] if nullable else []))


def _imported(class_path: str) -> Any:
    """The class (or function) ``class_path`` names, or None where it does not import."""
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, TypeError, ValueError):
        return None


def _set_by_the_class(class_path: Optional[str], name: str) -> Optional[str]:
    """Where the class ``class_path`` hands argument ``name`` to its base itself (its
    ``internal_init_arguments``), how to set it instead ("" where it does not say); else None."""
    internal = getattr(_imported(class_path), "internal_init_arguments", ()) if class_path else ()
    if name not in internal:
        return None
    return (internal.get(name) or "") if isinstance(internal, dict) else ""


def _class_parameters(class_path: str) -> list[str]:
    """Names of the keyword arguments a class (or function) accepts, for suggestions."""
    try:
        target = _imported(class_path)
        if target is None:
            return []
        if inspect.isclass(target):  # its own arguments and those it hands on (**options)
            return list(init_parameters(target))
        params = inspect.signature(target).parameters.values()
    except (ImportError, AttributeError, TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


def _parser_keys(parser) -> list[str]:
    """Every option key of a jsonargparse parser (``trainer.max_epochs``, ``model``, ...)."""
    if parser is None:
        return []
    keys = [a.dest for a in getattr(parser, "_actions", []) if isinstance(a.dest, str)]
    return [k for k in keys if k not in _NO_HELP and not k.endswith(".help") and k != argparse.SUPPRESS]


def _subcommands(parser) -> list[str]:
    action = getattr(parser, "_subcommands_action", None)
    return list(getattr(action, "choices", None) or [])


def _suggest(name: str, valid: Iterable[str], prefix: str = "", label: str = "valid keys") -> str:
    """``; did you mean X?`` for close matches, else the valid names (a few), else nothing."""
    valid = list(dict.fromkeys(valid))
    if not valid:
        return ""
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    if close:
        return "; did you mean " + " or ".join(prefix + c for c in close) + "?"
    shown = ", ".join(valid[:12]) + (f" (+{len(valid) - 12} more)" if len(valid) > 12 else "")
    where = prefix.strip("-.")
    return f"; {label}{' under ' + where if where else ''}: {shown}"


def _unknown_key_message(key: str, parser, what: str = "config key", dashes: str = "") -> str:
    """A key of the parser itself (``trainer.*``, top level) that does not exist."""
    keys = _parser_keys(parser)
    parent = key
    while "." in parent:
        parent = parent.rsplit(".", 1)[0]
        siblings = [k[len(parent) + 1:] for k in keys if k.startswith(parent + ".")]
        if siblings:
            name = key[len(parent) + 1:]
            return f"unknown {what} {dashes}{key}{_suggest(name, siblings, dashes + parent + '.')}"
    top = [k for k in keys if "." not in k]
    return f"unknown {what} {dashes}{key}{_suggest(key.split('.')[0], top, dashes)}"


def _flow_mapping_hint(value: Optional[str]) -> str:
    """``{base_width:8}`` is a YAML string, not a mapping: YAML needs a space after each colon."""
    if value is None or not _FLOW_MAPPING_NO_SPACE.search(value.strip()):
        return ""
    fixed = re.sub(r"([\w\]\"'])\s*:(?=[^\s/])", r"\1: ", value.strip())
    return f"; a YAML mapping needs a space after each colon: '{fixed}'"


def _list_index_message(list_key: str, option: str, parser) -> str:
    """``--trainer.callbacks.0.init_args.every_n_train_steps 30``: jsonargparse has no way to set
    an entry of a list by its index, and reports only ``--0.init_args...``."""
    rest, _, value = option.lstrip("-").partition("=")
    index, _, name = rest.partition(".")
    name = name[len("init_args."):] if name.startswith("init_args.") else name
    value = value or "VALUE"
    typed = f"--{list_key}.{index}.{rest.partition('.')[2]}"
    example = "ClassName"
    if list_key == "trainer.callbacks":
        example = next((c for c in ("ModelCheckpoint", "EarlyStopping", "LearningRateMonitor")
                        if name in _class_parameters(f"lightning.pytorch.callbacks.{c}")), "ClassName")
    message = (f"unknown option {typed}: an entry of {list_key} cannot be set by its index on the command "
               f"line; set {name} in the config file's {list_key} list (- class_path: {example}, init_args: "
               f"{{{name}: {value}}}) or append an entry with its arguments (--{list_key}+={example} "
               f"--{list_key}.{name} {value})")
    suite = [k for k in _parser_keys(parser) if k.endswith("." + name) and k.count(".") == 1]
    if suite:  # the suite's always-on callbacks have their own sections
        message += f"; the suite's always-on {suite[0].split('.')[0]} callback takes --{suite[0]} {value}"
    return message


def describe_argument_error(err: BaseException, parser=None) -> str:
    """One line for a jsonargparse parse error: the full key, what is wrong, how to fix it."""
    path: list[str] = []
    class_path: Optional[str] = None
    subtypes: Optional[str] = None
    given: Optional[str] = None
    chain = _chain(err)
    for exc in chain:
        text, first = str(exc), _first_line(exc)
        match = _PARSER_KEY.match(first)
        if match and (not path or path[-1] != match.group(1)):
            path.append(match.group(1))
            subtypes = given = None  # a new key: earlier union reports were about its parent
        match = _CLASS_PATH.match(first)
        if match and class_path != match.group(1):
            class_path = match.group(1)
            path.append("init_args")
        if _CALLABLE.match(first):  # optimizer/scheduler factories: the class is in the given value
            given_classes = _GIVEN_CLASS.findall(text)
            if given_classes and class_path != given_classes[-1]:
                class_path = given_classes[-1]
                path.append("init_args")
        if first.startswith("Does not validate against any of the Union subtypes"):
            found = _SUBTYPES.search(text)
            subtypes = found.group(1) if found else subtypes
            found = _GIVEN.search(text)
            given = found.group(1).strip() if found else given
    leaf = _first_line(chain[-1])
    key = ".".join(path)
    hint = f" (--{key} or the {key.split('.')[0]}: section of the config)" if key else ""

    match = _NO_VALUE.match(leaf)
    if match:  # argparse reads a value such as -1e-4 as an option, and names only the option's section
        return (f"option {match.group(1)} or a key under it got no value: write --key VALUE, or --key=VALUE when "
                "the value starts with '-' (a value such as -1e-4 is otherwise read as an option)")
    match = _UNKNOWN_KEY.match(leaf)
    if match:
        return _unknown_key_message(match.group(2), parser)
    match = _UNKNOWN_IN_GROUP.match(leaf)
    if match:
        return _unknown_key_message(f"{match.group(1)}.{match.group(2)}", parser)
    match = _UNKNOWN_OPTION.match(leaf)
    if match:
        name = match.group(1)
        owner = class_path.rsplit(".", 1)[-1] if class_path else "this class"
        full = f"{key}.{name}" if key else name
        how = _set_by_the_class(class_path, name)
        if how is not None:
            return f"unknown config key {full}: {owner} sets {name!r} itself{': ' + how if how else ''}"
        # never the rejected name itself: whatever lists it, the parser does not take it
        valid = [p for p in (_class_parameters(class_path) if class_path else []) if p != name]
        return (f"unknown config key {full}: {owner} has no parameter {name!r}"
                f"{_suggest(name, valid, key + '.' if key else '')}")
    match = _UNRECOGNIZED.match(leaf) or _INVALID_CHOICE.search(leaf)
    if match and path and _LIST_INDEX.match(match.group(1)):  # --trainer.callbacks.0.init_args.x
        return _list_index_message(path[0], match.group(1).split()[0], parser)
    if match:
        words = match.group(1).split()
        commands = _subcommands(parser)
        if words and commands and not words[0].startswith("-"):  # a misspelled subcommand
            return f"unknown command {words[0]!r}{_suggest(words[0], commands, label='commands')}"
        if words and not words[0].startswith("-"):
            return f"unexpected argument {words[0]!r}: options are written --key value (see --help)"
        options = [w for w in words if w.startswith("--")] or words[:1]
        name = options[0].lstrip("-").split("=")[0] if options else ""
        return _unknown_key_message(name, parser, "option", "--")
    match = _BAD_IMPORT.search(leaf)
    if match:
        return (f"bad value for {key or 'a class'}: {match.group(1)!r} is not an importable class; give a "
                f"full import path (package.module.ClassName) or a class name this key accepts{hint}")
    match = _EXPECTED.match(leaf)
    if match:
        expected = _expected_types(subtypes) if subtypes else _pretty_type(match.group(1))
        value = given if given is not None else match.group(2)
        got = f", got {value!r}" if value is not None else ""
        return f"bad value for {key}: expected {expected}{got}{_flow_mapping_hint(value)}{hint}"
    match = _REQUIRED.match(leaf)
    if match:  # rescale fit without a --config: "the following arguments are required: fit.data, fit.model"
        names = [n.strip().split(".", 1)[-1] for n in match.group(1).split(",")]
        return (f"no {' and no '.join(names)} given: give a run config, --config experiments/<task>/<run>.yaml (e.g. "
                f"experiments/digits/rescale56.yaml), which sets them, or {' and '.join('--' + n for n in names)}")
    if _NOT_A_MAPPING.match(leaf) and key.endswith("init_args"):  # --model.init_args bn, --model.init_args m.yaml
        section = key[:-len(".init_args")] or key
        return (f"bad value for {key}: expected a mapping of the class's arguments, as --{key} '{{name: value}}' "
                f"or --{key}.NAME VALUE (a file of the whole section: --{section} FILE)")
    return f"{key + ': ' if key else ''}{flatten(leaf)}"


@contextmanager
def config_errors(parser=None) -> Iterator[None]:
    """Re-raise parse errors and user errors wrapped by jsonargparse as one-line ConfigErrors.

    ``parser`` (the subcommand's parser) provides the valid keys for suggestions. Other
    exceptions pass unchanged: they are bugs, and their traceback is what one needs.
    """
    try:
        yield
    except UserError:
        raise
    except argparse.ArgumentError as err:
        found = user_error_in(err)
        if found is not None:
            raise found from None
        raise ConfigError(describe_argument_error(err, parser)) from None
    except Exception as err:  # noqa: BLE001 - only re-raised changed when it wraps a UserError
        found = user_error_in(err) or _missing_package(err)
        if found is None:
            raise
        raise found from None


def _missing_package(exc: BaseException) -> Optional[ConfigError]:
    """A class the config names whose constructor needs a package that is not installed
    (``--trainer.logger TensorBoardLogger`` without ``tensorboard``): one line naming the class and
    what its library says to install."""
    chain = _chain(exc)
    for outer, cause in zip(chain, chain[1:]):
        match = _CLASS_PATH.match(str(outer).strip())
        if match and isinstance(cause, ModuleNotFoundError):
            return ConfigError(f"cannot build {match.group(1)}: {_first_line(cause)} (or choose another class)")
    return None


_LIGHTNING_PACKAGES = ("lightning", "lightning_fabric", "pytorch_lightning", "lightning_utilities")


def _package_root(name: str) -> Optional[str]:
    spec = importlib.util.find_spec(name)
    return os.path.dirname(spec.origin) + os.sep if spec is not None and spec.origin else None


def _raised_by_lightning_checks(err: BaseException) -> bool:
    """Whether every frame between the call into Lightning and the ``raise`` is Lightning's own
    code: then the error is Lightning checking a value it was given (the Trainer is built only
    from the config). A frame of any other code (a callback's, a logger's, this suite's, torch's)
    means a bug there, whose traceback is what one needs."""
    roots = tuple(r for r in map(_package_root, _LIGHTNING_PACKAGES) if r)
    frames = [f.filename for f in traceback.extract_tb(err.__traceback__)]
    first = next((i for i, name in enumerate(frames) if name.startswith(roots)), None)
    return first is not None and all(name.startswith(roots) for name in frames[first:])


@contextmanager
def trainer_config_errors() -> Iterator[None]:
    """Lightning's own checks of ``trainer.*`` values (accelerator, strategy, devices ...) as one
    ConfigError line. Only errors Lightning raises itself are translated; a ``ValueError`` from
    any other code the Trainer calls keeps its traceback. ``RESCALE_TRACEBACK=1`` prints the
    traceback of a translated one too (:func:`~.command.run_command`)."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        yield
    except (ValueError, MisconfigurationException) as err:
        if isinstance(err, UserError) or not _raised_by_lightning_checks(err):
            raise
        error = ConfigError(f"bad trainer setting (trainer.* in the config or --trainer.*): {flatten(err)}")
        error.original = err
        raise error from None
