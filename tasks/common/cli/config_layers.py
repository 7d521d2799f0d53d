"""The layers of a run's configuration, in the order the ``rescale`` command applies them.

A run config holds only what differs from the ``_defaults.yaml`` files of its folder and the folders
above it up to ``experiments/`` (applied first, nearest last), then come the ``--config`` files in
their order, then the ``--key value`` overrides. :func:`defaults_for` finds the defaults;
:func:`check_layers` refuses, in one line, a config or defaults file that is no config (a key given
twice included); :func:`yaml_layers` reads the files in that order and :func:`flag_values` the
overrides, for a caller that needs a setting without building the run (a study resolving its
points' logger); :func:`key_location` names the file and line that set a key (a bad one's error);
:func:`refuse_lost_overrides` refuses an option that a later ``--config`` would override;
:func:`replaced_mappings` says which keys of a mapping argument (``scheme_options`` ...) a later
layer that gives the whole mapping (alone, or inside the ``model`` section it gives) drops;
:func:`carried_arguments` which arguments of an optimizer or schedule stay when a later layer
gives another class.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

import yaml

from ..errors import UserError
from .config_files import check_config_file, composed, load_file, load_yaml

__all__ = ["DEFAULTS_NAME", "CONFIG_FLAGS", "defaults_for", "check_layers", "flag_values", "yaml_layers",
           "key_location", "refuse_lost_overrides", "replaced_mappings", "carried_arguments", "option_sets",
           "MAPPING_ARGUMENTS", "CLASS_ARGUMENTS"]

DEFAULTS_NAME = "_defaults.yaml"
#: the task modules' mapping arguments (dotted, without ``init_args`` levels): a layer that gives
#: one whole (a config's ``scheme_options: {...}``, ``--model.init_args.scheme_options "{...}"``)
#: replaces the mapping of the layers before it, where a class's section (``trainer``,
#: ``optimizer``) is merged key by key
MAPPING_ARGUMENTS = ("model.scheme_options", "model.network_options", "model.compile_options",
                     "model.detector_options")
#: the task modules' class arguments (dotted, without ``init_args`` levels) whose class a layer may
#: change: jsonargparse keeps the arguments set before it that the new class takes too
CLASS_ARGUMENTS = ("model.optimizer", "model.lr_scheduler")
CONFIG_FLAGS = ("--config", "-c")


def defaults_for(config_paths: Sequence[str]) -> list[str]:
    """``_defaults.yaml`` files that apply to the given run configs, outermost first: those of
    the config's folder and its parents up to the ``experiments`` folder holding it, or of the
    config's own folder alone outside an ``experiments`` tree (an unrelated ``_defaults.yaml``
    higher up, in a home or scratch folder, is never applied)."""
    found: list[str] = []
    for cfg in config_paths:
        folder = Path(cfg).resolve().parent
        parents = [folder, *folder.parents]
        top = next((i for i, p in enumerate(parents) if p.name == "experiments"), 0)
        chain = []
        for parent in parents[:top + 1]:
            candidate = parent / DEFAULTS_NAME
            if candidate.is_file() and candidate != Path(cfg).resolve():
                chain.append(str(candidate))
        for path in reversed(chain):
            if path not in found:
                found.append(path)
    return found


def check_layers(configs: Sequence[str], where: str = "--config") -> list[str]:
    """Check the run configs and the ``_defaults.yaml`` files applied to them
    (:func:`~.config_files.check_config_file`: one :class:`UserError` line naming the file);
    returns those defaults, outermost first. ``where``: how the configs were given."""
    for path in configs:
        check_config_file(path, where)
    _refuse_other_experiments(configs, where)
    defaults = defaults_for(configs)
    for path in defaults:
        check_config_file(path, f"the {DEFAULTS_NAME} applied to the run configs below its folder")
    return defaults


def _refuse_other_experiments(configs: Sequence[str], where: str) -> None:
    """A config after the first whose folder brings a ``_defaults.yaml`` the first's does not have
    (another experiments folder: its data, network and recipe) would silently replace what the
    first config's folder sets; refused in one line."""
    if len(configs) < 2:
        return
    base = set(defaults_for(configs[:1]))
    for path in configs[1:]:
        foreign = [d for d in defaults_for([path]) if d not in base]
        if foreign:
            raise UserError(f"{where} {path}: it lies under {Path(foreign[-1]).parent}, whose {DEFAULTS_NAME} would "
                            f"replace what {configs[0]}'s folder sets (data, network, recipe); give configs of one "
                            f"experiments folder, or an overlay from a folder without a {DEFAULTS_NAME}")


