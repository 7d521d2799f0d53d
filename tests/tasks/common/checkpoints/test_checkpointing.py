"""Atomic checkpoint writes, loading that never runs code, and the saved random streams."""
from __future__ import annotations

import pathlib
import random
import types

import numpy as np
import pytest
import torch

import forked
from rescale_tasks.common.checkpoints import AtomicCheckpointIO, CheckpointError, ResumeState, safe_load


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
    """A writer killed (SIGKILL) mid-save leaves ``<file>.ckpt.tmp-<pid>``; the next save in the
    folder deletes every such temp whose process is gone (also another file's: the resumed run may
    never write a killed step checkpoint again), and leaves a live writer's temp alone."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    target = tmp_path / "last.ckpt"
    stale, live = target.with_name(f"last.ckpt.tmp-{dead}"), target.with_name("last.ckpt.tmp-1")
    other = target.with_name(f"step=014.ckpt.tmp-{dead}")  # a killed step checkpoint's temp
    for p in (stale, live, other):
        p.write_bytes(b"half a checkpoint")
    AtomicCheckpointIO().save_checkpoint({"step": torch.tensor(1)}, target)
    assert not stale.exists() and not other.exists() and live.exists()  # pid 1 always runs
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
    with pytest.raises(CheckpointError) as err:  # the run's folder given for its checkpoint
        safe_load(tmp_path)
    assert str(err.value) == (f"checkpoint {tmp_path} (--ckpt_path) is a folder. Pass the path of a .ckpt file, "
                              f"e.g. {path}")
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError) as err:  # torch's own text names a private save option
        safe_load(tmp_path / "notes.ckpt", mmap=True)
    assert f"(not a checkpoint file torch can read); no other checkpoint in {tmp_path} can be read" in str(err.value)
    for garbage in (b"Delete\nSave changes\n", b"\x80\x02garbage"):  # read whole: it said the text held code
        (tmp_path / "notes.ckpt").write_bytes(garbage)
        with pytest.raises(CheckpointError) as err:
            safe_load(tmp_path / "notes.ckpt")
        assert str(err.value).startswith(f"checkpoint {tmp_path / 'notes.ckpt'} is corrupt or truncated (not a "
                                         "checkpoint file torch can read); "), err.value


def test_a_truncated_checkpoint_names_the_newest_readable_one_beside_it(tmp_path):
    """A node died while ``last.ckpt`` was copied: the line names the newest checkpoint beside it
    that reads (a truncated newer one skipped) to pass instead, and leaves every file as it is."""
    import os

    writer = AtomicCheckpointIO()
    for step, name in enumerate(["epoch000.ckpt", "epoch001.ckpt", "epoch002.ckpt", "last.ckpt"]):
        writer.save_checkpoint({"state_dict": {"w": torch.full((100,), float(step))}, "global_step": 2 * step},
                               tmp_path / name)
        os.utime(tmp_path / name, (1_000_000 + step, 1_000_000 + step))  # written in this order
    for name in ("epoch002.ckpt", "last.ckpt"):
        (tmp_path / name).write_bytes((tmp_path / name).read_bytes()[:200])
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(CheckpointError) as err:
        safe_load(tmp_path / "last.ckpt")
    good = tmp_path / "epoch001.ckpt"
    assert str(err.value).endswith(f"; the newest readable checkpoint beside it is {good} (step 2): pass --ckpt_path "
                                   f"{good} (this file is left as it is)"), err.value
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


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

    from rescale_tasks.common.checkpoints import LastCheckpoint
    from rescale_tasks.common.training import DivergenceMonitor

    last = LastCheckpoint(every_n_train_steps=1)
    trainer = L.Trainer(default_root_dir=tmp_path, max_steps=10, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, accelerator="cpu",
                        callbacks=[last, DivergenceMonitor(check_every_n_steps=5, raise_error=False)],
                        plugins=[AtomicCheckpointIO()])
    trainer.fit(_BlowsUp())
    saved = safe_load(last.saved_path)
    assert saved["global_step"] == 3  # the last finite state; the deferred check ran before each save
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values())


# --- remote checkpoint folders (fsspec URLs), on fsspec's in-process memory:// filesystem ---

@pytest.fixture
def memory_dir(tmp_path, monkeypatch):
    """A fresh ``memory://`` folder, removed afterwards; the working directory is ``tmp_path``, so
    a URL mistaken for a local path (a ``memory:`` folder) would show up there."""
    import uuid

    import fsspec

    monkeypatch.chdir(tmp_path)
    name = f"rescale-test-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    yield f"memory://{name}"
    if fs.exists(f"/{name}"):
        fs.rm(f"/{name}", recursive=True)


def _memory_files(url: str) -> list[str]:
    import fsspec

    fs = fsspec.filesystem("memory")
    return sorted(p.rsplit("/", 1)[-1] for p in fs.find(url))


def test_remote_checkpoints_save_load_and_remove_through_fsspec(memory_dir, tmp_path):
    io = AtomicCheckpointIO()
    url = f"{memory_dir}/ckpts/a.ckpt"
    saved = {"step": torch.tensor(7), "w": torch.randn(3, 2)}
    io.save_checkpoint(saved, url)
    assert _memory_files(memory_dir) == ["a.ckpt"]
    assert list(tmp_path.iterdir()) == []  # nothing written to the local disk
    loaded = io.load_checkpoint(url)
    assert int(loaded["step"]) == 7 and torch.equal(loaded["w"], saved["w"])
    io.remove_checkpoint(url)
    assert _memory_files(memory_dir) == []


def test_remote_storage_options_reach_the_filesystem_and_are_refused_for_local_files(memory_dir, tmp_path,
                                                                                     monkeypatch):
    import rescale_tasks.common.checkpoints.files as checkpointing

    seen = []
    real = checkpointing.get_filesystem
    monkeypatch.setattr(checkpointing, "get_filesystem", lambda path, **kw: seen.append(kw) or real(path, **kw))
    url = f"{memory_dir}/b.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": torch.tensor(1)}, url, storage_options={"skip_instance_cache": True})
    assert {"skip_instance_cache": True} in seen and int(safe_load(url)["step"]) == 1
    with pytest.raises(CheckpointError, match="storage_options apply to remote .* local file") as err:
        AtomicCheckpointIO().save_checkpoint({}, tmp_path / "c.ckpt", storage_options={"anon": True})
    assert "\n" not in str(err.value)


def test_missing_and_truncated_remote_checkpoints_are_one_line_errors(memory_dir):
    import fsspec

    missing = f"{memory_dir}/ckpts/last.ckpt"
    with pytest.raises(CheckpointError, match=f"checkpoint not found: {missing}") as err:
        AtomicCheckpointIO().load_checkpoint(missing)
    assert "\n" not in str(err.value)
    AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(1000)}, missing)
    fs = fsspec.filesystem("memory")
    fs.pipe_file(missing, fs.cat_file(missing)[:300])
    with pytest.raises(CheckpointError, match="corrupt or truncated") as err:
        safe_load(missing)
    assert "\n" not in str(err.value)


def test_remote_loading_never_runs_code_from_the_file(memory_dir, tmp_path):
    import fsspec

    marker = tmp_path / "code-ran"
    url = f"{memory_dir}/evil.ckpt"
    with fsspec.open(url, "wb") as handle:
        torch.save({"state_dict": {}, "x": _Payload(str(marker))}, handle)
    with pytest.raises(CheckpointError, match=f"refusing to load {url}"):
        AtomicCheckpointIO().load_checkpoint(url)
    assert not marker.exists()


def test_peek_reads_the_run_id_of_a_remote_checkpoint(memory_dir):
    """``--ckpt_path memory://.../last.ckpt`` continues the W&B run: the CLI peeks at the run id."""
    import fsspec

    from rescale_tasks.common.checkpoints import peek_checkpoint

    url = f"{memory_dir}/last.ckpt"

    def write(state):  # straight to the store, as another process's upload would
        with fsspec.open(url, "wb") as handle:
            torch.save(state, handle)

    write({"hyper_parameters": {"network": "rescale18"}, "callbacks": {"ResumeState": {"run_id": "abc123"}}})
    info = peek_checkpoint(url)
    assert info.run_id == "abc123" and info.hyper_parameters == {"network": "rescale18"}
    write({"callbacks": {"ResumeState": {"run_id": "def456"}}})
    assert peek_checkpoint(url).run_id == "def456"  # a rewritten file is read again


