"""``rescale average-checkpoints``: the weights of the last N checkpoints of a run, averaged
(fairseq's ``scripts/average_checkpoints.py``; Vaswani et al. 2017 average the last 5 or 20 for
their WMT results).

    rescale average-checkpoints runs/<project>/<run id>/checkpoints --num 5 --output avg.ckpt
    rescale test --config <run config> --ckpt_path avg.ckpt

"Last" is by the global step stored in each checkpoint, not by file time; of several files at
one step (``last.ckpt`` beside the newest epoch checkpoint) one is used and the others are named
as left out, when they hold one state: they record the same W&B run id, or, where a run id is not
recorded (no W&B logger), their weights are equal; other files at one step are refused. From a
folder only the checkpoints on the run's save schedule are taken: ``last.ckpt`` (the resume point,
written at epoch ends, every N steps or minutes and on SIGTERM) never, and, when the run saved
every k steps (a ModelCheckpoint with ``every_n_train_steps``, recorded in every checkpoint), no
file at a step that is not a multiple of k (an epoch-end checkpoint): a SIGTERM save at step 586
among 120/240/360/480 would otherwise be "the newest"; nor an earlier output of this command
(it records ``averaged_from``). Files named one by one are all taken, one per state as above; an
average named as an input is refused (it would count its checkpoints again), and so, before
anything is read, is an ``--output`` that exists and is not an earlier average (writing it would
replace a checkpoint's weights). The command says in one line which steps it averaged and which
files it left out, naming files by as much of their paths as tells them apart. Floating-point
parameters and buffers (mean-shift ``mu0``, BN running statistics) are averaged in float64 and
stored in their own dtype; integer buffers (counters) are taken from the newest checkpoint. The
output keeps the newest checkpoint's hyper-parameters (so ``validate``/``test`` rebuild the
network) but no optimizer or loop state: it is for evaluation, not for resuming. Of a run trained
with an average of the weights (``--ema.decay``) it averages what ``state_dict`` holds, the averaged
weights, and drops the training ones (``current_model_state``).

Averaging is only meaningful for the weights of one run: checkpoints of other runs (other W&B
run ids, recorded by :class:`.callbacks.ResumeState`), saved from other network hyper-parameters
(network, scheme, their options, sizes), with other parameters or shapes, or whose outputs mean
other things (a translation run's SentencePiece model, compared by its bytes' digest; a task's
label names and order, :mod:`..data.labels`) are refused in one line naming the first two files
that differ. A checkpoint that records no run id, vocabulary or labels (no W&B logger; written
before checkpoints carried them) is compared by what it records. A checkpoint to average whose
weights hold NaN or infinite values (saved after its run diverged) is refused in one line naming
it: the average would be NaN wherever it is.
"""
from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
from typing import Optional

import torch

from ..data import LABELS_KEY, checkpoint_labels
from ..errors import UserArgumentParser
from ..training import resolved_architecture
from .architecture_match import ARCHITECTURE_KEYS, hparam_differences
from .files import (AtomicCheckpointIO, CheckpointError, checkpoint_exists, checkpoint_run_id, is_remote,
                    non_finite_text, non_finite_weights, safe_load)

__all__ = ["average_checkpoints", "main"]

log = logging.getLogger(__name__)

# (a run with an average of the weights, training.ema: its state_dict is the average, the training
# weights and the average's count are training state)
_TRAINING_STATE = ("optimizer_states", "lr_schedulers", "loops", "callbacks", "MixedPrecision",
                   "current_model_state", "averaging_state")
_SENTENCEPIECE = "sentencepiece"  # the translation module's SentencePiece model (serialized) in its checkpoints
_ONE_RUN = "average checkpoints of one run only"


def _candidates(inputs: list[str]) -> list[tuple[str, bool]]:
    """``(path, named)``: the .ckpt files of the folders (``named`` False) and the files given."""
    files: list[tuple[str, bool]] = []
    for item in inputs:
        if os.path.isdir(item):
            files += [(f, False) for f in sorted(glob.glob(os.path.join(item, "*.ckpt")))]
        elif os.path.isfile(item):
            files.append((item, True))
        else:
            raise CheckpointError(f"no checkpoint or folder {item}: give .ckpt files or the run's checkpoints folder")
    out: dict[str, bool] = {}
    for path, named in files:
        path = os.path.abspath(path)
        out[path] = out.get(path, False) or named
    return list(out.items())


