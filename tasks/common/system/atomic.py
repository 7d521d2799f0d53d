"""Result files written whole or not at all.

:func:`atomic_open` writes into a temporary file beside the target and renames it over the
target only when the block ends without an error (``os.replace``: a reader sees the old file or
the new one, never half of one); on an error the temporary file is removed and the target is
left as it was. :func:`write_atomically` writes text or bytes in one call; :func:`atomic_path`
hands out the temporary file's name, for a writer that opens the file itself (PyAV, NumPy).
Run summaries, what ``test`` and ``predict`` write, study grids, prepared translation data and
re-encoded videos are written through them; checkpoints have their own fsynced writer
(:mod:`..checkpoints.files`).
"""
from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from typing import IO

__all__ = ["atomic_open", "atomic_path", "write_atomically"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, temporary: str | os.PathLike | None = None) -> Iterator[str]:
    """``with atomic_path(path) as tmp: writer(tmp)``: the name of a file beside ``path`` for a
    writer that opens it itself; renamed over ``path`` once the block has finished, removed on an
    error. ``temporary``: that file's name, fixed (in ``path``'s folder: one a killed writer left
    is written over by the next) instead of a new one per call (any number of writers at once)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    if temporary is None:
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    else:
        tmp = os.path.join(folder, os.path.basename(os.fspath(temporary)))
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8",
                fsync: bool = False, newline: str | None = None) -> Iterator[IO]:
    """``with atomic_open(path) as f: f.write(...)``: ``path`` appears (or is replaced) only once
    the block has finished; ``mode`` is ``"w"`` or ``"wb"``; ``newline`` as :func:`open` takes it
    (``""`` for :mod:`csv`); ``fsync``: make the content durable before the rename (a power cut
    right after keeps the new file)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', not {mode!r}")
    with atomic_path(path) as tmp:
        # O_EXCL with the default mode: the file gets the permissions of any new file (umask), not
        # mkstemp's owner-only ones
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        text = {} if "b" in mode else {"encoding": encoding, "newline": newline}
        with os.fdopen(fd, mode, **text) as handle:
            yield handle
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())


def write_atomically(path: str | os.PathLike, data: str | bytes, fsync: bool = False) -> None:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` whole or not at all."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", fsync=fsync) as handle:
        handle.write(data)
