"""What each process of the 2-process FSDP test of the learned scalars runs
(test_core_analysis.py), in a module of its own: a spawned process imports only torch and this."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


def scalars_rank(rank: int, world: int, rendezvous: str, net: torch.nn.Module, out: str) -> None:
    """One rank: ``net`` in FSDP, one FULL_SHARD unit per residual block (the FSDP overlay's
    wrapping), its learned scalars read on every rank; rank 0 saves what it read to ``out``."""
    from rescale_core.analysis import learned_scalars
    from rescale_core.blocks import ResidualBlock

    torch.set_num_threads(1)
    net = copy.deepcopy(net)  # not the parent's shared-memory tensors
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        sharded = FullyShardedDataParallel(net, sharding_strategy=ShardingStrategy.FULL_SHARD,
                                           device_id=torch.device("cpu"), use_orig_params=True,
                                           auto_wrap_policy=ModuleWrapPolicy({ResidualBlock}))
        scalars = learned_scalars(sharded)
        if rank == 0:
            torch.save(scalars, out)
    finally:
        dist.destroy_process_group()
