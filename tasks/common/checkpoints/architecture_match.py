"""Does a checkpoint belong to the architecture this run builds? One line saying what differs.

Loading a checkpoint of another network or scheme otherwise fails deep in ``load_state_dict``
with a page of missing keys and shape mismatches, or, through LightningCLI (which replaces the
run's model config with the checkpoint's hyper-parameters), silently evaluates the wrong
network. Every task compares the hyper-parameters that decide its architecture and the state
dict's keys and shapes with :func:`check_checkpoint_compatible`.
"""
from __future__ import annotations

import glob
import os
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
from rescale_core.schemes import TRAINING_ONLY_OPTIONS

from ..errors import ConfigError
from ..training import class_of, init_parameters, resolved_architecture
from .files import CheckpointError, checkpoint_exists, is_remote, peek_checkpoint

__all__ = ["NETWORK_PREFIX", "network_weights", "ARCHITECTURE_KEYS", "CONFIG_KEYS", "check_checkpoint_compatible", "check_config_against_checkpoint",
           "hparam_differences", "state_dict_differences", "tied_apart", "UNSHARED_GAINS", "MISMATCH_FIX",
           "CONFIG_FILE", "saved_config",
           "trained_config_fix", "load_into_module",
           "typed_model_arguments", "run_arguments_over_checkpoint", "require_classification_checkpoint"]

#: Hyper-parameters that fix a network's parameters (names, shapes) or its forward pass.
ARCHITECTURE_KEYS = ("network", "scheme", "scheme_options", "network_options", "num_classes", "in_channels",
                     "vocab_size", "pad_index", "bos_index", "eos_index", "detector", "heads_norm", "fpn_norm")
#: What the CLI compares before anything is built: num_classes/in_channels (and a translation
#: model's vocabulary and special ids) are only linked from the data module at instantiation, so
#: those are checked against the built module instead.
CONFIG_KEYS = ("_class_path", "network", "scheme", "scheme_options", "network_options", "detector",
               "heads_norm", "fpn_norm")
#: How to fix a mismatch; ``{config}`` becomes where the checkpoint's run config is (:func:`trained_config_fix`).
MISMATCH_FIX = "Run with the config the checkpoint was trained with ({config}), or drop --ckpt_path to start from scratch."
#: The resolved config every command saves into its run's own folder (``run.outputs.SaveConfigToRun``).
CONFIG_FILE = "rescale_config.yaml"


def saved_config(ckpt_path: Optional[str]) -> Optional[str]:
    """The config the run that wrote ``ckpt_path`` saved, where it can be found: where the checkpoint
    records it was saved (its ``run_config``, wherever ``--last_checkpoint.dirpath`` sent the
    checkpoint), else, for a checkpoint written before it was recorded or a run folder since moved,
    beside the checkpoint's ``checkpoints/`` (a CSV or TensorBoard logger's version folder), or the
    W&B run's ``<save_dir>/wandb/*-<run id>/files/`` (the run id the checkpoint records, or its
    folder's name: ``<save_dir>/<project>/<run id>/checkpoints/``; a study point's
    ``<point>/checkpoints/<run id>/``); the newest where the run was started several times. None
    for a remote checkpoint or where none is found."""
    if not ckpt_path or is_remote(str(ckpt_path)) or not os.path.isfile(str(ckpt_path)):
        return None
    try:
        info = peek_checkpoint(str(ckpt_path))
    except CheckpointError:
        info = None
    if info is not None and info.run_config and os.path.isfile(info.run_config):
        return info.run_config
    folder = os.path.dirname(os.path.abspath(str(ckpt_path)))
    run = os.path.dirname(folder) if os.path.basename(folder) == "checkpoints" else folder
    if os.path.isfile(os.path.join(run, CONFIG_FILE)):
        return os.path.join(run, CONFIG_FILE)
    recorded = info.run_id if info is not None else None
    ids = {i for i in (recorded, os.path.basename(run), os.path.basename(folder)) if i and i != "checkpoints"}
    found = []
    above = run
    for _ in range(3):  # <save_dir>/<project>/<run id>: the save_dir is two folders up
        above = os.path.dirname(above)
        for run_id in ids:
            found += glob.glob(os.path.join(glob.escape(above), "wandb", f"*-{glob.escape(run_id)}", "files",
                                            CONFIG_FILE))
    return max(found, key=os.path.getmtime) if found else None


