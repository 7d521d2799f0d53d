"""Where prepared data lives and how its name follows from its content.

Everything derived from the text (the SentencePiece model, the encoded token arrays) is stored
under a name that is a hash of what it was made from, so a cache entry can never be stale: edited
text or other options give another name. Files are written under a temporary name and renamed
into place (an atomic step on one file system), so processes preparing the same entry at once
(DDP ranks, nodes sharing a disk) never see a half-written file; the last rename wins and every
writer wrote the same bytes.

Hashing a WMT-sized text (~1.3 GB) costs about a second; :func:`file_digest` remembers each
file's digest next to its size, modification time and inode in ``<cache>/digests.json``, so a
later run reuses it without reading the text again (the rule ``make`` uses).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from rescale_tasks.common.errors import DataError
from rescale_tasks.common.system import write_atomically

from .corpus import option_name

__all__ = ["resolve_cache_dir", "user_cache_dir", "file_digest", "digest_of", "write_atomic", "DIGEST_CHARS"]

DIGEST_CHARS = 16  # hex characters of a digest used in file names (64 bits)
_MEMO = "digests.json"


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)


def user_cache_dir() -> Path:
    """The user's cache folder for corpora whose root is read-only (``$XDG_CACHE_HOME/rescale/translation``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rescale" / "translation"


def resolve_cache_dir(root: Path, cache_dir: str | os.PathLike | None, flags: str = "--data.") -> Path:
    """``cache_dir`` when given; else ``<root>/rescale_cache``, or the user's cache folder
    (``$XDG_CACHE_HOME/rescale/translation``) when ``root`` is read-only (a shared data set).
    ``flags``: how the command at hand spells the options in its messages."""
    if cache_dir is not None:
        folder = Path(os.path.expanduser(str(cache_dir)))
        if not _writable(folder):
            raise DataError(f"cache folder not writable: {folder} ({option_name('cache_dir', flags)}); point "
                            "it at a folder you can write to.")
        return folder
    folder = root / "rescale_cache"
    if _writable(folder):
        return folder
    user = user_cache_dir()
    if not _writable(user):
        raise DataError(f"no writable cache folder: neither {folder} nor {user}; pass "
                        f"{flags}cache_dir DIR (a folder you can write to).")
    return user


def digest_of(*parts: object) -> str:
    """Hex SHA-256 of a JSON rendering of ``parts`` (digests, option values, versions)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def file_digest(path: Path, cache_dir: Path | None = None) -> str:
    """Hex SHA-256 of a file's bytes, remembered in ``cache_dir`` by (size, mtime, inode)."""
    path = Path(path).resolve()
    stat = path.stat()
    stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
    memo = _read_memo(cache_dir)
    entry = memo.get(str(path))
    if entry and entry[:3] == stamp:
        return entry[3]
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            sha.update(block)
    digest = sha.hexdigest()
    if cache_dir is not None:
        memo = _read_memo(cache_dir)  # re-read: another process may have added entries meanwhile
        memo[str(path)] = stamp + [digest]
        write_atomic(cache_dir / _MEMO, json.dumps(memo, indent=0).encode())
    return digest


def _read_memo(cache_dir: Path | None) -> dict:
    if cache_dir is None:
        return {}
    try:
        return json.loads((cache_dir / _MEMO).read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: digests are simply computed again


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename
    (:func:`~rescale_tasks.common.system.write_atomically`)."""
    write_atomically(path, data)
