"""Files on disk as data sets list them.

Class folders: ``<split>/<class>/<file>``, the layout of ImageNet-style image folders and
of Kinetics-style video folders.

:func:`scan_class_folders` maps every class folder (sorted by name) to its sorted files of the
extensions a task reads, and lists everything else it meets (files of other extensions, hidden
files, sub-folders, broken links, files beside the class folders, hidden folders) so that a data
module can report it (``unread_files``, :mod:`rescale_tasks.common.run.data_report`) instead of
letting it vanish.

File names written otherwise than the files: a list or annotation file made on Windows names
``images\\0001.jpg``; a json made on Linux names ``café.jpg`` composed (NFC), while a folder copied
through macOS holds it decomposed (NFD), or the reverse: :func:`found_path` finds the file they mean.
"""
from __future__ import annotations

import os
import re
import threading
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from ..errors import DataError

__all__ = ["found_path", "nested_folders_hint", "scan_class_folders", "unnested"]


def scan_class_folders(split_dir: str | os.PathLike, extensions: Sequence[str],
                       unread: list[str], nested: str | None = None) -> dict[str, list[str]]:
    """Map each class folder (sorted) of ``split_dir`` to its sorted files whose lower-case names end
    with one of ``extensions``; every other entry of a class folder (other extensions, hidden files,
    sub-folders, broken links), and what ``split_dir`` holds besides class folders (files, hidden
    folders), is appended to ``unread``.

    ``nested`` (Tiny ImageNet's ``"images"``, as its zip unpacks: ``train/<wnid>/images/*.JPEG``
    beside ``train/<wnid>/<wnid>_boxes.txt``): where every class folder that is not empty holds no
    file to read and exactly one folder, of that name, the files of ``<class>/<nested>/`` are the
    class's (an empty one stays empty, for the caller to name); other layouts are read as without it."""
    split_dir = Path(split_dir)
    extensions = tuple(e.lower() for e in extensions)
    folders = []
    with os.scandir(split_dir) as entries:
        for e in entries:
            if e.is_dir() and not e.name.startswith("."):
                folders.append(e.name)
            else:
                unread.append(e.path)
    found: dict[str, tuple[list[str], list[str]]] = {}
    for name in sorted(folders):
        found[name] = _readable_files(split_dir / name, extensions)
    holding = [name for name in found if any(found[name])]  # an empty class folder says nothing of the layout
    if nested and holding and all(_holds_only(split_dir / name, nested, *found[name]) for name in holding):
        for name in holding:
            other = found[name][1]
            inner = _readable_files(split_dir / name / nested, extensions)
            found[name] = (inner[0], [path for path in other if path != str(split_dir / name / nested)] + inner[1])
    classes: dict[str, list[str]] = {}
    for name, (files, other) in found.items():
        classes[name] = sorted(files)
        unread += other
    return classes


