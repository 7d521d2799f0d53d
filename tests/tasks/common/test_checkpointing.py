"""Atomic checkpoint writes, loading that never runs code, and the saved random streams."""
from __future__ import annotations

import pathlib
import random
import types

import numpy as np
import pytest
import torch

from rescale_tasks.common.checkpointing import (AtomicCheckpointIO, CheckpointError, ResumeState,
                                                safe_load)


def test_save_is_atomic_when_the_writer_crashes(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    target = tmp_path / "ckpts" / "last.ckpt"
    io.save_checkpoint({"step": torch.tensor(1)}, target)
    good = target.read_bytes()

    def crash(obj, handle, *a, **k):  # a partial write, then the process "dies"
        handle.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"step": torch.tensor(2)}, target)
    assert target.read_bytes() == good  # the old checkpoint is intact
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]  # no temp file left
    monkeypatch.undo()
    assert int(io.load_checkpoint(target)["step"]) == 1


def test_next_save_removes_temps_of_killed_writers(tmp_path):
    """A writer killed (SIGKILL) mid-save leaves ``last.ckpt.tmp-<pid>``; the next save deletes
    it when that process is gone, and leaves a live writer's temp alone."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    target = tmp_path / "last.ckpt"
    stale, live = target.with_name(f"last.ckpt.tmp-{dead}"), target.with_name("last.ckpt.tmp-1")
    other = target.with_name(f"best.ckpt.tmp-{dead}")  # another file's temp: not ours to judge
    for p in (stale, live, other):
        p.write_bytes(b"half a checkpoint")
    AtomicCheckpointIO().save_checkpoint({"step": torch.tensor(1)}, target)
    assert not stale.exists() and live.exists() and other.exists()  # pid 1 always runs
    assert int(safe_load(target)["step"]) == 1


class _Payload:
    """Unpickling this would create a file: stands in for arbitrary code in a checkpoint."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def test_loading_never_runs_code_from_the_file(tmp_path):
    marker = tmp_path / "code-ran"
    bad = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "x": _Payload(str(marker))}, bad)
    with pytest.raises(CheckpointError, match="refusing to load .*evil.ckpt"):
        AtomicCheckpointIO().load_checkpoint(bad)
    assert not marker.exists()


def test_truncated_and_missing_checkpoints_are_one_line_errors(tmp_path):
    path = tmp_path / "last.ckpt"
    torch.save({"w": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(CheckpointError, match="corrupt or truncated") as err:
        safe_load(path)
    assert "\n" not in str(err.value)
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        safe_load(tmp_path / "nope.ckpt")


def test_random_streams_round_trip_through_a_weights_only_checkpoint(tmp_path):
    state = ResumeState()
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    saved = state.state_dict()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    AtomicCheckpointIO().save_checkpoint({"callbacks": {"ResumeState": saved}}, tmp_path / "c.ckpt")
    loaded = safe_load(tmp_path / "c.ckpt")["callbacks"]["ResumeState"]

    torch.manual_seed(99), np.random.seed(99), random.seed(99)
    restored = ResumeState()
    restored.load_state_dict(loaded)
    restored.on_train_start(types.SimpleNamespace(fit_loop=None), None)  # back when training starts
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0])
    assert np.array_equal(expected[1], again[1]) and expected[2] == again[2]


class _BlowsUp(__import__("lightning").pytorch.LightningModule):
    """A linear model whose loss turns non-finite from step 3 on."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        return loss * float("inf") if self.global_step >= 3 else loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(64, 4))
        return torch.utils.data.DataLoader(data, batch_size=4)


def test_last_checkpoint_is_never_a_diverged_model(tmp_path):
    import lightning.pytorch as L

    from rescale_tasks.common.callbacks import DivergenceMonitor
    from rescale_tasks.common.checkpointing import LastCheckpoint

    last = LastCheckpoint(every_n_train_steps=1)
    trainer = L.Trainer(default_root_dir=tmp_path, max_steps=10, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, accelerator="cpu",
                        callbacks=[last, DivergenceMonitor(check_every_n_steps=5, raise_error=False)],
                        plugins=[AtomicCheckpointIO()])
    trainer.fit(_BlowsUp())
    saved = safe_load(last.saved_path)
    assert saved["global_step"] == 3  # the last finite state; the deferred check ran before each save
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values())
