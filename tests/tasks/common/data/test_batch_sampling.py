"""Whole-batch loaders (token budgets, aspect-ratio groups) resume mid-epoch only on the same data:
a position saved over a data set of another size is refused in one line even when the number of
batches happens to be the same."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from rescale_tasks.common.data import BatchListLoader, BatchListSampler, ResumeMismatch


class _Pairs(BatchListSampler):
    """Batches of two consecutive indices counted from the end, in a seeded order; an odd first
    sample is left out."""

    def num_batches(self) -> int:
        return len(self.dataset) // 2

    def epoch_batches(self):
        order = torch.randperm(self.num_batches(), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        last = len(self.dataset) - 1
        return [[last - 2 * int(b) - 1, last - 2 * int(b)] for b in order]


def _loader(n: int) -> BatchListLoader:
    data = TensorDataset(torch.arange(n))
    return BatchListLoader(data, _Pairs(data, num_replicas=1, rank=0))


def _ids(loader, epoch: int) -> list:
    loader.sampler.set_epoch(epoch)
    return [b[0].tolist() for b in loader]


def test_a_position_over_a_data_set_of_another_size_is_refused():
    first = _loader(20)
    first.sampler.set_epoch(0)
    it = iter(first)
    seen = [next(it)[0].tolist() for _ in range(3)]
    state = first.state_dict()

    same = _loader(20)
    same.load_state_dict(state)
    assert seen + [b[0].tolist() for b in same] == _ids(_loader(20), 0)

    other = _loader(21)  # one more file: as many batches, other samples in them
    assert len(other) == len(first)
    other.load_state_dict(state)
    with pytest.raises(ResumeMismatch, match="with num_samples 20, this run has num_samples 21"):
        _ids(other, 0)
    assert _ids(other, 1) == _ids(_loader(21), 1)  # the next epoch starts from its top
