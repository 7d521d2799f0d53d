"""The Kinetics layouts people have on disk, read into ``VideoSample(path, label_name)`` lists.

Three layouts (``layout=`` in :class:`~rescale_tasks.video.data.KineticsDataModule`):

* ``"folders"``: ``root/{train,val}/<class>/<clip>`` -- torchvision's ``Kinetics`` layout, and the
  CVDF download (``cvdfoundation/kinetics-dataset``) after its ``k400_extractor``/arrange script.
* ``"cvdf"``: the official annotation CSVs (header ``label,youtube_id,time_start,time_end,split``;
  extra columns such as ``is_cc`` are ignored) next to one flat folder of
  ``<youtube_id>_<start:06d>_<end:06d>.mp4`` files, as the CVDF tarballs unpack (or of any video
  extension the ``folders`` layout reads, as downloaders write ``.mkv``/``.webm``; the ``.mp4`` where a
  clip is there twice). Kinetics
  downloads always miss some videos (taken off YouTube): rows whose file is absent are counted,
  warned about once, and left out; only a split with no file at all is an error.
* ``"list"``: mmaction2 / SlowFast list files, one ``<path> <label>`` per line (space or comma
  separated, as SlowFast's ``path_to_video label``), the path relative to ``list_prefix`` (or
  absolute; a list written on Windows may separate folders with ``\\``), the label an integer or a
  class name. Listed videos that do not exist are counted, warned about once per split, and left
  out, as for ``"cvdf"``; only a split with no video at all is an error.

The class list comes from the training split: sorted class names, except for list files whose
labels are all integers, where the names are ``"0", "1", ...`` (so the integers keep their
meaning), ``data.num_classes`` of them where it is set, else ``max label + 1``; an evaluation with
``--ckpt_path`` sets it to the checkpoint's class count, so a validation list alone (which need not
name the highest class) numbers the classes the network learned. Validation may not name a class training lacks. A machine that
only evaluates may lack the training split (class folders holding val/ alone; ``train_csv`` or
``train_list`` unset or not there): validate, test and predict then take the classes from the
validation split, and a checkpoint's classes are matched to them by name. Classes are
taken from the annotations, not from which files happen to be present, so ``num_classes`` is the
same whatever was downloaded.

Every function here has a cheap ``*_classes`` twin used right after the DataModule's ``__init__``
(folder names, CSV labels, list labels; no video is looked at) and a full scan for ``setup``.
Annotation and list files are UTF-8; a byte-order mark opening one is no part of its first line.
Every problem is one :class:`~rescale_tasks.common.errors.DataError` line: what, where, how to fix.
"""
from __future__ import annotations

import codecs
import csv
import io
import os
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from lightning.pytorch.utilities import rank_zero_warn

from rescale_tasks.common.data import found_path, nested_folders_hint, scan_class_folders, to_utf8_advice
from rescale_tasks.common.errors import DataError

__all__ = [
    "CVDF_COLUMNS", "LAYOUTS", "VIDEO_EXTENSIONS", "VideoSample", "VideoSplits", "class_list_key", "class_names_of",
    "cvdf_file_name", "integer_labels", "label_samples", "read_cvdf", "read_folders", "read_layout", "read_lists",
]

LAYOUTS = ("folders", "cvdf", "list")
VIDEO_EXTENSIONS = (".mp4", ".avi", ".mkv", ".webm", ".mov", ".m4v", ".mpg", ".mpeg")
CVDF_COLUMNS = ("label", "youtube_id", "time_start", "time_end", "split")
SPLITS = ("train", "val")


@dataclass(frozen=True)
class VideoSample:
    """One video file and the name of its class."""

    path: str
    label_name: str


@dataclass(frozen=True)
class VideoSplits:
    """The training and validation samples and the class list (index = label)."""

    train: list[VideoSample]
    val: list[VideoSample]
    class_names: list[str]
    #: what the class folders layout holds besides videos (other extensions, hidden files, sub-folders,
    #: files beside the class folders), for the data report; empty for the other layouts
    unread: list[str] = field(default_factory=list)
    #: split -> the videos its ``cvdf`` or ``list`` annotations name that are not on disk (left out), for
    #: the data report; empty for the class folders layout
    missing: dict[str, list[str]] = field(default_factory=dict)


