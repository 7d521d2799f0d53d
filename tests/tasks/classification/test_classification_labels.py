"""A classification checkpoint carries its class names; evaluation matches them to the data's by
name: the same classes in another order are mapped (the same scores), other class folders are
refused in one line (matched by index, they would be scored against swapped labels, without
a word)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rescale_tasks.cli import main
from rescale_tasks.common.cli import run_lightning

CLASSES = ("cat", "dog", "fox")
CSV = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "logs"}}


def folder_config(run_config, path: Path, root: Path) -> str:
    """The tiny rescale network on an image folder of 32 px crops, 3 training steps."""
    return run_config(path, model={"init_args": {"scheme_options": {"measure_batches": 2}}},
                      data={"class_path": "rescale_tasks.classification.data.ImageFolderDataModule",
                            "init_args": {"root": str(root), "num_classes": 3, "image_size": 32, "eval_resize": 36,
                                          "batch_size": 4, "num_workers": 0, "pin_memory": False,
                                          "persistent_workers": False}},
                      trainer={"limit_train_batches": 3, "limit_val_batches": 2, "logger": CSV})


@pytest.fixture(scope="module")
def trained(tmp_path_factory, run_config, data_writers) -> tuple[Path, str, str]:
    """(image folder, config, checkpoint) of 3 steps on real images of 3 classes."""
    folder = tmp_path_factory.mktemp("labels")
    root = data_writers.imagefolder(folder / "images", classes=CLASSES)
    config = folder_config(run_config, folder / "run.yaml", root)
    assert main(["fit", "--config", config, "--trainer.default_root_dir", str(folder),
                 "--trainer.logger.init_args.save_dir", str(folder / "logs")]) == 0
    [ckpt] = sorted(folder.rglob("last.ckpt"))
    return root, config, str(ckpt)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")


def _validate(config: str, ckpt: str) -> dict[str, float]:
    cli = run_lightning(["--config", config], run=False)
    return cli.trainer.validate(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt, verbose=False)[0]


def test_a_checkpoint_carries_the_class_names_of_its_folders(trained):
    _, _, ckpt = trained
    assert torch.load(ckpt, map_location="cpu", weights_only=True)["labels"]["class_names"] == list(CLASSES)


@pytest.mark.parametrize("command", ["validate", "fit"])
def test_a_renamed_class_folder_is_refused_in_one_line(trained, tmp_path, command, error_line):
    """The trial: 'dog' renamed 'zebra' sorts last, so label 1 became 'fox' and label 2 'zebra';
    matched by label index, the run would score (or train on) swapped labels and exit 0."""
    root, config, ckpt = trained
    renamed = Path(shutil.copytree(root, tmp_path / "renamed"))
    for split in ("train", "val"):
        (renamed / split / "dog").rename(renamed / split / "zebra")
    assert main([command, "--config", config, "--ckpt_path", ckpt, "--data.root", str(renamed),
                 "--trainer.default_root_dir", str(tmp_path), "--trainer.max_epochs", "2"]) == 2
    line = error_line()
    assert f"checkpoint {ckpt}" in line and str(renamed / "train") in line
    assert "not in the data: 'dog'" in line and "not in the checkpoint: 'zebra'" in line
    assert "Point --data.root at the data the network was trained on" in line


def test_the_same_classes_in_another_order_score_the_same(trained, tmp_path, capsys, reordered_checkpoint):
    root, config, ckpt = trained
    original = _validate(config, ckpt)
    capsys.readouterr()
    reordered = _validate(config, reordered_checkpoint(ckpt, tmp_path / "reordered.ckpt", CLASSES, [2, 0, 1]))
    assert reordered["val/loss"] == pytest.approx(original["val/loss"], rel=1e-5)
    assert reordered["val/acc1"] == original["val/acc1"]
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("labels: ")]
    assert len(notes) == 1 and "in another order" in notes[0] and "mapped" in notes[0]


def test_a_checkpoint_without_class_names_still_loads(trained, tmp_path, capsys):
    """Checkpoints written before they carried labels: evaluated as before, with one line saying so."""
    _, config, ckpt = trained
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    del checkpoint["labels"]
    torch.save(checkpoint, tmp_path / "old.ckpt")
    capsys.readouterr()
    assert _validate(config, str(tmp_path / "old.ckpt")) == pytest.approx(_validate(config, ckpt))
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("labels: ")]
    assert len(notes) == 1 and "records no label names" in notes[0]


def test_a_machine_holding_val_alone_validates_tests_and_predicts(trained, tmp_path, error_line):
    """An evaluation machine holding ImageNet's val/ without its 140 GB train/: validate scores the
    same as beside train/ (the checkpoint names the classes, matched to val/'s class folders by
    name), test and predict run; fit still needs train/, and says so in one line."""
    root, config, ckpt = trained
    alone = Path(shutil.copytree(root / "val", tmp_path / "val_alone" / "val")).parent
    beside = _validate(config, ckpt)
    cli = run_lightning(["--config", config, "--data.root", str(alone)], run=False)
    assert cli.trainer.validate(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt, verbose=False)[0] == \
        pytest.approx(beside)
    for command in ("test", "predict"):
        assert main([command, "--config", config, "--ckpt_path", ckpt, "--data.root", str(alone),
                     "--output_dir", str(tmp_path / command)]) == 0
    rows = (tmp_path / "predict" / "predictions.test.csv").read_text(encoding="utf-8").splitlines()
    assert len(rows) == 1 + len(list((alone / "val").rglob("*.JPEG"))) > 1
    assert main(["fit", "--config", config, "--data.root", str(alone), "--trainer.default_root_dir", str(tmp_path)]) == 2
    assert error_line().startswith(f"ImageNet folder {alone} (data.root) has no train/ sub-folder")


def test_class_folders_in_decomposed_accents_match_the_checkpoints_composed_names(trained, tmp_path, capsys):
    """A checkpoint naming a class 'dóg' (composed, as Linux tools write it) meets that class folder copied
    through macOS, whose name is decomposed ('do' + a combining accent + 'g'): the same name, which
    read as two different ones refused the data ("not in the data: 'dóg'; not in the checkpoint: 'dóg'").
    Matched by name: validate and predict score as the checkpoint does on its own folders, one line
    names the spelling."""
    import csv
    import unicodedata

    root, config, ckpt = trained
    composed, decomposed = unicodedata.normalize("NFC", "dóg"), unicodedata.normalize("NFD", "dóg")
    assert composed != decomposed
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    checkpoint["labels"]["class_names"] = ["cat", composed, "fox"]
    torch.save(checkpoint, tmp_path / "accented.ckpt")
    mac = tmp_path / "mac_copy"
    for split in ("train", "val"):
        shutil.copytree(root / split, mac / split)
        (mac / split / "dog").rename(mac / split / decomposed)
    capsys.readouterr()
    cli = run_lightning(["--config", config, "--data.root", str(mac)], run=False)
    scores = cli.trainer.validate(cli.model, datamodule=cli.datamodule, ckpt_path=str(tmp_path / "accented.ckpt"),
                                  verbose=False)[0]
    assert scores == pytest.approx(_validate(config, ckpt))
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("labels: ")]
    assert len(notes) == 1 and "matched by name" in notes[0] and "decomposed" in notes[0], notes
    assert main(["predict", "--config", config, "--ckpt_path", str(tmp_path / "accented.ckpt"), "--data.root",
                 str(mac), "--output_dir", str(tmp_path / "predicted")]) == 0
    with open(tmp_path / "predicted" / "predictions.test.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(list((mac / "val").rglob("*.JPEG"))) and {r["top1"] for r in rows} <= {"cat", composed, "fox"}



@pytest.mark.parametrize("command", ["validate", "predict", "fit"])
def test_data_lacking_a_class_names_the_class_not_the_class_count(trained, tmp_path, command, error_line):
    """An evaluation machine whose val/ (alone: no train/) lost the 'dog' folder, run with the
    checkpoint's config and --data.num_classes 2: the line said "num_classes=3 but this run builds
    num_classes=2 ... Run with the config the checkpoint was trained with" (the config was that one).
    It names the class the data lacks; so does fit on folders that lost it."""
    root, config, ckpt = trained
    lacking = tmp_path / "lacking"
    for split in ("train", "val") if command == "fit" else ("val",):
        shutil.copytree(root / split, lacking / split)
        shutil.rmtree(lacking / split / "dog")
    where = ["--output_dir", str(tmp_path / "out")] if command == "predict" else \
        ["--trainer.default_root_dir", str(tmp_path)]
    assert main([command, "--config", config, "--ckpt_path", ckpt, "--data.root", str(lacking),
                 "--data.num_classes", "2", *where]) == 2
    line = error_line()
    assert "not in the data: 'dog'" in line and "num_classes" not in line, line
    assert "Point --data.root at the data the network was trained on" in line


@pytest.mark.parametrize("change", ["lacking", "extra"])
def test_the_trained_config_on_folders_of_another_class_set_names_the_classes(trained, tmp_path, change, error_line):
    """The checkpoint's own config (data.num_classes 3) on a val/ that lost 'dog', or holds a 4th
    class 'bunny': the line said "has 2 class folders but data.num_classes is 3. Set --data.num_classes
    2", a change the checkpoint then refuses. It names the class the data lacks or adds."""
    root, config, ckpt = trained
    other = Path(shutil.copytree(root / "val", tmp_path / "other" / "val")).parent
    if change == "lacking":
        shutil.rmtree(other / "val" / "dog")
    else:
        shutil.copytree(other / "val" / "dog", other / "val" / "bunny")
    assert main(["validate", "--config", config, "--ckpt_path", ckpt, "--data.root", str(other)]) == 2
    line = error_line()
    named = "not in the data: 'dog'" if change == "lacking" else "not in the checkpoint: 'bunny'"
    assert named in line and "num_classes" not in line and str(other / "val") in line, line


def test_data_lacking_a_class_with_a_checkpoint_recording_no_labels_names_the_class_count(trained, tmp_path,
                                                                                          error_line):
    """A checkpoint written before checkpoints carried labels cannot name the missing class: the
    class count, as before."""
    root, config, ckpt = trained
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    del checkpoint["labels"]
    torch.save(checkpoint, tmp_path / "old.ckpt")
    lacking = Path(shutil.copytree(root / "val", tmp_path / "lacking" / "val")).parent
    shutil.rmtree(lacking / "val" / "dog")
    assert main(["validate", "--config", config, "--ckpt_path", str(tmp_path / "old.ckpt"), "--data.root",
                 str(lacking), "--data.num_classes", "2"]) == 2
    assert "num_classes=3 but this run builds" in error_line()
    assert main(["validate", "--config", config, "--ckpt_path", str(tmp_path / "old.ckpt"), "--data.root",
                 str(lacking)]) == 2
    assert "has 2 class folders but data.num_classes is 3" in error_line()
