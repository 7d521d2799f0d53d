"""What a test's offline W&B run received, read by W&B's own reader of its run files.

The suite never reads W&B's binary run files (``rescale compare`` reads the ``run_summary.json``
beside them; ``wandb sync`` uploads them). Tests that check what was logged ask W&B's record
inspector (``wandb leet inspect --json``, part of the installed wandb) for the records of
``offline-run-*/run-*.wandb`` and keep the run's identity, config, history rows and summary.
"""
from __future__ import annotations

import glob
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

import forked

__all__ = ["OfflineRun", "read_offline_run", "find_offline_runs"]

# the W&B command line of the interpreter running the tests (its wandb is the one that wrote the runs),
# forked from the suite's zygote (tests/forked.py), which has imported W&B
WANDB = [sys.executable, "-m", "wandb"]
_NUMBERS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}  # how the inspector spells them


@dataclass
class OfflineRun:
    """One offline W&B run as its records say."""

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


def _value(value):
    if isinstance(value, str):
        return _NUMBERS.get(value, value)
    if isinstance(value, dict):
        return {k: _value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_value(v) for v in value]
    return value


def _media_keys(item: dict) -> dict:
    """A logged media object or table (``key._type``, ``key.path`` ... in the inspector's rows) as
    the ``key/_type``, ``key/path`` ... keys W&B's history shows; other keys as they are."""
    media = {key[:-len("._type")] for key in item if key.endswith("._type")}
    out = {}
    for key, value in item.items():
        head = next((m for m in media if key.startswith(m + ".")), None)
        out[f"{head}/{key[len(head) + 1:]}" if head else key] = value
    return out


def _records(path: str) -> list[dict]:
    done = forked.run([*WANDB, "leet", "inspect", "--json", path], capture_output=True, text=True,
                      timeout=120, env={**os.environ, "WANDB_SILENT": "true"})
    if done.returncode != 0:
        raise RuntimeError(f"wandb leet inspect {path} failed: {done.stderr.strip() or done.stdout.strip()}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _read(path: str) -> OfflineRun:
    files = glob.glob(os.path.join(path, "*.wandb")) if os.path.isdir(path) else [path]
    if not files:
        raise FileNotFoundError(f"no .wandb file in {path}")
    run = OfflineRun(path=files[0])
    for record in _records(files[0]):
        kind = record.get("type")
        body = _value(record.get(kind) or {})
        if kind == "exit":
            run.finished = True
        elif kind == "run":
            run.run_id, run.name, run.group = body.get("run_id"), body.get("display_name"), body.get("run_group")
            run.project = body.get("project") or None
            run.tags = list(body.get("tags") or [])
            run.config.update((body.get("config") or {}).get("update") or {})
        elif kind == "config":
            run.config.update(body.get("update") or {})
        elif kind == "history":
            run.history.append(_media_keys(body.get("item") or {}))
        elif kind == "summary":
            run.summary.update(_media_keys(body.get("update") or {}))
    return run


def read_offline_run(run_dir_or_file: str, wait_s: float = 60.0) -> OfflineRun:
    """Config, history rows and summary of an offline run directory or ``.wandb`` file.

    ``wandb.finish()`` can return before W&B's service process has written the last records
    (seen on a loaded machine); a run whose file has no ``exit`` record yet is read again for up
    to ``wait_s`` seconds, then returned as it is (``finished`` False).
    """
    deadline = time.monotonic() + wait_s
    while True:
        run = _read(run_dir_or_file)
        if run.finished or time.monotonic() > deadline:
            return run
        time.sleep(0.5)


def find_offline_runs(save_dir: str) -> list[str]:
    """Offline run directories under ``save_dir`` (``<save_dir>/wandb/offline-run-*``), oldest first:
    by the start time in the name, then the count W&B appends to the name of a run started in the
    same second as another of the same id (``offline-run-<time>-<id>-1`` after ``...-<id>``)."""
    runs = glob.glob(os.path.join(save_dir, "wandb", "offline-run-*"))

    def started(path: str) -> tuple[str, int]:
        base, _, count = path.rpartition("-")
        return (base, int(count)) if count.isdigit() and base in runs else (path, 0)
    return sorted(runs, key=started)
