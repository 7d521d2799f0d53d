"""The three Kinetics layouts on disk give the same samples and classes; problems are one line."""
from __future__ import annotations

import os
import shutil
import warnings

import pytest

from rescale_tasks.common.errors import DataError
from rescale_tasks.video.layouts import (VideoSample, class_names_of, integer_labels, label_samples, read_cvdf,
                                         read_folders, read_layout, read_lists)


def _layout_args(k, layout: str) -> dict:
    return {"folders": dict(root=k.root),
            "cvdf": dict(train_csv=k.train_csv, val_csv=k.val_csv, video_dir=k.video_dir),
            "list": dict(train_list=k.train_list, val_list=k.val_list, list_prefix=k.list_prefix)}[layout]


def _one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("layout", ["folders", "cvdf", "list"])
def test_each_layout_gives_the_same_samples_and_classes(kinetics_clips, layout):
    k = kinetics_clips
    args = _layout_args(k, layout)
    assert class_names_of(layout, **args) == k.classes  # the cheap scan agrees with the full one
    splits = read_layout(layout, **args)
    assert splits.class_names == k.classes
    for split in ("train", "val"):
        got = getattr(splits, split)
        assert [(os.path.basename(s.path), s.label_name) for s in got] == getattr(k, split)
        assert all(os.path.isfile(s.path) for s in got)
    labelled = label_samples(splits.train, splits.class_names)
    assert [label for _, label in labelled] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_cvdf_rows_without_a_file_are_counted_warned_once_and_left_out(kinetics_clips, tmp_path):
    k = kinetics_clips
    csv = tmp_path / "train.csv"
    lines = k.train_csv.read_text().splitlines()
    # two rows whose videos were never downloaded, one of them a class with no video at all
    lines += ["bikes,gone1,5,15,train", "zebra,gone2,0,10,train"]
    csv.write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match=r"^2 of 11 videos listed in .*train\.csv .*not in") as record:
        splits = read_cvdf(csv, k.val_csv, k.video_dir)
    assert len(record) == 1
    assert len(splits.train) == 9
    assert splits.class_names == k.classes + ["zebra"]  # classes come from the annotations
    with pytest.raises(DataError) as err:  # no video of the split present: an error
        read_cvdf(csv, k.val_csv, tmp_path)
    assert "None of the 11 videos" in _one_line(err) and "data.video_dir" in str(err.value)



def test_list_videos_not_on_disk_are_counted_warned_once_and_left_out_as_for_cvdf(kinetics_clips, tmp_path):
    """Kinetics downloads always miss some videos: a list naming them serves the rest, with one warning
    line per split and the absent paths kept for the data report, as the cvdf layout does."""
    k = kinetics_clips
    listed = tmp_path / "train.txt"
    names = [f"train/bikes/missing_{i}.mp4" for i in range(5)]
    listed.write_text(k.train_list.read_text() + "".join(f"{n} bikes\n" for n in names) + "train/gone.mp4 zebra\n")
    with pytest.warns(UserWarning, match=r"^6 of 15 videos listed in .*train\.txt \(data\.train_list\) are not in") \
            as record:
        splits = read_lists(listed, k.val_list, k.list_prefix)
    assert len(record) == 1
    assert splits.train == read_lists(k.train_list, k.val_list, k.list_prefix).train
    assert splits.class_names == k.classes + ["zebra"]  # classes come from the list, not the disk
    assert splits.missing == {"train": [str(k.list_prefix / n) for n in names] + [str(k.list_prefix / "train/gone.mp4")],
                              "val": []}
    val = tmp_path / "val.txt"  # a class training lacks is refused, its video there or not
    val.write_text(k.val_list.read_text() + "val/gone.mp4 yak\n")
    with pytest.raises(DataError, match="names 1 class"), pytest.warns(UserWarning):
        read_lists(k.train_list, val, k.list_prefix)
    cvdf = tmp_path / "train.csv"
    cvdf.write_text(k.train_csv.read_text() + "bikes,gone1,5,15,train\n")
    with pytest.warns(UserWarning):
        assert read_cvdf(cvdf, k.val_csv, k.video_dir).missing == {"train": [str(k.video_dir / "gone1_000005_000015.mp4")],
                                                                   "val": []}


