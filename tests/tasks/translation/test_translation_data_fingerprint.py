"""The translation data module's fingerprint (run_summary.json's ``data``): per split its pairs and a
hash of its text files and the SentencePiece model, the same for a copy elsewhere, another for other text."""
from __future__ import annotations

import shutil

from rescale_tasks.translation.data import TranslationDataModule


def _fingerprint(root) -> dict:
    dm = TranslationDataModule(str(root), vocab_size=500, num_workers=0, clean={"len_ratio": None}, max_tokens=1024)
    dm.setup("fit")
    return dm.data_fingerprint()


def test_the_fingerprint_follows_the_text_not_the_folder(parallel_root, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(parallel_root, copy, ignore=shutil.ignore_patterns("rescale_cache"))
    found = _fingerprint(copy)
    assert found["class"] == "TranslationDataModule" and found["root"] == str(copy)
    splits = found["splits"]
    assert {"train", "valid"} <= set(splits) and all(len(s["hash"]) == 12 and s["count"] > 0 for s in splits.values())
    again = tmp_path / "again"
    shutil.copytree(copy, again)
    assert _fingerprint(again)["splits"] == splits
    with open(again / "valid.en", "a", encoding="utf-8") as en, open(again / "valid.de", "a", encoding="utf-8") as de:
        en.write("One more line\n")
        de.write("Eine Zeile mehr\n")
    changed = _fingerprint(again)["splits"]
    assert changed["valid"]["count"] == splits["valid"]["count"] + 1 and changed["valid"]["hash"] != splits["valid"]["hash"]
    assert changed["train"] == splits["train"]
