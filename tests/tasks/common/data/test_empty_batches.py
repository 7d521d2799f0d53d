"""A batch made only of bad files is no step (rescale_tasks.common.data.empty_batches), with the suite's
callbacks attached: real JPEG files written with PIL, one of them truncated, read in batches of one
by the classification task's own dataset, the bad batch first, in the middle and last in the epoch,
with and without gradient accumulation. Before the mechanism, the divergence monitor failed on the
missing loss (``KeyError: 'loss'``) and the analysis plots probed an empty batch."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import lightning.pytorch as L
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from rescale_tasks.classification.datasets import ImageFileDataset, collate_drop_none
from rescale_tasks.classification.module import ClassificationModule
from rescale_tasks.common.data import SKIPPED, is_skipped
from rescale_tasks.common.reporting import AnalysisPlotsLogger, SuiteWandbLogger
from rescale_tasks.common.run import RunSummary
from rescale_tasks.common.training import DivergenceMonitor, LearnedScalarsLogger

BATCHES = 5  # of one image each
POSITIONS = {"first": 0, "middle": 2, "last": BATCHES - 1}


def _images(folder: Path, bad: int) -> list[tuple[str, int]]:
    """Five 16x16 JPEGs (three tints, one class each); file ``bad`` cut to its first 100 bytes."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    samples = []
    for i in range(BATCHES):
        pixels = (rng.random((16, 16, 3)) * 80 + np.array([60, 120, 180])[[i % 3, (i + 1) % 3, (i + 2) % 3]])
        path = folder / f"{i}.jpg"
        Image.fromarray(pixels.astype(np.uint8)).save(path, quality=90)
        if i == bad:
            path.write_bytes(path.read_bytes()[:100])  # a truncated JPEG
        samples.append((str(path), i % 3))
    return samples


class StepProbe(L.Callback):
    """Per batch: its sample count, whether the outputs say skipped, and whether the parameters
    or the optimizer's momentum moved while it ran."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, bool, bool]] = []

    @staticmethod
    def _state(pl_module, trainer) -> list[torch.Tensor]:
        optimizer = trainer.optimizers[0]
        momenta = [s["momentum_buffer"] for s in optimizer.state.values() if s.get("momentum_buffer") is not None]
        return [p.detach().clone() for p in pl_module.parameters()] + [m.clone() for m in momenta]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._before = self._state(pl_module, trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        after = self._state(pl_module, trainer)
        moved = len(after) != len(self._before) or any(not torch.equal(a, b) for a, b in zip(after, self._before))
        self.rows.append((len(batch[1]), is_skipped(outputs), moved))


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("position", POSITIONS)
def test_a_batch_of_bad_files_is_no_step(tmp_path, monkeypatch, position, accumulate):
    monkeypatch.chdir(tmp_path)
    bad = POSITIONS[position]
    transform = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    data = ImageFileDataset(_images(tmp_path / "images", bad), transform, skip_corrupt=True)
    loader = DataLoader(data, batch_size=1, shuffle=False,
                        collate_fn=functools.partial(collate_drop_none, image_shape=(3, 16, 16)))
    L.seed_everything(0)
    module = ClassificationModule("cifar_resnet", "rescale", network_options={"depth": 8, "base_width": 4},
                                  num_classes=3, optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    probe = StepProbe()
    callbacks = [probe, DivergenceMonitor(), LearnedScalarsLogger(every_n_steps=1),
                 RunSummary(path=str(tmp_path / "run_summary.json"))]
    logger = False
    if position == "first" and accumulate == 1:  # the probe is due at step 1, on the bad batch
        plots = AnalysisPlotsLogger(every_n_steps=100, samples=1)
        callbacks.append(plots)
        monkeypatch.setenv("WANDB_MODE", "offline")
        monkeypatch.setenv("WANDB_SILENT", "true")
        logger = SuiteWandbLogger(project="empty-batches", save_dir=str(tmp_path / "runs"))
    trainer = L.Trainer(max_epochs=1, accumulate_grad_batches=accumulate, accelerator="cpu", devices=1,
                        logger=logger, callbacks=callbacks, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1)
    try:
        trainer.fit(module, loader)
    finally:
        if logger:
            import wandb

            wandb.finish()  # the next test's run must not land in this one

    assert data.skipped == 1 and [n for n, _, _ in probe.rows] == [int(i != bad) for i in range(BATCHES)]
    assert [skipped for _, skipped, _ in probe.rows] == [i == bad for i in range(BATCHES)]
    # a step happens where a window of `accumulate` batches ends (and at the epoch's end)
    ends = [i for i in range(BATCHES) if (i + 1) % accumulate == 0 or i == BATCHES - 1]
    windows = {end: [i for i in range(BATCHES) if i <= end and (end - i) < accumulate and
                     (i // accumulate == end // accumulate)] for end in ends}
    for i, (_, _, moved) in enumerate(probe.rows):
        # the parameters and momenta move exactly at a window's end holding one real batch or more:
        # the bad batch alone in its window moves nothing; in a window with a good one, the step is kept
        assert moved == (i in windows and any(j != bad for j in windows[i])), (i, probe.rows)
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert summary["status"] == "finished" and summary["diverged_step"] is None
    if logger:
        assert len(plots.seconds) == 1  # probed once, on the first batch holding images
    assert SKIPPED == "skipped"
