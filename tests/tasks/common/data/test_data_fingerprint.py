"""A split of files is hashed by its paths under the root and, for at most ``SIZED_FILES`` files,
their sizes: a long list (ImageNet's) by its paths alone, so no file is stat-ed."""
from __future__ import annotations

from rescale_tasks.common.data import module


def test_a_long_file_list_is_hashed_by_its_paths_alone(tmp_path, monkeypatch):
    files = [tmp_path / name for name in ("a.jpg", "b.jpg")]
    for file in files:
        file.write_bytes(b"x")
    before = module._files_digest(files, str(tmp_path))
    files[0].write_bytes(b"xx")
    assert module._files_digest(files, str(tmp_path)) != before  # sizes count in a short list
    monkeypatch.setattr(module, "SIZED_FILES", 1)
    long = module._files_digest(files, str(tmp_path))
    files[0].write_bytes(b"xxx")
    assert module._files_digest(files, str(tmp_path)) == long  # a long list: paths alone
    assert module._files_digest(files[:1], str(tmp_path)) != long
    monkeypatch.setattr(module.os.path, "getsize", lambda path: (_ for _ in ()).throw(AssertionError(path)))
    module._files_digest(files, str(tmp_path))  # and no file is stat-ed