def trained_config_fix(fix: str, ckpt_path: Optional[str]) -> str:
    """``fix`` with ``{config}`` replaced by where the checkpoint's run config is
    (:func:`saved_config`, shown relative to the working folder where it lies below it), or, when
    it cannot be found, by where ``rescale fit`` saves it."""
    found = saved_config(ckpt_path)
    if found is not None:
        relative = os.path.relpath(found)
        where = f"its run saved it as {found if relative.startswith('..') else relative}"
    else:
        where = (f"rescale fit saves it as {CONFIG_FILE} in the run's folder: <save_dir>/wandb/*-<run id>/files/ "
                 "with the W&B logger, the logger's version folder with another")
    return fix.replace("{config}", where)


_LABELS = {"_class_path": "module"}


def _normal(value: Any) -> Any:
    """Comparable form: ``None`` and ``{}`` both mean "nothing overridden"; mappings sorted."""
    if isinstance(value, Mapping):
        value = {str(k): _normal(v) for k, v in value.items()}
        return dict(sorted(value.items())) or None
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    return value


def _show(key: str, value: Any) -> str:
    if key == "_class_path" and isinstance(value, str):
        value = value.rsplit(".", 1)[-1]
    return f"{_LABELS.get(key, key)}={_normal(value)}"


def hparam_differences(saved: Mapping[str, Any], current: Mapping[str, Any],
                       keys: Sequence[str] = ARCHITECTURE_KEYS) -> list[str]:
    """The ``keys`` present on both sides whose values differ."""
    return [k for k in keys if k in saved and k in current and _normal(saved[k]) != _normal(current[k])]


def _training_only_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``key=saved->current`` for each ``scheme_options`` key that differs between both sides when
    all that differ there act in training only (:data:`~rescale_core.schemes.TRAINING_ONLY_OPTIONS`:
    dropout, stochastic depth); empty when any other option differs too."""
    theirs, ours = (_normal(side.get("scheme_options")) or {} for side in (saved, current))
    differing = sorted(k for k in {*theirs, *ours} if theirs.get(k) != ours.get(k))
    if not differing or not set(differing) <= TRAINING_ONLY_OPTIONS:
        return []
    return [f"{k}={theirs.get(k)}->{ours.get(k)}" for k in differing]


#: why a checkpoint's gains per sublayer do not load into a ``layer_gain`` Transformer, and what to do
UNSHARED_GAINS = ("one gain per sublayer (the skipinit network), where this network shares one per Transformer "
                  "layer (scheme_options layer_gain, rezero's as in the ReZero code): record skipinit in it "
                  "(torch.load it, set its ['hyper_parameters']['scheme'] = 'skipinit', torch.save it) and run "
                  "it with --model.init_args.scheme skipinit")


def tied_apart(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The pairs of entries that are one tensor in ``current`` (tied weights, shared gains: the
    same storage) but hold different values in ``saved``: loading would keep one of each pair and
    silently drop the other."""
    tied: dict[tuple, list[str]] = {}
    for key, value in current.items():
        # plain tensors with data only: a sharded one (FSDP's DTensor) or a meta one (a shape to check
        # against) has no storage of its own to compare
        if (key in saved and type(value) in (torch.Tensor, torch.nn.Parameter) and value.numel()
                and not value.is_meta and not getattr(saved[key], "is_meta", False)):
            where = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape), value.stride())
            tied.setdefault(where, []).append(key)
    return [(keys[0], key) for keys in tied.values() for key in keys[1:] if not _same(saved[key], saved[keys[0]])]


def _same(a: Any, b: Any) -> bool:
    """Whether two saved entries hold the same values, NaN equal to NaN (a diverged checkpoint's
    tied weights are one tensor, which the refusal of non-finite weights names)."""
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and bool(torch.eq(a, b).logical_or_(a.isnan() & b.isnan()).all()))


