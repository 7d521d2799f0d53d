"""Another language pair is first-class: `rescale prepare-translation` on an English-French
folder of real text (the suite's French gettext catalogue pairs) records its languages and
vocabulary where `rescale fit` reads them, so the WMT recipe trains on it with no
--data.src_lang/--data.tgt_lang/--data.vocab_size to repeat, and the run's W&B name and group
(a CSV or TensorBoard logger's run folder) name the pair."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from unittest import mock

import pytest
from lightning.pytorch.loggers import TensorBoardLogger

from rescale_tasks.cli import main
from rescale_tasks.common.reporting import label_runs
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


def vocabulary_lines(caplog, root: Path, **options) -> list[str]:
    """The ``vocabulary:`` lines a data module of ``root`` says when built with ``options``."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        TranslationDataModule(str(root), num_workers=0, **options)
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("vocabulary:")]


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


def test_csv_and_tensorboard_run_folders_name_the_pair(en_fr, tmp_path, monkeypatch):
    """A CSV or TensorBoard logger's name (its run folder) takes the data's labels as a W&B run's
    does: the recipe's ``rescale6-{pair}`` under a CSVLogger is the folder ``rescale6-en-fr``."""
    monkeypatch.chdir(tmp_path)
    assert main(["prepare-translation", str(en_fr), "--tgt_lang", "fr", "--vocab_size", "120"]) == 0
    assert main(["fit", "--config", str(REPO / "experiments/wmt/rescale6.yaml"), *TINY_MODEL,
                 "--data.init_args.root", str(en_fr), "--trainer.logger", "CSVLogger",
                 "--trainer.logger.init_args.save_dir", "runs", "--trainer.max_steps", "1",
                 "--trainer.limit_val_batches", "0"]) == 0
    assert [p.name for p in Path("runs").iterdir()] == ["rescale6-en-fr"]
    assert (Path("runs") / "rescale6-en-fr" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    with mock.patch("lightning.fabric.loggers.tensorboard._TENSORBOARD_AVAILABLE", True):  # its writer is not made
        tensorboard = TensorBoardLogger("tb", name="{src_lang}-{tgt_lang}")
    label_runs([tensorboard], TranslationDataModule(str(en_fr)))
    assert tensorboard.log_dir == str(Path("tb") / "en-fr" / "version_0")


def test_a_vocabulary_other_than_the_prepared_one_is_said_in_one_line(en_fr, tmp_path, monkeypatch, caplog):
    """A vocabulary size the config sets that differs from the recorded one (or a recorded model
    that is gone) trains a SentencePiece model of its own: said once, with the way back."""
    monkeypatch.chdir(tmp_path)
    assert main(["prepare-translation", str(en_fr), "--tgt_lang", "fr", "--vocab_size", "120"]) == 0
    model = json.loads((en_fr / "rescale_cache" / RECORD).read_text())[str(en_fr.resolve())][0]["spm_model"]

    def said(**options) -> list[str]:
        return vocabulary_lines(caplog, en_fr, **options)

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


def test_a_prepared_vocabulary_of_other_text_is_not_used(en_fr, en_fr_pairs, tmp_path, monkeypatch, caplog):
    """Training text edited after prepare-translation: the data module uses the model
    prepare-translation makes of the current text (trained with the recorded options), said in
    one line, not the recorded model of the old text; a model given to prepare-translation
    (--spm_model) is used whatever the text."""
    monkeypatch.chdir(tmp_path)
    prepare = ["prepare-translation", str(en_fr), "--tgt_lang", "fr", "--vocab_size", "120",
               "--character_coverage", "0.9995"]
    assert main(prepare) == 0
    old = json.loads((en_fr / "rescale_cache" / RECORD).read_text())[str(en_fr.resolve())][0]["spm_model"]
    assert vocabulary_lines(caplog, en_fr) == []
    lines = (en_fr / "train.en").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[5] = en_fr_pairs[-1][0] + "\n"
    (en_fr / "train.en").write_text("".join(lines), encoding="utf-8")

    assert vocabulary_lines(caplog, en_fr) == [
        f"vocabulary: the SentencePiece model rescale prepare-translation recorded for {en_fr} ({old}) was trained "
        "on other text than the current train.en and train.fr: the 120-piece model prepare-translation makes of the "
        f"current text is used (trained now unless cached); run rescale prepare-translation {en_fr} again to "
        "record it"]
    data = TranslationDataModule(str(en_fr), num_workers=0)
    assert data.settings.spm_model is None and data.vocab_size == 120
    data.setup("fit")
    assert data.prepared.spm_model.resolve() != Path(old)
    assert main(prepare) == 0  # the model fit trained is the one prepare-translation makes of the text
    [entry] = json.loads((en_fr / "rescale_cache" / RECORD).read_text())[str(en_fr.resolve())]
    assert entry["spm_model"] == str(data.prepared.spm_model.resolve())
    assert vocabulary_lines(caplog, en_fr) == []
    record = en_fr / "rescale_cache" / RECORD
    unsaid = {k: v for k, v in entry.items() if k not in ("options", "text")}
    record.write_text(json.dumps({str(en_fr.resolve()): [unsaid]}))
    [line] = vocabulary_lines(caplog, en_fr)  # a record that does not say how its model was trained
    assert f"({entry['spm_model']}) was trained by another version of this suite or of SentencePiece: " in line

    assert main(["prepare-translation", str(en_fr), "--tgt_lang", "fr", "--spm_model", old]) == 0
    lines[6] = en_fr_pairs[-2][0] + "\n"
    (en_fr / "train.en").write_text("".join(lines), encoding="utf-8")
    assert vocabulary_lines(caplog, en_fr) == []  # given on purpose: used as it is
    assert TranslationDataModule(str(en_fr), num_workers=0).settings.spm_model == old
