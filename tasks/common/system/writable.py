"""Output folders checked before a command starts its work: a folder that cannot be written is
one line then, not a traceback after an epoch (or a W&B run quietly moved to a temporary folder);
and :func:`write_failure`, how to go on when a write fails later all the same (the disk filled)."""
from __future__ import annotations

import errno
import os
import tempfile

from ..errors import UserError

__all__ = ["require_writable", "write_failure", "FULL_DISK"]

#: what a write fails with when the disk or a quota is full (or the file outgrows its size limit)
FULL_DISK = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: ... and when the folder takes no more writes (remounted read-only, permissions taken away)
_REFUSED = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def write_failure(err: OSError, option: str) -> str | None:
    """What to do after ``err`` failed a write of an output that ``option`` (``--out``) places: free
    space or write elsewhere; None when ``err`` is no such failure (a missing file, a bad path)."""
    if err.errno in FULL_DISK:
        return f"free space, or give {option} a folder on another disk"
    if err.errno in _REFUSED:
        return f"give {option} a folder you can write"
    return None


def require_writable(path: str, what: str, fix: str) -> None:
    """Refuse ``path`` (a folder, created later if missing) in one :class:`UserError` line
    (``cannot write <what> <path>: <why>; <fix>``) when it cannot be written: a part of it is a
    file, or its nearest existing folder refuses a new file. Nothing is left behind: the probe is
    an anonymous temporary file, a real write (permission bits alone misjudge the root user)."""
    path = os.path.abspath(os.path.expanduser(str(path)))
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UserError(f"cannot write {what} {path}: {existing} is a file, not a folder; {fix}")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        why = ("it takes no new files (a virtual file system such as /proc)" if err.errno == errno.ENOENT
               else f"{err.strerror or err} in {existing}")
        raise UserError(f"cannot write {what} {path}: {why}; {fix}") from None