def state_dict_differences(saved: Mapping[str, Any], current: Mapping[str, Any], strict: bool = True,
                           limit: int = 2) -> list[str]:
    """Short descriptions of missing/unexpected keys (when ``strict``), shape mismatches and
    entries tied here that differ in ``saved`` (:func:`tied_apart`)."""
    problems = []
    apart = tied_apart(saved, current)
    if apart:
        (first, second), more = apart[0], f" (+{len(apart) - 1} more pairs)" if len(apart) > 1 else ""
        why = (UNSHARED_GAINS if all(a.endswith("merge.gain.weight") for pair in apart for a in pair)
               else "the two apart, where this network ties them")
        problems.append(f"{first} and {second}{more} are one tensor here but differ in the checkpoint, "
                        f"which holds {why}")
    shapes = [k for k in current if k in saved and hasattr(saved[k], "shape") and hasattr(current[k], "shape")
              and tuple(saved[k].shape) != tuple(current[k].shape)]
    for key in shapes[:limit]:
        problems.append(f"{key} has shape {tuple(saved[key].shape)} in the checkpoint but "
                        f"{tuple(current[key].shape)} here")
    if len(shapes) > limit:
        problems.append(f"{len(shapes) - limit} more shape mismatches")
    if strict:
        for keys, what in (([k for k in current if k not in saved], "missing from the checkpoint"),
                           ([k for k in saved if k not in current], "not in this network")):
            if keys:
                shown = ", ".join(keys[:limit]) + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")
                problems.append(f"{len(keys)} entries {what}: {shown}")
    return problems


def check_checkpoint_compatible(checkpoint: Mapping[str, Any], hparams: Mapping[str, Any],
                                state_dict: Optional[Mapping[str, Any]] = None, *,
                                keys: Sequence[str] = ARCHITECTURE_KEYS, source: str = "the checkpoint",
                                strict: bool = True,
                                normalize: Optional[Callable[[dict], dict]] = None,
                                fix: str = MISMATCH_FIX, ckpt_path: Optional[str] = None,
                                evaluating: bool = False) -> None:
    """Raise :class:`ConfigError` (one line) when ``checkpoint`` is of another architecture.

    ``scheme_options`` that act in training only (dropout, stochastic depth:
    :data:`~rescale_core.schemes.TRAINING_ONLY_OPTIONS`) change neither the weights nor the eval-mode
    outputs: a checkpoint is ``evaluating`` (validate, test, predict, export) under a config that
    differs in them alone, while a ``fit --ckpt_path`` (a resume: ``evaluating`` false) refuses a
    change of them in one line, as it would change the run's training.

    Args:
        checkpoint: the loaded checkpoint (``hyper_parameters`` and ``state_dict`` are read).
        hparams: this run's hyper-parameters (a module's ``hparams`` or a config section).
        state_dict: this run's state dict, to compare keys and shapes (None: skip).
        keys: the hyper-parameters that decide the architecture; only keys both sides have count.
        source: how to name the checkpoint in the message (e.g. ``checkpoint <path>``).
        strict: also report missing and unexpected state-dict entries (as strict loading would).
        normalize: applied to both hyper-parameter dicts first (e.g. fill in a network's
            default scheme, so "scheme: null" and the scheme it resolves to compare equal).
        fix: how to fix it, its ``{config}`` naming the config ``ckpt_path`` was trained with
            (:func:`trained_config_fix`).
    """
    saved = dict(checkpoint.get("hyper_parameters") or {})
    current = dict(hparams)
    if normalize is not None:
        saved, current = normalize(saved), normalize(current)
    differing = hparam_differences(saved, current, keys)
    training_only = _training_only_differences(saved, current) if "scheme_options" in differing else []
    if training_only and evaluating:
        differing.remove("scheme_options")
    elif training_only and differing == ["scheme_options"]:
        raise ConfigError(f"{source} was trained with other training-only scheme_options than this run sets "
                          f"({', '.join(training_only)}, checkpoint -> this run, None: the scheme's default): they act in training "
                          "only, so evaluating the checkpoint accepts the change, but resuming with it would change "
                          f"the run's training. {trained_config_fix(fix, ckpt_path)}")
    saved_state = checkpoint.get("state_dict")
    problems = [] if state_dict is None or saved_state is None else \
        state_dict_differences(saved_state, state_dict, strict=strict)
    if not differing and not problems:
        return
    shown = [k for k in keys if k in ("network", "scheme") or k in differing]
    theirs = ", ".join(_show(k, saved[k]) for k in shown if k in saved) or "unknown hyper-parameters"
    ours = ", ".join(_show(k, current[k]) for k in shown if k in current) or "network"
    if differing:
        labels = ", ".join(_LABELS.get(k, k) for k in differing)
        reason = (f"{source} was saved from {theirs} but this run builds {ours} (they differ in {labels}); "
                  f"{labels} define{'s' if len(differing) == 1 else ''} the network the weights belong to, "
                  "so cannot change with a checkpoint")
    else:
        reason = f"{source} does not fit this run's {ours}: {'; '.join(problems)}"
    raise ConfigError(f"{reason}. {trained_config_fix(fix, ckpt_path)}")