def test_cvdf_clips_downloaded_into_other_containers_are_found(kinetics_clips, tmp_path):
    """yt-dlp writes <youtube_id>_<start>_<end>.mkv or .webm where it merges formats: those clips are
    the rows' videos, not downloads missing (warned about and left out)."""
    k = kinetics_clips
    folder = tmp_path / "videos"
    shutil.copytree(k.video_dir, folder)
    expected = read_cvdf(k.train_csv, k.val_csv, k.video_dir)
    names = sorted(p.name for p in folder.iterdir())
    (folder / names[0]).rename(folder / names[0].replace(".mp4", ".mkv"))
    (folder / names[1]).rename(folder / names[1].replace(".mp4", ".WEBM"))
    shutil.copy(folder / names[2], folder / names[2].replace(".mp4", ".webm"))  # twice: the .mp4 is read
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "videos listed ... are not in" warning
        splits = read_cvdf(k.train_csv, k.val_csv, folder)
    renamed = {names[0]: names[0].replace(".mp4", ".mkv"), names[1]: names[1].replace(".mp4", ".WEBM")}
    for split in ("train", "val"):
        got, want = getattr(splits, split), getattr(expected, split)
        assert [s.label_name for s in got] == [s.label_name for s in want]
        assert [os.path.basename(s.path) for s in got] == [renamed.get(os.path.basename(s.path), os.path.basename(s.path))
                                                           for s in want]
        assert all(os.path.isfile(s.path) for s in got)



def test_list_files_written_on_windows_name_their_videos(kinetics_clips, tmp_path):
    """A list file made on Windows separates folders with backslashes (train\\bikes\\clip.mp4): the
    videos are found, not refused as missing."""
    k = kinetics_clips
    expected = read_lists(k.train_list, k.val_list, k.list_prefix)
    lists = {}
    for split, listed in (("train", k.train_list), ("val", k.val_list)):
        lines = listed.read_text(encoding="utf-8").splitlines()
        lists[split] = tmp_path / listed.name
        lists[split].write_text("".join(line.replace("/", "\\") + "\r\n" for line in lines), encoding="utf-8")
    assert "\\" in lists["train"].read_text(encoding="utf-8")
    assert read_lists(lists["train"], lists["val"], k.list_prefix) == expected


def test_list_files_in_other_accents_than_the_files_name_their_videos(kinetics_clips, tmp_path):
    """A list written on Linux names 'train/<class>/vidéo <clip>' with a composed é; the clips, copied
    through macOS, are named decomposed (e + a combining accent): every one was missing, and a split
    with none refused. They are found, each under its own file name."""
    import unicodedata

    k = kinetics_clips
    expected = read_lists(k.train_list, k.val_list, k.list_prefix)
    prefix, lists = tmp_path / "copied", {}
    for split, listed in (("train", k.train_list), ("val", k.val_list)):
        lines = []
        for line in listed.read_text(encoding="utf-8").splitlines():
            rel, label = line.rsplit(" ", 1)
            folder, name = rel.rsplit("/", 1)
            accented = f"{folder}/vidéo {name}"
            (prefix / folder).mkdir(parents=True, exist_ok=True)
            (prefix / unicodedata.normalize("NFD", accented)).symlink_to(os.path.join(k.list_prefix, rel))
            lines.append(f"{unicodedata.normalize('NFC', accented)} {label}\n")
        lists[split] = tmp_path / listed.name
        lists[split].write_text("".join(lines), encoding="utf-8")
    splits = read_lists(lists["train"], lists["val"], prefix)
    for split in ("train", "val"):
        got, want = getattr(splits, split), getattr(expected, split)
        assert [s.label_name for s in got] == [s.label_name for s in want]
        named = [unicodedata.normalize("NFD", f"vidéo {os.path.basename(w.path)}") for w in want]
        assert [os.path.basename(s.path) for s in got] == named
        assert all(os.path.isfile(s.path) and s.path.startswith(str(prefix)) for s in got)


