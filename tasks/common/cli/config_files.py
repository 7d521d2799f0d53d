"""Config files read before jsonargparse sees them, so that a file that cannot be a config is one
line naming it: a missing file or a folder, a binary file or text that is not UTF-8, a YAML syntax
error (file, line and column), a key given twice in one mapping (file and both lines), or YAML that
is not a mapping of sections. jsonargparse would report these as a traceback
(``UnicodeDecodeError``), as "not found" for a folder, as ``Unexpected config: <the file's text>``
without the file's name, or, for a repeated key, not at all (the last one silently wins).

:func:`load_yaml` reads YAML as PyYAML's safe loader does but refuses a repeated key;
:func:`refuse_duplicate_keys` makes jsonargparse's YAML loader refuse one too (YAML values given on
the command line, such as ``--model.init_args.scheme_options '{c: 1, c: 2}'``); every Lightning
command of the suite installs it before it parses (``lightning_commands.run_lightning``).

Within :func:`files_read_once` (a whole Lightning command) each file is read from disk and composed
once (:func:`composed`, :func:`load_file`), however many of the command's checks look at it, so
they all see the same text.
"""
from __future__ import annotations

import contextlib
import copy
import os
from contextvars import ContextVar
from typing import Any, Callable, Iterator, Optional

import yaml
from jsonargparse import get_loader, set_loader

from ..errors import ConfigError, UserError

__all__ = ["check_config_file", "load_yaml", "refuse_duplicate_keys", "SafeLoader", "UniqueKeyLoader", "DuplicateKeyError",
           "files_read_once", "composed", "load_file"]

_EXAMPLE = "Run configs live in experiments/<task>/, e.g. experiments/imagenet/rescale50.yaml"


class DuplicateKeyError(ConfigError):
    """A YAML mapping that gives one key twice (YAML leaves it to the reader; PyYAML keeps the
    last, which silently drops the first value, or a whole ``trainer:`` block)."""

    def __init__(self, key: Any, line: int, first_line: int, source: Optional[str] = None, file: bool = True):
        self.key, self.line, self.first_line = key, line, first_line
        if source and file:
            where, lines = f"{source}:{line}: ", f" (first at line {first_line})"
        else:
            where = f"{source}: " if source else ""
            lines = "" if line == first_line else f" (line {line}, first at line {first_line})"
        super().__init__(f"{where}key {key!r} is given twice in the same mapping{lines}; keep one")

    def naming(self, source: str, file: bool = True) -> "DuplicateKeyError":
        """The same error, naming where the YAML came from: a file (``path:line:``), else a value."""
        return DuplicateKeyError(self.key, self.line, self.first_line, source, file)