def check_config_against_checkpoint(model_config: Any, ckpt_path: Optional[str],
                                    normalize: Optional[Callable[[dict], dict]] = None,
                                    fix: str = MISMATCH_FIX, evaluating: bool = False) -> None:
    """The CLI's check of ``--ckpt_path`` against the run's ``model`` config section.

    Must run before LightningCLI parses the checkpoint's hyper-parameters into the config (it
    replaces the configured network with the checkpoint's, which would hide any mismatch).
    ``model_config`` is the ``class_path``/``init_args`` section (a dict or a jsonargparse
    Namespace); names such as ``last`` that are not files are left to Lightning. Remote URLs
    (``s3://...``) are checked too: Lightning's CLI reads hyper-parameters from local files only.
    ``fix``: how to fix a mismatch, for the error line. ``evaluating``: the command evaluates the
    checkpoint rather than resuming its training (:func:`check_checkpoint_compatible`).
    """
    if not ckpt_path or model_config is None or not checkpoint_exists(str(ckpt_path)):
        return

    if hasattr(model_config, "as_dict"):
        model_config = model_config.as_dict()
    saved = peek_checkpoint(ckpt_path).hyper_parameters
    current = {"_class_path": model_config.get("class_path"), **(model_config.get("init_args") or {})}
    check_checkpoint_compatible({"hyper_parameters": saved}, current, keys=CONFIG_KEYS,
                                source=f"checkpoint {ckpt_path}", normalize=normalize, fix=fix,
                                ckpt_path=str(ckpt_path), evaluating=evaluating)


def typed_model_arguments(argv: Sequence[Any]) -> set[str]:
    """The model arguments a command line names: ``--model.init_args.beam 1``, ``--model.beam=1``,
    ``--model.init_args.network_options.depth 14`` (``network_options``)."""
    typed = set()
    for arg in argv or ():
        if not isinstance(arg, str) or not arg.startswith("--model."):
            continue
        parts = arg[2:].split("=", 1)[0].split(".")[1:]
        if parts and parts[0] == "init_args":
            parts = parts[1:]
        if parts and parts[0] not in ("class_path", "dict_kwargs", "help"):
            typed.add(parts[0])
    return typed


def _as_dict(section: Any) -> dict:
    if hasattr(section, "as_dict"):
        section = section.as_dict()
    return dict(section or {}) if isinstance(section, Mapping) else {}


def _signature_defaults(cls: Optional[type]) -> dict[str, Any]:
    params = init_parameters(cls).values() if isinstance(cls, type) else ()
    return {p.name: p.default for p in params if p.default is not p.empty}


def run_arguments_over_checkpoint(before: Any, after: Any, ckpt_path: Any, typed: Sequence[str] = ()) -> dict[str, Any]:
    """A run's own model arguments win over the hyper-parameters of its ``--ckpt_path``.

    LightningCLI replaces the run's ``model`` arguments with the checkpoint's saved
    hyper-parameters (``before``: the section as the run configured it; ``after``: as Lightning
    left it). The arguments the user set (named on the command line in ``typed``, or given a value
    other than the class's default by a config file) are returned, to be put back: decoding and
    evaluation settings (``beam``, ``len_penalty``, ``draw_predictions``, ``plan``, ``compile`` ...)
    are the run's. Those that define the network the weights belong to (:data:`ARCHITECTURE_KEYS`
    and the module class's ``architecture_arguments``) cannot change: a one-line
    :class:`ConfigError` names the argument (the pre-parse check of :data:`CONFIG_KEYS`,
    :func:`check_config_against_checkpoint`, has compared those already). Arguments the user left
    at their defaults keep the checkpoint's values."""
    before, after = _as_dict(before), _as_dict(after)
    mine, theirs = _as_dict(before.get("init_args")), _as_dict(after.get("init_args"))
    cls = class_of(before.get("class_path"))
    defaults = _signature_defaults(cls)
    fixed = (*ARCHITECTURE_KEYS, *getattr(cls, "architecture_arguments", ()))
    restored = {}
    for key, value in mine.items():
        if key not in theirs or key in CONFIG_KEYS or _normal(theirs[key]) == _normal(value):
            continue
        set_by_user = key in typed or (key in defaults and _normal(defaults[key]) != _normal(value))
        if not set_by_user:
            continue  # left at its default: the checkpoint's value stands
        if key in fixed:
            given = f"--model.init_args.{key} {value}" if key in typed else f"model.init_args.{key}={value!r} (config)"
            raise ConfigError(f"{given} cannot change with --ckpt_path {ckpt_path}: {key} defines the network "
                              f"the checkpoint's weights belong to, and it was saved with {key}={theirs[key]!r}. "
                              f"Drop the argument (the checkpoint's value is used), or drop --ckpt_path to "
                              "start from scratch")
        restored[key] = value
    return restored


