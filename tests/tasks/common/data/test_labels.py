"""Matching the labels a checkpoint was trained on to the data's, by name (common.data.labels)."""
from __future__ import annotations

import unicodedata

import pytest

from rescale_tasks.common.data import Labels, checkpoint_labels, data_labels, match_labels
from rescale_tasks.common.errors import DataError

TRAINED = Labels(["cat", "dog", "fox"], source="checkpoint a.ckpt")


def _data(names, ids=None) -> Labels:
    return Labels(names, ids, source="the class folders of /data/train", key="data.root")


def test_the_same_names_in_the_same_order_need_nothing():
    assert match_labels(TRAINED, _data(["cat", "dog", "fox"])) == (None, None)


def test_the_same_names_in_another_order_are_mapped_by_name():
    order, note = match_labels(TRAINED, _data(["fox", "cat", "dog"]))
    assert order == [2, 0, 1]  # data label -> the checkpoint's label of the same name
    assert note.startswith("labels: the class folders of /data/train lists the 3 labels of checkpoint a.ckpt "
                           "in another order")


@pytest.mark.parametrize("names,shown,lead", [
    (["cat", "fox", "zebra"], "not in the data: 'dog'; not in the checkpoint: 'zebra'", "does not hold"),
    (["cat", "dog"], "not in the data: 'fox'", "does not hold"),
    # every trained class there, and one more: the line said the data "does not hold the 3 labels"
    (["cat", "dog", "fox", "yak"], "not in the checkpoint: 'yak'", "holds labels besides"),
    (["cat", "dog", "dog"], "not in the data: 'fox'", "does not hold"),
])
def test_other_names_are_refused_in_one_line(names, shown, lead):
    with pytest.raises(DataError) as err:
        match_labels(TRAINED, _data(names))
    message = str(err.value)
    assert "\n" not in message and shown in message
    assert message.startswith(f"the class folders of /data/train (data.root) {lead} the 3 labels "
                              "checkpoint a.ckpt was trained on")
    assert message.endswith("Point --data.root at the data the network was trained on (the same label names, "
                            "in any order)")


def test_many_differing_names_are_shown_a_few_at_a_time():
    trained = Labels([f"n{i:03d}" for i in range(10)], source="the checkpoint")
    with pytest.raises(DataError, match=r"not in the data: 'n000', 'n001', 'n002' and 7 more;"):
        match_labels(trained, _data([f"m{i:03d}" for i in range(10)]))


def test_repeated_names_cannot_be_matched():
    with pytest.raises(DataError, match="names repeat"):
        match_labels(Labels(["a", "a", "b"]), _data(["a", "b", "a"]))


def test_the_same_categories_under_other_ids_are_matched_by_name():
    """COCO: the ids decide the label order (sorted), so renumbered categories are reordered."""
    trained = Labels(["__background__", "zero", "one"], [None, 3, 7], source="the checkpoint")
    assert match_labels(trained, _data(["__background__", "one", "zero"], [None, 3, 7]))[0] == [0, 2, 1]
    order, note = match_labels(trained, _data(["__background__", "zero", "one"], [None, 5, 9]))
    assert order is None and "other ids" in note


class KineticsDataModule:
    """Stands for the video task's data module: Lightning keeps a data module's state in a
    checkpoint under its class name."""


def test_checkpoint_labels_round_trip_and_older_checkpoints():
    entry = Labels(["a", "b"], [None, 4]).to_checkpoint()
    assert entry == {"class_names": ["a", "b"], "ids": [None, 4]}
    assert checkpoint_labels({"labels": entry}, "x") == Labels(["a", "b"], [None, 4], source="x")
    older = {"KineticsDataModule": {"class_names": ["a", "b"]}}
    assert checkpoint_labels(older, "x", KineticsDataModule()).names == ("a", "b")
    assert checkpoint_labels(older, "x") is None and checkpoint_labels({}, "x", KineticsDataModule()) is None


def test_data_labels_are_what_the_data_module_says():
    from rescale_tasks.classification.data import CIFARDataModule, DigitsDataModule, MNISTDataModule

    assert data_labels(DigitsDataModule()).names == tuple("0123456789")
    assert data_labels(MNISTDataModule("mnist", variant="fashion_mnist")).names[0] == "T-shirt/top"
    assert data_labels(CIFARDataModule("cifar")).names[:2] == ("airplane", "automobile")
    assert data_labels(CIFARDataModule("cifar", variant="cifar100")) is None  # not recorded
    assert data_labels(object()) is None


def test_names_in_other_accents_are_named_once_and_only_where_the_sides_differ():
    composed, decomposed = unicodedata.normalize("NFC", "dóg"), unicodedata.normalize("NFD", "dóg")
    trained = Labels([decomposed, "cat"], source="checkpoint a.ckpt")
    order, note = match_labels(trained, _data(["cat", decomposed]))  # decomposed on both sides
    assert order == [1, 0] and "Unicode" not in note, note
    order, note = match_labels(trained, _data(["cat", composed]))
    assert order == [1, 0] and note.count("dóg") == 1 and "'dóg' is written in other Unicode" in note, note