def _step_schedules(checkpoint: dict) -> set[int]:
    """The ``every_n_train_steps`` of the run's ModelCheckpoints (in their state keys)."""
    keys = (checkpoint.get("callbacks") or {}).keys()
    return {int(n) for key in keys for n in re.findall(r"'every_n_train_steps': (\d+)", str(key)) if int(n) > 0}


def _names(paths: list[str]) -> dict[str, str]:
    """Each of ``paths`` by its shortest end (its file name, else with the folders above it) that no
    other of them ends with: ``<id1>/checkpoints/last.ckpt`` beside ``<id2>/checkpoints/last.ckpt``."""
    parts = {path: path.split(os.sep) for path in paths}
    names = {}
    for path, mine in parts.items():
        n = next((n for n in range(1, len(mine))
                  if all(other[-n:] != mine[-n:] for q, other in parts.items() if q != path)), len(mine))
        names[path] = os.sep.join(mine[-n:])
    return names


def _steps(averaged_from: list[dict]) -> str:
    steps = [str(item["global_step"]) for item in averaged_from]
    return f"global step{'s' if len(steps) != 1 else ''} {', '.join(steps)}"


def _off_schedule(checkpoint: dict, path: str, schedules: set[int]) -> Optional[str]:
    """Why a checkpoint found in a folder is not one of the run's scheduled saves (None: it is)."""
    if "averaged_from" in checkpoint:
        return f"an average of {_steps(checkpoint['averaged_from'])}"
    if re.fullmatch(r"last(-v\d+)?\.ckpt", os.path.basename(path)):
        return "the resume point"
    step = checkpoint.get("global_step", -1)
    if schedules and not any(step % k == 0 for k in schedules):
        every = " or ".join(str(k) for k in sorted(schedules))
        return f"off the every-{every}-steps schedule"
    return None


def _one_per_step(loaded: list[tuple[dict, str]], names: dict[str, str]
                  ) -> tuple[list[tuple[dict, str]], list[dict]]:
    """One checkpoint per global step, oldest first, and the files left out: two files of one run at
    one step hold one state (last.ckpt beside the epoch checkpoint it repeats), which averaging would
    count twice. The file kept is the one not named last.ckpt, else the last one given. Two files at
    one step whose run is not recorded are one state only when their weights are equal; others are
    refused."""
    kept: dict[int, tuple[dict, str]] = {}
    for checkpoint, path in sorted(loaded, key=lambda item: os.path.basename(item[1]) != "last.ckpt"):
        kept[checkpoint.get("global_step", -1)] = (checkpoint, path)
    left_out = []
    for checkpoint, path in loaded:
        step = checkpoint.get("global_step", -1)
        other, other_path = kept[step]
        if other_path == path:
            continue
        if not _one_state(checkpoint, other):
            raise CheckpointError(f"cannot average {path} with {other_path}: both hold global step {step} but other "
                                  f"weights and record no W&B run id, so they are not one state of one run; "
                                  f"{_ONE_RUN}")
        left_out.append({"path": path, "global_step": checkpoint.get("global_step"),
                         "why": f"the same step as {names[other_path]}"})
    return [kept[step] for step in sorted(kept)], left_out


def _one_state(checkpoint: dict, other: dict) -> bool:
    """Whether two checkpoints at one step hold one state: of one recorded run, or equal weights."""
    if checkpoint_run_id(checkpoint) is not None and checkpoint_run_id(checkpoint) == checkpoint_run_id(other):
        return True
    ours, theirs = checkpoint.get("state_dict") or {}, other.get("state_dict") or {}
    return ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def _run(checkpoint: dict) -> Optional[tuple[str, str]]:
    """``(run id, description)`` of the W&B run that saved the checkpoint; None when not recorded."""
    run_id = checkpoint_run_id(checkpoint)
    return None if run_id is None else (run_id, f"run {run_id}")


def _vocabulary(checkpoint: dict) -> Optional[tuple[str, str]]:
    """``(digest, description)`` of the checkpoint's SentencePiece model; None when it has none."""
    proto = checkpoint.get(_SENTENCEPIECE)
    if not isinstance(proto, (bytes, bytearray)):
        return None
    import sentencepiece as spm  # only for translation checkpoints

    digest = hashlib.sha256(proto).hexdigest()
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(bytes(proto))
        pieces = f"{processor.piece_size()} pieces, "
    except RuntimeError:
        pieces = ""
    return digest, f"{pieces}sha256 {digest[:12]}"


