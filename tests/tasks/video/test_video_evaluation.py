"""Multi-view evaluation at Kinetics scale (rescale_tasks.video.evaluation): known answers, the
memory of 20k test videos x 10 clips x 3 crops measured on synthetic logits, and two gloo processes
that reduce their sums onto rank 0 (no gather of every view onto every rank) to what one computes."""
from __future__ import annotations

import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rescale_tasks.common.data import UnrepeatedSampler
from rescale_tasks.common.errors import DataError
from rescale_tasks.video.evaluation import MultiViewAccuracy


def _items(rows):
    """``[(video, clip, label, probs per class, loss)]`` -> update arguments, 3 identical crops each."""
    probs = torch.tensor([p for *_, p, _ in rows]).unsqueeze(1).repeat(1, 3, 1)
    columns = list(zip(*rows))
    return (probs, torch.tensor(columns[2]), torch.tensor(columns[0]), torch.tensor(columns[1]),
            torch.tensor(columns[4], dtype=torch.float64))


def test_video_and_clip_accuracy_average_the_views_of_each_video():
    """Video 0: its 2 clips disagree, their mean picks class 1 (right); video 1: wrong. A clip met
    again in a later batch counts once."""
    metric = MultiViewAccuracy()
    metric.update(*_items([(0, 0, 1, [0.6, 0.4, 0.0], 3.0), (1, 0, 2, [0.5, 0.3, 0.2], 6.0)]))
    metric.update(*_items([(0, 1, 1, [0.0, 0.9, 0.1], 0.0), (0, 0, 1, [0.6, 0.4, 0.0], 3.0)]))
    metrics = metric.compute()
    assert metrics["acc1"] == 0.5 and metrics["acc5"] == 1.0
    assert metrics["clip_acc1"] == pytest.approx(3 / 9) and (metrics["videos"], metrics["views"]) == (2, 9)
    assert metrics["loss"] == pytest.approx(9.0 / 9)
    assert metric.nbytes() < 100  # spent: reset for the next evaluation


def test_20k_videos_x_10_clips_x_3_crops_stay_under_100_mb():
    """Kinetics-400's test protocol on synthetic logits (400 classes; the label's logit raised in
    the even clips): what the evaluation holds, measured after the last view."""
    videos, clips, crops, classes, batch = 20_000, 10, 3, 400, 2_000
    metric = MultiViewAccuracy()
    generator = torch.Generator().manual_seed(0)
    start, peak = time.perf_counter(), 0
    for first in range(0, videos * clips, batch):  # items in dataset order: video-major
        item = torch.arange(first, first + batch)
        video, clip = item // clips, item % clips
        label = video % classes
        logits = torch.randn(batch, crops, classes, generator=generator)
        logits[torch.arange(batch), :, label] += 10.0 * (clip % 2 == 0).unsqueeze(1)
        metric.update(logits.softmax(-1), label, video, clip, torch.ones(batch, dtype=torch.float64))
        peak = max(peak, metric.nbytes())
    print(f"multi-view evaluation of {videos} videos x {clips} x {crops} views, {classes} classes: "
          f"{peak / 2**20:.1f} MB held, {time.perf_counter() - start:.1f} s")
    assert peak < 100 * 2**20
    metrics = metric.compute()
    assert (metrics["videos"], metrics["views"]) == (videos, videos * clips * crops)
    assert metrics["acc1"] == 1.0 and metrics["clip_acc1"] == pytest.approx(0.5, abs=0.01)  # half carry the label


def _worker(rank: int, port: int, items: tuple, out: dict, repeat: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        def forbidden(*args, **kwargs):
            raise AssertionError("the evaluation gathered records onto every rank")

        dist.all_gather_object = dist.all_gather = forbidden
        probs, labels, videos, clips, losses = items
        sampler = UnrepeatedSampler(range(len(labels)), num_replicas=2, rank=rank)
        mine = torch.tensor(list(sampler))
        if repeat and rank == 1:
            mine = torch.cat([mine, torch.tensor([0])])  # a padding sampler's repeat
        metric = MultiViewAccuracy()
        metric.update(probs[mine], labels[mine], videos[mine], clips[mine], losses[mine])
        try:
            out[rank] = metric.compute()
        except DataError as err:
            out[rank] = str(err)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.ddp
def test_two_processes_reduce_their_sums_to_what_one_computes():
    """Two gloo processes, each with its contiguous chunk of 13 videos x 4 clips (a video's clips
    split between them): all_gather is forbidden, rank 0 computes, both log the same numbers,
    equal to one process's. An item given to both (a padding sampler) is one clear error."""
    generator = torch.Generator().manual_seed(1)
    n, crops, classes = 13 * 4, 3, 7
    items = (torch.randn(n, crops, classes, generator=generator).softmax(-1),
             torch.randint(0, classes, (13,), generator=generator).repeat_interleave(4),
             torch.arange(n) // 4, torch.arange(n) % 4, torch.rand(n, generator=generator, dtype=torch.float64))
    one = MultiViewAccuracy()
    one.update(*items)
    expected = one.compute()
    context = mp.get_context("fork")
    for repeat in (False, True):
        with context.Manager() as manager:
            out = manager.dict()
            workers = [context.Process(target=_worker, args=(r, port, items, out, repeat))
                       for port in [_free_port()] for r in range(2)]
            for w in workers:
                w.start()
            for w in workers:
                w.join(60)
            assert [w.exitcode for w in workers] == [0, 0]
            results = dict(out)
        if not repeat:
            assert results[0] == results[1] and results[0] == pytest.approx(expected)
        else:
            assert results[0] == results[1] and "1 evaluation item(s) (video, clip) reached more than one" in results[0]


def test_the_evaluation_sampler_deals_each_item_once_in_contiguous_chunks():
    chunks = [list(UnrepeatedSampler(range(10), num_replicas=4, rank=r)) for r in range(4)]
    assert sum(chunks, []) == list(range(10)) and {len(c) for c in chunks} == {2, 3}
    assert [len(UnrepeatedSampler(range(10), num_replicas=4, rank=r)) for r in range(4)] == [len(c) for c in chunks]
    with pytest.raises(Exception, match="2 item\\(s\\) for 3 processes"):
        UnrepeatedSampler(range(2), num_replicas=3, rank=0)


def test_a_sharded_strategys_padded_items_are_run_but_counted_nowhere():
    """Under FSDP the evaluation split is padded so every rank runs the same forwards
    (common.data.eval_sampler); the batch's mask leaves the padding out: the metrics of a batch
    with a padded item are those of its real items alone (before, MultiViewAccuracy refused the
    repeated item, or counted it where the repeat was of another rank's)."""
    from rescale_tasks.video.module import VideoClassificationModule

    torch.manual_seed(0)
    module = VideoClassificationModule("r3d_18", "skipinit", network_options={"base_width": 4}, num_classes=3).eval()
    clips, labels = torch.randn(3, 3, 4, 16, 16), torch.tensor([0, 1, 2])
    videos, clip_ids = torch.tensor([0, 1, 2]), torch.tensor([0, 0, 0])
    with torch.no_grad():
        module.evaluate_batch((clips, labels, videos, clip_ids, torch.tensor([True, True, False])), "val")
        padded = module.evaluation.compute()
        module.evaluate_batch((clips[:2], labels[:2], videos[:2], clip_ids[:2]), "val")
        real = module.evaluation.compute()
    assert padded == real and padded["videos"] == 2