def test_cli_checks_a_remote_checkpoint_against_the_configured_network(memory_dir):
    """Lightning's CLI reads hyper-parameters from local checkpoints only; ours checks remote ones too."""
    from rescale_tasks.common.checkpoints import check_config_against_checkpoint
    from rescale_tasks.common.errors import ConfigError

    import fsspec

    url, module = f"{memory_dir}/last.ckpt", "rescale_tasks.classification.module.ImageClassifier"
    with fsspec.open(url, "wb") as handle:
        torch.save({"hyper_parameters": {"_class_path": module, "network": "rescale18"}}, handle)
    check_config_against_checkpoint({"class_path": module, "init_args": {"network": "rescale18"}}, url)
    with pytest.raises(ConfigError, match=f"checkpoint {url} was saved from network=rescale18"):
        check_config_against_checkpoint({"class_path": module, "init_args": {"network": "rescale50"}}, url)


class _Steady(__import__("lightning").pytorch.LightningModule):
    """A linear model on fixed data, 4 steps an epoch, SGD with momentum (optimizer state matters)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)

    def on_train_start(self):
        self.start_step = self.global_step

    def training_step(self, batch, batch_idx):
        return (self.layer(batch[0]) - batch[1]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(1)
        data = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))
        return torch.utils.data.DataLoader(data, batch_size=4)


def test_fit_writes_last_checkpoint_to_a_remote_folder_and_resumes_from_it(memory_dir, tmp_path):
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from rescale_tasks.common.checkpoints import LastCheckpoint

    def fit(max_epochs, ckpt_path=None, root=memory_dir):
        model = _Steady()
        trainer = L.Trainer(default_root_dir=root, max_epochs=max_epochs, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0,
                            callbacks=[ModelCheckpoint(dirpath=f"{root}/ckpts"), LastCheckpoint(), ResumeState()],
                            plugins=[AtomicCheckpointIO()])
        trainer.fit(model, ckpt_path=ckpt_path)
        return trainer, model

    first, _ = fit(1)
    last = f"{memory_dir}/ckpts/last.ckpt"
    assert next(cb for cb in first.callbacks if isinstance(cb, LastCheckpoint)).saved_path == last
    assert _memory_files(memory_dir) == ["epoch=0-step=4.ckpt", "last.ckpt"]
    assert list(tmp_path.iterdir()) == []  # no local "memory:" folder
    assert safe_load(last)["global_step"] == 4

    resumed, model = fit(2, ckpt_path=last)
    assert model.start_step == 4 and resumed.global_step == 8 and safe_load(last)["global_step"] == 8
    _, straight = fit(2, root=str(tmp_path / "straight"))
    for name, value in straight.state_dict().items():  # weights and momentum restored from memory://
        assert torch.equal(model.state_dict()[name], value), name


def test_the_cli_writes_and_resumes_a_run_in_a_remote_folder(memory_dir, tmp_path, monkeypatch, run_config,
                                                             suite_wandb_logger):
    """``--last_checkpoint.dirpath s3://...`` (here memory://): last.ckpt and the epoch checkpoints
    land in ``<dirpath>/<run id>/``, and ``--ckpt_path <that URL>`` resumes the same run."""
    from rescale_tasks.cli import main
    from rescale_tasks.common.run import find_summaries, read_summary

    monkeypatch.setenv("WANDB_MODE", "offline")
    config = run_config(tmp_path / "run.yaml", trainer={"logger": suite_wandb_logger("rescale-test", "remote"),
                                                        "log_every_n_steps": 1})
    assert main(["fit", "--config", config, "--last_checkpoint.dirpath", memory_dir]) == 0
    files = _memory_files(memory_dir)
    assert files == ["epoch000.ckpt", "last.ckpt"] and not list(tmp_path.glob("**/*.ckpt"))
    (summary,) = find_summaries("runs")
    first = read_summary(summary)
    last = first["checkpoint"]
    assert last == f"{memory_dir}/{first['run_id']}/last.ckpt"
    assert main(["fit", "--config", config, "--last_checkpoint.dirpath", memory_dir, "--ckpt_path", last,
                 "--trainer.max_epochs", "2"]) == 0
    (resumed,) = [read_summary(p) for p in find_summaries("runs") if p != summary]  # W&B: a new offline folder
    assert resumed["run_id"] == first["run_id"] and resumed["steps"] == 4  # the same run, 2 more steps
    assert [s for s, _ in resumed["curves"]["train/loss"]] == [1, 2, 3, 4]  # its summary covers all of it
    assert _memory_files(memory_dir) == ["epoch000.ckpt", "epoch001.ckpt", "last.ckpt"]


def test_a_checkpoint_that_cannot_be_written_is_one_line_naming_the_intact_one(tmp_path, run_config):
    """The disk fills while a run saves (here: a real ``rescale fit`` process whose files may not
    grow past half a checkpoint, so every write of one fails in the operating system as on a full
    disk): one line saying why, naming the last good checkpoint, which is untouched, and no
    temporary file left behind."""
    import os
    import resource
    import sys

    config = run_config(tmp_path / "run.yaml", trainer={"max_epochs": None, "max_steps": 2, "limit_val_batches": 0,
                                                        "num_sanity_val_steps": 0})
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "rescale_tasks.cli", "fit", "--config", config]
    first = forked.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    last = tmp_path / "checkpoints" / "last.ckpt"
    good = last.read_bytes()

    # in the child: writes past this size fail with EFBIG, as on a full disk with ENOSPC
    small_files = {"RLIMIT_FSIZE": (len(good) // 2, resource.RLIM_INFINITY)}
    full = forked.run([*command, "--ckpt_path", str(last), "--trainer.max_steps", "4"], cwd=tmp_path, env=env,
                      capture_output=True, text=True, timeout=300, rlimits=small_files)
    lines = [line for line in full.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert full.returncode == 2 and len(errors) == 1 and "Traceback" not in full.stderr, full.stderr[-3000:]
    assert errors[0].startswith(f"error: cannot write checkpoint {last}: File too large")
    assert f"the last good checkpoint, {last}, is intact" in errors[0]
    assert f"resume with --ckpt_path {last}" in errors[0]
    assert last.read_bytes() == good
    assert sorted(p.name for p in last.parent.iterdir()) == [".lock", "epoch000.ckpt", "last.ckpt"]  # the run's lock


def test_a_checkpoint_folder_turned_read_only_is_not_told_to_free_space(tmp_path):
    """A save failing with EROFS (the folder remounted read-only mid-run) said "free space"; it says
    to give another folder, as every other failed write; a full disk still says to free space."""
    import errno

    from rescale_tasks.common.checkpoints.files import _write_failed

    last = tmp_path / "last.ckpt"
    last.write_bytes(b"good")
    read_only = _write_failed(last, OSError(errno.EROFS, "Read-only file system"))
    assert read_only == (f"cannot write checkpoint {last}: Read-only file system ([Errno {errno.EROFS}]); the last "
                         f"good checkpoint, {last}, is intact: give last_checkpoint.dirpath a folder you can write "
                         f"and resume with --ckpt_path {last}")
    full = _write_failed(tmp_path / "none" / "last.ckpt", OSError(errno.ENOSPC, "No space left on device"))
    assert full.endswith("no checkpoint of this run had been written yet: free space (or set "
                         "last_checkpoint.dirpath to another disk) and start again")
