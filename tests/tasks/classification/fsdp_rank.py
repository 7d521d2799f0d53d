"""What each process of the 2-process FSDP test runs (test_classification_fsdp.py), in a module of
its own: a spawned process imports only torch and this, not the CLI the test module imports."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

STEPS, BATCH, SIZE = 2, 8, 32  # global batch: 4 images per rank


def batches(classes: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batches of the run: the same seeded images and labels in every process."""
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, 3, SIZE, SIZE, generator=g), torch.randint(0, classes, (BATCH,), generator=g))
            for _ in range(STEPS)]


def train(net: nn.Module, data, rank: int = 0, world: int = 1) -> None:
    """Plain SGD steps of ``net`` on this rank's contiguous share of every batch in ``data``."""
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    share = BATCH // world
    for x, y in data:
        loss = F.cross_entropy(net(x[rank * share:(rank + 1) * share]), y[rank * share:(rank + 1) * share])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def sharded_rank(rank: int, world: int, rendezvous: str, net: nn.Module, strategy: dict, out: str) -> None:
    """One rank: ``net`` wrapped in FSDP as ``strategy`` says (``sharding_strategy``, ``kwargs``),
    trained on its share; rank 0 writes the gathered full state dict and the FSDP unit count to ``out``.
    ``rendezvous``: a file path, new for each run, where the processes find each other."""
    torch.set_num_threads(1)
    # spawn hands every process the parent's tensors in shared memory: a private copy, taken before
    # the group forms (so before any rank trains), keeps the ranks and the parent apart
    net = copy.deepcopy(net)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        sharded = FullyShardedDataParallel(net, sharding_strategy=strategy["sharding_strategy"],
                                           device_id=torch.device("cpu"), **strategy["kwargs"])
        units = [m for m in sharded.modules() if isinstance(m, FullyShardedDataParallel)]
        train(sharded, batches(strategy["classes"]), rank, world)
        gather = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
        with FullyShardedDataParallel.state_dict_type(sharded, StateDictType.FULL_STATE_DICT, gather):
            state = sharded.state_dict()
        if rank == 0:
            torch.save({"state_dict": state, "units": len(units)}, out)
    finally:
        dist.destroy_process_group()