def _names(items: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(str(i) for i in items[:limit])
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def _path(value: str | os.PathLike | None, key: str, what: str) -> Path:
    if value is None or str(value) == "":
        raise DataError(f"data.{key} is not set; point it at {what}.")
    return Path(os.path.expanduser(str(value)))


def _text(path: Path, key: str) -> str:
    """The text of an annotation or list file: UTF-8, a byte-order mark opening it (spreadsheets and
    Windows editors write one) no part of its first line; other bytes one DataError naming the line."""
    raw = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise DataError(f"{path}:{line} (data.{key}) is not UTF-8 ({err.reason} at byte {err.start}); "
                        f"{to_utf8_advice(raw)}.") from None


def _warn_missing(missing: int, listed: int, value, key: str, where: str) -> None:
    """One warning line for the listed videos of one split that are not on disk (left out)."""
    if missing:
        rank_zero_warn(f"{missing} of {listed} videos listed in {value} (data.{key}) are not in {where} "
                       "(Kinetics downloads always miss some); going on without them")


def _read_by_the_command(split: str, eval_only: bool) -> bool:
    """Whether the command reads ``split``'s videos: an evaluation (``eval_only``) reads val alone,
    whatever annotation files it is given; its videos missing from a download are warned about, and
    a split with none of them is refused; the training split's are not."""
    return split == "val" or not eval_only


def _eval_file_only(train, val) -> bool:
    """Whether the training annotation (CSV or list) file is unset or absent while the validation one
    is there: a machine that only evaluates, whose classes are the validation file's."""
    def there(value) -> bool:
        return value is not None and str(value) != "" and Path(os.path.expanduser(str(value))).is_file()
    return not there(train) and there(val)


def _check_subset(train_classes: Sequence[str], val_labels: Sequence[str], where: str, fix: str) -> None:
    known = set(train_classes)
    unknown = sorted({name for name in val_labels if name not in known})
    if unknown:
        composed = {unicodedata.normalize("NFC", name) for name in known}
        same = [name for name in unknown if unicodedata.normalize("NFC", name) in composed]
        if same:  # the same names to the eye: say why they differ (and keep the mend of the others)
            accents = (f"{_names(same)} {'is' if len(same) == 1 else 'are'} written with other Unicode characters than "
                       "in the training split (composed and decomposed accents: macOS writes decomposed names); write "
                       "them as the training split does.")
            fix = accents if len(same) == len(unknown) else f"{accents} {fix}"
        raise DataError(f"{where} names {len(unknown)} class(es) the training split lacks: {_names(unknown)}. {fix}")


# ----------------------------------------------------------------------------- class folders


def _folder_split(root: Path, split: str) -> Path:
    if not root.is_dir():
        raise DataError(f"Kinetics folder not found: {root} (data.root). Point --data.root at a folder "
                        "holding train/ and val/ class folders of videos.")
    split_dir = root / split
    if not split_dir.is_dir():
        raise DataError(f"Kinetics folder {root} (data.root) has no {split}/ sub-folder: expected "
                        f"{split_dir}/<class>/<video>. Point --data.root at a folder holding train/ and val/.")
    return split_dir


def _class_folders(split_dir: Path) -> list[str]:
    with os.scandir(split_dir) as entries:
        names = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    if not names:
        raise DataError(f"No class folders in {split_dir} (data.root). Expected one sub-folder per class, "
                        f"e.g. {split_dir}/abseiling/<video>.mp4.")
    return names


def _val_only(root: Path) -> bool:
    """Whether ``root`` holds val/ and no train/: a machine that only evaluates."""
    return root.is_dir() and not (root / "train").is_dir() and (root / "val").is_dir()


def folder_classes(root: str | os.PathLike | None) -> list[str]:
    """The class names of ``root/train`` (folder names only; cheap); of ``root/val`` where there is no
    train/ (a machine that only evaluates: the checkpoint's classes are matched to them by name)."""
    root = _path(root, "root", "the Kinetics folder")
    return _class_folders(root / "val" if _val_only(root) else _folder_split(root, "train"))


def read_folders(root: str | os.PathLike | None, eval_only: bool = False) -> VideoSplits:
    """``root/{train,val}/<class>/<video>``; every training class folder must hold a video. What the
    folders hold besides videos is listed in :attr:`VideoSplits.unread`. ``eval_only`` (validate,
    test, predict): a folder holding val/ alone will do; its class folders are the classes, and
    ``train`` is empty; with train/, its class folders are the classes, and need not hold videos."""
    root = _path(root, "root", "the Kinetics folder")
    found: dict[str, dict[str, list[str]]] = {}
    unread: list[str] = []
    splits = ("val",) if eval_only and _val_only(root) else SPLITS
    for split in splits:
        split_dir = _folder_split(root, split)
        _class_folders(split_dir)  # one line when there is none
        classes = scan_class_folders(split_dir, VIDEO_EXTENSIONS, unread)
        empty = [name for name, files in classes.items() if not files]
        read = _read_by_the_command(split, eval_only)  # (an evaluation reads train/ for its class names)
        if split == "train" and empty and read:
            raise DataError(f"Class folders without videos in {split_dir}: {_names(empty)}."
                            + (nested_folders_hint(split_dir, empty, unread) or
                               f" Add video files ({'/'.join(VIDEO_EXTENSIONS)}) or remove those folders."))
        if not any(classes.values()) and read:
            raise DataError(f"No videos in {split_dir} (data.root): expected {split_dir}/<class>/<video>.mp4.")
        found[split] = classes
    names = list(found.get("train", found["val"]))
    _check_subset(names, list(found["val"]), f"{root / 'val'}",
                  "Validation class folders must also exist in train/.")
    samples = {split: [VideoSample(f, name) for name, files in found.get(split, {}).items() for f in files]
               for split in SPLITS}
    return VideoSplits(samples["train"], samples["val"], names, sorted(unread))


# ----------------------------------------------------------------------------- official CVDF CSVs


def cvdf_file_name(youtube_id: str, time_start: int, time_end: int) -> str:
    """The CVDF tarballs' file name for one annotation row."""
    return f"{youtube_id}_{time_start:06d}_{time_end:06d}.mp4"


def _read_csv(path: Path, key: str) -> list[tuple[str, str]]:
    """``(label, file name)`` per row of an official Kinetics CSV."""
    if not path.is_file():
        raise DataError(f"Kinetics annotation file not found: {path} (data.{key}). Point it at the CVDF "
                        "CSV (e.g. kinetics400/annotations/train.csv).")
    with io.StringIO(_text(path, key), newline="") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in CVDF_COLUMNS if c not in header]
        if missing:
            raise DataError(f"{path} (data.{key}) lacks the column(s) {', '.join(missing)}: expected the header "
                            f"line '{','.join(CVDF_COLUMNS)}' of the official Kinetics CSVs.")
        at = {c: header.index(c) for c in CVDF_COLUMNS}
        rows = []
        for line, row in enumerate(reader, start=2):
            if not row or not "".join(row).strip():
                continue
            try:
                label = row[at["label"]].strip()
                name = cvdf_file_name(row[at["youtube_id"]].strip(), int(float(row[at["time_start"]])),
                                      int(float(row[at["time_end"]])))
            except (IndexError, ValueError):
                raise DataError(f"{path}:{line} (data.{key}) is not a '{','.join(CVDF_COLUMNS)}' row: "
                                f"{','.join(row)[:80]!r}. Fix or delete that line.") from None
            rows.append((label, name))
    if not rows:
        raise DataError(f"{path} (data.{key}) has a header but no rows; point it at a non-empty Kinetics CSV.")
    return rows


