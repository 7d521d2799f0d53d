"""``rescale export``: a trained network written as a plain one (ONNX, a ``torch.export``
ExportedProgram, TorchScript) and checked against the PyTorch model on real inputs of its task.

    rescale export --config experiments/imagenet/rescale50.yaml --data.root /data/imagenet \\
        --ckpt_path runs/rescale-imagenet/<id>/checkpoints/last.ckpt --format onnx exported-program

The config builds the task's module as ``rescale fit`` would (its ``_defaults.yaml`` applied;
further ``--key value`` arguments are Lightning overrides, e.g. ``--data.batch_size 8``), the
checkpoint's weights are loaded (a checkpoint of another task or network is one error line), and
the network is captured in evaluation, autograd off: the computation ``rescale test`` runs, on
the network's inference plan, with none of the schemes' modules or Python-side hooks left in the
file. Each file is read back by its own runtime (:mod:`.formats`) and run on the first batch
of the config's data (images, clips, token ids), from its training split, else its val, test or
predict split, the first that is there (:data:`CHECK_SPLITS`: a machine holding the val split
alone exports too); the largest absolute difference from
the PyTorch model is printed, and above ``--tolerance`` (relative to the outputs' largest
magnitude, at least 1) the command fails, that file kept as ``<name>.rejected<suffix>``. The files
are written in a folder beside their destination and moved there once all have passed, all or none
(:func:`move_in`), so a failed export replaces none of an earlier one's, and a new export at a stem
takes away the earlier one's files it does not write again (:func:`earlier_files`).

What is exported per task (:func:`~.programs.export_programs`): the network
(classification, video); a module whose task needs more says so with an ``export_programs(batch)``
method (translation: the encoder and one decoding step; detection: the backbone with its FPN, and
one line on what of the detector does not export). Files go to ``--out`` (a path whose suffix, a format's or
the sidecar's ``.json``, is replaced by the format's), by default ``export/<checkpoint name>`` in the folder of the run that wrote the
checkpoint; a task with several programs gets one file each, ``<name>.<program><suffix>``. Beside
them ``<name>.json`` (:func:`_sidecar`, with what the task module's ``export_metadata`` adds: class
names, preprocessing, the translation task's SentencePiece model as ``<name>.spm.model``), staged and
moved in with the files.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
from typing import Optional, Sequence

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException

from ..checkpoints import (check_config_against_checkpoint, is_remote, load_into_module, peek_checkpoint,
                           safe_load)
from ..cli import build_run
from ..errors import DataError, UserArgumentParser, UserError
from ..system import CODE_KEY, code_version, require_writable, write_failure, writer_folder
from ..training import resolved_architecture
from .formats import (FORMATS, capture, evaluating, input_specs, max_difference, onnx_data_path, op_counts,
                      require_packages, size_names, size_one_runs, tensors_of, varying_sizes)
from .programs import ExportProgram, any_size_only, export_programs

__all__ = ["export_paths", "export_stem", "ExportCheckFailed", "earlier_files", "move_in", "main"]

log = logging.getLogger(__name__)

#: The network is not compiled (the export captures its own graph), and its weights are in the default
#: memory format: ``channels_last`` is how a training step runs fast; its weights, written in the
#: files as they are, make ``torch.export.load`` warn that it found "no complete tensor" at every load.
PLAIN_NETWORK = ["--model.init_args.compile", "false", "--model.init_args.channels_last", "false"]
#: The layout of the sidecar ``<stem>.json``; raised when a key changes meaning or goes.
SIDECAR_VERSION = 1
#: the hidden folder beside the export's files where they are written and checked before they move in
STAGING_PREFIX = ".export-"
CONFIG_FIX = "Give the --config the checkpoint was trained with ({config}), with the same overrides."


class ExportCheckFailed(UserError):
    """An exported file whose outputs differ from the PyTorch model's beyond the tolerance."""

    exit_code = 1


# --- where the files go ---------------------------------------------------------------------------

def export_paths(ckpt_path: str, out: Optional[str], formats: list[str], programs: list[str]) -> dict:
    """``{(format, program): path}``: ``--out`` (a format's suffix on it, ``.pt`` or the sidecar's ``.json``,
    replaced by each format's;
    a folder, existing or ending in ``/``: ``<folder>/<checkpoint name>``), else
    ``export/<checkpoint name>`` in the folder of the run that wrote the checkpoint (the folder
    holding its ``checkpoints/``; for a checkpoint elsewhere, its own folder). Several programs:
    ``<stem>.<program><suffix>``."""
    stem = export_stem(ckpt_path, out)
    return {(f, p): f"{stem}{'' if len(programs) == 1 else '.' + p}{FORMATS[f].suffix}"
            for f in formats for p in programs}


