"""What a network's outputs mean, carried by every checkpoint and matched to the data by name.

A data module says what its labels are with ``labels()``: a :class:`Labels`, the name of every
label index (class folders, COCO categories with the background first, Kinetics classes) and,
where the data set numbers them itself, its id of each (COCO category ids); None where it does
not say. :class:`~rescale_tasks.common.module.RescaleTaskModule` writes the labels its network
learned into every checkpoint (``checkpoint["labels"]``) and, when a checkpoint meets data
(validate, test, predict, ``fit --ckpt_path``), matches them by name (:func:`match_labels`):

- the same names in the same order: nothing to do;
- the same names in another order (or under other ids): the data's label indices are mapped to
  the checkpoint's, so every score counts the classes the network learned; one line says so. A name
  is the same written in composed or decomposed accents (Unicode NFC and NFD: a class folder copied
  through macOS comes decomposed), and the line names it;
- other names: one :class:`~rescale_tasks.common.errors.DataError` line naming a few on each
  side and the data key to point at the data the network was trained on.
"""
from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import DataError

__all__ = ["LABELS_KEY", "Labels", "checkpoint_labels", "data_labels", "match_labels"]

#: the checkpoint entry holding the labels: ``{"class_names": [...], "ids": [...]}`` (ids optional)
LABELS_KEY = "labels"


@dataclass(frozen=True)
class Labels:
    """The labels of a data set or a checkpoint.

    Args:
        names: the name of every label index.
        ids: the data set's own id of every label index (None where it has none), e.g. COCO
            category ids; None when the data set does not number its labels.
        source: what the labels were read from, for messages (``the class folders of ...``).
        key: the config key that points at that data (``data.root``), for messages.
    """

    names: tuple[str, ...]
    ids: Optional[tuple[Optional[int], ...]] = None
    source: str = "the data"
    key: str = "data"

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(str(n) for n in self.names))
        if self.ids is not None:
            object.__setattr__(self, "ids", tuple(None if i is None else int(i) for i in self.ids))

    def to_checkpoint(self) -> dict[str, Any]:
        """The checkpoint entry (plain lists: checkpoints load with ``weights_only``)."""
        entry: dict[str, Any] = {"class_names": list(self.names)}
        if self.ids is not None:
            entry["ids"] = list(self.ids)
        return entry


def _from_entry(entry: Any, source: str) -> Optional[Labels]:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("class_names"), Sequence):
        return None
    return Labels(entry["class_names"], entry.get("ids"), source=source)


def checkpoint_labels(checkpoint: Mapping[str, Any], source: str, datamodule: Any = None) -> Optional[Labels]:
    """The labels a checkpoint's network learned; None for a checkpoint that does not record them.

    Checkpoints written before the module recorded them may hold them in the data module's own
    state (Lightning keeps it under the data module's class name: the video task's class list)."""
    labels = _from_entry(checkpoint.get(LABELS_KEY), source)
    if labels is None and datamodule is not None:
        labels = _from_entry(checkpoint.get(type(datamodule).__qualname__), source)
    return labels


def data_labels(datamodule: Any) -> Optional[Labels]:
    """What the labels of ``datamodule`` are (its ``labels()``), None when it does not say."""
    labels = getattr(datamodule, "labels", None)
    return labels() if callable(labels) else None


def _some(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def match_labels(trained: Labels, data: Labels) -> tuple[Optional[list[int]], Optional[str]]:
    """``(order, note)``: for every label index of ``data``, the index of the label of the same name
    in ``trained`` (None: the same order), and the line saying what was mapped (None: nothing).

    Raises a one-line :class:`DataError` when the names differ (or repeat, so that the order
    cannot be matched)."""
    same_ids = trained.ids is None or data.ids is None or trained.ids == data.ids
    if trained.names == data.names and same_ids:
        return None, None
    # a name is the same name in composed or decomposed accents (macOS writes file names decomposed)
    trained_names, data_names = _nfc(trained.names), _nfc(data.names)
    index = {name: i for i, name in enumerate(trained_names)}
    missing = [n for n, c in zip(trained.names, trained_names) if c not in set(data_names)]
    extra = [n for n, c in zip(data.names, data_names) if c not in index]
    repeated = len(index) != len(trained_names) or len(set(data_names)) != len(data_names)
    if missing or extra or repeated:
        parts = ([f"not in the data: {_some(missing)}"] if missing else []) + (
            [f"not in the checkpoint: {_some(extra)}"] if extra else []) + (
            ["names repeat, so their order cannot be matched"] if repeated and not (missing or extra) else [])
        # every trained label there, and more: the data holds them, besides labels the network never learned
        how = "does not hold" if missing or repeated else "holds labels besides"
        raise DataError(f"{data.source} ({data.key}) {how} the {len(trained.names)} labels "
                        f"{trained.source} was trained on: {'; '.join(parts)}. Point --{data.key} at the data the "
                        "network was trained on (the same label names, in any order)")
    order = [index[n] for n in data_names]
    spelled = [n for n, i in zip(data.names, order) if n != trained.names[i]]  # the data's, once each
    accents = (f"; {_some(spelled)} {'is' if len(spelled) == 1 else 'are'} written in other Unicode characters on "
               "one side (composed and decomposed accents: macOS writes file names decomposed)" if spelled else "")
    if order == list(range(len(order))):  # the same names in the same order, under other ids or spellings
        how = "numbers the {} labels of {} with other ids" if not same_ids else "holds the {} labels of {}"
        return None, f"labels: {data.source} {how.format(len(order), trained.source)}; matched by name{accents}"
    note = (f"labels: {data.source} lists the {len(order)} labels of {trained.source} in another order; its "
            "labels are mapped to the checkpoint's by name, so the scores count the classes the network learned")
    return order, note + accents


def _nfc(names: Sequence[str]) -> list[str]:
    return [unicodedata.normalize("NFC", n) for n in names]
