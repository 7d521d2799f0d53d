"""The resumable training order: seeded per epoch, sharded over ranks, resumable mid-epoch."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from rescale_tasks.common.data import (PerSampleSeed, ResumableDataLoader, ResumableSampler, ResumeMismatch,
                                       sample_seed)


def _loader(n=20, batch=4, rank=0, replicas=1, seed=0, workers=0, dataset=None):
    data = dataset or TensorDataset(torch.arange(n))
    sampler = ResumableSampler(data, seed=seed, num_replicas=replicas, rank=rank)
    return ResumableDataLoader(data, sampler, batch_size=batch, num_workers=workers,
                               generator=torch.Generator().manual_seed(0))


def _epoch(loader, epoch):
    loader.sampler.set_epoch(epoch)
    return [b[0].tolist() for b in loader]


def test_order_depends_on_seed_and_epoch_only():
    a, b = _loader(), _loader()
    assert _epoch(a, 0) == _epoch(b, 0)
    assert _epoch(a, 0) != _epoch(a, 1)
    assert _epoch(a, 1) != _epoch(_loader(seed=1), 1)
    assert sorted(sum(_epoch(a, 3), [])) == list(range(20))  # a permutation


def test_two_ranks_together_see_one_global_batch_per_step():
    single = _epoch(_loader(batch=8, n=32), 2)
    ranks = [_epoch(_loader(batch=4, n=32, rank=r, replicas=2), 2) for r in range(2)]
    for step, batch in enumerate(single):
        assert sorted(batch) == sorted(ranks[0][step] + ranks[1][step])


def test_resume_mid_epoch_continues_with_the_next_batch():
    full = _epoch(_loader(), 1)
    first = _loader()
    first.sampler.set_epoch(1)
    it = iter(first)
    seen = [next(it)[0].tolist() for _ in range(2)]
    state = first.state_dict()
    assert state["epoch"] == 1 and state["batches_seen"] == 2

    resumed = _loader()
    resumed.load_state_dict(state)
    rest = [b[0].tolist() for b in resumed]  # epoch already set from the state
    assert seen + rest == full
    assert resumed.state_dict()["batches_seen"] == len(resumed)
    # the skip applies once: the next epoch is whole again
    assert _epoch(resumed, 2) == _epoch(_loader(), 2)


def test_saved_position_is_ignored_when_another_epoch_starts():
    """An epoch cut short by limit_train_batches ends Lightning's epoch: the next starts at its top."""
    loader = _loader()
    loader.load_state_dict({"epoch": 1, "batches_seen": 2, "seed": 0, "num_replicas": 1, "batch_size": 4})
    assert _epoch(loader, 2) == _epoch(_loader(), 2)


@pytest.mark.parametrize("saved", [{"num_replicas": 2}, {"batch_size": 2}, {"seed": 1}, {"num_samples": 24}])
def test_a_position_is_not_continued_under_another_layout(saved):
    """A mid-epoch position means other samples under another batch size, process count, seed or
    data set size (another data root, files added or removed): continuing that epoch is refused in one line naming the saved value; the next epoch starts
    from its top as usual."""
    state = {**_loader().state_dict(), "epoch": 0, "batches_seen": 2, **saved}
    loader = _loader()
    loader.load_state_dict(state)
    (key, value), = saved.items()
    with pytest.raises(ResumeMismatch, match=f"2 batches into it with {key} {value}, this run has {key} "):
        _epoch(loader, 0)
    assert _epoch(loader, 1) == _epoch(_loader(), 1)


def test_a_position_saved_before_the_data_set_size_was_recorded_continues():
    first = _loader()
    first.sampler.set_epoch(0)
    it = iter(first)
    seen = [next(it)[0].tolist() for _ in range(2)]
    state = {k: v for k, v in first.state_dict().items() if k != "num_samples"}
    resumed = _loader()
    resumed.load_state_dict(state)
    assert seen + [b[0].tolist() for b in resumed] == _epoch(_loader(), 0)


class _Noisy(Dataset):
    """Returns a random number drawn from the global torch RNG (like a random augmentation)."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.rand(()), i


def test_per_sample_seeds_make_augmentation_independent_of_workers_and_restarts():
    data = PerSampleSeed(_Noisy())

    def draws(workers):
        loader = _loader(n=12, batch=3, workers=workers, dataset=data)
        loader.sampler.with_seeds = True
        loader.sampler.set_epoch(4)
        return {int(i): float(v) for x, idx in loader for v, i in zip(x, idx)}

    torch.manual_seed(0)
    before = torch.get_rng_state()
    in_process = draws(0)
    assert torch.equal(before, torch.get_rng_state())  # the training stream is untouched
    assert in_process == draws(2)  # two worker processes: same values per sample
    assert len(set(in_process.values())) == 12


class _ThreeStreams(torch.utils.data.Dataset):
    """A sample drawn from every global stream an augmentation may use: torch's, Python's, NumPy's."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        import random

        import numpy as np
        return float(torch.rand(())), random.random(), float(np.random.rand()), i


def test_a_batch_is_the_samples_one_by_one_and_restores_every_stream_once():
    """The loader's fetcher takes a batch at once (``__getitems__``): the caller's three streams are
    saved and restored once around it, and each sample is what ``dataset[key]`` alone gives."""
    import random

    import numpy as np
    data = PerSampleSeed(_ThreeStreams())
    keys = [(i, sample_seed(0, 1, i)) for i in (3, 7, 7, 0)]
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()
    batch = data.__getitems__(keys)
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), before[2]))
    assert batch == [data[key] for key in keys] and batch[1] == batch[2] and batch[0] != batch[1]
    torch.manual_seed(2), random.seed(2), np.random.seed(2)  # keys without a seed: the caller's streams
    unseeded = data.__getitems__([5, 6])
    torch.manual_seed(2), random.seed(2), np.random.seed(2)
    assert unseeded == [data[5], data[6]] != data.__getitems__([5, 6])


def test_sample_seed_is_stable_and_spread():
    assert sample_seed(0, 1, 2) == sample_seed(0, 1, 2)
    seeds = {sample_seed(s, e, i) for s in range(3) for e in range(3) for i in range(50)}
    assert len(seeds) == 450 and all(0 <= s < 2**63 for s in seeds)


def test_per_sample_seed_leaves_the_device_generators_alone(monkeypatch):
    """Only the CPU generator is seeded per sample: reseeding CUDA (what ``torch.manual_seed``
    does) would restart the training loop's device random stream at every batch."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a per-sample seed reseeded the CUDA generators")

    monkeypatch.setattr(torch.cuda, "manual_seed_all", forbidden)
    monkeypatch.setattr(torch.cuda, "manual_seed", forbidden)
    data = PerSampleSeed(_Noisy())
    before = torch.get_rng_state()
    first, again = data[(3, 11)], data[(3, 11)]
    assert torch.equal(first[0], again[0])  # the sample's own stream is seeded
    assert torch.equal(torch.get_rng_state(), before)  # and the caller's CPU stream restored


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_stream_advances_across_batches_with_per_sample_seeds():
    data = PerSampleSeed(_Noisy())
    draws = []
    for step in range(3):  # num_workers=0: samples are loaded in the training process
        data[(step, 5)]
        draws.append(torch.rand(4, device="cuda"))  # what dropout would draw at this step
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])
