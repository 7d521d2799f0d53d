"""What each process of the 2-process sharded evaluation test (test_eval_sampling.py) runs, in a
module of its own: a spawned process imports only torch, torchmetrics and the sampling module."""
from __future__ import annotations

import copy
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.strategies import FSDPStrategy
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from rescale_tasks.common.data import eval_sampler, real_rows

SAMPLES, CLASSES, FEATURES = 7, 3, 4  # 7 on 2 processes: one item padded


def split() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(SAMPLES, FEATURES, generator=g), torch.randint(0, CLASSES, (SAMPLES,), generator=g))


class Unreadable(Dataset):
    """:func:`split` with the items in ``bad`` unreadable (``None``, as a data set that skips a corrupt file)."""

    def __init__(self, bad: tuple[int, ...] = ()) -> None:
        self.items, self.bad = split(), set(bad)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return None if index in self.bad else self.items[index]


def collate_readable(batch: list):
    """``default_collate`` of the readable items (an empty batch where none is)."""
    kept = [item for item in batch if item is not None]
    return default_collate(kept) if kept else (torch.empty(0, FEATURES), torch.empty(0, dtype=torch.long))


def evaluate(net, loader, mask: bool = True) -> tuple[dict, int]:
    """acc1 and the mean loss over ``loader`` (synced over ranks at compute), and the forwards run;
    a batch without items is skipped, as the task modules' evaluation steps do."""
    acc, loss, forwards = MulticlassAccuracy(CLASSES, top_k=1, average="micro"), MeanMetric(), 0
    with torch.no_grad():
        for batch in loader:
            (x, y), real = real_rows(batch, 2)
            if not len(x):
                continue
            logits = net(x)  # under FSDP a collective: every rank must run as many
            forwards += 1
            if mask and real is not None:
                logits, y = logits[real], y[real]
            if len(y):
                acc.update(logits, y)
                loss.update(F.cross_entropy(logits, y), weight=len(y))
    return {"acc1": float(acc.compute()), "loss": float(loss.compute())}, forwards


def sharded_eval_rank(rank: int, world: int, rendezvous: str, net: torch.nn.Module, out: str,
                      bad: tuple[int, ...] = (), batch_size: int = 2) -> None:
    """One rank: ``net`` wrapped in FSDP, evaluated on its share of :func:`split` (``bad`` items
    unreadable) as ``eval_sampler`` shards it under Lightning's FSDPStrategy; rank 0 saves the
    metrics. A rank waiting for a forward another never runs fails after 30 s instead of hanging."""
    torch.set_num_threads(1)
    net = copy.deepcopy(net)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    try:
        sharded = FullyShardedDataParallel(net, device_id=torch.device("cpu"))
        dataset, sampler = eval_sampler(Unreadable(bad), FSDPStrategy())
        loader = DataLoader(dataset, sampler=sampler, batch_size=batch_size, collate_fn=collate_readable)
        masked, forwards = evaluate(sharded, loader)
        unmasked, _ = evaluate(sharded, loader, mask=False)
        counts = [None] * world
        dist.all_gather_object(counts, forwards)
        if rank == 0:
            torch.save({"masked": masked, "unmasked": unmasked, "forwards": counts}, out)
    finally:
        dist.destroy_process_group()
