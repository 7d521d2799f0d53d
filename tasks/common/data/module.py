"""The base of every task's data module."""
from __future__ import annotations

import hashlib
import os
from typing import Any, Optional

import lightning.pytorch as L

from .labels import Labels

__all__ = ["TaskDataModule", "DATA_KEY", "FINGERPRINT_KEY", "data_fingerprint", "describe_fingerprint",
           "same_data"]

#: the name a run summary gives the data fingerprint (:meth:`TaskDataModule.data_fingerprint`)
DATA_KEY = "data"
#: its name in a checkpoint and in the config the loggers receive
FINGERPRINT_KEY = "data_fingerprint"


class TaskDataModule(L.LightningDataModule):
    """Lightning's data module, described without building its loaders.

    Lightning's ``__str__`` calls every ``*_dataloader`` method to report the datasets' sizes, which
    sets the data up. jsonargparse writes the data module into a debug message (formatted whether
    or not anything logs it) for each data -> model link whose attribute the data module lacks (a
    classification data module has no ``vocab_size``), so every ``rescale fit`` loaded its training
    data, or listed an image folder, while it built its objects, before any check had run
    (measured: 0.66 s of a 0.9 s MNIST-5k build). The text here is the class and its arguments
    (its hyper-parameters less the ``_class_path`` and ``_instantiator`` Lightning's CLI adds).

    The hyper-parameters it hands the loggers leave out those the model also has with another value
    (:attr:`hparams_initial`): Lightning merges both into one flat set and stopped every run with a
    traceback (``Error while merging hparams``) at such a name, as COCO's ``data.max_size`` (the
    training resize's long-side cap) next to ``model.max_size`` (the test-time one). The model's
    value is logged under the flat name; the data's stays in the logged config (``data``).
    The data order's ``seed`` is handed over as ``data_seed``: a flat ``seed`` beside the config's
    ``seed_everything`` read as the run's seed (every seed of ``rescale study --seeds`` showed 0).
    """

    #: the labels of the checkpoint the run starts from (``--ckpt_path``; set by the CLI before the
    #: data is set up; None: none, or it records none), so that a data module's own check of its
    #: class count names the classes the data lacks or adds (:func:`~.labels.match_labels`)
    trained_labels: Optional[Labels] = None

    @property
    def hparams_initial(self) -> Any:
        """The hyper-parameters as given, less those the attached model has with another value."""
        initial = super().hparams_initial
        module = getattr(getattr(self, "trainer", None), "lightning_module", None)
        if module is None:
            return _data_seed_named(initial)
        theirs = module.hparams_initial
        for key in [k for k in initial if k in theirs and k != "_class_path"]:
            mine, other = initial[key], theirs[key]
            try:
                differ = type(mine) is not type(other) or bool(mine != other)
            except Exception:  # values whose comparison is no truth value (tensors, arrays): never merged
                differ = mine is not other
            if differ:
                del initial[key]
        return _data_seed_named(initial)

    #: the attributes :meth:`data_fingerprint` reads the splits from (a dict of splits also serves)
    fingerprint_splits = ("train_set", "val_set", "test_set", "datasets")

    def data_fingerprint(self) -> dict:
        """Which data the run read, from what :meth:`setup` already holds (no file is read again): the
        class, the root as given and resolved (where there is one: :meth:`fingerprint_root`), and per
        split its sample count and a 12-hex-digit hash: of the sorted (path relative to the root,
        size) list of its files (:meth:`fingerprint_files`), else of its tensors' bytes for a split
        held in memory. What cannot be said is left out (a split with neither count nor hash)."""
        found: dict[str, Any] = {"class": type(self).__name__}
        root, base = self.fingerprint_root(), None
        if isinstance(root, (str, os.PathLike)):
            base = os.path.abspath(os.path.expanduser(str(root)))  # what the paths are relative to
            found["root"], found["resolved_root"] = str(root), os.path.realpath(base)
        splits: dict[str, Any] = {}
        for name in self.fingerprint_splits:
            value = getattr(self, name, None)
            if isinstance(value, dict):
                splits.update({str(k): v for k, v in value.items() if v is not None})
            elif value is not None:
                splits[name.removesuffix("_set")] = value
        found["splits"] = {name: self._split_fingerprint(name, dataset, base) for name, dataset in splits.items()}
        return found

    def _split_fingerprint(self, name: str, dataset: Any, base: Optional[str]) -> dict:
        """One split's, hashed once per dataset object: the run's config and its summary both
        record it (an in-memory CIFAR is 150 MB of bytes to hash)."""
        cache = self.__dict__.setdefault("_fingerprints", {})
        held = cache.get((name, base))
        if held is None or held[0] is not dataset:
            held = cache[(name, base)] = (dataset, _split_fingerprint(dataset, self.fingerprint_files(name, dataset),
                                                                      base))
        return dict(held[1])

    def fingerprint_root(self) -> Any:
        """The data's root folder as given (None: none), for :meth:`data_fingerprint`."""
        return getattr(self, "root", None)

    def fingerprint_files(self, split: str, dataset: Any) -> Optional[list]:
        """The files ``split`` reads, for its hash (None: not a split of files); by default the
        paths of the dataset's ``samples`` (``(path, label)`` pairs or paths). An entry may also be a
        ``(path, name)`` pair: the file at ``path`` hashed under the path ``name`` (a layout that holds
        the same files elsewhere: the same data, the same hash)."""
        samples = getattr(dataset, "samples", None)
        if not isinstance(samples, (list, tuple)):
            return None
        return [sample[0] if isinstance(sample, (list, tuple)) else sample for sample in samples]

    def __str__(self) -> str:
        arguments = {k: v for k, v in self.hparams.items() if not k.startswith("_")}
        return f"{type(self).__name__}({arguments})"