def csv_classes(train_csv: str | os.PathLike | None, key: str = "train_csv") -> list[str]:
    """The sorted labels of the training CSV (of ``data.<key>``; no video is looked at)."""
    path = _path(train_csv, key, f"the official Kinetics {key.split('_')[0]}.csv")
    return sorted({label for label, _ in _read_csv(path, key)})


def read_cvdf(train_csv: str | os.PathLike | None, val_csv: str | os.PathLike | None,
              video_dir: str | os.PathLike | None, eval_only: bool = False) -> VideoSplits:
    """Official CSVs next to a flat folder of ``<youtube_id>_<start>_<end>.mp4``; absent files are
    counted, warned about once per split, and left out. ``eval_only`` (validate, test, predict):
    without a training CSV the classes are the validation CSV's, and ``train`` is empty; with one,
    its absent videos are not warned about (the command reads val alone)."""
    folder = _path(video_dir, "video_dir", "the flat folder of Kinetics .mp4 files")
    if not folder.is_dir():
        raise DataError(f"Kinetics video folder not found: {folder} (data.video_dir). Point it at the folder "
                        "holding <youtube_id>_<start>_<end>.mp4 files.")
    present: dict[str, str] = {}  # "<youtube_id>_<start>_<end>" -> its file (a download may be .mkv or .webm)
    with os.scandir(folder) as entries:  # one listing instead of a stat per row (~240k rows)
        for e in entries:
            stem, extension = os.path.splitext(e.name)
            if (e.is_file() and extension.lower() in VIDEO_EXTENSIONS
                    and (stem not in present or extension.lower() == ".mp4")):  # the .mp4 of two
                present[stem] = e.name
    out: dict[str, list[VideoSample]] = {}
    rows_of: dict[str, list[tuple[str, str]]] = {}
    missing: dict[str, list[str]] = {}
    val_only = eval_only and _eval_file_only(train_csv, val_csv)
    for split, value in (("val", val_csv),) if val_only else (("train", train_csv), ("val", val_csv)):
        key = f"{split}_csv"
        rows = _read_csv(_path(value, key, f"the official Kinetics {split}.csv"), key)
        kept = [VideoSample(str(folder / present[stem]), label) for label, stem in
                ((label, os.path.splitext(name)[0]) for label, name in rows) if stem in present]
        absent = len(rows) - len(kept)
        if _read_by_the_command(split, eval_only):  # (an evaluation reads the training CSV for its classes)
            if not kept:
                raise DataError(f"None of the {len(rows)} videos of {value} (data.{key}) is in {folder} "
                                f"(data.video_dir), e.g. {rows[0][1]}. Point data.video_dir at the unpacked videos.")
            _warn_missing(absent, len(rows), value, key, str(folder))
        missing[split] = [str(folder / name) for _, name in rows if os.path.splitext(name)[0] not in present]
        out[split], rows_of[split] = kept, rows
    names = sorted({label for label, _ in rows_of.get("train", rows_of["val"])})
    _check_subset(names, [label for label, _ in rows_of["val"]], f"{val_csv} (data.val_csv)",
                  "Use the train and validate CSVs of the same Kinetics version.")
    return VideoSplits(out.get("train", []), out["val"], names, missing=missing)


