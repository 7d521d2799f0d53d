"""Vocabularies that do not fit the text or each other, on real parallel text (issue 41).

A target side in another script than the SentencePiece model was trained on (the suite's German
sentences written in Greek letters, against a model of the English-German text) is mostly
``<unk>``: `rescale prepare-translation` counts the ``<unk>`` pieces of every split side, stores
them with the encoded arrays and warns per split side past ``--unk_warn_percent``; `rescale fit`
warns once from the stored counts (nothing encoded again), also for a cache written before the
counts were stored. `rescale average-checkpoints` refuses checkpoints of runs whose
SentencePiece models differ.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from rescale_tasks.cli import main
from rescale_tasks.common.checkpoints import safe_load
from rescale_tasks.common.errors import ConfigError
from rescale_tasks.translation import binarize
from rescale_tasks.translation.catalogues import write_parallel_files
from rescale_tasks.translation.data import TranslationDataModule

REPO = Path(__file__).resolve().parents[3]
SIZES = {"train": 300, "valid": 40, "test": 40}
VOCAB = "300"
# Latin letters to Greek ones, one for one: the same sentences in a script the model never saw
GREEK = str.maketrans("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZäöüß",
                      "αβγδεζηθικλμνξοπρστυφχψωάέΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩΆΈήίόύ")
TINY = ["--config", str(REPO / "experiments/wmt/rescale6.yaml"), "--model.init_args.network", "transformer_tiny",
        "--model.init_args.network_options", "{share_embeddings: true, dropout: 0.0, d_model: 32, nhead: 2, "
        "dim_feedforward: 64, num_encoder_layers: 1, num_decoder_layers: 1}",
        "--model.init_args.val_bleu_sentences", "4", "--data.init_args.max_tokens", "400",
        "--data.init_args.num_workers", "0", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
        "--trainer.precision", "32-true", "--trainer.enable_progress_bar", "false",
        "--trainer.limit_val_batches", "0"]


def _splits(pairs) -> dict[str, list[tuple[str, str]]]:
    splits, start = {}, 0
    for split, size in SIZES.items():
        splits[split] = list(pairs[start:start + size])
        start += size
    return splits


def corpora(folder: Path, en_de_pairs, en_fr_pairs) -> dict[str, Path]:
    """English-German, the same with the German in Greek letters (en-el), and English-French."""
    de = _splits(en_de_pairs)
    return {"de": write_parallel_files(folder / "en_de", de),
            "el": write_parallel_files(folder / "en_el", {s: [(e, t.translate(GREEK)) for e, t in pairs]
                                                          for s, pairs in de.items()}, tgt="el"),
            "fr": write_parallel_files(folder / "en_fr", _splits(en_fr_pairs), tgt="fr")}


def unknown_in(model: Path, text: Path) -> tuple[int, int]:
    """(<unk> pieces, pieces) of a text file encoded with ``model`` line by line."""
    processor = spm.SentencePieceProcessor(model_file=str(model))
    ids = [i for line in text.read_text(encoding="utf-8").split("\n")[:-1] for i in processor.encode(line)]
    return ids.count(processor.unk_id()), len(ids)


def warnings_of(records, logger: str) -> list[str]:
    return [r.getMessage() for r in records if r.name == logger and r.levelno == logging.WARNING]


def expected_warnings(model: Path, root: Path) -> dict[str, str]:
    """Per split, the start of the warning its Greek side gets (rate and counts of a real encoding)."""
    out = {}
    for split in SIZES:
        unk, total = unknown_in(model, root / f"{split}.el")
        assert unk / total > 0.3  # the issue: nearly half the target pieces are <unk>
        out[split] = (f"unknown pieces: {100 * unk / total:.2f}% of the el side of {split} ({unk} of {total} "
                      "pieces) are <unk>")
    return out


class Lines(logging.Handler):
    """The messages a logger emits, for fixtures (pytest's caplog is per test)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _forbidden(*args, **kwargs):
    raise AssertionError("the corpus was encoded again")


@pytest.fixture
def roots(tmp_path, en_de_pairs, en_fr_pairs) -> dict[str, Path]:
    return corpora(tmp_path / "text", en_de_pairs, en_fr_pairs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, en_de_pairs, en_fr_pairs, fit_checkpoint) -> dict:
    """Two real runs: 1 step on en-el prepared with the English-German model (the warnings its
    fit logged, with encoding forbidden), and 2 steps on en-fr with a SentencePiece model of its
    own, saving a checkpoint every step."""
    folder = tmp_path_factory.mktemp("vocabularies")
    (folder / "el_run").mkdir()
    (folder / "fr_run").mkdir()
    text = corpora(folder / "text", en_de_pairs, en_fr_pairs)
    assert main(["prepare-translation", str(text["de"]), "--vocab_size", VOCAB]) == 0
    latin = next((text["de"] / "rescale_cache").glob("spm-*.model"))
    assert main(["prepare-translation", str(text["el"]), "--tgt_lang", "el", "--spm_model", str(latin)]) == 0
    lines, data_log = Lines(), logging.getLogger("rescale_tasks.translation.data")
    data_log.addHandler(lines)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(binarize, "_encode_side", _forbidden)
            greek = fit_checkpoint(folder / "el_run", [*TINY, "--data.init_args.root", str(text["el"]),
                                                       "--trainer.max_steps", "1"])
    finally:
        data_log.removeHandler(lines)
    every_step = ('[{class_path: lightning.pytorch.callbacks.ModelCheckpoint, init_args: {filename: "step{step:03d}", '
                  "every_n_train_steps: 1, save_top_k: -1, auto_insert_metric_name: false}}]")
    french = fit_checkpoint(folder / "fr_run", [*TINY, "--data.init_args.root", str(text["fr"]),
                                                "--data.init_args.tgt_lang", "fr", "--data.init_args.vocab_size",
                                                VOCAB, "--trainer.max_steps", "2", "--trainer.callbacks", every_step])
    return {"text": text, "latin": latin, "greek": greek, "greek_fit": lines.records, "french": french.parent}


def test_prepare_counts_unknown_pieces_stores_them_and_warns_per_split_side(roots, tmp_path, caplog, capsys):
    cache = tmp_path / "cache"
    with caplog.at_level(logging.WARNING):
        assert main(["prepare-translation", str(roots["de"]), "--vocab_size", VOCAB, "--cache_dir", str(cache)]) == 0
    assert warnings_of(caplog.records, "rescale_tasks.translation.prepare") == []  # its own text: spelled
    assert "<unk> 0 + 0 (0.00% + 0.00%)" in capsys.readouterr().out  # train
    latin = next(cache.glob("spm-*.model"))

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert main(["prepare-translation", str(roots["el"]), "--tgt_lang", "el", "--spm_model", str(latin),
                     "--cache_dir", str(cache)]) == 0
    out = capsys.readouterr().out
    said = warnings_of(caplog.records, "rescale_tasks.translation.prepare")
    expected = expected_warnings(latin, roots["el"])
    assert [line.split(": the SentencePiece")[0] for line in said] == list(expected.values())  # one per split
    assert all(f"model {latin} cannot spell that text" in line and "leave out --spm_model" in line
               and line.endswith("(threshold: --unk_warn_percent 1)") for line in said), said
    unk, _ = unknown_in(latin, roots["el"] / "train.el")
    assert f"<unk> 0 + {unk} (" in out  # train: no English piece unknown
    # the counts are stored with the encoded arrays
    stored = {(meta["source"][meta["side"]], meta["unk_pieces"], meta["num_tokens"])
              for meta in (json.loads(p.read_text()) for p in (cache / "tokens").glob("*.json"))}
    for split in SIZES:
        path = roots["el"] / f"{split}.el"
        assert (str(path), *unknown_in(latin, path)) in stored

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert main(["prepare-translation", str(roots["el"]), "--tgt_lang", "el", "--spm_model", str(latin),
                     "--cache_dir", str(cache), "--unk_warn_percent", "60"]) == 0
    assert warnings_of(caplog.records, "rescale_tasks.translation.prepare") == []


def test_fit_warns_once_per_split_side_from_the_stored_counts(runs):
    said = warnings_of(runs["greek_fit"], "rescale_tasks.translation.data")
    expected = expected_warnings(runs["latin"], runs["text"]["el"])
    assert [line.split(": the SentencePiece")[0] for line in said] == list(expected.values())
    assert all("rescale prepare-translation" in line and line.endswith("(threshold: --data.unk_warn_percent 1)")
               for line in said), said


def test_a_corpus_the_model_spells_does_not_warn(roots, tmp_path, caplog):
    data = TranslationDataModule(str(roots["fr"]), tgt_lang="fr", vocab_size=int(VOCAB), num_workers=0,
                                 cache_dir=str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING):
        data.setup("fit")
    assert warnings_of(caplog.records, "rescale_tasks.translation.data") == []
    assert [c.split for c in data.unknown] == ["train", "train", "valid", "valid", "test", "test"]
    assert all(c.percent < 1 for c in data.unknown) and data.unknown[0].unknown == 0


def test_a_cache_without_counts_is_counted_once_without_encoding(roots, tmp_path, caplog, monkeypatch):
    """A corpus prepared before the counts were stored: fit counts them from the token files."""
    cache = tmp_path / "cache"
    assert main(["prepare-translation", str(roots["de"]), "--vocab_size", VOCAB, "--cache_dir",
                 str(tmp_path / "latin")]) == 0
    latin = next((tmp_path / "latin").glob("spm-*.model"))
    assert main(["prepare-translation", str(roots["el"]), "--tgt_lang", "el", "--spm_model", str(latin),
                 "--cache_dir", str(cache)]) == 0
    metas = list((cache / "tokens").glob("*.json"))
    for path in metas:
        meta = json.loads(path.read_text())
        del meta["unk_pieces"]
        path.write_text(json.dumps(meta))
    monkeypatch.setattr(binarize, "_encode_side", _forbidden)
    with caplog.at_level(logging.WARNING):
        TranslationDataModule(str(roots["el"]), cache_dir=str(cache), num_workers=0).setup("fit")
    said = warnings_of(caplog.records, "rescale_tasks.translation.data")
    expected = expected_warnings(latin, roots["el"])
    assert [line.split(": the SentencePiece")[0] for line in said] == list(expected.values())
    assert all("unk_pieces" in json.loads(path.read_text()) for path in metas)  # written back: counted once


def test_checkpoints_of_runs_with_other_sentencepiece_models_are_not_averaged(runs, tmp_path, capsys, error_line):
    french = sorted(runs["french"].glob("step*.ckpt"))
    assert [safe_load(p)["global_step"] for p in french] == [1, 2]
    out = tmp_path / "avg.ckpt"
    assert main(["average-checkpoints", str(runs["french"]), "--output", str(out)]) == 0  # one run: averaged
    capsys.readouterr()
    averaged, newest = safe_load(out), safe_load(french[-1])
    assert averaged["sentencepiece"] == newest["sentencepiece"]
    key = next(k for k, v in averaged["state_dict"].items() if v.is_floating_point())
    torch.testing.assert_close(averaged["state_dict"][key],
                               sum(safe_load(p)["state_dict"][key].double() for p in french).float() / 2)

    greek = runs["greek"]  # the same network and shapes, but the English-German SentencePiece model
    assert main(["average-checkpoints", str(greek), str(french[-1]), "--output", str(tmp_path / "mixed.ckpt")]) == 2
    line = error_line()
    assert line.startswith(f"cannot average {greek} with {french[-1]}: their SentencePiece vocabularies differ "
                           f"(last.ckpt: 300 pieces, sha256 ")
    assert "; step002.ckpt: 300 pieces, sha256 " in line
    assert line.endswith("so the same ids stand for other pieces; average checkpoints of one run only")
    assert not (tmp_path / "mixed.ckpt").exists()


def test_the_threshold_is_a_percentage(roots, error_line):
    assert main(["prepare-translation", str(roots["de"]), "--unk_warn_percent", "150"]) == 2
    assert error_line() == "--unk_warn_percent must be a percentage in [0, 100], got 150."
    with pytest.raises(ConfigError, match=r"data.unk_warn_percent must be a percentage in \[0, 100\], got -1"):
        TranslationDataModule(str(roots["de"]), unk_warn_percent=-1)