def export_stem(ckpt_path: str, out: Optional[str]) -> str:
    """The path every file of an export starts with (:func:`export_paths`); its sidecar is ``<stem>.json``."""
    name = os.path.splitext(os.path.basename(ckpt_path))[0]
    if out is None and is_remote(ckpt_path):  # its run folder is in a store the files cannot be checked in
        raise UserError(f"--ckpt_path {ckpt_path} is remote: the files are written and checked on this machine; "
                        f"give --out, a local file or folder for them (e.g. --out export/)")
    if out is None:
        folder = os.path.dirname(os.path.abspath(ckpt_path))
        if os.path.basename(folder) == "checkpoints":
            folder = os.path.dirname(folder)
        stem = os.path.join(folder, "export", name)
    elif out.endswith(os.sep) or os.path.isdir(out):
        stem = os.path.join(out, name)
    else:
        stem = out
        # a format's suffix, or the sidecar's (--out deploy/net.json: the sidecar deploy/net.json, deploy/net.onnx)
        for suffix in sorted({f.suffix for f in FORMATS.values()} | {".pt", ".json"}, key=len, reverse=True):
            if stem.endswith(suffix):
                stem = stem[:-len(suffix)]
                break
        if not os.path.basename(stem):  # "" (an unset shell variable), "deploy/.onnx": hidden files named by a suffix
            raise UserError(f"--out {out!r} names no file: give a file name (--out deploy/net) or a folder ending "
                            f"in / (--out deploy/)")
    return stem


# --- the command -----------------------------------------------------------------------------------

def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0:  # refuses nan too
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _parser() -> UserArgumentParser:
    p = UserArgumentParser(prog="rescale export", description=__doc__.split("\n\n")[0], allow_abbrev=False,
                           epilog="Other --key value arguments override the config, as for rescale fit "
                                  "(e.g. --data.batch_size 8: the batch the files are checked on).")
    p.add_argument("--config", action="append", required=True,
                   help="the run config the checkpoint was trained with (repeatable, as for rescale fit)")
    p.add_argument("--ckpt_path", required=True, help="a checkpoint written by rescale fit")
    p.add_argument("--format", nargs="+", required=True, choices=list(FORMATS),
                   help="one or more of: " + ", ".join(FORMATS))
    p.add_argument("--out", help="the file to write (a .onnx/.pt2/.pt/.json suffix on it becomes each format's: "
                                 "--out deploy/net.json writes deploy/net.onnx beside deploy/net.json), or a "
                                 "folder (existing, or ending in /) to write <checkpoint name>.<suffix> in (default: "
                                 "export/<checkpoint name> in the run folder of the checkpoint); beside the files, "
                                 "<name>.json says what a runtime needs (classes, inputs, preprocessing)")
    p.add_argument("--tolerance", type=_tolerance, default=1e-4,
                   help="largest difference from the PyTorch model allowed, relative to the outputs' largest "
                        "magnitude (at least 1) (default 1e-4)")
    return p


def _build(configs: list[str], overrides: list[str], ckpt_path: str, formats: list[str]):
    """The module (the checkpoint's weights loaded, eval mode) and data module of the configs, and the
    code the checkpoint records it was trained with (None for one written before checkpoints did);
    a format the module's programs cannot be written in is refused before the weights or data are read."""
    peek_checkpoint(ckpt_path)  # a missing or unreadable file: one line before anything is built
    cli = build_run([a for c in configs for a in ("--config", c)] + overrides + PLAIN_NETWORK)
    refuse_fixed_sizes(cli.model, formats)
    check_config_against_checkpoint(cli.config.get("model"), ckpt_path, normalize=resolved_architecture,
                                    fix=CONFIG_FIX, evaluating=True)
    checkpoint = safe_load(ckpt_path)
    load_into_module(cli.model, checkpoint, f"checkpoint {ckpt_path} (--ckpt_path)", fix=CONFIG_FIX,
                     ckpt_path=ckpt_path)
    return cli.model.eval(), cli.datamodule, checkpoint.get(CODE_KEY)


#: where the check batch comes from, in this order: (split, the stage that sets it up, its loader)
CHECK_SPLITS = (("train", "fit", "train_dataloader"), ("val", "validate", "val_dataloader"),
                ("test", "test", "test_dataloader"), ("predict", "predict", "predict_dataloader"))


