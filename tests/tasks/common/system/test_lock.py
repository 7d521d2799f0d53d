"""One process at a time in a folder (:mod:`rescale_tasks.common.system.lock`)."""
from __future__ import annotations

import errno
import fcntl
import logging

import pytest

from rescale_tasks.common.system import FolderBusy, folder_lock, lock_holder


def test_a_second_holder_is_refused_and_the_lock_is_free_once_the_first_ends(tmp_path):
    with folder_lock(str(tmp_path), "run folder", "wait"):
        assert lock_holder(str(tmp_path)).startswith("pid ")
        with pytest.raises(FolderBusy, match=rf"^run folder {tmp_path} is in use by pid \d+ "):
            with folder_lock(str(tmp_path), "run folder", "wait"):
                pass
    assert lock_holder(str(tmp_path)) is None


def test_a_file_system_without_locks_is_one_warning_and_the_command_goes_on(tmp_path, monkeypatch, caplog):
    """Lustre mounted without ``flock`` (or NFS without its lock service) answers every lock with
    ENOLCK (here: the system call itself made to answer so): that was a traceback, which stopped
    every run and study on such a file system."""
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with caplog.at_level(logging.WARNING), folder_lock(str(tmp_path), "run folder", "wait") as path:
        assert path == str(tmp_path / ".lock")
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"warning: cannot lock run folder {tmp_path} (No locks available): its file system keeps "
                              "no locks, so a second process working there at the same time is not refused")
    assert lock_holder(str(tmp_path)) is None  # emptied on the way out, as with a lock


def test_a_full_disk_is_one_line_before_the_command_starts(tmp_path, monkeypatch):
    """The disk is full as ``rescale fit`` starts: writing who holds the lock fails (here: the system
    call itself made to answer so), which was an OSError traceback."""
    import os

    from rescale_tasks.common.errors import UserError

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(UserError) as err:
        with folder_lock(str(tmp_path), "run folder", "wait", "give --out a folder you can write"):
            pass
    assert str(err.value) == (f"cannot write run folder {tmp_path}: No space left on device ([Errno 28]); free space "
                              "there, or give --out a folder you can write")
