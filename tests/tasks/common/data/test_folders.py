"""Finding the file a name written otherwise means (common.data.folders.found_path)."""
from __future__ import annotations

import os
import unicodedata

import pytest

from rescale_tasks.common.data import found_path
from rescale_tasks.common.errors import DataError

NFC, NFD = (unicodedata.normalize(form, "é") for form in ("NFC", "NFD"))


def test_a_name_in_the_other_form_finds_its_file(tmp_path):
    (tmp_path / f"caf{NFD}.jpg").write_bytes(b"x")
    assert found_path(tmp_path, f"caf{NFC}.jpg") == os.path.join(tmp_path, f"caf{NFD}.jpg")
    assert found_path(tmp_path, "other.jpg") is None


def test_a_name_in_both_forms_at_once_matching_two_files_is_refused_naming_them(tmp_path):
    composed, decomposed = f"{NFC}t{NFC}.jpg", f"{NFD}t{NFD}.jpg"
    (tmp_path / composed).write_bytes(b"composed")
    (tmp_path / decomposed).write_bytes(b"decomposed")
    if os.path.samefile(tmp_path / composed, tmp_path / decomposed):
        pytest.skip("this file system does not tell the two forms apart")
    with pytest.raises(DataError, match="written with composed and decomposed accents at once, and names two files"):
        found_path(tmp_path, f"{NFC}t{NFD}.jpg")


def test_a_folder_in_one_form_holding_a_file_in_the_other_is_found(tmp_path):
    """Each component is compared with the listing's names (NFC): a folder written decomposed on disk
    holding a file written composed is found whichever form the name is written in, relative,
    absolute or written on Windows."""
    folder = tmp_path / f"{NFD}t{NFD}"
    folder.mkdir()
    (folder / f"caf{NFC}.mp4").write_bytes(b"x")
    meant = os.path.join(tmp_path, f"{NFD}t{NFD}", f"caf{NFC}.mp4")
    for form in (NFC, NFD):
        assert os.path.samefile(found_path(tmp_path, f"{form}t{form}/caf{form}.mp4"), meant)
    assert os.path.samefile(found_path(tmp_path, f"{NFC}t{NFD}/caf{NFD}.mp4"), meant)
    assert os.path.samefile(found_path("unused", f"{tmp_path}/{NFC}t{NFC}/caf{NFD}.mp4"), meant)
    if os.sep == "/":
        assert os.path.samefile(found_path(tmp_path, f"{NFC}t{NFC}\\caf{NFD}.mp4"), meant)
    assert found_path(tmp_path, f"{NFC}t{NFC}/other.mp4") is None


def test_a_name_matching_files_in_two_folders_of_either_form_is_refused_naming_them(tmp_path):
    for form in (NFC, NFD):
        (tmp_path / f"{form}t{form}").mkdir(exist_ok=True)
        (tmp_path / f"{form}t{form}" / "a.mp4").write_bytes(form.encode())
    if os.path.samefile(tmp_path / f"{NFC}t{NFC}", tmp_path / f"{NFD}t{NFD}"):
        pytest.skip("this file system does not tell the two forms apart")
    with pytest.raises(DataError, match="names two files"):
        found_path(tmp_path, f"{NFC}t{NFD}/a.mp4")


def _counting_listings(monkeypatch) -> list:
    """The folders ``os.listdir`` lists from now on (the real listing, counted)."""
    listed, real = [], os.listdir

    def listdir(path="."):
        listed.append(str(path))
        return real(path)

    monkeypatch.setattr(os, "listdir", listdir)
    return listed


def test_a_file_added_within_the_folders_clock_tick_is_found(tmp_path, monkeypatch):
    """A file system whose clock ticks in seconds keeps a folder's modification time when a file is
    added within the tick of its listing (os.utime sets it back here): the name is still found."""
    (tmp_path / "a.jpg").write_bytes(b"x")
    before = os.stat(tmp_path)
    assert found_path(tmp_path, f"caf{NFC}.jpg") is None
    (tmp_path / f"caf{NFD}.jpg").write_bytes(b"x")
    os.utime(tmp_path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert found_path(tmp_path, f"caf{NFC}.jpg") == os.path.join(tmp_path, f"caf{NFD}.jpg")


def test_a_folder_is_listed_once_for_the_names_it_holds_and_lacks(tmp_path, monkeypatch):
    """Names found in a kept listing cost no listing; neither do absent ones once the folder's last
    change is long past (the listing cannot have missed a file added in its clock tick)."""
    for n in range(3):
        (tmp_path / f"{n}caf{NFD}.jpg").write_bytes(b"x")
    os.utime(tmp_path, (1e9, 1e9))  # changed long ago
    listed = _counting_listings(monkeypatch)
    for n in range(3):
        assert found_path(tmp_path, f"{n}caf{NFC}.jpg") == os.path.join(tmp_path, f"{n}caf{NFD}.jpg")
        assert found_path(tmp_path, f"gone{n}.jpg") is None
    assert listed == [str(tmp_path)]