def data_fingerprint(datamodule: Any) -> Optional[dict]:
    """``datamodule``'s :meth:`~TaskDataModule.data_fingerprint`; None for none, or one of another kind."""
    return datamodule.data_fingerprint() if isinstance(datamodule, TaskDataModule) else None


def describe_fingerprint(fingerprint: Any, root: bool = False) -> str:
    """A data fingerprint in a few words: the module and each split's count and hash
    (``DigitsDataModule[train 1257 #3f2a...; val 270 #9c1b...]``), with ``root`` where the data lies
    (``... in /data/a``); not a fingerprint: ``unknown``."""
    if not isinstance(fingerprint, dict):
        return "unknown"
    splits = fingerprint.get("splits") if isinstance(fingerprint.get("splits"), dict) else {}
    text = f"{fingerprint.get('class')}[" + "; ".join(
        " ".join([name, *([str(s["count"])] if "count" in s else []), *([f"#{s['hash']}"] if "hash" in s else [])])
        for name, s in sorted(splits.items()) if isinstance(s, dict)) + "]"
    return f"{text} in {fingerprint['root']}" if root and fingerprint.get("root") else text


def same_data(saved: dict, current: dict) -> bool:
    """Whether two fingerprints say the same data: the same module and, for each split both hold,
    the same count and hash where both have one (not where the root lies: the same files read from
    another folder are the same data)."""
    if saved.get("class") != current.get("class"):
        return False
    mine, theirs = saved.get("splits") or {}, current.get("splits") or {}
    for name in set(mine) & set(theirs):
        for key in ("count", "hash"):
            if key in mine[name] and key in theirs[name] and mine[name][key] != theirs[name][key]:
                return False
    return True


def _split_fingerprint(dataset: Any, files: Optional[list], root: Optional[str]) -> dict:
    """One split's sample count and short hash (:meth:`TaskDataModule.data_fingerprint`)."""
    found: dict[str, Any] = {}
    try:
        found["count"] = len(dataset)
    except TypeError:
        pass
    digest = _files_digest(files, root) if files is not None else _tensors_digest(dataset)
    if digest is not None:
        found["hash"] = digest
    return found


#: the most files whose sizes a split's hash takes (one stat each: ImageNet's 1.28 million on a
#: cluster's file system would take minutes); a longer list is hashed by its paths alone
SIZED_FILES = 1000


def _files_digest(files: list, root: Optional[str]) -> str:
    """The sorted list of paths relative to ``root`` (with each file's size, -1 for one gone since,
    where there are at most :data:`SIZED_FILES`), hashed; a ``(path, name)`` entry is hashed as
    ``name`` with the size of ``path``."""
    sized = len(files) <= SIZED_FILES
    entries = []
    for file in files:
        path, name = (str(file[0]), str(file[1])) if isinstance(file, tuple) else (str(file), str(file))
        relative = os.path.relpath(os.path.abspath(name), root) if root else name
        if not sized:
            entries.append((relative,))
            continue
        try:
            size = os.path.getsize(path)
        except OSError:
            size = -1
        entries.append((relative, size))
    return hashlib.sha256(repr(sorted(entries)).encode()).hexdigest()[:12]


def _tensors_digest(dataset: Any) -> Optional[str]:
    """The hash of a split held in memory: its tensors' shapes and bytes (None: not such a split)."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is None and hasattr(dataset, "images") and hasattr(dataset, "labels"):
        tensors = (dataset.images, dataset.labels)
    if not (isinstance(tensors, (list, tuple)) and tensors and all(hasattr(t, "numpy") for t in tensors)):
        return None
    sha = hashlib.sha256()
    for tensor in tensors:
        sha.update(str(tuple(tensor.shape)).encode())
        sha.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return sha.hexdigest()[:12]


def _data_seed_named(hparams: Any) -> Any:
    """``seed`` (the data order's) as ``data_seed``, the name the run summary gives it too."""
    if "seed" in hparams:
        hparams["data_seed"] = hparams.pop("seed")
    return hparams
