"""What an image class folder holds besides images (other extensions, hidden files, sub-folders) is
counted and reported in one line, not silently left out: a ``.heic`` photo or a sub-folder of
images in a class folder is not part of the data, and the user is told so."""
from __future__ import annotations

import shutil
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch

from rescale_tasks.classification.data import ImageFolderDataModule
from rescale_tasks.classification.datasets import IMAGE_EXTENSIONS, scan_image_folder
from rescale_tasks.classification.module import ClassificationModule
from rescale_tasks.common.errors import DataError
from rescale_tasks.common.run import SkippedDataReport, unread_line

READ = IMAGE_EXTENSIONS


def _add_other_files(root: Path) -> set[str]:
    """Five entries the loader does not read, in train/ and val/ class folders."""
    picture = (root / "train/n001/n001_0.JPEG").read_bytes()
    others = {"train/n001/notes.txt": b"labels checked by hand\n", "train/n002/photo.HEIC": picture,
              "train/n002/.DS_Store": b"\0\0\0\1Bud1", "val/n003/edit.xcf": b"gimp xcf v011"}
    for name, content in others.items():
        (root / name).write_bytes(content)
    (root / "val/n001/more").mkdir()
    (root / "val/n001/more/n001_9.JPEG").write_bytes(picture)  # one level too deep
    return {str(root / name) for name in [*others, "val/n001/more"]}


def test_the_scan_lists_what_it_does_not_read(imagenet_folder):
    unread = _add_other_files(imagenet_folder)
    folder = scan_image_folder(imagenet_folder, num_classes=3)
    assert set(folder.unread) == unread
    assert (len(folder.train), len(folder.val)) == (12, 6)  # the images, and only them


def test_the_data_report_names_the_files_not_read(imagenet_folder):
    _add_other_files(imagenet_folder)
    data = ImageFolderDataModule(str(imagenet_folder), num_classes=3, image_size=32, eval_resize=36,
                                 batch_size=2, num_workers=0, pin_memory=False, persistent_workers=False)
    module = ClassificationModule("cifar_resnet", "skipinit", network_options={"depth": 8, "base_width": 4},
                                  num_classes=3)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[SkippedDataReport()],
                        limit_val_batches=1, enable_progress_bar=False, enable_model_summary=False)
    with pytest.warns(UserWarning) as warned:
        trainer.validate(module, datamodule=data)
    lines = [str(w.message) for w in warned if "not read" in str(w.message)]
    assert lines == [
        f"data: 5 file(s) under {imagenet_folder} were found but not read (.heic 1, .txt 1, .xcf 1, "
        f"folder 1, hidden 1), e.g. {imagenet_folder / 'train/n001/notes.txt'}; only "
        ".jpg/.jpeg/.png/.ppm/.bmp/.pgm/.tif/.tiff/.webp files are read: convert them or move them out of "
        "the data folder"]


def test_images_beside_the_class_folders_hidden_folders_and_broken_links_are_reported(imagenet_folder):
    """An image in train/ itself, a hidden folder of images (a notebook's checkpoints) and a link
    to nothing are not read either, and the report says what each is."""
    picture = (imagenet_folder / "train/n001/n001_0.JPEG").read_bytes()
    (imagenet_folder / "train/stray.jpg").write_bytes(picture)
    (imagenet_folder / "train/.ipynb_checkpoints").mkdir()
    (imagenet_folder / "train/.ipynb_checkpoints/n001_0.JPEG").write_bytes(picture)
    (imagenet_folder / "val/n002/gone.jpg").symlink_to(imagenet_folder / "nowhere.jpg")
    folder = scan_image_folder(imagenet_folder, num_classes=3)
    assert set(folder.unread) == {str(imagenet_folder / p) for p in
                                  ("train/stray.jpg", "train/.ipynb_checkpoints", "val/n002/gone.jpg")}
    line = unread_line(folder.unread, READ)
    assert "were found but not read (.jpg outside a class folder 1, broken link 1, folder 1)" in line, line