def test_integer_label_lists_keep_their_numbers_and_accept_commas(kinetics_clips, tmp_path):
    k = kinetics_clips
    train = tmp_path / "train.csv"
    train.write_text("# path,label\n" + "".join(f"train/{c}/{n},{k.classes.index(c) * 2}\n" for n, c in k.train))
    val = tmp_path / "val.txt"
    val.write_text("".join(f"val/{c}/{n} {k.classes.index(c) * 2}\n" for n, c in k.val))
    splits = read_lists(train, val, k.list_prefix)
    assert splits.class_names == [str(i) for i in range(5)]  # max label 4 + 1
    assert [s.label_name for s in splits.val] == ["0", "2", "4"]
    assert [label for _, label in label_samples(splits.val, splits.class_names)] == [0, 2, 4]
    # a name in the validation list of integer-labelled training data
    val.write_text(f"val/bikes/{k.val[0][0]} bikes\n")
    with pytest.raises(DataError, match="integer labels"):
        read_lists(train, val, k.list_prefix)


def test_a_label_of_digits_int_refuses_is_a_class_name(tmp_path):
    """``²`` is a digit to ``str.isdigit`` but no integer: a list holding it names its classes, as
    every check of integer labels (classes, splits, the evaluation's class count) agrees."""
    for name in ("a.mp4", "b.mp4"):
        (tmp_path / name).touch()
    (tmp_path / "train.txt").write_text("a.mp4 \u00b2\nb.mp4 1\n", encoding="utf-8")
    (tmp_path / "val.txt").write_text("b.mp4 1\n", encoding="utf-8")
    splits = read_lists(tmp_path / "train.txt", tmp_path / "val.txt", tmp_path)
    assert splits.class_names == ["1", "\u00b2"] and [s.label_name for s in splits.val] == ["1"]
    assert not integer_labels("list", train_list=tmp_path / "train.txt", val_list=tmp_path / "val.txt")


def test_one_line_errors(kinetics_clips, tmp_path):
    k = kinetics_clips
    with pytest.raises(DataError) as err:
        read_folders(tmp_path / "nowhere")
    assert "nowhere" in _one_line(err) and "data.root" in str(err.value)
    with pytest.raises(DataError) as err:
        class_names_of("folders", root=None)
    assert "data.root is not set" in _one_line(err)

    wrong = tmp_path / "wrong.csv"
    wrong.write_text("label,video,start,end\nbikes,x,0,10\n")
    with pytest.raises(DataError) as err:
        read_cvdf(wrong, k.val_csv, k.video_dir)
    message = _one_line(err)
    assert "youtube_id" in message and "label,youtube_id,time_start,time_end,split" in message

    with pytest.raises(DataError) as err:  # no listed video there: a wrong prefix, one line
        read_lists(k.train_list, k.val_list, tmp_path)
    message = _one_line(err)
    assert "None of the 9 videos" in message and "(+6 more)" in message and "data.list_prefix" in message


def test_a_validation_class_written_in_other_accents_is_named_as_such(kinetics_clips, tmp_path):
    """train/bikés (composed é) and val/bikés copied through macOS (decomposed): the same name to the eye,
    which the line said the training split lacked, with nothing to tell why. It says why, and the mend."""
    import unicodedata

    k = kinetics_clips
    root = tmp_path / "folders"
    shutil.copytree(k.root, root)
    (root / "train" / "bikes").rename(root / "train" / unicodedata.normalize("NFC", "bikés"))
    (root / "val" / "bikes").rename(root / "val" / unicodedata.normalize("NFD", "bikés"))
    with pytest.raises(DataError) as err:
        read_folders(root)
    assert _one_line(err) == (f"{root / 'val'} names 1 class(es) the training split lacks: "
                              f"{unicodedata.normalize('NFD', 'bikés')}. {unicodedata.normalize('NFD', 'bikés')} is "
                              "written with other Unicode characters than in the training split (composed and "
                              "decomposed accents: macOS writes decomposed names); write them as the training split does.")


