"""`rescale predict` on image classification writes a CSV row per image of the predicted split (its
index, file, true class and the top classes the checkpoint names, with their probabilities) where
`test` writes (beside the checkpoint's run, or `--output_dir`), and its closing line names the file.
The split is real JPEGs of 3 classes with one unreadable file, skipped (`data.skip_corrupt`) in the
middle of a batch: every row still names its own image."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from rescale_tasks.cli import main

CLASSES = ("cat", "dog", "fox")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, run_config, data_writers) -> tuple[Path, str, Path]:
    """(image folder, config, checkpoint) of one step on real images of 3 classes, 3 + 3 + 3 to predict
    and a broken file between them."""
    folder = tmp_path_factory.mktemp("predict")
    root = data_writers.imagefolder(folder / "images", classes=CLASSES, train_per_class=2, val_per_class=3)
    (root / "val" / "dog" / "dog_1a.JPEG").write_bytes(b"not a JPEG")  # index 5 of the split, batch 2
    config = run_config(folder / "run.yaml", data={
        "class_path": "rescale_tasks.classification.data.ImageFolderDataModule",
        "init_args": {"root": str(root), "num_classes": 3, "image_size": 32, "eval_resize": 36, "batch_size": 4,
                      "num_workers": 0, "pin_memory": False, "persistent_workers": False, "skip_corrupt": True}},
        trainer={"limit_train_batches": 1, "limit_val_batches": 0, "default_root_dir": str(folder)})
    assert main(["fit", "--config", config]) == 0
    [ckpt] = sorted(folder.rglob("last.ckpt"))
    return root, config, ckpt


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _closing_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_predict_writes_a_row_per_image_where_test_writes(trained, capsys):
    root, config, ckpt = trained
    assert main(["predict", "--config", config, "--ckpt_path", str(ckpt)]) == 0
    written = ckpt.parent.parent / "results" / "last" / "predictions.test.csv"
    line = _closing_line(capsys)
    assert line.startswith("predict finished: ") and f"; 9 predictions in {written}" in line, line

    rows = _rows(written)
    files = sorted(p for p in (root / "val").rglob("*.JPEG") if p.name != "dog_1a.JPEG")
    assert [row["path"] for row in rows] == [str(p) for p in files]
    assert [int(row["index"]) for row in rows] == [0, 1, 2, 3, 4, 6, 7, 8, 9]  # 5: the broken file
    for row in rows:
        assert row["label"] == Path(row["path"]).parent.name  # the true class of that very image
        names = [row[f"top{i}"] for i in (1, 2, 3)]
        probs = [float(row[f"top{i}_prob"]) for i in (1, 2, 3)]
        assert sorted(names) == list(CLASSES) and probs == sorted(probs, reverse=True)
        assert sum(probs) == pytest.approx(1.0, abs=1e-5)


def test_predictions_name_the_checkpoints_classes_in_output_dir(trained, tmp_path, capsys, reordered_checkpoint):
    """A checkpoint listing the same classes in another order (the same network): the same rows, each
    class named as the checkpoint names it, in --output_dir."""
    root, config, ckpt = trained
    reordered = reordered_checkpoint(ckpt, tmp_path / "reordered.ckpt", CLASSES, [2, 0, 1])
    for name, checkpoint in (("original", str(ckpt)), ("reordered", reordered)):
        assert main(["predict", "--config", config, "--ckpt_path", checkpoint, "--output_dir", name]) == 0
        assert _closing_line(capsys).endswith(f"; 9 predictions in {name}/predictions.test.csv")
    original, mapped = _rows(Path("original/predictions.test.csv")), _rows(Path("reordered/predictions.test.csv"))
    assert [(r["path"], r["label"], r["top1"], r["top2"]) for r in mapped] == \
        [(r["path"], r["label"], r["top1"], r["top2"]) for r in original]
    assert [float(r["top1_prob"]) for r in mapped] == pytest.approx([float(r["top1_prob"]) for r in original],
                                                                     abs=1e-5)


@pytest.mark.ddp
def test_two_processes_write_the_rows_of_one(trained, tmp_path, rescale_processes):
    """10 images (one unreadable) on 2 DDP processes, each image on one of them
    (common.data.eval_sampler): the rows written are one process's, each image once."""
    root, config, ckpt = trained
    rows = {}
    for devices in (1, 2):
        out = tmp_path / f"out{devices}"
        rescale_processes(["predict", "--config", config, "--ckpt_path", str(ckpt), "--output_dir", str(out),
                           "--trainer.logger", "false"], devices)
        rows[devices] = _rows(out / "predictions.test.csv")
    assert [row["index"] for row in rows[2]] == [row["index"] for row in rows[1]]
    for one, two in zip(rows[1], rows[2]):
        assert float(one["top1_prob"]) == pytest.approx(float(two["top1_prob"]), abs=1e-5)
