"""Read an offline W&B run (``offline-run-*/run-*.wandb``) without syncing it.

wandb >= 0.2x writes runs from its Go core and ships no Python reader for them. The file is a
LevelDB-style log of ``wandb_internal_pb2.Record`` protobufs: a 7-byte header (``:W&B``, magic
0xBEE1, version 0), then 32 KiB blocks of chunks, each ``crc32 (4) | length (2, LE) | type (1)``
(1 full, 2 first, 3 middle, 4 last); a block tail under 7 bytes is zero padding.
"""
from __future__ import annotations

import glob
import json
import os
import struct
import time
from dataclasses import dataclass, field

__all__ = ["OfflineRun", "read_offline_run", "find_offline_runs"]

_HEADER = 7
_BLOCK = 32 * 1024


@dataclass
class OfflineRun:
    path: str
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    run_id: str | None = None
    project: str | None = None
    name: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    finished: bool = False  # the run's exit record is written

    def metric(self, key: str) -> list:
        """Every logged value of ``key``, in order."""
        return [row[key] for row in self.history if key in row]


def _records(path: str):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    pos, pending = _HEADER, b""
    while pos + 7 <= len(data):
        block_left = _BLOCK - (pos % _BLOCK)
        if block_left < 7:
            pos += block_left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7: pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            pos += block_left - 7  # zero padding to the end of the block
            continue
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
            pending = b""


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def _set_nested(target: dict, item) -> None:
    keys = list(item.nested_key) or [item.key]
    for k in keys[:-1]:
        target = target.setdefault(k, {})
    target[keys[-1]] = json.loads(item.value_json)


def read_offline_run(run_dir_or_file: str, wait_s: float = 60.0) -> OfflineRun:
    """Config, history rows and summary of an offline run directory or ``.wandb`` file.

    ``wandb.finish()`` can return before W&B's service process has written the last records
    (seen on a loaded machine); a run whose file has no ``exit`` record yet is re-read for up
    to ``wait_s`` seconds, then returned as it is (``finished`` False).
    """
    deadline = time.monotonic() + wait_s
    while True:
        run = _read(run_dir_or_file)
        if run.finished or time.monotonic() > deadline:
            return run
        time.sleep(0.2)


def _read(run_dir_or_file: str) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2 as pb

    path = run_dir_or_file
    if os.path.isdir(path):
        files = glob.glob(os.path.join(path, "*.wandb"))
        if not files:
            raise FileNotFoundError(f"no .wandb file in {path}")
        path = files[0]
    run = OfflineRun(path=path)
    for raw in _records(path):
        rec = pb.Record()
        try:
            rec.ParseFromString(raw)
        except Exception:  # a record still being written: the rest is not there yet
            break
        kind = rec.WhichOneof("record_type")
        if kind == "exit":
            run.finished = True
        if kind == "run":
            run.run_id, run.name, run.group = rec.run.run_id, rec.run.display_name, rec.run.run_group
            run.project = rec.run.project or None
            run.tags = list(rec.run.tags)
            for item in rec.run.config.update:
                _set_nested(run.config, item)
        elif kind == "config":
            for item in rec.config.update:
                _set_nested(run.config, item)
        elif kind == "history":
            run.history.append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            for item in rec.summary.update:
                _set_nested(run.summary, item)
    # W&B stores config values as {"value": v}
    run.config = {k: (v["value"] if isinstance(v, dict) and set(v) == {"value"} else v)
                  for k, v in run.config.items()}
    return run


def find_offline_runs(save_dir: str) -> list[str]:
    """Offline run directories under ``save_dir`` (``<save_dir>/wandb/offline-run-*``), oldest first."""
    return sorted(glob.glob(os.path.join(save_dir, "wandb", "offline-run-*")))
