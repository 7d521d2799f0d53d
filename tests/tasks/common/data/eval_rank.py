"""What each process of the 2-process sharded evaluation test (test_eval_sampling.py) runs, in a
module of its own: a spawned process imports only torch, torchmetrics and the sampling module."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.strategies import FSDPStrategy
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from rescale_tasks.common.data import eval_sampler, real_rows

SAMPLES, CLASSES, FEATURES = 7, 3, 4  # 7 on 2 processes: one item padded


def split() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(SAMPLES, FEATURES, generator=g), torch.randint(0, CLASSES, (SAMPLES,), generator=g))


def evaluate(net, loader, mask: bool = True) -> tuple[dict, int]:
    """acc1 and the mean loss over ``loader`` (synced over ranks at compute), and the forwards run."""
    acc, loss, forwards = MulticlassAccuracy(CLASSES, top_k=1, average="micro"), MeanMetric(), 0
    with torch.no_grad():
        for batch in loader:
            (x, y), real = real_rows(batch, 2)
            logits = net(x)  # under FSDP a collective: every rank must run as many
            forwards += 1
            if mask and real is not None:
                logits, y = logits[real], y[real]
            if len(y):
                acc.update(logits, y)
                loss.update(F.cross_entropy(logits, y), weight=len(y))
    return {"acc1": float(acc.compute()), "loss": float(loss.compute())}, forwards


def sharded_eval_rank(rank: int, world: int, rendezvous: str, net: torch.nn.Module, out: str) -> None:
    """One rank: ``net`` wrapped in FSDP, evaluated on its share of :func:`split` as
    ``eval_sampler`` shards it under Lightning's FSDPStrategy; rank 0 saves the metrics."""
    torch.set_num_threads(1)
    net = copy.deepcopy(net)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        sharded = FullyShardedDataParallel(net, device_id=torch.device("cpu"))
        dataset, sampler = eval_sampler(split(), FSDPStrategy())
        loader = DataLoader(dataset, sampler=sampler, batch_size=2)
        masked, forwards = evaluate(sharded, loader)
        unmasked, _ = evaluate(sharded, loader, mask=False)
        counts = [None] * world
        dist.all_gather_object(counts, forwards)
        if rank == 0:
            torch.save({"masked": masked, "unmasked": unmasked, "forwards": counts}, out)
    finally:
        dist.destroy_process_group()