def flag_values(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """Every value ``argv`` gives one of ``flags``, in order: ``--flag value`` and ``--flag=value``,
    and as argparse reads a short flag, ``-c value``, ``-c=value`` and ``-cvalue`` (a flag at the
    end, with no value after it, gives none)."""
    return [value for _, value in _flag_positions(argv, flags)]


def _flag_positions(argv: Sequence[str], flags: Sequence[str]) -> Iterator[tuple[int, str]]:
    """(index, value) of every value ``argv`` gives one of ``flags`` (:func:`flag_values`)."""
    short = [f for f in flags if len(f) == 2 and f[0] == "-" and f[1] != "-"]
    for i, arg in enumerate(argv):
        key, sep, value = arg.partition("=")
        if key in flags:
            if sep:
                yield i, value
            elif i + 1 < len(argv):
                yield i, argv[i + 1]
        elif any(arg.startswith(f) and len(arg) > 2 for f in short):
            yield i, arg[2:]


def yaml_layers(configs: Sequence[str]) -> Iterator[dict]:
    """The YAML mappings the command applies in order: the ``_defaults.yaml`` files, then the
    configs; a missing or broken file (one that gives a key twice included) is skipped (the run
    itself reports it)."""
    for path in [*defaults_for(configs), *configs]:
        try:
            data = load_file(path) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError, UserError):
            continue
        if isinstance(data, dict):
            yield data


def key_location(key: str, configs: Sequence[str]) -> Optional[str]:
    """``path:line`` of the YAML file that gives the dotted ``key`` its value (the last one of the
    ``_defaults.yaml`` files and ``configs`` that sets it, as the command applies them), or None
    when none does. ``init_args`` levels may be written or left out on either side
    (``data.batch_size``, ``data: {init_args: {batch_size: ...}}``)."""
    parts = _key_parts(key)
    if not parts:
        return None
    for path in reversed([*defaults_for(configs), *configs]):
        line = next((line for keys, line, _ in _file_keys(path) if keys == parts), None)
        if line is not None:
            return f"{path}:{line}"
    return None


def refuse_lost_overrides(argv: Sequence[str]) -> None:
    """Refuse, in one :class:`UserError` line, an option that a later ``--config`` sets again:
    jsonargparse applies the command line in order, so ``--model.init_args.scheme bn --config
    run.yaml`` trains the scheme of ``run.yaml`` and the option is silently lost."""
    configs = list(_config_positions(argv))
    if not configs:
        return
    for i, arg in enumerate(argv):
        if not arg.startswith("--") or i >= configs[-1][0]:
            continue
        name, sep, value = arg[2:].partition("=")
        if name in ("config", "print_config") or not name or arg in CONFIG_FLAGS:
            continue
        if not sep:
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else ""
        given = _option_keys(_key_parts(name.rstrip("+")), value)
        for position, path in configs:
            if position <= i:
                continue
            line = next((line for leaf, line, section in _file_keys(path)
                         if not section and any(_overlaps(key, leaf, replaced) for key, replaced in given)), None)
            if line is not None:
                raise UserError(f"--{name} comes before --config {path}, whose line {line} sets it again and is "
                                "applied after it, so the option would be lost: give options after the last --config")


