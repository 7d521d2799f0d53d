"""Files written whole or not at all: an error mid-write leaves the old file and no temporary file."""
from __future__ import annotations

import os

import pytest

from rescale_tasks.common.system import atomic_open, atomic_path, write_atomically


class Stop(Exception):
    pass


def test_a_write_that_fails_midway_leaves_the_old_file_and_nothing_else(tmp_path):
    target = tmp_path / "results.json"
    write_atomically(target, '{"old": 1}')
    with pytest.raises(Stop):
        with atomic_open(target) as f:
            f.write('{"new": ')
            f.flush()
            assert len(os.listdir(tmp_path)) == 2  # the temporary file beside the target
            raise Stop
    assert target.read_text() == '{"old": 1}'
    assert os.listdir(tmp_path) == ["results.json"]


def test_a_finished_write_replaces_the_file_with_its_permissions_of_a_new_file(tmp_path):
    target = tmp_path / "sub" / "rows.csv"  # the folder is made
    with atomic_open(target, newline="") as f:
        f.write("a,b\r\n1,2\r\n")
    assert target.read_bytes() == b"a,b\r\n1,2\r\n"  # newline="" as csv needs: no translation
    write_atomically(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01" and os.listdir(target.parent) == ["rows.csv"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_writer_that_opens_the_file_itself_gets_a_name(tmp_path):
    """``atomic_path``: for PyAV, NumPy ...; a fixed temporary name (``.x.partial``) that a killed
    writer left is written over by the next, and removed when the writer fails."""
    target = tmp_path / "clip.mp4"
    left = tmp_path / ".clip.mp4.partial"
    left.write_bytes(b"half a file from a killed run")
    with pytest.raises(Stop):
        with atomic_path(target, temporary=left.name) as tmp:
            assert tmp == str(left)
            with open(tmp, "wb") as f:
                f.write(b"again, half")
            raise Stop
    assert os.listdir(tmp_path) == []
    with atomic_path(target, temporary=left.name) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"whole")
    assert target.read_bytes() == b"whole" and os.listdir(tmp_path) == ["clip.mp4"]
    with atomic_path(target) as tmp:  # a name of its own each time otherwise
        assert os.path.dirname(tmp) == str(tmp_path) and os.path.basename(tmp).startswith(".clip.mp4.")
        with open(tmp, "w") as f:
            f.write("new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["clip.mp4"]
