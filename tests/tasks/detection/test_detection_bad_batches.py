"""A truncated JPEG in a batch of one is no step (``rescale_tasks.common.data.empty_batches``): `rescale
fit` with ``--data.skip_corrupt true --data.batch_size 1`` over three epochs whose seed puts the bad
image first, in the middle and last, with gradient accumulation over two batches. Before the fix:
Lightning's "`training_step` returned `None`" warning, then ``KeyError: 'loss'`` in the divergence
monitor."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image
from test_detection_cli import tiny_config

from rescale_tasks.cli import main
from wandb_runs import find_offline_runs, read_offline_run
from rescale_tasks.detection.data import CocoDataModule

EPOCHS = 3


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def truncate_as_jpeg(root: Path, image_index: int, split: str = "train") -> int:
    """Image ``image_index`` of the ``split`` json becomes a JPEG cut after 300 bytes; returns its id."""
    annotations = root / "annotations" / f"instances_{split}2017.json"
    data = json.loads(annotations.read_text())
    image = data["images"][image_index]
    old = root / f"{split}2017" / image["file_name"]
    image["file_name"] = Path(image["file_name"]).with_suffix(".jpg").name
    encoded = io.BytesIO()
    Image.open(old).convert("RGB").save(encoded, format="JPEG", quality=95)
    (root / f"{split}2017" / image["file_name"]).write_bytes(encoded.getvalue()[:300])
    annotations.write_text(json.dumps(data))
    return image["id"]


def test_a_truncated_jpeg_alone_in_its_batch_is_no_step(coco_canvases_copy, tmp_path):
    root = coco_canvases_copy.root
    bad_id = truncate_as_jpeg(root, 0)
    data = CocoDataModule(root=str(root), batch_size=1, num_workers=0, skip_corrupt=True)
    sampler = data.train_loader(num_replicas=1, rank=0).sampler
    bad = next(i for i in range(len(sampler.dataset)) if sampler.dataset.image_ids[i] == bad_id)

    def position(seed: int, epoch: int) -> int:
        sampler.seed = seed
        sampler.set_epoch(epoch)
        return [batch[0] for batch in sampler.epoch_batches()].index(bad)

    n = sampler.num_batches()
    wanted = (0, n // 2, n - 1)  # first, middle, last in epochs 0, 1, 2
    seed = next(s for s in range(20_000) if all(position(s, e) == p for e, p in enumerate(wanted)))
    config = tiny_config(tmp_path / "tiny.yaml", root)
    with pytest.warns(UserWarning, match=r"skipped 1 corrupt input file\(s\)"):
        assert main(["fit", "--config", str(config), "--data.skip_corrupt", "true", "--data.batch_size", "1",
                     "--data.seed", str(seed), "--trainer.max_steps", "-1", "--trainer.max_epochs", str(EPOCHS),
                     "--trainer.accumulate_grad_batches", "2", "--trainer.limit_val_batches", "0"]) == 0
    [run] = [read_offline_run(d) for d in find_offline_runs("runs")]
    assert run.summary["data/skipped_corrupt"] == 1
    [summary] = [json.loads(p.read_text()) for p in Path("runs").rglob("run_summary.json")]
    assert summary["status"] == "finished" and summary["steps"] == EPOCHS * ((n + 1) // 2)
    # throughput in images, the skipped batch left out, to W&B and the summary
    assert (summary["throughput_unit"], summary["samples"]) == ("images", EPOCHS * (n - 1))
    assert run.summary["throughput/run_images_per_s"] == pytest.approx(summary["samples_per_second"])


def test_an_ap_without_skipped_images_says_on_how_many_it_was_computed(coco_canvases_copy, tmp_path, caplog):
    """A validation image that cannot be read, skipped: the logged metrics hold ``val/images`` (the
    images the AP was computed on) beside the AP, and one warning line names the skipped image."""
    root = coco_canvases_copy.root
    bad_id = truncate_as_jpeg(root, 0, split="val")
    images = len(json.loads((root / "annotations" / "instances_val2017.json").read_text())["images"])
    config = tiny_config(tmp_path / "tiny.yaml", root)
    with pytest.warns(UserWarning, match=r"skipped 1 corrupt input file\(s\)"):
        assert main(["validate", "--config", str(config), "--data.skip_corrupt", "true"]) == 0
    [run] = [read_offline_run(d) for d in find_offline_runs("runs")]
    assert run.summary["val/images"] == images - 1 and "val/bbox_AP" in run.summary
    [line] = [r.getMessage() for r in caplog.records if "COCO AP computed on" in r.getMessage()]
    assert f"val: COCO AP computed on {images - 1} images: 1 unreadable image(s) of the val set" in line
    assert f"image id(s) {bad_id};" in line