def replaced_mappings(argv: Sequence[str]) -> list[str]:
    """One line for each layer of the run (the ``_defaults.yaml`` files, the ``--config`` files
    and the command line, in the order the command applies them) that gives a mapping argument
    (:data:`MAPPING_ARGUMENTS`) whole and so drops keys a layer before it set: the mapping is
    replaced, not merged, so ``--model.init_args.scheme_options "{zero_gamma: false}"`` after a
    recipe that sets ``scheme_options: {stochdepth_rate: 0.1}`` trains without stochastic depth.
    The mapping may be given inside a bigger one (``--model.init_args '{scheme_options: {...}}'``,
    a config's ``model: {init_args: {scheme_options: ...}}``, the file of ``--model model.yaml``):
    jsonargparse merges the sections around it key by key and replaces the mapping itself all the
    same. A dotted option (``--model.init_args.scheme_options.zero_gamma false``) adds its key; a
    dropped key that a later layer sets again is not lost, and not named."""
    mappings = [_key_parts(m) for m in MAPPING_ARGUMENTS]
    layers = _layers(argv, mappings)
    found = []
    for mapping in mappings:
        held: dict[str, str] = {}  # key -> where it was set
        given_in = [set(_inside(keys, mapping, source)) for source, keys, _ in layers]
        for n, (source, keys, _) in enumerate(layers):
            whole = any(leaf == mapping for leaf, _, _ in keys)
            inside = _inside(keys, mapping, source)
            if whole:
                later = set().union(*given_in[n + 1:])  # set again after this layer: not lost to it
                dropped = sorted(set(held) - set(inside) - later)
                if dropped:
                    what = ", ".join(f"{k} ({held[k]})" for k in dropped)
                    found.append(f"{source} gives {'.'.join(mapping)} whole, which replaces the mapping set before "
                                 f"it and drops {what}: repeat the dropped keys in it, or change one key alone "
                                 f"with {_option(mapping)}.KEY VALUE")
                held = {}
            held.update(inside)
    return found


def option_sets(argv: Sequence[str], key: str) -> bool:
    """Whether an option of ``argv`` gives the dotted ``key`` itself: ``--model.init_args.num_classes
    5``, or a mapping holding it (``--model.init_args '{num_classes: 5}'``, ``--model '{init_args:
    {...}}'``); ``init_args`` levels written or not."""
    wanted = _key_parts(key)
    return any(any(leaf == wanted for leaf, _, _ in keys) for _, keys, _ in _layers(argv, [wanted], files=False))


def carried_arguments(argv: Sequence[str], final: dict[str, Any]) -> list[str]:
    """One line for each class argument (:data:`CLASS_ARGUMENTS`) whose class a layer changes
    (``--model.init_args.optimizer torch.optim.Adam`` after a recipe's SGD) while arguments set
    for the class before it stay: jsonargparse keeps those the new class takes too, so Adam trains
    at the recipe's SGD ``lr`` and ``weight_decay`` unless they are given again. ``final``: each
    class argument's ``init_args`` as parsed (the values named)."""
    arguments = [_key_parts(a) for a in CLASS_ARGUMENTS]
    layers = _layers(argv, arguments)
    found = []
    for argument in arguments:
        taken = final.get(".".join(argument)) or {}
        held: dict[str, str] = {}  # key -> where it was set
        current: Optional[str] = None  # the class in effect
        change: Optional[tuple[str, str, str, dict[str, str]]] = None  # the last: source, old, new, carried
        for source, keys, content in layers:
            given = _at(content, argument)
            inside = {k: where for k, where in _inside(keys, argument, source).items() if k != "class_path"}
            if given is None and any(leaf == argument for leaf, _, _ in keys):  # null: no class, nothing held
                held, current, change = {}, None, None
                continue
            new = given if isinstance(given, str) else given.get("class_path") if isinstance(given, dict) else None
            if isinstance(new, str) and current is not None and _class_name(new) != _class_name(current):
                change = (source, current, new, {k: held[k] for k in held if k not in inside})
            elif change is not None:
                change[3].update((k, "") for k in inside)  # given again: not carried
            if isinstance(new, str):
                current = new
            held.update(inside)
        if change is None:
            continue
        source, old, new, carried = change
        kept = [f"{k}={taken[k]} ({where})" for k, where in sorted(carried.items()) if where and k in taken]
        if kept:
            found.append(f"{source} gives {'.'.join(argument)} the class {new} in place of {old}, and jsonargparse "
                         f"keeps the arguments set for {old} that {new} takes too: {', '.join(kept)}; give them again "
                         f"({_option(argument)}.init_args.KEY VALUE) to change them")
    return found


