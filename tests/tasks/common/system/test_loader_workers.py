"""DataLoader workers default to at most the usable cores: on a small machine no
"suggested max number of worker" warning, on a large one the config's count stays the cap."""
from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from rescale_tasks.classification.data import DigitsDataModule
from rescale_tasks.common.system import loader_workers, usable_cores
from rescale_tasks.detection.data import CocoDataModule
from rescale_tasks.video.data import KineticsDataModule


@pytest.fixture
def one_core():
    """This process limited to one core (as ``taskset -c 0`` or a one-CPU SLURM task would)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _no_worker_warning(loader: torch.utils.data.DataLoader) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "suggested max number of worker" is a UserWarning
        loader.check_worker_number_rationality()


def test_usable_cores_follow_the_affinity(one_core):
    assert usable_cores() == 1 == len(os.sched_getaffinity(0))
    assert [loader_workers(n) for n in (0, 1, 4, 8)] == [0, 1, 1, 1]


def test_the_configs_count_stays_the_cap():
    cores = usable_cores()
    assert loader_workers(0) == 0 and loader_workers(1) == 1
    assert loader_workers(cores + 7) == cores
    assert loader_workers(max(cores - 1, 0)) == max(cores - 1, 0)


def test_digits_loaders_on_a_one_core_machine(one_core):
    """The real data module, its three loaders: one worker each where the config asks for four."""
    data = DigitsDataModule(batch_size=64, num_workers=4, persistent_workers=False)
    loaders = [data.train_dataloader(), data.val_dataloader(), data.test_dataloader()]
    assert [loader.num_workers for loader in loaders] == [1, 1, 1]
    for loader in loaders:
        _no_worker_warning(loader)
    assert data.num_workers == 4  # the setting itself is left as configured


def test_every_tasks_loaders_take_the_capped_count(one_core, tmp_path):
    """Detection and video build their loaders with the same cap (translation:
    tests/tasks/translation/test_translation_workers.py)."""
    (tmp_path / "annotations").mkdir()
    (tmp_path / "val2017").mkdir()
    (tmp_path / "annotations" / "instances_val2017.json").write_text(
        json.dumps({"images": [], "annotations": [], "categories": [{"id": 1, "name": "digit"}]}))
    coco = CocoDataModule(root=str(tmp_path), num_workers=8)
    assert coco._loader_options()["num_workers"] == 1
    for split in ("train", "val"):  # a folder layout: <split>/<class>/<video> (not decoded here)
        (tmp_path / "kinetics" / split / "abseiling").mkdir(parents=True)
        (tmp_path / "kinetics" / split / "abseiling" / "clip.mp4").touch()
    video = KineticsDataModule(root=str(tmp_path / "kinetics"), num_workers=8, batch_size=2, eval_batch_size=2)
    video.val_set = [torch.zeros(1)] * 4  # the loader only needs the data set's length here
    loader = video.val_dataloader()
    assert loader.num_workers == 1
    _no_worker_warning(loader)
