"""Detection's evaluation under a strategy that shards the parameters (FSDP): every forward gathers
the parameters of each FSDP unit from all ranks, so a rank whose evaluation batch lost every image
(``data.skip_corrupt``: the images were unreadable) still runs a forward, on a stand-in image whose
detections count nowhere, and the other ranks do not wait for it forever.

Lightning's FSDPStrategy refuses the CPU, so the 2-process test shards the detector with torch's
FullyShardedDataParallel over gloo as experiments/cluster/fsdp.yaml does (one unit per residual
block) and runs the module's own ``predict_step``."""
from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rescale_core
from rescale_tasks.detection.module import DetectionModule

TINY = dict(network="resnet18", scheme="rescale", network_options={"base_width": 8}, detector="maskrcnn",
            num_classes=4, fpn_channels=16, min_size=48, max_size=64,
            detector_options={"rpn_pre_nms_top_n_test": 50, "rpn_post_nms_top_n_test": 20,
                              "box_detections_per_img": 10})


def _batch(seeds: list[int]) -> tuple[list[torch.Tensor], list[dict]]:
    """48 x 64 images and their targets (an image id only: predict reads nothing else); no seed:
    a batch whose every image was unreadable, as the data module collates it."""
    images = [torch.rand(3, 48, 64, generator=torch.Generator().manual_seed(s)) for s in seeds]
    return images, [{"image_id": torch.tensor(s)} for s in seeds]


def _counting_forwards(module: DetectionModule) -> list:
    counted = []
    module.net.register_forward_hook(lambda *args: counted.append(1))
    return counted


def test_an_empty_evaluation_batch_still_runs_a_forward_and_counts_nothing():
    """One process: a batch whose every image was skipped runs one forward of the detector (under a
    sharded strategy the other ranks gather parameters with it) and adds nothing: no prediction, no
    drawing, no record scored in validation; a batch with images is predicted and scored as before."""
    torch.manual_seed(0)
    module = DetectionModule(**TINY, draw_predictions=2).eval()
    forwards = _counting_forwards(module)
    module.on_predict_epoch_start()
    with torch.no_grad():
        assert module.predict_step(_batch([]), 0) is None
        assert (len(forwards), module._predicted, module._drawings) == (1, [], [])
        assert len(module.predict_step(_batch([3]), 1)) == 1
        assert len(forwards) == 2 and [r.image_id for r in module._predicted] == [3] and len(module._drawings) == 1
        assert module.validation_step(_batch([]), 0) is None  # no evaluator: nothing is scored
        assert len(forwards) == 3


def _predict_rank(rank: int, rendezvous: str, module: DetectionModule, batches: list, out: str) -> None:
    """One forked rank: the detector sharded as experiments/cluster/fsdp.yaml shards it (one FSDP unit
    per residual block), ``predict_step`` over ``batches[rank]`` (image seeds per batch); writes the
    image ids it predicted and the forwards it ran to ``out.<rank>``. A rank running fewer forwards
    than another leaves it waiting in a parameter all-gather (until the group's timeout)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=15))
    try:
        module.net = torch.distributed.fsdp.FullyShardedDataParallel(
            module.net, auto_wrap_policy=torch.distributed.fsdp.wrap.ModuleWrapPolicy({rescale_core.blocks.ResidualBlock}),
            device_id=torch.device("cpu"), use_orig_params=True)
        forwards = _counting_forwards(module)
        module.on_predict_epoch_start()
        with torch.no_grad():
            for k, seeds in enumerate(batches[rank]):
                module.predict_step(_batch(seeds), k)
        dist.barrier()
        torch.save({"images": [r.image_id for r in module._predicted], "forwards": len(forwards)}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_a_rank_whose_batch_lost_every_image_does_not_hang_the_others(tmp_path):
    """Rank 0's second batch lost its image, rank 1's did not: both run two forwards and finish; the
    predictions are those of the images read."""
    torch.manual_seed(0)
    module = DetectionModule(**TINY).eval()  # built once; each forked rank has its own copy
    out, context = tmp_path / "ranks", mp.get_context("fork")
    ranks = [context.Process(target=_predict_rank, args=(rank, str(tmp_path / "rendezvous"), module,
                                                         [[[1], []], [[2], [3]]], str(out))) for rank in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(60)
    assert [p.exitcode for p in ranks] == [0, 0]
    results = [torch.load(f"{out}.{rank}", weights_only=True) for rank in (0, 1)]
    assert [r["forwards"] for r in results] == [2, 2]
    assert [r["images"] for r in results] == [[1], [2, 3]]