def test_a_validation_class_in_other_accents_beside_an_unknown_one_keeps_the_mend_of_the_unknown(kinetics_clips,
                                                                                                   tmp_path):
    import unicodedata

    root = tmp_path / "folders"
    shutil.copytree(kinetics_clips.root, root)
    (root / "train" / "bikes").rename(root / "train" / unicodedata.normalize("NFC", "bikés"))
    (root / "val" / "bikes").rename(root / "val" / unicodedata.normalize("NFD", "bikés"))
    shutil.copytree(root / "val" / unicodedata.normalize("NFD", "bikés"), root / "val" / "zebras")
    with pytest.raises(DataError) as err:
        read_folders(root)
    line = _one_line(err)
    assert "names 2 class(es) the training split lacks" in line and "written with other Unicode characters" in line
    assert line.endswith("write them as the training split does. Validation class folders must also exist in "
                         "train/."), line


def test_validation_classes_must_be_known_from_training(kinetics_clips, tmp_path):
    k = kinetics_clips
    root = tmp_path / "folders"
    shutil.copytree(k.root, root)
    (root / "val" / "yak").mkdir()
    shutil.copy(k.root / "val" / "bikes" / k.val[0][0], root / "val" / "yak" / "y.mp4")
    with pytest.raises(DataError) as err:
        read_folders(root)
    assert "yak" in _one_line(err) and "train/" in str(err.value)
    val = tmp_path / "val.txt"
    val.write_text(f"val/bikes/{k.val[0][0]} yak\n")
    with pytest.raises(DataError, match="yak"):
        read_lists(k.train_list, val, k.list_prefix)
    assert VideoSample("a.mp4", "x") == VideoSample("a.mp4", "x")


@pytest.mark.parametrize("layout", ["cvdf", "list"])
def test_annotation_files_saved_by_a_spreadsheet_read_as_written(kinetics_clips, tmp_path, layout):
    """A CSV or list file saved as "CSV UTF-8" (a byte-order mark first, Windows line breaks) gives
    the same samples; one that is not UTF-8 is one line naming the file, the line and the fix."""
    k = kinetics_clips
    args = _layout_args(k, layout)
    key = "train_csv" if layout == "cvdf" else "train_list"
    expected = read_layout(layout, **args)
    spreadsheet = tmp_path / args[key].name
    spreadsheet.write_bytes(b"\xef\xbb\xbf" + args[key].read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    args = {**args, key: spreadsheet}
    assert class_names_of(layout, **args) == k.classes
    assert read_layout(layout, **args) == expected
    lines = args[key].read_bytes().split(b"\r\n")
    lines[2] = lines[2].replace(b"bikes", b"v\xe9los")  # a Latin-1 class name
    args[key].write_bytes(b"\r\n".join(lines))
    with pytest.raises(DataError) as err:
        read_layout(layout, **args)
    assert _one_line(err).startswith(f"{spreadsheet}:3 (data.{key}) is not UTF-8 (")
    assert "convert the text to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)" in str(err.value)
    # saved as UTF-16 (Windows PowerShell's >): named as such, with the conversion from UTF-16
    args[key].write_bytes(args[key].read_bytes().replace(b"\xe9", b"e").decode("utf-8-sig").encode("utf-16"))
    with pytest.raises(DataError) as err:
        read_layout(layout, **args)
    assert _one_line(err).startswith(f"{spreadsheet}:1 (data.{key}) is not UTF-8 (")
    assert "it is UTF-16" in str(err.value) and "iconv -f UTF-16 -t UTF-8" in str(err.value)


def test_an_evaluation_is_not_refused_for_training_videos_it_does_not_read(kinetics_clips, tmp_path):
    """Class folders whose train/ lost the videos of a class (or all of them: a machine that copied the
    validation videos alone): validate, test and predict read val/ with train/'s class names; a fit
    is still refused in one line."""
    k = kinetics_clips
    root = tmp_path / "kinetics"
    shutil.copytree(k.root, root)
    for video in (root / "train" / k.classes[1]).iterdir():
        video.unlink()
    splits = read_folders(root, eval_only=True)
    assert splits.class_names == k.classes
    assert [(os.path.basename(s.path), s.label_name) for s in splits.val] == k.val
    with pytest.raises(DataError, match=rf"^Class folders without videos in {root / 'train'}: {k.classes[1]}\."):
        read_folders(root)
    for folder in (root / "train").iterdir():
        for video in folder.iterdir():
            video.unlink()
    assert read_folders(root, eval_only=True).class_names == k.classes
    with pytest.raises(DataError, match="^Class folders without videos"):
        read_folders(root)