def _first_batch(datamodule, where: str):
    """The first batch of the first split the data has, in :data:`CHECK_SPLITS` order (real inputs
    of the task): a machine holding the val (or test) split alone exports as one holding them all;
    one line when none gives a batch, with why the first did not."""
    if datamodule is None or not hasattr(datamodule, "train_dataloader"):
        raise UserError(f"{where} has no data module to take real inputs from; give the run config the "
                        "checkpoint was trained with")
    why: list[str] = []
    for split, stage, loader in CHECK_SPLITS:
        try:
            datamodule.setup(stage)
            batches = getattr(datamodule, loader)()
            batch = next(iter(batches), None) if batches is not None else None
        except (UserError, MisconfigurationException) as err:  # the split is not there (or not this task's)
            why.append(f"{split}: {str(err).splitlines()[0] if str(err) else type(err).__name__}")
            continue
        if batch is not None:
            log.info(f"checking the exported files on the first batch of the {split} split")
            return batch
        why.append(f"{split}: empty")
    raise DataError(f"the data of {where} gives no batch to check the exported network on (of the train, val, test "
                    f"and predict splits, in that order; {why[0]}): give the data a split holding samples, e.g. "
                    "--data.init_args.root")


def _describe(inputs: tuple) -> str:
    """Shapes (and the dtype of what is not floating point): ``64x3x224x224, 64x26 int64``."""
    return ", ".join("x".join(map(str, t.shape)) + ("" if t.is_floating_point() else " " + str(t.dtype)[6:])
                     for t in tensors_of(inputs))


def _capture(program: ExportProgram, dynamic_shapes) -> "torch.export.ExportedProgram":
    try:
        return capture(program.module, program.inputs, dynamic_shapes)
    except Exception as err:  # torch.export's reasons are pages long: the first line, traceback on request
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        error = UserError(f"cannot export the {program.name} with torch.export: {first}")
        error.original = err
        raise error from None


def rejected_path(path: str, suffix: str) -> str:
    """Where a file that failed its check is kept for inspection: ``net.onnx`` -> ``net.rejected.onnx``
    (the file of an earlier export at ``path``, if any, left as it was)."""
    return f"{path[:-len(suffix)]}.rejected{suffix}"


def _sizes_of_fixed_file(program: ExportProgram, captured, run, bound: float) -> str:
    """What a file traced at the real batch's sizes (TorchScript) is known to take: the free sizes it
    also computes right at 1 (checked, as for the program), else the batch's sizes only."""
    right = size_one_runs(captured, program.module, program.inputs, bound, runner=run)
    if not right:
        return ", traced at these sizes (it may fail at others)"
    checked = " and ".join(f"{name} 1" for name in size_names(captured, right))
    return f", traced at the batch's sizes and right at {checked} too"


def _export_one(program: ExportProgram, formats: list[str], paths: dict, staged: dict, tolerance: float) -> dict:
    """Each format of ``program`` written to its ``staged`` path and checked; a file beyond the tolerance
    is moved to :func:`rejected_path` and fails the command. Returns what the sidecar says of the
    program: its files by format, their differences from PyTorch, its inputs and outputs."""
    with torch.no_grad():  # first: the inference plan folds the weights the capture then reads
        reference = evaluating(program.module)(*program.inputs)
    captured = {False: _capture(program, program.dynamic_shapes)}
    scale = max([1.0] + [float(t.abs().max()) for t in tensors_of(reference) if t.numel() and t.is_floating_point()])
    right_at_one = size_one_runs(captured[False], program.module, program.inputs, tolerance * scale)
    free = varying_sizes(captured[False], right_at_one)
    described = {"files": {}, "max_difference": {},
                 "inputs": input_specs(captured[False], program.inputs, right_at_one),
                 "outputs": [{"shape": list(t.shape), "dtype": str(t.dtype)[len("torch."):]}
                             for t in tensors_of(reference)]}
    log.info(f"{program.name}: {sum(op_counts(captured[False]).values())} ops, checked on a real batch "
             f"({_describe(program.inputs)}); " + (f"sizes that may vary: {free}" if free else "every input size fixed"))
    for name in formats:
        fmt, path = FORMATS[name], paths[(name, program.name)]
        if fmt.static and True not in captured:
            captured[True] = _capture(program, None)
        written = staged[(name, program.name)]
        difference = max_difference(fmt.save_and_load(captured[fmt.static], program.inputs, written), reference)
        sizes = ""
        if fmt.static and free and difference <= tolerance * scale:
            sizes = _sizes_of_fixed_file(program, captured[False], fmt.load(written), tolerance * scale)
        if difference > tolerance * scale:
            path = rejected_path(path, fmt.suffix)
            fmt.move(written, path)  # with what it writes beside it: ONNX's external data
        line = (f"{path}: the {program.name} read back by {fmt.runtime}{sizes}: max |difference| from PyTorch "
                f"{difference:.2e}")
        if difference > tolerance * scale:
            raise ExportCheckFailed(f"{line}, above the tolerance {tolerance:g} x {scale:.3g}; the file is kept "
                                    "for inspection, no other file written (--tolerance sets the bound)")
        log.info(line)
        described["files"][name] = os.path.basename(path)
        if os.path.exists(onnx_data_path(written)):  # weights kept beside the file: a runtime copies both
            described.setdefault("data_files", {})[name] = os.path.basename(onnx_data_path(path))
        described["max_difference"][name] = difference
        if fmt.static:  # ``free`` is the program's: a file traced at the batch's sizes says what it was checked at
            described.setdefault("traced", {})[name] = sizes.lstrip(", ") or "traced at these sizes"
    return described