def _labels(checkpoint: dict) -> Optional[tuple[tuple, str]]:
    """``(names and ids, description)`` of the labels the checkpoint's network learned; None
    when it records none."""
    labels = checkpoint_labels(checkpoint, "")
    if labels is None:
        return None
    shown = ", ".join(repr(n) for n in labels.names[:3]) + (
        f" and {len(labels.names) - 3} more" if len(labels.names) > 3 else "")
    return (labels.names, labels.ids), f"{len(labels.names)} labels {shown}"


#: what must agree besides the weights: (what, how it is read, what differing means)
_MEANINGS = (  # the most telling first: runs on other corpora or data sets are other runs too
    ("SentencePiece vocabularies", _vocabulary, "the same ids stand for other pieces"),
    ("labels", _labels, "the same outputs stand for other classes"),
    ("W&B runs", _run, "they are the weights of separate trainings (other seeds or settings)"),
)


def _check_same_meaning(loaded: list[tuple[dict, str]], names: dict[str, str]) -> None:
    """One :class:`CheckpointError` line naming the first two of ``loaded`` (oldest first) whose
    W&B run, SentencePiece vocabulary, labels or network hyper-parameters differ."""
    for what, read, means in _MEANINGS:
        recorded = [(found, path) for checkpoint, path in loaded if (found := read(checkpoint)) is not None]
        for (key, description), path in recorded[1:]:
            (first_key, first_description), first_path = recorded[0]
            if key != first_key:
                raise CheckpointError(
                    f"cannot average {first_path} with {path}: their {what} differ ({names[first_path]}: "
                    f"{first_description}; {names[path]}: {description}), so {means}; {_ONE_RUN}")
    first, first_path = loaded[0]
    theirs = resolved_architecture(dict(first.get("hyper_parameters") or {}))
    for checkpoint, path in loaded[1:]:
        ours = resolved_architecture(dict(checkpoint.get("hyper_parameters") or {}))
        differing = hparam_differences(theirs, ours, ARCHITECTURE_KEYS)
        if differing:
            shown = "; ".join(f"{k} {theirs[k]!r} in {names[first_path]}, {ours[k]!r} in {names[path]}"
                              for k in differing)
            raise CheckpointError(f"cannot average {first_path} with {path}: they were saved from other networks "
                                  f"({shown}); {_ONE_RUN}")


def _check_same_parameters(loaded: list[tuple[dict, str]]) -> None:
    """One :class:`CheckpointError` line naming a file of ``loaded`` whose parameters or shapes are
    not those of the newest (the last)."""
    newest_path = loaded[-1][1]
    reference = loaded[-1][0].get("state_dict") or {}
    for checkpoint, path in loaded:
        state = checkpoint.get("state_dict")
        if state is None or set(state) != set(reference):
            extra = sorted(set(state or {}) ^ set(reference))[:3]
            raise CheckpointError(f"cannot average {path} with {newest_path}: their parameters differ "
                                  f"(e.g. {extra}); {_ONE_RUN}")
        for key, value in state.items():
            if value.shape != reference[key].shape:
                raise CheckpointError(f"cannot average {path} with {newest_path}: {key} has shape "
                                      f"{tuple(value.shape)} there and {tuple(reference[key].shape)} here")