def _layers(argv: Sequence[str], arguments: Sequence[tuple[str, ...]], files: bool = True
            ) -> list[tuple[str, list[tuple[tuple[str, ...], int, bool]], Any]]:
    """The layers of the run that may set ``arguments`` (dotted parts, without ``init_args``), in
    the order the command applies them: (where, the keys it sets as :func:`_file_keys` lists them,
    its content as a mapping without ``init_args`` levels needed): the ``_defaults.yaml`` files,
    then the ``--config`` files and the options in and around the arguments, a section's file
    (``--model model.yaml``) included; ``files=False``: the options alone."""
    configs = dict(_config_positions(argv))
    layers = [(path, _file_keys(path), _file_content(path)) for path in defaults_for(list(configs.values()))
              if files]
    for i, arg in enumerate(argv):
        if i in configs:
            if files:
                layers.append((configs[i], _file_keys(configs[i]), _file_content(configs[i])))
            continue
        name, sep, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if not sep:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        parts = _key_parts(name)
        if not parts or not any(m[:len(parts)] == parts or parts[:len(m)] == m for m in arguments):
            continue  # an option neither in an argument nor around one
        section_file = not name.endswith("init_args") and os.path.isfile(value)  # --model m.yaml (not init_args)
        if section_file and any(len(parts) < len(m) for m in arguments) and files:
            layers.append((value, [(parts, 0, True), *[((*parts, *leaf), line, section)
                                                       for leaf, line, section in _file_keys(value)]],
                           _nested(parts, _file_content(value))))
            continue
        try:
            given = load_yaml(value, file=False)
        except (UserError, yaml.YAMLError):
            given = None
        layers.append((f"--{name}", [(parts, 0, isinstance(given, dict) and bool(given)),
                                     *_mapping_keys(given, parts)], _nested(parts, given)))
    return layers


def _inside(keys: list[tuple[tuple[str, ...], int, bool]], argument: tuple[str, ...], source: str) -> dict[str, str]:
    """The keys of ``argument`` a layer's ``keys`` set, each with where (``path:line``, or the option)."""
    return {leaf[len(argument)]: f"{source}:{line}" if line else source
            for leaf, line, _ in keys if len(leaf) > len(argument) and leaf[:len(argument)] == argument}


def _option(argument: tuple[str, ...]) -> str:
    """The command-line option of a dotted argument: ``--model.init_args.scheme_options``."""
    return "--" + ".".join((argument[0], "init_args", *argument[1:]))


def _file_content(path: str) -> Any:
    try:
        return load_file(path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, UserError):
        return None


def _nested(parts: tuple[str, ...], value: Any) -> dict:
    """``value`` given at the dotted ``parts``: ``{"model": {"optimizer": value}}``."""
    for part in reversed(parts):
        value = {part: value}
    return value


_MISSING = object()


def _at(content: Any, parts: tuple[str, ...]) -> Any:
    """The value ``content`` gives at ``parts`` (``init_args`` levels written or not), else
    :data:`_MISSING`."""
    for part in parts:
        if not isinstance(content, dict):
            return _MISSING
        if part in content:
            content = content[part]
        elif isinstance(content.get("init_args"), dict) and part in content["init_args"]:
            content = content["init_args"][part]
        else:
            return _MISSING
    return content


def _class_name(class_path: str) -> str:
    return class_path.rsplit(".", 1)[-1]