# ----------------------------------------------------------------------------- list files

_LIST_LINE = re.compile(r"^(?P<path>.*?)[\s,]+(?P<label>[^\s,]+)$")


def _read_list(path: Path, key: str) -> list[tuple[str, str]]:
    """``(relative path, label)`` per line of a ``path label`` list file."""
    if not path.is_file():
        raise DataError(f"Video list file not found: {path} (data.{key}). Point it at an mmaction2/SlowFast "
                        "list file with one '<path> <label>' per line.")
    rows = []
    with io.StringIO(_text(path, key), newline=None) as f:
        for line, text in enumerate(f, start=1):
            text = text.strip()
            if not text or text.startswith("#"):
                continue
            match = _LIST_LINE.match(text)
            if not match or not match["path"]:
                raise DataError(f"{path}:{line} (data.{key}) is not '<path> <label>': {text[:80]!r}. "
                                "Write one video path and its label per line (space or comma separated).")
            rows.append((match["path"], match["label"]))
    if not rows:
        raise DataError(f"{path} (data.{key}) lists no videos; write one '<path> <label>' per line.")
    return rows


def _integer_labels(labels: Iterable[str]) -> bool:
    """Whether every label of a list file is an integer (``0``, ``007``), which keeps its meaning
    (the class's index), rather than a class name. Decimal digits only: ``str.isdigit`` also takes
    superscripts such as ``²``, which ``int`` refuses."""
    return all(label.isdecimal() for label in labels)