def _sidecar(module, ckpt_path: str, trained_with, metadata: dict, programs: dict) -> dict:
    """What ``<stem>.json`` holds (docs/inference.md, under ``rescale export``)."""
    info = peek_checkpoint(ckpt_path)
    package = type(module).__module__.split(".")
    return {"rescale_export": SIDECAR_VERSION, "task": package[-2] if len(package) > 1 else package[0],
            "module": type(module).__name__, "network": (module.hparams or {}).get("network"),
            "scheme": module.scheme_name,
            "checkpoint": {"path": ckpt_path if is_remote(ckpt_path) else os.path.abspath(ckpt_path),
                           "run_id": info.run_id, "step": info.global_step, "code": trained_with},
            "code": code_version(), "programs": programs, **metadata}


def refuse_fixed_sizes(module, formats: list[str]) -> None:
    """One :class:`UserError` line, before any data is read or file written, for a format captured
    at the real batch's sizes (TorchScript) asked of a program of ``module`` that must take other
    sizes (:func:`~.programs.any_size_only`)."""
    fixed = [name for name in formats if FORMATS[name].static]
    blocked = any_size_only(module)
    if fixed and blocked:
        program, why = next(iter(blocked.items()))
        others = " or ".join(name for name in FORMATS if not FORMATS[name].static)
        raise UserError(f"rescale export --format {' '.join(fixed)}: the {program} is not written as "
                        f"{', '.join(fixed)}: {why}; give --format {others}, whose {program} takes every size")


def earlier_files(folder: str, stem: str, names: Sequence[str]) -> list[str]:
    """The files of an earlier export at ``stem`` in ``folder`` that an export writing ``names`` would
    leave beside its own: those the earlier sidecar ``<stem>.json`` lists (a format or program not
    written again, another task's tokenizer) and the external data an earlier ONNX file kept beside a
    name written again (``<name>.onnx.data``, where the new file holds its weights). Files of this
    stem only; a rejected file (``<stem>.rejected...``, kept for inspection) is none of them."""
    try:
        with open(os.path.join(folder, f"{stem}.json"), encoding="utf-8") as f:
            sidecar = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        sidecar = None
    listed = [onnx_data_path(name) for name in names if name.endswith(FORMATS["onnx"].suffix)]
    if isinstance(sidecar, dict) and "rescale_export" in sidecar:
        programs = sidecar.get("programs")
        for program in programs.values() if isinstance(programs, dict) else ():
            for key in ("files", "data_files"):
                files = program.get(key) if isinstance(program, dict) else None
                listed += list(files.values()) if isinstance(files, dict) else []
        translation = sidecar.get("translation")
        listed.append(translation.get("sentencepiece") if isinstance(translation, dict) else None)
    return sorted({name for name in listed if isinstance(name, str) and name.startswith(f"{stem}.")
                   and os.path.basename(name) == name and name not in names
                   and os.path.isfile(os.path.join(folder, name))})


