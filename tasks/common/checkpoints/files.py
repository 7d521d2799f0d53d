"""Checkpoint files a multi-day run can trust: atomic writes and safe loading.

- :class:`AtomicCheckpointIO`: writes ``<file>.tmp-<pid>``, fsyncs it and renames it over the
  target, so a crash while saving never leaves a truncated ``last.ckpt``; loads with
  ``torch.load(weights_only=True)`` (never runs code from the file), our own classes allow-listed.
  Remote folders (``s3://``, ``gs://``, any fsspec URL) go through Lightning's fsspec writer (one
  upload: the object appears whole or not at all) and load just as safely; ``s3://`` needs
  ``s3fs`` and ``gs://`` needs ``gcsfs``, which are not installed with the suite.
- :func:`safe_load`, :func:`peek_checkpoint`, :func:`checkpoint_exists`: reading a checkpoint
  (or only its hyper-parameters and run id), every problem one :class:`CheckpointError` line.
- :func:`require_restorable`: a checkpoint without what a command restores (the weights; for
  ``fit`` the optimizer, schedule and loop state too) is one line, not Lightning's ``KeyError``.

When a run writes them and how it resumes from them: :mod:`.callbacks`.
"""
from __future__ import annotations

import functools
import glob
import io
import os
import pickle
from dataclasses import dataclass
from pathlib import Path, PosixPath, WindowsPath
from typing import Any, Optional

import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol, get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO

from rescale_core.schemes import Scheme

from ..data.labels import Labels, checkpoint_labels
from ..errors import UserError
from ..system import FULL_DISK, write_failure

__all__ = ["AtomicCheckpointIO", "safe_load", "SAFE_GLOBALS", "CheckpointError", "CheckpointInfo", "RUN_CONFIG_KEY",
           "peek_checkpoint", "checkpoint_run_id", "is_remote", "checkpoint_exists", "require_restorable",
           "non_finite_weights", "non_finite_text"]


class CheckpointError(UserError):
    """A checkpoint that cannot be used: missing, truncated, or holding code."""


def _safe_globals() -> list:
    """Classes a checkpoint of this suite may hold besides tensors and plain containers."""
    return [Scheme, PosixPath, WindowsPath]


SAFE_GLOBALS = _safe_globals()


