import os

import pytest

from tasks.common.errors import UserError
from tasks.common.system import require_writable


def refusal(path) -> str:
    with pytest.raises(UserError) as err:
        require_writable(str(path), "--out", "name another folder")
    return str(err.value)


def test_a_new_folder_under_a_writable_one_passes_and_leaves_nothing(tmp_path):
    require_writable(str(tmp_path / "a" / "b"), "--out", "name another folder")
    assert os.listdir(tmp_path) == []


def test_a_file_on_the_path_is_named(tmp_path):
    (tmp_path / "f").write_text("")
    message = refusal(tmp_path / "f" / "out")
    assert message == f"cannot write --out {tmp_path}/f/out: {tmp_path}/f is a file, not a folder; name another folder"


def test_a_virtual_file_system_is_named_as_such():
    message = refusal("/proc/x.onnx")
    assert message == ("cannot write --out /proc/x.onnx: it takes no new files (a virtual file system such as "
                       "/proc); name another folder")


def test_a_failed_write_says_to_free_space_only_when_the_disk_is_full():
    import errno

    from rescale_tasks.common.system import write_failure

    full = write_failure(OSError(errno.ENOSPC, "No space left on device"), "--out")
    assert full == "free space, or give --out a folder on another disk"
    assert write_failure(OSError(errno.EROFS, "Read-only file system"), "--out") == "give --out a folder you can write"
    assert write_failure(OSError(errno.ENOENT, "No such file or directory"), "--out") is None