def _refuse_repeated_keys(constructor: yaml.constructor.BaseConstructor, node: yaml.MappingNode) -> None:
    """Raise :class:`DuplicateKeyError` when ``node`` gives a key twice. Only the keys written in the
    mapping itself count: keys merged in with ``<<: *anchor`` may be overridden, as YAML intends."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key, line = constructor.construct_object(key_node, deep=True), key_node.start_mark.line + 1
        try:
            if key in seen:
                raise DuplicateKeyError(key, line, seen[key])
            seen[key] = line
        except TypeError:  # an unhashable key: PyYAML refuses it with its own error
            continue


#: PyYAML's safe loader, its parser in C where PyYAML was built with libyaml (as its wheels are)
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UniqueKeyLoader(SafeLoader):
    """PyYAML's safe loader whose mappings refuse a key given twice (:class:`DuplicateKeyError`)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            _refuse_repeated_keys(self, node)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str, source: Optional[str] = None, file: bool = True) -> Any:
    """``yaml.safe_load(text)``, refusing a key given twice in one mapping with a
    :class:`DuplicateKeyError` naming ``source`` and both lines: a file's path (``path:line:``),
    or with ``file=False`` what else the text is (an option's value)."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except DuplicateKeyError as err:
        raise (err.naming(source, file) if source else err) from None


#: the files the running command has read: (what, absolute path) -> the file's bytes, its YAML nodes
_command_files: ContextVar[Optional[dict]] = ContextVar("rescale_command_files", default=None)


@contextlib.contextmanager
def files_read_once() -> Iterator[None]:
    """While it is open, each config file is read and composed once (the file checks, the options a
    later ``--config`` would override, the mappings a layer drops, the file and line an error
    names); nested, the outermost one holds. Outside it every call reads the file again."""
    if _command_files.get() is not None:
        yield
        return
    token = _command_files.set({})
    try:
        yield
    finally:
        _command_files.reset(token)


def _once(what: str, path: str, read: Callable[[], Any]) -> Any:
    files = _command_files.get()
    if files is None:
        return read()
    key = (what, os.path.abspath(path))
    if key not in files:  # an error is raised again at the next call, not kept
        files[key] = read()
    return files[key]


def _file_bytes(path: str) -> bytes:
    """The bytes of a file (``OSError`` where it cannot be read)."""
    def read() -> bytes:
        with open(path, "rb") as f:
            return f.read()
    return _once("bytes", path, read)


def composed(path: str) -> Optional[yaml.Node]:
    """The YAML node tree of a file (None: no document); ``OSError``, ``UnicodeDecodeError`` or
    ``yaml.YAMLError`` where it cannot be read as YAML."""
    return _once("nodes", path, lambda: yaml.compose(_file_bytes(path).decode("utf-8"), Loader=SafeLoader))


def load_file(path: str) -> Any:
    """A YAML file's content as :func:`load_yaml` reads it (a key given twice: a
    :class:`DuplicateKeyError` naming the file and both lines), from its :func:`composed` nodes."""
    node = composed(path)
    if node is None:
        return None
    node = copy.deepcopy(node)  # PyYAML resolves a merge key (<<: *anchor) in the nodes it constructs from
    loader = UniqueKeyLoader("")
    try:
        return loader.construct_document(node)
    except DuplicateKeyError as err:
        raise err.naming(path) from None
    finally:
        loader.dispose()


def _inline(text: str) -> str:
    """How a YAML value without a file is named in an error: the value itself (shortened)."""
    flat = " ".join(text.split())
    return f"the YAML value {flat if len(flat) <= 60 else flat[:57] + '...'!r}"


def refuse_duplicate_keys() -> None:
    """Make jsonargparse's ``yaml`` loader (config files, and YAML values on the command line)
    refuse a key given twice in one mapping; it reads everything else as before."""
    jsonargparse_load = get_loader("yaml")
    if getattr(jsonargparse_load, "refuses_duplicate_keys", False):
        return

    def load(stream: str, path: str = "") -> Any:
        if not any(mark in stream for mark in ":{?"):  # no mapping, so no key to repeat
            return jsonargparse_load(stream)
        try:
            yaml.load(stream, Loader=UniqueKeyLoader)
        except DuplicateKeyError as err:
            raise (err.naming(str(path)) if path else err.naming(_inline(stream), file=False)) from None
        except Exception:  # noqa: BLE001 - not YAML, or not safe YAML: jsonargparse's loader decides
            pass
        return jsonargparse_load(stream)

    load.refuses_duplicate_keys = True
    set_loader("yaml", load, exceptions=(yaml.YAMLError,))


def _text(path: str, where: str) -> str:
    if not os.path.exists(path):
        raise UserError(f"config file not found: {path} ({where}). {_EXAMPLE}")
    if os.path.isdir(path):
        raise UserError(f"{path} is a folder, not a config file ({where}); give one of its YAML files. {_EXAMPLE}")
    try:
        data = _file_bytes(path)
    except OSError as err:
        raise UserError(f"cannot read config file {path} ({where}): {err.strerror}") from None
    if b"\0" in data:
        raise UserError(f"{path} is a binary file, not a YAML config ({where}). {_EXAMPLE}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise UserError(f"config file {path} is not UTF-8 text: byte 0x{data[err.start]:02x} at line {line}, "
                        f"column {column} ({where}); save it as UTF-8 (or write that character another "
                        "way)") from None


def check_config_file(path: str, where: str = "--config") -> None:
    """Refuse, in one :class:`UserError` line naming ``path``, a file that is no YAML mapping.
    ``where``: how the file was given (``--config``, or the config it is the defaults of)."""
    _text(path, where)
    try:
        content = load_file(path)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        at = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        what = " ".join(str(x) for x in (err.context, err.problem) if x)
        raise UserError(f"YAML syntax error in {at}: {what}; fix the file (the line shown, or the one above "
                        "it)") from None
    except yaml.YAMLError as err:
        raise UserError(f"YAML error in {path}: {' '.join(str(err).split())}") from None
    if isinstance(content, dict):
        _refuse_empty_sections(content, path, where)
        return
    if content is None:
        held = "no settings (it is empty or only comments)"
    elif isinstance(content, list):
        held = "a YAML list"
    else:
        held = f"a single {type(content).__name__} value ({' '.join(str(content).split())[:40]!r})"
    raise UserError(f"config file {path} holds {held}, not a mapping of sections (model:, data:, trainer: "
                    f"...) ({where}). {_EXAMPLE}")


# sections (and their class's arguments) that hold a mapping, where an empty one is a mistake: every key
# below them commented out leaves a null, which jsonargparse reports without the file
_SECTIONS = ("model", "data", "trainer")


def _refuse_empty_sections(content: dict, path: str, where: str) -> None:
    for section in _SECTIONS:
        if section in content and content[section] is None:
            raise UserError(f"config file {path}: section '{section}:' is empty ({where}); give it keys, or remove "
                            "the line (every key below it commented out?)")
        init = content.get(section, {}).get("init_args", {}) if isinstance(content.get(section), dict) else {}
        if init is None:
            raise UserError(f"config file {path}: '{section}: init_args:' is empty ({where}); give it keys, or "
                            "remove the line")

