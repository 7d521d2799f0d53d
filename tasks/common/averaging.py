"""``rescale average-checkpoints``: the weights of the last N checkpoints of a run, averaged
(fairseq's ``scripts/average_checkpoints.py``; Vaswani et al. 2017 average the last 5 or 20 for
their WMT results).

    rescale average-checkpoints runs/<project>/<run id>/checkpoints --num 5 --output avg.ckpt
    rescale test --config <run config> --ckpt_path avg.ckpt

"Last" is by the global step stored in each checkpoint, not by file time; of several files at
one step (``last.ckpt`` beside the newest epoch checkpoint) one is used. Floating-point
parameters and buffers (mean-shift ``mu0``, BN running statistics) are averaged in float64 and
stored in their own dtype; integer buffers (counters) are taken from the newest checkpoint. The
output keeps the newest checkpoint's hyper-parameters (so ``validate``/``test`` rebuild the
network) but no optimizer or loop state: it is for evaluation, not for resuming.
"""
from __future__ import annotations

import argparse
import glob
import os
from typing import Optional

import torch

from .checkpointing import AtomicCheckpointIO, CheckpointError, safe_load

__all__ = ["average_checkpoints", "main"]

_TRAINING_STATE = ("optimizer_states", "lr_schedulers", "loops", "callbacks", "MixedPrecision")


def _candidates(inputs: list[str]) -> list[str]:
    files: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            files += sorted(glob.glob(os.path.join(item, "*.ckpt")))
        elif os.path.isfile(item):
            files.append(item)
        else:
            raise CheckpointError(f"no checkpoint or folder {item}: give .ckpt files or the run's checkpoints folder")
    return list(dict.fromkeys(os.path.abspath(f) for f in files))


def average_checkpoints(paths: list[str], num: Optional[int] = None) -> dict:
    """The averaged checkpoint of the ``num`` newest (by global step) of ``paths`` (all if None)."""
    loaded = [(safe_load(p), p) for p in paths]
    # one checkpoint per step: last.ckpt repeats the newest epoch checkpoint's state
    loaded.sort(key=lambda item: (item[0].get("global_step", -1), os.path.basename(item[1]) != "last.ckpt"))
    loaded = list({c.get("global_step", -1): (c, p) for c, p in loaded}.values())
    if num is not None:
        if num < 1 or num > len(loaded):
            raise CheckpointError(f"--num {num}: {len(loaded)} checkpoint(s) at distinct steps found; "
                                  f"choose 1..{len(loaded)}")
        loaded = loaded[-num:]
    newest, newest_path = loaded[-1]
    reference = newest["state_dict"]
    sums: dict[str, torch.Tensor] = {}
    for checkpoint, path in loaded:
        state = checkpoint.get("state_dict")
        if state is None or set(state) != set(reference):
            extra = sorted(set(state or {}) ^ set(reference))[:3]
            raise CheckpointError(f"cannot average {path} with {newest_path}: their parameters differ "
                                  f"(e.g. {extra}); average checkpoints of one run only")
        for key, value in state.items():
            if value.shape != reference[key].shape:
                raise CheckpointError(f"cannot average {path} with {newest_path}: {key} has shape "
                                      f"{tuple(value.shape)} there and {tuple(reference[key].shape)} here")
            if value.is_floating_point():
                sums[key] = sums.get(key, 0) + value.double()
    averaged = {k: (sums[k] / len(loaded)).to(v.dtype) if k in sums else v.clone() for k, v in reference.items()}
    out = {k: v for k, v in newest.items() if k not in _TRAINING_STATE}
    out["state_dict"] = averaged
    out["averaged_from"] = [{"path": p, "global_step": c.get("global_step")} for c, p in loaded]
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="rescale average-checkpoints", description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", help="checkpoint files and/or folders holding *.ckpt")
    p.add_argument("--num", type=int, help="average the last NUM checkpoints by global step (default: all)")
    p.add_argument("--output", required=True, help="the averaged checkpoint to write")
    args = p.parse_args(argv)
    paths = [f for f in _candidates(args.inputs) if os.path.abspath(f) != os.path.abspath(args.output)]
    if not paths:
        raise CheckpointError(f"no .ckpt files in {', '.join(args.inputs)}")
    checkpoint = average_checkpoints(paths, args.num)
    AtomicCheckpointIO().save_checkpoint(checkpoint, args.output)
    steps = ", ".join(str(item["global_step"]) for item in checkpoint["averaged_from"])
    print(f"averaged {len(checkpoint['averaged_from'])} checkpoints (global steps {steps}) -> {args.output}")
    return 0
