"""How evaluation is sharded over processes (``eval_sampler``): each item counted once, whatever
the strategy; under one that shards the parameters (FSDP) every rank runs the same forwards and the
padding that makes them equal is run but counted nowhere."""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from rescale_tasks.common.data import (MarkedPadding, PaddedEvalSampler, UnrepeatedSampler, eval_sampler, keep_real,
                                       real_rows)
from eval_rank import Unreadable, collate_readable, evaluate, sharded_eval_rank, split


@pytest.mark.parametrize("n, world", [(5, 2), (7, 3), (2, 3), (6, 3)])
def test_the_real_rows_of_all_ranks_are_the_split_once_and_ranks_run_alike(n, world):
    data = TensorDataset(torch.arange(n))
    real, lengths = [], set()
    for rank in range(world):
        sampler = PaddedEvalSampler(data, num_replicas=world, rank=rank)
        marked = MarkedPadding(data, sampler.padded())
        items = [marked[i] for i in sampler]
        lengths.add(len(items))
        real += [int(index) for index, keep in items if keep]
    assert sorted(real) == list(range(n)) and len(lengths) == 1


def test_the_strategy_decides_the_sampler():
    data = TensorDataset(torch.arange(4))
    assert isinstance(eval_sampler(data, DDPStrategy())[1], UnrepeatedSampler)
    assert eval_sampler(data, None)[0] is data
    marked, sampler = eval_sampler(data, FSDPStrategy())
    assert isinstance(sampler, PaddedEvalSampler) and isinstance(marked, MarkedPadding)
    batch = next(iter(DataLoader(marked, sampler=sampler, batch_size=4)))
    (values,), real = real_rows(batch, 1)
    assert real.dtype == torch.bool and real.all() and values.tolist() == [0, 1, 2, 3]


def test_two_fsdp_processes_evaluate_as_one(tmp_path):
    """7 items, 2 FSDP processes over gloo: both run 2 forwards, and the metrics synced over them
    are one process's over the 7; without the mask the padded item counts twice."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    single, _ = evaluate(net, DataLoader(split(), batch_size=2))
    out = tmp_path / "metrics.pt"
    mp.spawn(sharded_eval_rank, args=(2, str(tmp_path / "rendezvous"), net, str(out)), nprocs=2)
    got = torch.load(out, weights_only=True)
    assert got["forwards"] == [2, 2]
    assert got["masked"] == pytest.approx(single, rel=1e-6)
    assert got["unmasked"] != pytest.approx(single, rel=1e-6)  # what the padding did to the numbers


def test_an_unreadable_item_is_replaced_by_a_stand_in_that_counts_nowhere(tmp_path):
    """7 items on 2 FSDP processes in batches of 3: rank 0's last batch is item 6 alone. Unreadable,
    it left that batch empty, rank 0 skipped its forward and rank 1 waited in the parameter
    all-gather forever; now the next readable item stands in, run and marked padding, and the
    metrics are one process's over the readable items."""
    marked, _ = eval_sampler(Unreadable((6,)), FSDPStrategy())
    assert marked[6][-1] is False and marked[5][-1] is True
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    single, _ = evaluate(net, DataLoader(Unreadable((6,)), batch_size=3, collate_fn=collate_readable))
    out = tmp_path / "metrics.pt"
    mp.spawn(sharded_eval_rank, args=(2, str(tmp_path / "rendezvous"), net, str(out), (6,), 3), nprocs=2)
    got = torch.load(out, weights_only=True)
    assert got["forwards"] == [2, 2] and got["masked"] == pytest.approx(single, rel=1e-6)


def test_only_a_boolean_last_field_is_a_mask_and_keep_real_takes_tensors_and_lists():
    """An int64 label field is never read as the mask (a batch of one field fewer is not taken for
    a marked one); keep_real keeps the marked rows of tensors and lists alike."""
    images, labels, mask = torch.zeros(3, 2), torch.tensor([1, 0, 1]), torch.tensor([True, False, True])
    assert real_rows((images, labels), 1) == ((images, labels), None)
    fields, real = real_rows((images, labels, mask), 2)
    assert real is mask and fields[1] is labels
    kept_labels, kept_names = keep_real(real, labels, ["a", "b", "c"])
    assert kept_labels.tolist() == [1, 1] and kept_names == ["a", "c"]
    assert keep_real(None, labels, ["a"]) == (labels, ["a"])