def _mapping_keys(value, prefix: tuple[str, ...]) -> list[tuple[tuple[str, ...], int, bool]]:
    """The keys a mapping given on the command line at ``prefix`` sets, as :func:`_file_keys` lists
    a file's (line 0: no file); [] for a value that is no mapping."""
    found: list[tuple[tuple[str, ...], int, bool]] = []
    for key, sub in (value.items() if isinstance(value, dict) else ()):
        at = prefix if str(key) == "init_args" else (*prefix, str(key))
        section = isinstance(sub, dict) and bool(sub)
        if str(key) != "init_args" or not section:
            found.append((at, 0, section))
        if section:
            found += _mapping_keys(sub, at)
    return found


def _config_positions(argv: Sequence[str]) -> Iterator[tuple[int, str]]:
    return _flag_positions(argv, CONFIG_FLAGS)


def _key_parts(name: str) -> tuple[str, ...]:
    """A dotted key without its ``init_args`` levels (``data.init_args.batch_size`` = ``data.batch_size``)."""
    return tuple(p for p in name.split(".") if p and p != "init_args")


def _option_keys(option: tuple[str, ...], value: str) -> list[tuple[tuple[str, ...], bool]]:
    """The keys an option sets, each with whether a file's keys below it replace it: a mapping (a
    file's replaces it), a logger, callback ... turned off (false, null). A mapping given for a
    section (``--model.init_args '{scheme: bn}'``, ``--trainer '{max_steps: 3}'``) sets its keys
    alone: jsonargparse merges a later file's other keys of the section with them."""
    replaced = value.lstrip().startswith("{") or value.strip().lower() in ("false", "null", "none")
    try:
        given = load_yaml(value, file=False) if len(option) == 1 and replaced else None
    except (UserError, yaml.YAMLError):
        given = None
    if not isinstance(given, dict) or not given:
        return [(option, replaced)]
    classes = [_key_parts(a) for a in CLASS_ARGUMENTS]
    keys = []
    for key, sub in given.items():
        for name, inner in (sub.items() if key == "init_args" and isinstance(sub, dict) else [(key, sub)]):
            at = (*option, str(name))
            if at in classes and isinstance(inner, dict):  # a class's init_args merge with a later file's
                keys += [(leaf, False) for leaf, _, section in _mapping_keys(inner, at) if not section]
            else:
                keys.append((at, isinstance(inner, dict) or inner is None or inner is False))
    return keys


def _overlaps(option: tuple[str, ...], leaf: tuple[str, ...], option_is_mapping: bool) -> bool:
    """Whether a file's value at ``leaf`` replaces what an option gave ``option``: the same key, a
    section above it, a key inside a mapping (or a false/null) the option gave, or the class of the
    option's class_path."""
    if leaf[:len(option)] != option:
        return option[:len(leaf)] == leaf  # the file sets the whole section the option is in
    rest = leaf[len(option):]
    return not rest or option_is_mapping or rest == ("class_path",)


def _file_keys(path: str) -> list[tuple[tuple[str, ...], int, bool]]:
    """Every key a YAML file sets, in file order, as its dotted path without ``init_args`` levels
    (``data: {init_args: {batch_size: 8}}`` and ``data: {batch_size: 8}`` both give ``("data",
    "batch_size")``), with its line and whether it holds a section (a mapping with keys, walked in
    turn: an ``init_args`` section adds no level of its own); [] for a file that cannot be read."""
    try:
        root = composed(path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    found: list[tuple[tuple[str, ...], int, bool]] = []

    def walk(node, prefix: tuple[str, ...]) -> None:
        for key_node, value in node.value:
            key = str(getattr(key_node, "value", ""))
            at = prefix if key == "init_args" else (*prefix, key)
            section = isinstance(value, yaml.MappingNode) and bool(value.value)
            if key != "init_args" or not section:
                found.append((at, key_node.start_mark.line + 1, section))
            if section:
                walk(value, at)

    if isinstance(root, yaml.MappingNode):
        walk(root, ())
    return found