def load_into_module(module, checkpoint: Mapping[str, Any], source: str, fix: str = MISMATCH_FIX,
                     ckpt_path: Optional[str] = None) -> int:
    """Load a (safely read) checkpoint into a LightningModule outside a Trainer, as Lightning does:
    the architecture check, the module's ``on_load_checkpoint`` hook, then its state dict. Returns
    the checkpoint's global step. ``ckpt_path``: its file, for the fix's run config. The module is
    evaluated, not trained on: training-only scheme options may differ (:func:`check_checkpoint_compatible`)."""
    if not isinstance(checkpoint.get("state_dict"), Mapping):
        raise ConfigError(f"{source} holds no state_dict: not a Lightning checkpoint of this suite")
    strict = getattr(module, "strict_loading", True)
    check_checkpoint_compatible(checkpoint, getattr(module, "hparams", {}) or {}, module.state_dict(),
                                source=source, strict=strict, normalize=resolved_architecture, fix=fix,
                                ckpt_path=ckpt_path, evaluating=True)
    module.on_load_checkpoint(checkpoint)
    module.load_state_dict(checkpoint["state_dict"], strict=strict)
    return int(checkpoint.get("global_step") or 0)


#: The task modules hold their network as ``self.net``: its keys in a Lightning checkpoint.
NETWORK_PREFIX = "net."


def require_classification_checkpoint(path: Optional[str], key: str, what: str, trained: str) -> None:
    """A model argument naming a classification checkpoint to start from (``backbone_checkpoint``,
    ``inflate_from``): a missing file is one :class:`ConfigError` naming the argument, the folder a
    relative path is read from, and how to train ``trained`` from scratch instead."""
    if path is not None and not os.path.isfile(path):
        where = "" if os.path.isabs(path) else f", relative to {os.getcwd()}"
        raise ConfigError(f"{what} not found: {path} (model.init_args.{key}{where}); pass a .ckpt written by "
                          f"`rescale fit` of the classification task, or set {key}: null "
                          f"(--model.init_args.{key} null) to train {trained} from scratch")


def network_weights(checkpoint: Mapping[str, Any], source: str, where: str,
                    bare: bool = False) -> dict[str, Any]:
    """The network's weights of a checkpoint written by ``rescale fit`` (``state_dict`` entries
    ``net.*``, the prefix removed), for another task to start from (a detection backbone, an
    inflated 3D network). ``bare``: a plain state dict (no ``state_dict`` key, no prefix) is
    accepted too. Anything else is a one-line :class:`ConfigError` naming ``source`` and the
    config key ``where``."""
    fix = "To fix: pass a classification checkpoint written by `rescale fit`"
    state = checkpoint.get("state_dict", checkpoint if bare else None) if isinstance(checkpoint, Mapping) else None
    if not isinstance(state, Mapping):
        raise ConfigError(f"{source} holds no state_dict ({where}). {fix}")
    net = {k[len(NETWORK_PREFIX):]: v for k, v in state.items() if k.startswith(NETWORK_PREFIX)}
    if net:
        return net
    if not bare or "state_dict" in checkpoint:
        raise ConfigError(f"{source} holds no network weights (no '{NETWORK_PREFIX}*' entries) ({where}). {fix}")
    return {k: v for k, v in state.items() if hasattr(v, "shape")}
