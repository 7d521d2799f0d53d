"""One process at a time in a folder: a study folder (two ``rescale study`` commands on one
``--out`` would run the same points and write over each other's files) or a run's folder (two
``rescale fit`` with one run id would write over each other's checkpoints and share a W&B run id).

:func:`folder_lock` holds an exclusive ``flock`` on ``<folder>/.lock`` while the command works
and writes who holds it (pid, host, start, command) into the file; a second process is refused at
once with one line naming the first. The operating system releases the lock when its holder ends,
however it ends (a SIGKILL or a crash leaves no stale lock: the file stays, unheld).
:func:`lock_holder` tells a held lock (a process working in the folder) from one left behind;
:func:`writer_folder` so removes the hidden work folders of writers killed on the way (``rescale
export``'s staging folders).
A file system that takes no locks at all (Lustre mounted without ``flock``, NFS without its lock
service) cannot keep two processes apart: the command goes on, with one warning line saying so.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shlex
import shutil
import socket
import sys
import tempfile
import time
from typing import Iterator

from ..errors import UserError
from .writable import FULL_DISK, require_writable

__all__ = ["folder_lock", "lock_holder", "writer_folder", "FolderBusy", "LOCK_FILE"]

LOCK_FILE = ".lock"

log = logging.getLogger(__name__)


class FolderBusy(UserError):
    """Another process holds the folder's lock; ``holder`` says which."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


@contextlib.contextmanager
def folder_lock(folder: str, what: str = "study folder",
                fix: str = "wait until it ends, or give this study another --out folder",
                unwritable: str = "give --out a folder you can write") -> Iterator[str]:
    """Hold ``<folder>/.lock`` (created if needed) for the ``with`` block; :class:`FolderBusy`
    (one line: ``<what> <folder> is in use by <holder>; <fix>``) when another process holds it,
    a :class:`UserError` (``cannot write <what> <folder>: <why>; <unwritable>``) when the folder
    cannot be written (a part of its path is a file: nothing created; a full disk)."""
    require_writable(folder, what, unwritable)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            raise FolderBusy(f"{what} {folder} is in use by {holder}; {fix}", holder) from None
        except OSError as err:  # ENOLCK, EOPNOTSUPP, ENOSYS: locks are not kept on this file system
            log.warning(f"warning: cannot lock {what} {folder} ({err.strerror or err}): its file system keeps no "
                        "locks, so a second process working there at the same time is not refused; make sure none "
                        "does (or mount it with locks, e.g. Lustre's flock option)")
        me = (f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')} "
              f"({shlex.join([os.path.basename(sys.argv[0]), *sys.argv[1:]])})")
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, me.encode("utf-8") + b"\n", 0)
        except OSError as err:  # a full disk: the command could write nothing else there either
            space = "free space there, or " if err.errno in FULL_DISK else ""
            raise UserError(f"cannot write {what} {folder}: {err.strerror or err} ([Errno {err.errno}]); "
                            f"{space}{unwritable}") from None
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)  # the lock goes with the descriptor; the file stays, empty
    finally:
        os.close(fd)


def lock_holder(folder: str) -> str | None:
    """Who holds ``<folder>/.lock`` now (the text :func:`folder_lock` wrote: pid, host, start,
    command), or None when no process does: no file, an empty one (released), or one whose holder
    ended without emptying it (killed), which a shared lock taken and let go at once tells apart.
    Held by this very process (another ``folder_lock`` of it) counts as held."""
    path = os.path.join(folder, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        if not holder:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return holder
        except OSError:  # a file system without locks: whether its writer still runs cannot be told
            return holder
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def writer_folder(folder: str, prefix: str, what: str,
                  unwritable: str = "give --out a folder you can write") -> Iterator[str]:
    """A new, empty folder inside a hidden ``<prefix>*`` folder of ``folder`` for the ``with`` block
    (``what`` names it), removed after it. The hidden folder's lock (:func:`folder_lock`) says its writer
    still runs: the ones a writer killed on the way left (SIGKILL, the out-of-memory killer) are removed
    first, with a line; never one whose writer runs, nor one whose lock says nothing (being made).
    ``unwritable``: what to do when ``folder`` takes no new folder (:func:`folder_lock`)."""
    root = tempfile.mkdtemp(prefix=prefix, dir=folder)
    try:
        with folder_lock(root, what, fix="", unwritable=unwritable):
            for name in sorted(os.listdir(folder)):
                left = os.path.join(folder, name)
                if (name.startswith(prefix) and left != root and os.path.isdir(left)
                        and _size(os.path.join(left, LOCK_FILE)) > 0 and lock_holder(left) is None):
                    shutil.rmtree(left, ignore_errors=True)
                    log.info(f"removed {left}: the {what} of a process killed before it ended")
            files = os.path.join(root, "files")
            os.mkdir(files)
            yield files
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