def move_in(staging: str, folder: str, what: str, stale: Sequence[str] = ()) -> None:
    """Every file in ``staging`` moved into ``folder``, all or none as far as the file system allows:
    each destination is checked first (one that is a folder is refused before any file moves), the
    files an earlier export left there are set aside in ``staging`` and put back if a move fails
    midway; so are the files ``stale`` names in ``folder`` (:func:`earlier_files`), which go with
    ``staging``. A refusal or a failure is one :class:`UserError` line; ``folder`` then holds what it
    held."""
    names = sorted(os.listdir(staging))  # the files, and any a format writes beside its own (ONNX's data)
    for name in names:
        destination = os.path.join(folder, name)
        if os.path.isdir(destination) and not os.path.islink(destination):
            raise UserError(f"cannot write {what} {destination}: a folder is in the way of the export's file "
                            f"{name}; move it away or give --out another path (no file written)")
    aside = tempfile.mkdtemp(prefix=".previous-", dir=staging)
    done: list[tuple[str, bool, bool]] = []  # (name, whether an earlier file was set aside, whether one moved in)
    failed = ""
    try:
        for name, new in [*((n, True) for n in names), *((n, False) for n in stale)]:
            failed, destination = name, os.path.join(folder, name)
            earlier = os.path.lexists(destination)
            if earlier:
                os.replace(destination, os.path.join(aside, name))
            done.append((name, earlier, new))
            if new:
                os.replace(os.path.join(staging, name), destination)
    except OSError as err:
        for name, earlier, new in reversed(done):  # the failed one's new file is still in staging
            destination = os.path.join(folder, name)
            if new and not os.path.lexists(os.path.join(staging, name)):
                os.replace(destination, os.path.join(staging, name))
            if earlier:
                os.replace(os.path.join(aside, name), destination)
        raise UserError(f"cannot write {what} {os.path.join(folder, failed)}: {err.strerror or err}; the files "
                        f"already moved in were taken back, the folder holds what it held (no file written)") from None


def main(argv: Optional[list[str]] = None) -> int:
    args, overrides = _parser().parse_known_args(argv)
    args.format = list(dict.fromkeys(args.format))  # each format once
    require_packages(args.format)
    folder = os.path.dirname(os.path.abspath(next(iter(export_paths(args.ckpt_path, args.out, args.format,
                                                                    ["network"]).values()))))
    require_writable(folder, "--out" if args.out else "the export folder",
                     "give --out a path in a folder you can write")
    module, datamodule, trained_with = _build(args.config, overrides, args.ckpt_path, args.format)
    where = " ".join(f"--config {c}" for c in args.config)
    programs = export_programs(module, _first_batch(datamodule, where))
    paths = export_paths(args.ckpt_path, args.out, args.format, [p.name for p in programs])
    folder = os.path.dirname(os.path.abspath(next(iter(paths.values()))))
    os.makedirs(folder, exist_ok=True)
    # every file is written and checked in a folder of its own beside the destination, and moved
    # there only once all have passed: a failed or interrupted export replaces none of an earlier one's
    with writer_folder(folder, STAGING_PREFIX, "export staging folder") as staging:
        _export_in(args, module, datamodule, trained_with, programs, paths, folder, staging)
    return 0


def _export_in(args, module, datamodule, trained_with, programs, paths, folder: str, staging: str) -> None:
    """The export's files written and checked in ``staging``, then moved into ``folder``."""
    try:
        staged = {key: os.path.join(staging, os.path.basename(path)) for key, path in paths.items()}
        described = {}
        for program in programs:
            if program.note:
                log.info(f"{program.name}: {program.note}")
            described[program.name] = _export_one(program, args.format, paths, staged, args.tolerance)
        # what a runtime needs beside the files (class names, preprocessing, a tokenizer), moved in with them
        stem = os.path.basename(export_stem(args.ckpt_path, args.out))
        metadata = module.export_metadata(datamodule, staging, stem)
        sidecar = _sidecar(module, args.ckpt_path, trained_with, metadata, described)
        with open(os.path.join(staging, f"{stem}.json"), "w", encoding="utf-8") as f:
            json.dump(sidecar, f, indent=1)
            f.write("\n")
        stale = earlier_files(folder, stem, os.listdir(staging))
        move_in(staging, folder, "--out" if args.out else "the export folder", stale)
        if stale:
            log.info(f"took away the earlier export's {', '.join(os.path.join(folder, name) for name in stale)}: "
                     f"{stem}.json now describes this export's files only")
        log.info(f"{os.path.join(os.path.dirname(next(iter(paths.values()))), stem)}.json: what a runtime needs "
                 "beside the files (task, classes, inputs, preprocessing; docs/inference.md)")
    except OSError as err:
        fix = write_failure(err, "--out")
        if fix is None:
            raise
        raise UserError(f"cannot write the export in {folder}: {err.strerror} ([Errno {err.errno}]); none of its files "
                        f"was moved there (an earlier export's are as they were): {fix}") from None