def _list_class_names(rows: list[tuple[str, str]], num_classes: int | None = None, where: str = "",
                      key: str = "train_list") -> list[str]:
    labels = [label for _, label in rows]
    if _integer_labels(labels):  # integer labels keep their meaning
        highest = max(int(label) for label in labels)
        if num_classes is None:
            return [str(i) for i in range(highest + 1)]
        if highest >= num_classes:
            raise DataError(f"{where} (data.{key}) has label {highest} but data.num_classes is {num_classes} (labels "
                            f"0..{num_classes - 1}): set --data.num_classes to the class count the labels number "
                            "(the checkpoint's), or fix the list.")
        return [str(i) for i in range(num_classes)]
    return sorted(set(labels))


def _normal_label(label: str, integer: bool) -> str:
    """``label`` of a list whose labels are integers (``integer``: :func:`_integer_labels`) as its
    index (``007`` -> ``7``); any other as it is."""
    return str(int(label)) if integer else label


def list_classes(train_list: str | os.PathLike | None, key: str = "train_list",
                 num_classes: int | None = None) -> list[str]:
    """The class names of a training list file (of ``data.<key>``; no video is looked at); integer
    labels name ``num_classes`` classes where it is given."""
    what = "a training list file" if key == "train_list" else "a validation list file"
    path = _path(train_list, key, what)
    return _list_class_names(_read_list(path, key), num_classes, str(path), key)


def read_lists(train_list: str | os.PathLike | None, val_list: str | os.PathLike | None,
               list_prefix: str | os.PathLike | None = None, eval_only: bool = False,
               num_classes: int | None = None) -> VideoSplits:
    """mmaction2/SlowFast list files, the paths relative to ``list_prefix``; listed videos that do not
    exist are counted, warned about once per split, and left out (:attr:`VideoSplits.missing`).
    ``eval_only`` (validate, test, predict): without a training list the classes are the validation
    list's, and ``train`` is empty; with one, its absent videos are not warned about (the command
    reads val alone). ``num_classes``: the class count integer labels number (None:
    the highest label of the list the classes are read from, plus one)."""
    prefix = Path(os.path.expanduser(str(list_prefix))) if list_prefix else None
    if prefix is not None and not prefix.is_dir():
        raise DataError(f"Video folder not found: {prefix} (data.list_prefix). Point it at the folder the "
                        "list files' paths are relative to.")
    out: dict[str, list[VideoSample]] = {}
    names: list[str] = []
    integer = False
    absent: dict[str, list[str]] = {}
    val_only = eval_only and _eval_file_only(train_list, val_list)
    for split, value in (("val", val_list),) if val_only else (("train", train_list), ("val", val_list)):
        key = f"{split}_list"
        list_path = _path(value, key, f"a {split} list file")
        rows = _read_list(list_path, key)
        if split == "train" or val_only:
            names = _list_class_names(rows, num_classes, str(list_path), key)
            integer = _integer_labels(label for _, label in rows)
        if integer and not _integer_labels(label for _, label in rows):
            bad = [label for _, label in rows if not _integer_labels([label])]
            raise DataError(f"{list_path} (data.{key}) has class names ({_names(bad)}) but the training list has "
                            "integer labels; use the same kind of label in both files.")
        base = prefix if prefix is not None else list_path.parent
        samples, missing = [], []
        for rel, label in rows:
            path = str(base / rel)
            if not os.path.isfile(path):  # a list written on Windows names abseiling\\x.mp4, or in other accents
                path = found_path(base, rel) or path
            if os.path.isfile(path):
                samples.append(VideoSample(path, _normal_label(label, integer)))
            else:
                missing.append(path)
        if _read_by_the_command(split, eval_only):  # (an evaluation reads the training list for its classes)
            if not samples:
                raise DataError(f"None of the {len(rows)} videos listed in {list_path} (data.{key}) exists, e.g. "
                                f"{_names(missing)}. Fix data.list_prefix (the folder the paths are relative to) "
                                "or the list.")
            _warn_missing(len(missing), len(rows), list_path, key, str(base))
        absent[split] = missing
        out[split] = samples
        val_labels = [_normal_label(label, integer) for _, label in rows]  # the last split: val; absent too
    _check_subset(names, val_labels, f"{val_list} (data.val_list)",
                  "Use labels of the training list in the validation list.")
    return VideoSplits(out.get("train", []), out["val"], names, missing=absent)