def test_class_names_spelt_with_other_unicode_characters_are_named_as_such(imagenet_folder):
    """macOS writes decomposed accents: val/café (e + combining accent) against train/café."""
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    (imagenet_folder / "train/n003").rename(imagenet_folder / "train" / composed)
    (imagenet_folder / "val/n003").rename(imagenet_folder / "val" / decomposed)
    with pytest.raises(DataError) as refused:
        scan_image_folder(imagenet_folder, num_classes=3)
    assert "written with other Unicode characters in each split" in str(refused.value)


def test_class_folders_whose_images_lie_a_level_deeper_say_so(imagenet_folder):
    """Class folders holding a folder of images (not Tiny ImageNet's one images/ each): the class
    folders look empty, and the line says where the images are and how to move them up, not to add
    images."""
    train = imagenet_folder / "train"
    for name in ("n001", "n002", "n003"):
        (train / name / "photos").mkdir()
        for image in (train / name).glob("*.JPEG"):
            image.rename(train / name / "photos" / image.name)
    with pytest.raises(DataError) as refused:
        scan_image_folder(imagenet_folder, num_classes=3)
    message = str(refused.value)
    assert "\n" not in message
    assert message == (f"Class folders without images in {train}: n001, n002, n003. They hold folders instead (e.g. "
                       f"{train / 'n001/photos'}): the files of a class must lie directly in its folder, "
                       f"{train}/<class>/<file>; move them up a level (e.g. mv {train / 'n001/photos'}/* "
                       f"{train / 'n001'}/).")
    for name in ("n001", "n002", "n003"):  # moved up as said, every image is read
        for image in (train / name / "photos").glob("*.JPEG"):
            image.rename(train / name / image.name)
        (train / name / "photos").rmdir()
    assert len(scan_image_folder(imagenet_folder, num_classes=3).train) == 12


def _nest_tiny_imagenet_train(root: Path) -> None:
    """Lay train/ out as Tiny ImageNet's zip unpacks: train/<wnid>/images/<file> beside
    train/<wnid>/<wnid>_boxes.txt."""
    for folder in sorted((root / "train").iterdir()):
        (folder / "images").mkdir()
        for image in folder.glob("*.JPEG"):
            image.rename(folder / "images" / image.name)
        (folder / f"{folder.name}_boxes.txt").write_text(f"{folder.name}_0.JPEG\t0\t0\t39\t39\n")


def _read(root: Path, stage: str) -> ImageFolderDataModule:
    data = ImageFolderDataModule(str(root), num_classes=3, image_size=32, eval_resize=36, batch_size=4,
                                 num_workers=0, pin_memory=False, persistent_workers=False)
    data.setup(stage)
    return data