def _readable_files(folder: Path, extensions: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The files of ``folder`` whose lower-case names end with one of ``extensions`` (not hidden), and
    its other entries."""
    files, other = [], []
    with os.scandir(folder) as entries:
        for e in entries:
            readable = e.is_file() and not e.name.startswith(".") and e.name.lower().endswith(extensions)
            (files if readable else other).append(e.path)
    return files, other


def _holds_only(folder: Path, nested: str, files: list[str], other: list[str]) -> bool:
    """Whether class ``folder`` (its ``files`` to read and ``other`` entries) holds no file to read and
    exactly one folder, ``nested``."""
    inner = [path for path in other if os.path.isdir(path)]
    return not files and inner == [str(folder / nested)]


def unnested(path: str, split_dir: str | os.PathLike, nested: str) -> str:
    """``<split_dir>/<class>/<nested>/<file>`` (read by :func:`scan_class_folders` with ``nested``) as the
    flattened layout names it, ``<split_dir>/<class>/<file>``; any other path as it is."""
    parts = Path(os.path.relpath(path, split_dir)).parts
    if len(parts) == 3 and parts[1] == nested and ".." not in parts:
        return os.path.join(split_dir, parts[0], parts[2])
    return path


def nested_folders_hint(split_dir: str | os.PathLike, empty: Sequence[str], unread: Sequence[str]) -> str:
    """What to say of class folders of ``split_dir`` left ``empty`` (names) when they hold folders (in
    ``unread``): their files lie a level too deep (e.g. ``<class>/photos/``; Tiny ImageNet's one
    ``images/`` each is read where :func:`scan_class_folders` is given ``nested``), and are read once
    moved up; an empty string when none of them holds a folder."""
    inside = [Path(split_dir) / name for name in empty]
    nested = [p for p in map(Path, unread) if p.parent in inside and p.is_dir()]
    if not nested:
        return ""
    return (f" They hold folders instead (e.g. {nested[0]}): the files of a class must lie directly in its folder, "
            f"{Path(split_dir)}/<class>/<file>; move them up a level (e.g. mv {nested[0]}/* {nested[0].parent}/).")


def found_path(folder: str | os.PathLike, name: str) -> str | None:
    """The file ``folder/name`` names when ``name`` is written otherwise than the file: each folder and
    the file in the other Unicode form of its accents (composed or decomposed; each component
    compared with the directory listing's names, NFC, so a folder in one form holding a file in the
    other is found) or with Windows's ``\\`` separators, or both; None where no such file exists. A
    name that two distinct files match (the disk holds both forms) is one
    :class:`~rescale_tasks.common.errors.DataError` line naming them, not one taken silently."""
    exact = os.path.join(folder, name)
    if os.path.isfile(exact):
        return exact
    drive = os.path.splitdrive(name)[0]
    base, name_left = (drive + os.sep, name[len(drive):]) if os.path.isabs(name) else (str(folder) or ".", name)
    found: list[str] = []
    for parts in _components(name_left):
        for path in _matching(base, parts):
            if any(os.path.samefile(path, seen) for seen in found):  # (one file where the disk ignores the form)
                continue
            found.append(path)
            if len(found) > 1:
                raise DataError(f"{name!r} in {folder} is written with composed and decomposed accents at once, "
                                f"and names two files: {found[0]!r} and {found[1]!r}; rename one of them, or "
                                "write the name as the file it means is written.")
    return found[0] if found else None


def _components(name: str) -> list[list[str]]:
    """The folder and file components ``name`` may mean: split at this system's separators, and also at
    ``\\`` where that is not one of them (a name written on Windows)."""
    separators = "".join(dict.fromkeys(s for s in (os.sep, os.altsep, "/") if s))
    spellings = [re.split(f"[{re.escape(separators)}]", name)]
    if "\\" not in separators and "\\" in name:
        spellings.append(re.split(f"[{re.escape(separators)}\\\\]", name))
    return spellings


def _matching(folder: str, parts: Sequence[str]) -> list[str]:
    """The files under ``folder`` whose path components after it equal ``parts`` in NFC."""
    if not parts:
        return [folder] if os.path.isfile(folder) else []
    head, rest = parts[0], parts[1:]
    if head in ("", ".", ".."):  # an absolute name, a doubled separator, or a step up: as written
        return _matching(os.path.join(folder, head) if head == ".." else folder, rest)
    return [path for entry in _entries_named(folder, unicodedata.normalize("NFC", head))
            for path in _matching(os.path.join(folder, entry), rest)]


class _Listing(NamedTuple):
    """A folder's entry names by NFC form, listed when its :func:`_stamp` was ``stamp`` (first seen
    at ``seen``, :func:`time.monotonic`); ``settled``: taken once the stamp's clock tick was over."""
    stamp: tuple
    entries: dict[str, tuple[str, ...]]
    seen: float
    settled: bool


#: the folders whose listings :func:`_entries_named` keeps (the most recently used), by path
_LISTINGS: OrderedDict[str, _Listing] = OrderedDict()
_KEPT_LISTINGS = 64
_LISTINGS_LOCK = threading.Lock()  # (found_path may be called from several threads)
#: the coarsest tick of a file system's clock (FAT's, two seconds): a folder's modification time
#: can stay the same while it gains a file this long after the time was first seen
_TICK_S = 2.0
#: a modification time older than this by the local clock is over its tick wherever the file
#: system's clock lies (a network file system's server may differ from this machine by seconds)
_SETTLED_AGE_S = 60.0


def _entries_named(folder: str, name: str) -> tuple[str, ...]:
    """``folder``'s entries whose NFC form is ``name``, from its listing, taken once per version of
    the folder (a data set names many files of one folder): its :func:`_stamp`. The stamp cannot see
    a file added within the clock tick of the folder's last change (a file system whose clock ticks
    in seconds keeps the time), so while that tick may still run a name the kept listing lacks lists
    the folder again before it is called absent; a settled listing answers every name itself."""
    now = time.monotonic()
    stamp = _stamp(folder)
    with _LISTINGS_LOCK:
        held = _LISTINGS.get(folder)
        if held is not None and held.stamp == stamp:
            _LISTINGS.move_to_end(folder)
            if held.settled or name in held.entries:
                return held.entries.get(name, ())
    seen = held.seen if held is not None and held.stamp == stamp else now
    settled = stamp[0] is None or now - seen >= _TICK_S or time.time() - stamp[0] / 1e9 >= _SETTLED_AGE_S
    listing = _Listing(stamp, _normal_entries(folder, stamp), seen, settled)
    with _LISTINGS_LOCK:
        _LISTINGS[folder] = listing
        _LISTINGS.move_to_end(folder)
        while len(_LISTINGS) > _KEPT_LISTINGS:
            _LISTINGS.popitem(last=False)
    return listing.entries.get(name, ())


def _stamp(folder: str) -> tuple:
    """What changes when ``folder``'s entries do, on most file systems (its modification time, and
    its size, which grows with its entries on tmpfs, btrfs and small XFS folders); None: no folder."""
    try:
        found = os.stat(folder)
    except OSError:
        return (None,)
    return (found.st_mtime_ns, found.st_size)


def _normal_entries(folder: str, stamp: tuple) -> dict[str, tuple[str, ...]]:
    """``folder``'s entry names by their NFC form."""
    if stamp == (None,) or not os.path.isdir(folder):
        return {}
    entries: dict[str, tuple[str, ...]] = {}
    for entry in sorted(os.listdir(folder)):
        key = unicodedata.normalize("NFC", entry)
        entries[key] = (*entries.get(key, ()), entry)
    return entries
