"""Which code made a result: the suite's version and, where it runs from a git checkout, the commit.

:func:`code_version` is what ``run_summary.json`` and every checkpoint record (under
:data:`CODE_KEY`), and :func:`describe_code` the line ``rescale --version`` and the benchmarks'
header print. The version is ``rescale_core.__version__`` (pyproject.toml's, read from the installed
distribution; read here without importing torch, so that ``rescale --version`` answers at once); the commit and whether tracked files differ from it are asked of git in the folder
holding the suite's packages, only when that folder is a checkout (an installed copy reports none),
and are None where git is missing, refuses the folder or does not answer within seconds.
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import subprocess
from pathlib import Path
from typing import Optional, TypedDict

__all__ = ["CODE_KEY", "CodeVersion", "code_version", "describe_code"]

#: the key of :func:`code_version` in ``run_summary.json`` and in a checkpoint
CODE_KEY = "code"

#: the folder holding ``rescale_core/`` and ``tasks/``: a checkout's root when the suite runs from one
_ROOT = Path(__file__).resolve().parents[3]
# a repository named by the caller's environment (a git hook's) would answer for another tree
_GIT_LOCATION = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR")


class CodeVersion(TypedDict):
    """``version``: the suite's; ``commit``: the checkout's full commit hash (None: not run from a
    checkout, or git could not tell); ``dirty``: tracked files differ from that commit (None: unknown)."""

    version: str
    commit: Optional[str]
    dirty: Optional[bool]


def _git(*args: str) -> Optional[str]:
    """git's output in the suite's checkout; None when git is missing, fails or hangs."""
    env = {k: v for k, v in os.environ.items() if k not in _GIT_LOCATION}
    try:
        done = subprocess.run(["git", "--no-optional-locks", "-C", str(_ROOT), *args], capture_output=True,
                              text=True, timeout=10, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def _checkout() -> tuple[Optional[str], Optional[bool]]:
    """(commit, dirty), asked of git once per process."""
    if not ((_ROOT / ".git").exists() and (_ROOT / "pyproject.toml").is_file()):
        return None, None
    commit = _git("rev-parse", "--verify", "HEAD")
    if not commit:
        return None, None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return commit, None if status is None else bool(status)


@functools.lru_cache(maxsize=1)
def _version() -> str:
    """``rescale_core.__version__``: the installed distribution's, asked of its metadata; a checkout
    that is not installed, rescale_core's own reading of its pyproject.toml."""
    try:
        return importlib.metadata.version("rescale-suite")
    except importlib.metadata.PackageNotFoundError:
        from rescale_core import __version__  # torch, for a checkout that was never installed only

        return __version__


def code_version() -> CodeVersion:
    """The suite's version, and the commit (and whether tracked files were changed) when it runs
    from a git checkout."""
    commit, dirty = _checkout()
    return {"version": _version(), "commit": commit, "dirty": dirty}


def describe_code(code: Optional[CodeVersion] = None) -> str:
    """``0.1.0 (commit 4e1a811, uncommitted changes)``; ``0.1.0`` where no commit is known."""
    code = code or code_version()
    if not code["commit"]:
        return code["version"]
    changes = ", uncommitted changes" if code["dirty"] else ""
    return f"{code['version']} (commit {code['commit'][:7]}{changes})"
