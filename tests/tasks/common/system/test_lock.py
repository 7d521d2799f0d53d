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


# --- staging folders left by killed exports ----------------------------------------------------------

_HOLD = ("import sys, time\nfrom rescale_tasks.common.system.lock import writer_folder\n"
         "with writer_folder(sys.argv[1], '.export-', 'export staging folder') as staging:\n"
         "    print(staging, flush=True)\n    time.sleep(120)\n")


def test_the_staging_folder_of_a_killed_export_is_removed_by_the_next_never_a_live_ones(tmp_path, caplog):
    """``rescale export`` killed with SIGKILL (the out-of-memory killer) left its hidden ``.export-*``
    folder in the export folder, and nothing removed it; the next export removes it, with a line,
    and leaves the one of an export that still runs, and one it cannot tell (no lock in it)."""
    import logging
    import os
    import signal
    import subprocess
    import sys

    from rescale_tasks.common.system.lock import writer_folder

    env = dict(os.environ, OMP_NUM_THREADS="1")
    exports = [subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                                env=env) for _ in range(2)]
    killed, live = exports
    try:
        folders = [os.path.dirname(p.stdout.readline().strip()) for p in exports]
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        (tmp_path / ".export-unknown").mkdir()
        with caplog.at_level(logging.INFO, logger="rescale_tasks.common.system.lock"):
            with writer_folder(str(tmp_path), ".export-", "export staging folder") as staging:
                assert sorted(os.listdir(tmp_path)) == sorted([".export-unknown", os.path.basename(folders[1]),
                                                              os.path.basename(os.path.dirname(staging))])
        assert [r.getMessage() for r in caplog.records] == [
            f"removed {folders[0]}: the export staging folder of a process killed before it ended"]
        assert sorted(os.listdir(tmp_path)) == sorted([".export-unknown", os.path.basename(folders[1])])
    finally:
        live.kill()
        live.wait()