# ----------------------------------------------------------------------------- dispatch


def _layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise DataError(f"unknown video data layout {layout!r} (data.layout); choose one of {', '.join(LAYOUTS)}.")
    return layout


def class_names_of(layout: str, *, root=None, train_csv=None, val_csv=None, train_list=None, val_list=None,
                   num_classes=None, **_ignored) -> list[str]:
    """The class list of a layout's training split, cheaply (no video file is looked at); of the
    validation split where only that one is there (a machine that only evaluates). ``num_classes``:
    the class count integer labels of list files number (class names are their own count)."""
    layout = _layout(layout)
    if layout == "folders":
        return folder_classes(root)
    if layout == "cvdf":
        return csv_classes(val_csv, "val_csv") if _eval_file_only(train_csv, val_csv) else csv_classes(train_csv)
    if _eval_file_only(train_list, val_list):
        return list_classes(val_list, "val_list", num_classes)
    return list_classes(train_list, num_classes=num_classes)


def integer_labels(layout: str, *, train_list=None, val_list=None, **_ignored) -> bool:
    """Whether the layout's classes are the integer labels of a list file (``data.num_classes`` of
    them where it is set), not names that are their own count (folders, CSV labels, named lists)."""
    return _layout(layout) == "list" and _integer_labels(class_names_of(
        layout, train_list=train_list, val_list=val_list))


def class_list_key(layout: str, *, train_csv=None, val_csv=None, train_list=None, val_list=None,
                   **_ignored) -> str:
    """The config key (under ``data.``) naming what :func:`class_names_of` reads the classes from."""
    layout = _layout(layout)
    if layout == "folders":
        return "root"
    train, val = (train_csv, val_csv) if layout == "cvdf" else (train_list, val_list)
    split = "val" if _eval_file_only(train, val) else "train"
    return f"{split}_{'csv' if layout == 'cvdf' else 'list'}"


def read_layout(layout: str, *, root=None, train_csv=None, val_csv=None, video_dir=None, train_list=None,
                val_list=None, list_prefix=None, num_classes=None, eval_only: bool = False) -> VideoSplits:
    """The full scan of one layout (see the module docstring); ``eval_only``: the validation split
    alone will do (class folders holding val/ alone, no training CSV or list file)."""
    layout = _layout(layout)
    if layout == "folders":
        return read_folders(root, eval_only)
    if layout == "cvdf":
        return read_cvdf(train_csv, val_csv, video_dir, eval_only)
    return read_lists(train_list, val_list, list_prefix, eval_only, num_classes)


def label_samples(samples: Sequence[VideoSample], class_names: Sequence[str]) -> list[tuple[str, int]]:
    """``(path, label index)`` pairs for :class:`~rescale_tasks.video.dataset.VideoClipDataset`."""
    index = {name: i for i, name in enumerate(class_names)}
    return [(s.path, index[s.label_name]) for s in samples]