def test_tiny_imagenet_as_distributed_is_read_as_its_flattened_layout(imagenet_folder, tmp_path):
    """Tiny ImageNet as its zip unpacks (train/<wnid>/images/, val/images/ + val_annotations.txt) is read,
    not refused with a mv hint: the same classes in the same order, the same samples with the same
    labels, and the same data fingerprint as the flattened layout (train/<wnid>/<file>)."""
    _tiny_imagenet_val(imagenet_folder)
    flat = tmp_path / "flat"
    shutil.copytree(imagenet_folder, flat)
    _nest_tiny_imagenet_train(imagenet_folder)
    tiny, plain = _read(imagenet_folder, "fit"), _read(flat, "fit")
    assert tiny.class_names == plain.class_names == ["n001", "n002", "n003"]
    for split in ("train_set", "val_set"):
        ours, theirs = getattr(tiny, split).samples, getattr(plain, split).samples
        assert [(Path(p).name, Path(p).read_bytes(), y) for p, y in ours] == \
            [(Path(p).name, Path(p).read_bytes(), y) for p, y in theirs]
    assert len(tiny.train_set) == 12
    assert tiny.data_fingerprint()["splits"] == plain.data_fingerprint()["splits"]
    assert tiny.unread_files == [str(imagenet_folder / f"train/{n}/{n}_boxes.txt") for n in ("n001", "n002", "n003")]
    images, labels = next(iter(tiny.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and labels.dtype == torch.long

    (imagenet_folder / "train/n002/n002_9.JPEG").write_bytes(b"")  # a loose image: not that layout, as before
    with pytest.raises(DataError, match="Class folders without images in .*: n001, n003. They hold folders"):
        scan_image_folder(imagenet_folder, num_classes=3)


def test_tiny_imagenets_box_annotations_are_named_as_such_without_advice_to_convert(imagenet_folder):
    """train/<wnid>/<wnid>_boxes.txt beside train/<wnid>/images/ are counted as the dataset's box
    annotations, with no advice to convert or move them; another unread file keeps that advice."""
    _nest_tiny_imagenet_train(imagenet_folder)
    train = imagenet_folder / "train"
    unread = [str(train / f"{n}/{n}_boxes.txt") for n in ("n001", "n002", "n003")]
    assert unread_line(unread, READ) == (
        f"data: 3 file(s) under {train} were found but not read (box annotations 3), e.g. {unread[0]}; the "
        "<class>_boxes.txt files are the dataset's box annotations, which classification does not read")
    (train / "n001/notes.heic").write_bytes(b"x")
    line = unread_line([*unread, str(train / "n001/notes.heic")], READ)
    assert line.startswith(f"data: 4 file(s) under {train} were found but not read (.heic 1, box annotations 3)")
    assert line.endswith(f"which classification does not read; only {'/'.join(READ)} files are read: convert the "
                         "others or move them out of the data folder")


def test_an_empty_class_folder_in_tiny_imagenets_layout_is_named_alone(imagenet_folder):
    """One class folder left empty (an unpacking cut short) among Tiny ImageNet's train/<wnid>/images/:
    that class is named as holding no image, not every class told to move its images up a level."""
    _nest_tiny_imagenet_train(imagenet_folder)
    shutil.rmtree(imagenet_folder / "train/n002")
    (imagenet_folder / "train/n002").mkdir()
    with pytest.raises(DataError, match=r"^Class folders without images in .*train: n002\. Add image files"):
        scan_image_folder(imagenet_folder, num_classes=3)


def test_class_names_differing_only_in_case_are_named_as_such(imagenet_folder):
    """val/N003 against train/n003 (a copy through a case-insensitive disk, a script that changed the
    case): the line says the names differ only in case."""
    (imagenet_folder / "val/n003").rename(imagenet_folder / "val/N003")
    with pytest.raises(DataError) as refused:
        scan_image_folder(imagenet_folder, num_classes=3)
    message = str(refused.value)
    assert "\n" not in message and "missing from val/: n003; not in train/: N003" in message
    assert message.endswith(" n003 / N003 differ only in case (train/ / val/): folder names are compared as written; "
                            "rename the folders of one split to the other's spelling.")


def _tiny_imagenet_val(root: Path) -> list[str]:
    """Lay val/ out as Tiny ImageNet's is: val/images/val_<i>.JPEG and val/val_annotations.txt
    (``<file>\\t<wnid>\\t<x0>\\t<y0>\\t<x1>\\t<y1>``); the class of every image, in file order."""
    val = root / "val"
    (val / "images").mkdir()
    lines, labels = [], []
    for i, image in enumerate(sorted(val.glob("*/*.JPEG"), key=lambda p: p.name)):
        name = f"val_{i}.JPEG"
        image.rename(val / "images" / name)
        lines.append(f"{name}\t{image.parent.name}\t0\t0\t39\t39")
        labels.append(image.parent.name)
    for folder in val.iterdir():
        if folder.name != "images":
            folder.rmdir()
    (val / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return labels


def test_tiny_imagenet_validation_images_are_read_by_their_annotations(imagenet_folder):
    """Tiny ImageNet's val/ holds no class folders but val/images/ and val_annotations.txt: its
    images are read with the classes the annotations give them, not refused as a class 'images'."""
    plain = scan_image_folder(imagenet_folder, num_classes=3)
    pixels = {Path(path).name: (Path(path).read_bytes(), label) for path, label in plain.val}
    classes = _tiny_imagenet_val(imagenet_folder)
    (imagenet_folder / "val/images/stray.JPEG").write_bytes(b"not named by any line")
    tiny = scan_image_folder(imagenet_folder, num_classes=3)
    assert tiny.class_names == plain.class_names and tiny.train == plain.train
    assert sorted((Path(p).read_bytes(), label) for p, label in tiny.val) == sorted(pixels.values())
    assert [plain.class_names[label] for _, label in tiny.val] == sorted(classes)
    assert tiny.unread == [str(imagenet_folder / "val/images/stray.JPEG")]  # named, not read
    dm = ImageFolderDataModule(str(imagenet_folder), num_classes=3, image_size=32, eval_resize=36, batch_size=8,
                               num_workers=0, pin_memory=False, persistent_workers=False)
    dm.setup("validate")
    images, labels = next(iter(dm.val_dataloader()))
    assert images.shape == (6, 3, 32, 32) and sorted(labels.tolist()) == [0, 0, 1, 1, 2, 2]

    annotations = imagenet_folder / "val/val_annotations.txt"
    annotations.write_text(annotations.read_text() + "val_99.JPEG\tn001\t0\t0\t1\t1\n")
    with pytest.raises(DataError) as refused:
        scan_image_folder(imagenet_folder, num_classes=3)
    assert "\n" not in str(refused.value) and f"{annotations}:7 (data.root) names val_99.JPEG" in str(refused.value)
    annotations.write_text("val_0.JPEG\n")
    with pytest.raises(DataError, match=r"val_annotations\.txt:1 \(data\.root\) is not '<file>"):
        scan_image_folder(imagenet_folder, num_classes=3)


def test_tiny_imagenet_annotations_saved_with_a_byte_order_mark_name_their_first_image(imagenet_folder):
    """val_annotations.txt saved by a Windows editor ("UTF-8 with BOM", \\r\\n breaks): its first line named
    an invisible U+FEFF before val_0.JPEG, refused as "names val_0.JPEG, which is not in val/images", a file
    that is there. The mark is no part of the name: every image is read with its class."""
    plain = scan_image_folder(imagenet_folder, num_classes=3)
    _tiny_imagenet_val(imagenet_folder)
    annotations = imagenet_folder / "val/val_annotations.txt"
    annotations.write_bytes(b"\xef\xbb\xbf" + annotations.read_text().replace("\n", "\r\n").encode())
    tiny = scan_image_folder(imagenet_folder, num_classes=3)
    assert len(tiny.val) == len(plain.val) == 6 and tiny.unread == []
    assert sorted(label for _, label in tiny.val) == [0, 0, 1, 1, 2, 2]


def test_an_evaluation_is_not_refused_for_training_images_it_does_not_read(imagenet_folder):
    """train/ that lost the images of a class (a machine that keeps the validation images): validate,
    test and predict read val/ with train/'s class names; a fit is still refused in one line."""
    for image in (imagenet_folder / "train/n002").iterdir():
        image.unlink()
    folder = scan_image_folder(imagenet_folder, num_classes=3, eval_only=True)
    assert folder.class_names == ["n001", "n002", "n003"] and len(folder.val) == 6
    data = _read(imagenet_folder, "validate")
    assert sorted(label for _, label in data.val_set.samples) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(DataError, match=r"^Class folders without images in .*train: n002\. Add image files"):
        scan_image_folder(imagenet_folder, num_classes=3)