def average_checkpoints(paths: list[str], num: Optional[int] = None, named: Optional[set[str]] = None) -> dict:
    """The averaged checkpoint of the ``num`` newest (by global step) of ``paths`` (all if None).

    ``named``: the paths the user named one by one; the others (found in folders) are taken only
    when on the run's save schedule (module docstring); None: every path is taken."""
    loaded = [(safe_load(p), p) for p in paths]
    names = _names(paths)
    for checkpoint, path in loaded:
        if "averaged_from" in checkpoint and (named is None or path in named):
            raise CheckpointError(f"cannot average {path}: it is an average of {_steps(checkpoint['averaged_from'])} "
                                  "(written by rescale average-checkpoints), and taking it as one checkpoint counts "
                                  "those weights again; average the run's own checkpoints instead")
    left_out = []
    if named is not None:
        schedules = set().union(*(_step_schedules(c) for c, _ in loaded))
        kept = []
        for checkpoint, path in loaded:
            why = None if path in named else _off_schedule(checkpoint, path, schedules)
            if why:
                left_out.append({"path": path, "global_step": checkpoint.get("global_step"), "why": why})
            else:
                kept.append((checkpoint, path))
        loaded = kept
    if not loaded:
        raise CheckpointError(f"no checkpoint on the run's save schedule among {len(left_out)} file(s) (left out: "
                              f"{_left_out_text(left_out, names)}); name the files to average one by one")
    loaded.sort(key=lambda item: item[0].get("global_step", -1))
    _check_same_meaning(loaded, names)
    _check_same_parameters(loaded)
    loaded, same_step = _one_per_step(loaded, names)
    left_out += same_step
    if num is not None:
        if num < 1 or num > len(loaded):
            raise CheckpointError(f"--num {num}: {len(loaded)} checkpoint(s) at distinct steps found"
                                  + (f" on the save schedule (left out: {_left_out_text(left_out, names)})"
                                     if left_out else "") + f"; choose 1..{len(loaded)}")
        loaded = loaded[-num:]
    for checkpoint, path in loaded:
        broken = non_finite_weights(checkpoint)
        if broken:  # NaN + anything is NaN: the average's every such weight would be NaN
            raise CheckpointError(f"cannot average {path} (global step {checkpoint.get('global_step')}): "
                                  f"{non_finite_text(broken)}, weights saved after the run diverged, which would make "
                                  "those of the average NaN too; name the checkpoints saved before the divergence one "
                                  "by one")
    newest = loaded[-1][0]
    reference = newest["state_dict"]
    sums: dict[str, torch.Tensor] = {}
    for checkpoint, _ in loaded:
        for key, value in checkpoint["state_dict"].items():
            if value.is_floating_point():
                sums[key] = sums.get(key, 0) + value.double()
    averaged = {k: (sums[k] / len(loaded)).to(v.dtype) if k in sums else v.clone() for k, v in reference.items()}
    out = {k: v for k, v in newest.items() if k not in _TRAINING_STATE}
    for key in (_SENTENCEPIECE, LABELS_KEY):  # what the outputs mean: the newest record of it
        found = [c[key] for c, _ in reversed(loaded) if key in c]
        if found:
            out[key] = found[0]
    out["state_dict"] = averaged
    out["averaged_from"] = [{"path": p, "global_step": c.get("global_step")} for c, p in loaded]
    out["left_out"] = left_out
    return out


def _left_out_text(left_out: list[dict], names: dict[str, str]) -> str:
    return ", ".join(f"{names[x['path']]} at step {x['global_step']} ({x['why']})" for x in left_out)


def _check_output(path: str) -> None:
    """Refuse, before any work, an ``--output`` that would replace anything but an earlier average."""
    if not checkpoint_exists(path):
        return
    try:
        existing = safe_load(path, mmap=True)
    except CheckpointError:
        if is_remote(path):
            raise
        existing = None
    if isinstance(existing, dict) and "averaged_from" in existing:
        return
    what = (f"is a checkpoint at global step {existing.get('global_step')}, not an average written by rescale "
            "average-checkpoints" if isinstance(existing, dict) else "exists and is not a checkpoint")
    raise CheckpointError(f"--output {path} {what}: writing the average there would replace it; give --output a "
                          "new file name")


def main(argv: Optional[list[str]] = None) -> int:
    p = UserArgumentParser(prog="rescale average-checkpoints", description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", help="checkpoint files and/or folders holding *.ckpt")
    p.add_argument("--num", type=int, help="average the last NUM checkpoints by global step (default: all)")
    p.add_argument("--output", required=True, help="the averaged checkpoint to write")
    args = p.parse_args(argv)
    _check_output(args.output)
    candidates = [(f, named) for f, named in _candidates(args.inputs)
                  if os.path.abspath(f) != os.path.abspath(args.output)]
    if not candidates:
        raise CheckpointError(f"no .ckpt files in {', '.join(args.inputs)}")
    paths = [f for f, _ in candidates]
    checkpoint = average_checkpoints(paths, args.num, {f for f, named in candidates if named})
    AtomicCheckpointIO(output="--output").save_checkpoint(checkpoint, args.output)
    count = len(checkpoint["averaged_from"])
    skipped = f"; left out {_left_out_text(checkpoint['left_out'], _names(paths))}" if checkpoint["left_out"] else ""
    log.info(f"averaged {count} checkpoint{'s' if count != 1 else ''} ({_steps(checkpoint['averaged_from'])}{skipped})"
             f" -> {args.output}")
    return 0
