"""Another language pair is first-class: `rescale prepare-translation` on an English-French
folder of real text (the suite's French gettext catalogue pairs) records its languages and
vocabulary where `rescale fit` reads them, so the WMT recipe trains on it with no
--data.src_lang/--data.tgt_lang/--data.vocab_size to repeat, and the run's W&B name and group
name the pair."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rescale_tasks.cli import main
from wandb_runs import find_offline_runs, read_offline_run
from rescale_tasks.translation.catalogues import write_parallel_files
from rescale_tasks.translation.data import TranslationDataModule
from rescale_tasks.translation.prepared import RECORD

REPO = Path(__file__).resolve().parents[3]
TINY_MODEL = ["--model.init_args.network", "transformer_tiny",
              "--model.init_args.network_options", "{share_embeddings: true, dropout: 0.0, d_model: 32, nhead: 2, "
              "dim_feedforward: 64, num_encoder_layers: 1, num_decoder_layers: 1}",
              "--model.init_args.val_bleu_sentences", "4", "--data.init_args.max_tokens", "400",
              "--data.init_args.num_workers", "0", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
              "--trainer.precision", "32-true", "--trainer.enable_progress_bar", "false"]


@pytest.fixture
def en_fr(tmp_path, en_fr_pairs, short_pairs) -> Path:
    """200 short real English-French pairs as train, valid and test."""
    pairs = short_pairs(en_fr_pairs, 200)
    return write_parallel_files(tmp_path / "gettext_en_fr", {"train": pairs, "valid": pairs, "test": pairs},
                                src="en", tgt="fr")


def test_fit_reads_what_prepare_translation_recorded(en_fr, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert main(["prepare-translation", str(en_fr), "--src_lang", "en", "--tgt_lang", "fr",
                 "--vocab_size", "120"]) == 0
    printed = capsys.readouterr().out
    record = en_fr / "rescale_cache" / RECORD
    assert f"recorded in {record}: en-fr, vocabulary 120" in printed
    [entry] = json.loads(record.read_text())[str(en_fr.resolve())]
    assert (entry["src_lang"], entry["tgt_lang"], entry["vocab_size"]) == ("en", "fr", 120)

    # the WMT recipe (en, de, 32000 unless recorded) on the French folder, nothing repeated
    assert main(["fit", "--config", str(REPO / "experiments/wmt/rescale6.yaml"), *TINY_MODEL,
                 "--data.init_args.root", str(en_fr), "--trainer.max_steps", "1",
                 "--trainer.limit_val_batches", "0"]) == 0
    [run] = [read_offline_run(d) for d in find_offline_runs("runs")]
    assert (run.name, run.group) == ("rescale6-en-fr", "en-fr-6L")
    # the hyper-parameters of the model (its embedding, linked from the data) and the data module
    assert (run.config["vocab_size"], run.config["src_lang"], run.config["tgt_lang"]) == (120, "en", "fr")


def test_languages_set_win_over_the_record_and_unknown_labels_are_one_line(en_fr, tmp_path, monkeypatch,
                                                                             error_line):
    monkeypatch.chdir(tmp_path)
    assert main(["prepare-translation", str(en_fr), "--tgt_lang", "fr", "--vocab_size", "120"]) == 0
    data = TranslationDataModule(str(en_fr))
    assert (data.settings.src_lang, data.settings.tgt_lang, data.vocab_size) == ("en", "fr", 120)
    assert data.hparams.tgt_lang == "fr" and data.hparams.vocab_size == 120  # saved as used
    assert TranslationDataModule(str(en_fr), vocab_size=100).vocab_size == 100  # set: a model of its own
    assert TranslationDataModule(str(en_fr), tgt_lang="de").settings.tgt_lang == "de"  # nothing recorded for it
    assert data.run_labels() == {"src_lang": "en", "tgt_lang": "fr", "pair": "en-fr"}

    monkeypatch.setenv("WANDB_MODE", "offline")
    assert main(["fit", "--config", str(REPO / "experiments/wmt/rescale6.yaml"), *TINY_MODEL,
                 "--data.init_args.root", str(en_fr), "--trainer.logger.init_args.group", "{corpus}-6L",
                 "--trainer.max_steps", "1"]) == 2
    line = error_line()
    assert line.startswith("trainer.logger.init_args.group '{corpus}-6L' names a label the data module does not give")
    assert "{src_lang}, {tgt_lang}, {pair}" in line


def test_a_vocabulary_other_than_the_prepared_one_is_said_in_one_line(en_fr, tmp_path, monkeypatch, caplog):
    """A vocabulary size the config sets that differs from the recorded one (or a recorded model
    that is gone) trains a SentencePiece model of its own: said once, with the way back."""
    monkeypatch.chdir(tmp_path)
    assert main(["prepare-translation", str(en_fr), "--tgt_lang", "fr", "--vocab_size", "120"]) == 0
    model = json.loads((en_fr / "rescale_cache" / RECORD).read_text())[str(en_fr.resolve())][0]["spm_model"]

    def said(**options) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            TranslationDataModule(str(en_fr), num_workers=0, **options)
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("vocabulary:")]

    assert said() == said(vocab_size=120) == said(vocab_size=100, spm_model=model) == []
    assert said(vocab_size=100) == [
        f"vocabulary: data.vocab_size is 100 but rescale prepare-translation recorded 120 pieces for {en_fr} "
        f"({model}): a 100-piece SentencePiece model of the training text is used (trained now unless cached); "
        "to use the prepared one, set --data.vocab_size 120 or leave it unset"]
    Path(model).unlink()
    assert said() == [
        f"vocabulary: the SentencePiece model rescale prepare-translation recorded for {en_fr} is gone ({model}): "
        "a 120-piece model of the training text is used (trained now unless cached); run rescale "
        f"prepare-translation {en_fr} again to record it"]
