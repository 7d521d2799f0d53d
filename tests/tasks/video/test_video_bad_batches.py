"""Bad videos never end an epoch, also when a whole batch is bad: a zero-byte mp4 and a text file
renamed ``.avi`` land in the same batch of two, which is then no step (``rescale_tasks.common.
empty_batches``), through the `rescale` CLI with every callback of a real run, in one process and in
two (gloo DDP, the bad batch on one rank only). Three epochs put the bad batch first, in the middle
and last, with gradient accumulation over two batches (so it opens a window, closes one, and is a
window alone). Before the fix a single process ended in ``KeyError: 'loss'`` (divergence monitor)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_video_cli import tiny_config

from rescale_tasks.cli import main
from rescale_tasks.common.data import ResumableSampler
from wandb_runs import find_offline_runs, read_offline_run

BAD = ("zz_empty.mp4", "zz_notes.avi")
EPOCHS = 3  # the bad batch is batch 0, 1, 2 of epochs 0, 1, 2 (first, middle, last)


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def bad_tree(clips, tmp_path: Path, good: int) -> tuple[Path, list[int]]:
    """The class-folder layout with ``good`` training clips (taken round the classes, copied again
    under new names past the nine there are) and the two bad files; returns the root and the
    training indices of the bad files (the layout's scan order: classes, then names)."""
    root = tmp_path / "tree"
    shutil.copytree(clips.root / "val", root / "val")
    by_class = [[(name, cls) for name, cls in clips.train if cls == c] for c in clips.classes]
    ring = [item for group in zip(*by_class) for item in group]
    for i in range(good):
        name, cls = ring[i % len(ring)]
        (root / "train" / cls).mkdir(parents=True, exist_ok=True)
        shutil.copy(clips.root / "train" / cls / name, root / "train" / cls / f"{i // len(ring)}_{name}")
    folder = root / "train" / clips.classes[0]
    (folder / BAD[0]).write_bytes(b"")
    (folder / BAD[1]).write_text("these are notes, not a video\n")
    paths = sorted((p for p in (root / "train").rglob("*") if p.is_file()), key=lambda p: (p.parent.name, p.name))
    return root, [i for i, p in enumerate(paths) if p.name in BAD]


def seed_for(n: int, bad: list[int], world: int, batch: int = 2) -> int:
    """A data seed whose epoch e (0, 1, 2) holds both bad files in batch e of one rank.

    DistributedSampler draws epoch e's order with the seed ``seed + e``: one pass over the
    orders finds a seed; the data module's own sampler then confirms it."""
    pair, step, candidates = set(bad), world * batch, 40_000
    batch_of = []  # for each drawing seed: which batch holds the pair on one rank (-1: none)
    for s in range(candidates + EPOCHS):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(s)).tolist()
        found = [b for b in range(n // step) for r in range(world)
                 if set(order[b * step + r:(b + 1) * step:world]) == pair]
        batch_of.append(found[0] if found else -1)
    seed = next(s for s in range(candidates) if all(batch_of[s + e] == e for e in range(EPOCHS)))
    for epoch in range(EPOCHS):  # the sampler the run uses agrees
        shards = []
        for rank in range(world):
            sampler = ResumableSampler(range(n), seed=seed, num_replicas=world, rank=rank)
            sampler.set_epoch(epoch)
            shards.append(sampler.indices()[epoch * batch:(epoch + 1) * batch])
        assert any(set(shard) == pair for shard in shards)
    return seed


def _fit_args(config: Path, seed: int) -> list[str]:
    return ["fit", "--config", str(config), "--data.seed", str(seed), "--trainer.max_epochs", str(EPOCHS),
            "--trainer.accumulate_grad_batches", "2", "--trainer.limit_val_batches", "0"]


def test_a_batch_of_bad_videos_is_no_step_in_one_process(kinetics_clips, tmp_path):
    root, bad = bad_tree(kinetics_clips, tmp_path, good=4)
    n = 4 + len(BAD)  # three batches of two per epoch
    seed = seed_for(n, bad, world=1)
    config = tiny_config(tmp_path / "tiny.yaml", kinetics_clips, root=root)
    with pytest.warns(UserWarning, match=r"data problems: 2 file\(s\) \(unreadable 2\): 2 skipped; the files") \
            as warned:
        assert main(_fit_args(config, seed)) == 0
    assert not [w for w in warned if "short" in str(w.message)]  # no kind that did not occur
    [run] = [read_offline_run(d) for d in find_offline_runs("runs")]
    assert run.summary["data/unreadable"] == 2
    [summary] = [json.loads(p.read_text()) for p in Path("runs").rglob("run_summary.json")]
    # three batches in windows of two: two steps per epoch (the bad batch alone in its window counts)
    assert summary["status"] == "finished" and summary["steps"] == EPOCHS * 2


@pytest.mark.ddp
def test_a_batch_of_bad_videos_on_one_rank_is_no_step_on_either(kinetics_clips, tmp_path, rescale_processes):
    """Two processes: 12 videos, three batches of two per rank and epoch, both bad files in one
    batch of one rank: all ranks take the zero step together, none waits for another."""
    root, bad = bad_tree(kinetics_clips, tmp_path, good=10)
    n = 10 + len(BAD)
    seed = seed_for(n, bad, world=2)
    config = tiny_config(tmp_path / "tiny.yaml", kinetics_clips, root=root)
    done = rescale_processes(_fit_args(config, seed) + ["--trainer.logger", "false", "--trainer.log_every_n_steps", "1",
                                                        "--trainer.default_root_dir", str(tmp_path / "ddp")], 2)
    assert "Traceback" not in done.stderr and "data problems: 2 file(s) (unreadable 2): 2 skipped;" in done.stderr
    [ckpt] = sorted((tmp_path / "ddp").rglob("last.ckpt"))
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert state["epoch"] == EPOCHS - 1 and state["global_step"] == EPOCHS * 2  # 3 batches, windows of 2
    # the skipped batch's zero loss (what the ranks step on together) is no point of the loss curve
    [summary] = [json.loads(p.read_text()) for p in (tmp_path / "ddp").rglob("run_summary.json")]
    curve = summary["curves"]["train/loss"]
    assert curve and all(loss > 0 for _, loss in curve), curve