def safe_load(path: str | os.PathLike, map_location: Any = "cpu", mmap: bool = False) -> dict:
    """``torch.load`` that never executes code from the file; errors are one clear line.

    ``mmap=True`` maps the tensors instead of reading them: cheap when only the metadata
    (hyper-parameters, run id) of a large checkpoint is needed. Remote URLs (``s3://...``) are
    read whole through fsspec (nothing to map) and loaded with the same allow-list.
    """
    path = str(path)
    if is_remote(path):
        source, mmap = io.BytesIO(_read_remote(path)), False
    elif os.path.isdir(path):
        last = os.path.join(path, "last.ckpt")
        example = last if os.path.isfile(last) else "runs/<project>/<run id>/checkpoints/last.ckpt"
        raise CheckpointError(f"checkpoint {path} (--ckpt_path) is a folder. Pass the path of a .ckpt file, e.g. "
                              f"{example}")
    elif not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path} (--ckpt_path). Pass the path of a .ckpt "
                              "file written by this suite, e.g. runs/<project>/<run id>/checkpoints/last.ckpt")
    else:
        source = path
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(source, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        reason = _first_line(err)
        if "Unsupported operand" in str(err):  # not a pickle at all (text, random bytes): nothing to refuse
            raise CheckpointError(f"checkpoint {path} is corrupt or truncated (not a checkpoint file torch can "
                                  f"read); {_earlier(path)}") from None
        if "weights_only" in str(err) or "global" in str(err).lower():
            raise CheckpointError(
                f"refusing to load {path}: it holds Python objects that could run code "
                f"({_first_global(str(err))}); only checkpoints written by this suite load safely") from None
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated ({reason}); {_earlier(path)}") from None
    except (RuntimeError, EOFError, OSError) as err:
        reason = "not a checkpoint file torch can read" if "zip" in str(err).lower() else _first_line(err)
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated ({reason}); {_earlier(path)}") from None


def _earlier(path: str) -> str:
    """How to go on from the checkpoint at ``path`` that cannot be read (a node died while it was
    copied, a disk filled): the newest checkpoint beside it that can, named to pass instead (the bad
    file is left for its owner to look at; nothing is resumed from a guess)."""
    if is_remote(path):
        return "use an earlier checkpoint in the same folder (the epoch or step checkpoints beside it)"
    folder = os.path.dirname(path)
    others = [p for p in glob.glob(os.path.join(glob.escape(folder or "."), "*.ckpt"))
              if os.path.isfile(p) and os.path.abspath(p) != os.path.abspath(path)]
    for other in sorted(others, key=os.path.getmtime, reverse=True):
        try:
            with torch.serialization.safe_globals(SAFE_GLOBALS):
                state = torch.load(other, map_location="cpu", weights_only=True, mmap=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError):
            continue
        if isinstance(state, dict) and "state_dict" in state and "averaged_from" not in state:
            shown = os.path.join(folder, os.path.basename(other))
            return (f"the newest readable checkpoint beside it is {shown} (step {state.get('global_step', '?')}): pass "
                    f"--ckpt_path {shown} (this file is left as it is)")
    return f"no other checkpoint in {folder or '.'} can be read: start the run again, or pass a checkpoint from elsewhere"


def is_remote(path: str | os.PathLike) -> bool:
    """True for fsspec URLs that are not the local disk (``s3://``, ``gs://``, ``memory://``...)."""
    return not _is_local_file_protocol(path)


def checkpoint_exists(path: str | os.PathLike) -> bool:
    """Whether ``path`` (a local path or a remote URL) is a checkpoint file, not a name such as ``last``."""
    if not is_remote(path):
        return os.path.isfile(path)
    try:
        return _filesystem(str(path)).isfile(str(path))
    except OSError:  # unreachable or forbidden: loading it says why, in one line
        return True


def _filesystem(path: str, storage_options: Optional[Any] = None):
    """The fsspec filesystem of a remote URL; a missing package or a rejected option is one line
    (option names only: their values may be credentials)."""
    protocol = path.split("://", 1)[0].split("::", 1)[0]
    try:
        return get_filesystem(path, **(storage_options or {}))  # TypeError when not a mapping
    except ImportError as err:  # fsspec: "Install s3fs to access S3"
        raise CheckpointError(f"cannot open checkpoint {path}: {_first_line(err)}. Remote checkpoint folders "
                              "need the fsspec package of their storage, e.g. pip install s3fs (s3://) or "
                              "gcsfs (gs://)") from None
    except (TypeError, ValueError) as err:
        what = "the URL is"
        if storage_options:
            what = (f"storage_options {sorted(storage_options)} are" if isinstance(storage_options, dict)
                    else "storage_options (not a dict of fsspec options) are")
        raise CheckpointError(f"cannot open checkpoint {path}: {what} not accepted by the {protocol}:// "
                              f"filesystem ({_first_line(err)})") from None


def _read_remote(path: str) -> bytes:
    fs = _filesystem(path)
    try:
        if not fs.isfile(path):
            raise CheckpointError(f"checkpoint not found: {path} (--ckpt_path). Pass the URL of a .ckpt file "
                                  "written by this suite, e.g. s3://<bucket>/<run id>/checkpoints/last.ckpt")
        return fs.cat_file(path)  # one download; torch.load would otherwise seek through the remote file
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {path} ({_first_line(err)}); check the URL and the "
                              "credentials of its storage") from None


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _first_global(message: str) -> str:
    for line in message.splitlines():
        if "GLOBAL" in line or "Unsupported global" in line:
            return line.strip()
    return message.strip().splitlines()[0]


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO with atomic saves (temp file + fsync + rename) and ``weights_only`` loads.

    Remote URLs (``s3://``, ``gs://``...) are written by Lightning's fsspec IO; ``storage_options``
    (``trainer.save_checkpoint(..., storage_options=...)``) are passed to their fsspec filesystem.
    ``output``: the option naming the file written, for a command whose output is no run's resume
    point (``--output`` of ``rescale average-checkpoints``): a failed write says to free space or
    give that option another place, not to resume a run.
    """

    def __init__(self, output: Optional[str] = None) -> None:
        super().__init__()
        self.output = output

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if is_remote(path):
            self._save_remote(checkpoint, str(path), storage_options)
            return
        if storage_options:  # they configure an fsspec filesystem; the local write uses none
            raise CheckpointError(f"storage_options apply to remote checkpoint URLs (s3://, gs://...) only; "
                                  f"{path} is a local file: save it without them")
        target = Path(path)
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)  # atomic on POSIX: readers see the old file or the new one
        except (OSError, RuntimeError) as err:  # torch.save reports a failed write as a RuntimeError
            raise CheckpointError(_write_failed(target, err, self.output)) from err
        finally:
            if tmp.exists():
                tmp.unlink()
        _fsync_dir(target.parent)
        _remove_stale_temps(target)

    def _save_remote(self, checkpoint: dict[str, Any], path: str, storage_options: Optional[Any]) -> None:
        # an object store has no rename; one upload (multipart on S3/GCS) only appears once complete
        if not storage_options:
            super().save_checkpoint(checkpoint, path)  # Lightning's fsspec writer, tuned per store
            return
        fs = _filesystem(path, storage_options)  # Lightning's writer takes no options: its write, our fs
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        fs.makedirs(os.path.dirname(path), exist_ok=True)
        with fs.transaction:
            fs.pipe_file(path, buffer.getvalue())

    def load_checkpoint(self, path, map_location: Any = None, weights_only: Optional[bool] = None) -> dict:
        return safe_load(path, map_location=map_location if map_location is not None else "cpu")


def _write_failed(target: Path, err: BaseException, output: Optional[str] = None) -> str:
    """The line for a checkpoint that could not be written (a full disk, a quota, a file size
    limit): why, and which earlier checkpoint is intact (the temporary file was removed and the
    target never touched); for a command's ``output`` file, how to write it elsewhere."""
    cause = next((e for e in (err, err.__cause__, err.__context__) if isinstance(e, OSError)), None)
    reason = (f"{cause.strerror} ([Errno {cause.errno}])" if cause is not None and cause.strerror
              else _first_line(err))
    if output is not None:
        fix = (write_failure(cause, output) if cause is not None else None) or f"give {output} a folder you can write"
        return f"cannot write {target}: {reason}; nothing was written (an earlier file there is as it was): {fix}"
    folder = target.parent
    kept = target if target.is_file() else max(
        (p for p in folder.glob("*.ckpt") if p.is_file()), key=lambda p: p.stat().st_mtime, default=None)
    # a folder that takes no more writes (remounted read-only, permissions taken away) wants another
    # folder, not space; a failure of unknown cause (torch.save's RuntimeError) is most often a full disk
    refused = write_failure(cause, "last_checkpoint.dirpath") if cause is not None and cause.errno not in FULL_DISK \
        else None
    how = refused or "free space (or set last_checkpoint.dirpath to another disk)"
    intact = (f"the last good checkpoint, {kept}, is intact: {how} and resume with --ckpt_path {kept}"
              if kept is not None else f"no checkpoint of this run had been written yet: {how} and start again")
    return f"cannot write checkpoint {target}: {reason}; {intact}"


def _remove_stale_temps(target: Path) -> None:
    """Delete ``*.tmp-<pid>`` files of writers that no longer run in ``target``'s folder (a run
    killed with SIGKILL in the middle of a save leaves one; the checkpoint itself was never
    touched). Any file of the folder, not only ``target``'s: the killed save may have been of a
    step checkpoint the resumed run never writes again."""
    for tmp in target.parent.glob("*.ckpt.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            tmp.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (a power cut right after it keeps the new file)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass(frozen=True)
class CheckpointInfo:
    """What the CLI needs to know about a checkpoint before building anything (``run_config``: where
    its run saved its config, :data:`RUN_CONFIG_KEY`; None for a checkpoint written before it was recorded;
    ``keys``: its top-level entries; ``labels``: the labels its network learned, None where it does
    not record them, :func:`~..data.labels.checkpoint_labels`)."""

    hyper_parameters: dict
    run_id: Optional[str]
    global_step: int = 0
    run_config: Optional[str] = None
    keys: frozenset = frozenset()
    labels: Optional[Labels] = None


#: The checkpoint's entry holding the absolute path its run saved its config to (``rescale_config.yaml``).
RUN_CONFIG_KEY = "run_config"


def peek_checkpoint(path: str | os.PathLike) -> CheckpointInfo:
    """Hyper-parameters, W&B run id and step of a checkpoint, read once per file version (local tensors
    are memory-mapped, not read; a remote file is downloaded once): the CLI's several checks share
    one load."""
    path = str(path)
    return _peek(path, *_file_version(path))


def _file_version(path: str) -> tuple:
    """What changes when the file is rewritten: local mtime and size, or the remote store's metadata."""
    if not is_remote(path):
        stat = os.stat(path) if os.path.isfile(path) else None
        return (stat.st_mtime_ns, stat.st_size) if stat else (None, None)
    try:
        info = _filesystem(path).info(path)
    except OSError:  # missing or unreachable: safe_load says which, uncached
        return None, None
    stamp = next((info[k] for k in ("ETag", "etag", "md5Hash", "LastModified", "mtime", "updated", "created")
                  if info.get(k) is not None), None)
    return (None if stamp is None else str(stamp)), info.get("size")


@functools.lru_cache(maxsize=4)
def _peek(path: str, version: Any, size: Optional[int]) -> CheckpointInfo:
    state = safe_load(path, mmap=True)
    recorded = state.get(RUN_CONFIG_KEY)
    return CheckpointInfo(dict(state.get("hyper_parameters") or {}), checkpoint_run_id(state),
                          int(state.get("global_step") or 0), recorded if isinstance(recorded, str) else None,
                          frozenset(state), checkpoint_labels(state, f"checkpoint {path}"))


#: what Lightning restores every command from, and what ``fit`` restores besides (the training state,
#: which an average of checkpoints or a weights-only save does not hold)
_WEIGHTS = ("state_dict", "pytorch-lightning_version")
_TRAINING_STATE = ("optimizer_states", "lr_schedulers", "loops")


def require_restorable(path: str | os.PathLike, command: str) -> None:
    """A :class:`CheckpointError` line when the checkpoint at ``path`` lacks what ``rescale <command>
    --ckpt_path`` restores from it, before Lightning fails on the missing entry with a ``KeyError``:
    the network's weights as Lightning saves them, and for ``fit`` the optimizer, the schedule and
    the loops' position too."""
    keys = peek_checkpoint(path).keys
    missing = [key for key in _WEIGHTS if key not in keys]
    if missing:
        raise CheckpointError(f"checkpoint {path} is no checkpoint of a Lightning run (it holds no "
                              f"{' or '.join(missing)}), so rescale {command} cannot restore a network from it; pass a "
                              "checkpoint written by rescale fit, e.g. runs/<project>/<run id>/checkpoints/last.ckpt")
    missing = [key for key in _TRAINING_STATE if key not in keys] if command == "fit" else []
    if missing:
        raise CheckpointError(f"checkpoint {path} holds the network's weights but no training state to resume "
                              f"(no {', '.join(missing)}: an average of checkpoints or a weights-only save, written for "
                              "evaluation); resume from the run's last.ckpt or an epoch<NNN>.ckpt, or evaluate this one "
                              f"with rescale test --ckpt_path {path}")


def checkpoint_run_id(checkpoint: dict) -> Optional[str]:
    """The W&B run id a loaded checkpoint records (its ResumeState callback's); None without a W&B logger."""
    return next((value.get("run_id") for key, value in (checkpoint.get("callbacks") or {}).items()
                 if key.startswith("ResumeState") and isinstance(value, dict)), None)


def non_finite_weights(checkpoint: dict) -> list[str]:
    """The ``state_dict`` entries of a loaded checkpoint holding a NaN or an infinity (weights saved
    after a run diverged): every output of such a network is NaN."""
    return [key for key, value in (checkpoint.get("state_dict") or {}).items()
            if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(value.isfinite().all())]


def non_finite_text(keys: list[str], shown: int = 2) -> str:
    """``keys`` (of :func:`non_finite_weights`) for a message: the first few and how many more."""
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return f"{', '.join(keys[:shown])}{more} hold{'s' if len(keys) == 1 else ''} NaN or infinite values"
