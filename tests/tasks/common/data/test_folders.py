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
