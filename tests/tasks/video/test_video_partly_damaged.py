"""A video whose first clips decode and a later one does not is dropped whole from the evaluation:
the data report counts it as skipped, so `test`, `validate` and `predict` score it on none of its
views (not on the ones that happened to decode first), in one process as under DDP."""
from __future__ import annotations

import functools
import os
import socket

import lightning as L
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from rescale_tasks.common.data import UnrepeatedSampler

from rescale_tasks.video.dataset import VideoClipDataset, collate_drop_none
from rescale_tasks.video.evaluation import MultiViewAccuracy
from rescale_tasks.video.module import VideoClassificationModule
from rescale_tasks.video.transforms import eval_transform


def test_a_dropped_video_counts_in_no_number():
    """Video 1 was dropped after one clip was counted: video- and clip-level numbers, the loss and
    the view count are video 0's alone, and `videos()` gives no row for it."""
    metric = MultiViewAccuracy()
    probs = torch.tensor([[[0.1, 0.9]], [[0.9, 0.1]]])
    metric.update(probs, torch.tensor([1, 1]), torch.tensor([0, 1]), torch.tensor([0, 0]),
                  torch.tensor([1.0, 5.0], dtype=torch.float64))
    metric.drop(torch.tensor([False, True, False]))
    assert metric.compute() == pytest.approx({"acc1": 1.0, "acc5": 1.0, "clip_acc1": 1.0, "clip_acc5": 1.0,
                                              "loss": 1.0, "videos": 1.0, "views": 1.0})
    metric.update(probs, torch.tensor([1, 1]), torch.tensor([0, 1]), torch.tensor([0, 0]),
                  torch.tensor([1.0, 5.0], dtype=torch.float64))
    metric.drop(torch.tensor([False, True]))
    video, _, _, views = metric.videos()
    assert video.tolist() == [0] and views.tolist() == [1]


def _drop_on_rank_one(rank: int, port: int, items: tuple, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mine = torch.tensor(list(UnrepeatedSampler(range(len(items[1])), num_replicas=2, rank=rank)))
        metric = MultiViewAccuracy()
        metric.update(*(t[mine] for t in items))
        if rank == 1:  # the rank whose clip of video 6 failed; rank 0 counted its first clips
            metric.drop(torch.arange(13) == 6)
        out[rank] = metric.compute()
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_a_video_one_rank_dropped_is_left_out_on_every_rank():
    """13 videos x 4 clips over two gloo processes, video 6's clips split between them: the rank that
    met its failing clip drops it, and both report what one process without video 6 reports."""
    generator = torch.Generator().manual_seed(2)
    n, classes = 13 * 4, 5
    items = (torch.randn(n, 2, classes, generator=generator).softmax(-1),
             torch.randint(0, classes, (13,), generator=generator).repeat_interleave(4),
             torch.arange(n) // 4, torch.arange(n) % 4, torch.rand(n, generator=generator, dtype=torch.float64))
    kept = items[2] != 6
    one = MultiViewAccuracy()
    one.update(*(t[kept] for t in items))
    expected = one.compute()
    context = mp.get_context("fork")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with context.Manager() as manager:
        out = manager.dict()
        workers = [context.Process(target=_drop_on_rank_one, args=(r, port, items, out)) for r in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        assert [w.exitcode for w in workers] == [0, 0]
        assert out[0] == out[1] == pytest.approx(expected) and expected["videos"] == 12


def test_a_video_damaged_after_its_first_clips_is_left_out_of_the_test(kinetics_clips, b_frame_clips, tmp_path):
    _, damage = b_frame_clips
    good = kinetics_clips.folder_paths("train")[-1]  # 40 frames
    damaged = damage(kinetics_clips.video_dir / kinetics_clips.train[-1][0], tmp_path / "damaged.mp4", 0.2)
    tiny = kinetics_clips.tiny
    dataset = VideoClipDataset([(good, 0), (str(damaged), 1)], "test", frames=tiny["frames"], stride=tiny["stride"],
                               num_clips=10, num_crops=1, transform=eval_transform(tiny["test_short_side"],
                                                                                    tiny["crop"], 1))
    decoded = [dataset[10 + clip] is not None for clip in range(10)]
    assert any(decoded) and not all(decoded)  # the case: some clips of the damaged video decode
    dataset.status.zero_()
    loader = DataLoader(dataset, batch_size=5, collate_fn=functools.partial(collate_drop_none,
                                                                            clip_shape=(1, 3, 4, 32, 32)))
    model = VideoClassificationModule("r3d_18", "bn", num_classes=2, network_options={"base_width": 4})
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    metrics = trainer.test(model, dataloaders=loader, verbose=False)[0]
    assert dataset.problems() == {"unreadable": 1}
    assert (metrics["test/videos"], metrics["test/views"]) == (1.0, 10.0)


def test_a_short_video_once_dropped_stays_dropped(kinetics_clips):
    """A later clip of a short video that decodes (repaired by looping) does not take back the drop."""
    dataset = VideoClipDataset([(str(kinetics_clips.bad["short"]), 0)], "test", frames=4, stride=2, num_clips=2)
    dataset._record(0, "unreadable", "damaged")
    dataset._record(0, "short_loop", "5 frames")
    assert dataset.problems() == {"unreadable": 1} and dataset.dropped().tolist() == [True]
