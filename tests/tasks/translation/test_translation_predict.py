"""`rescale predict` on the translation task writes the test split's translations, one detokenized
line per source line in corpus order, where `test` writes its hypotheses (beside the checkpoint's run,
or `--output_dir`), the same lines `test` writes, and its closing line names the file."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rescale_tasks.cli import main
from rescale_tasks.translation.module import BLEU_FILE, HYPOTHESES_FILE

REPO = Path(__file__).resolve().parents[3]


def tiny(root: Path) -> list[str]:
    """A 1-layer Transformer of width 32 on ``root``, greedy decoding on the CPU."""
    return ["--config", str(REPO / "experiments/wmt/rescale6.yaml"), "--model.init_args.network", "transformer_tiny",
            "--model.init_args.network_options", "{share_embeddings: true, dropout: 0.0, d_model: 32, nhead: 2, "
            "dim_feedforward: 64, num_encoder_layers: 1, num_decoder_layers: 1}",
            "--model.init_args.val_bleu_sentences", "4", "--model.init_args.beam", "1",
            "--data.init_args.root", str(root), "--data.init_args.vocab_size", "100",
            "--data.init_args.max_tokens", "400", "--data.init_args.num_workers", "0",
            "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.precision", "32-true",
            "--trainer.enable_progress_bar", "false"]


def with_test_sources(root: Path, tmp_path: Path, lines: list[str]) -> Path:
    """A copy of the corpus ``root`` (its SentencePiece model is trained again, the same) whose
    test source lines are ``lines``."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("train.en", "train.de", "valid.en", "valid.de", "test.de"):
        (corpus / name).write_bytes((root / name).read_bytes())
    (corpus / "test.en").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return corpus


@pytest.fixture(scope="module")
def trained(tmp_path_factory, handful_root, fit_checkpoint) -> Path:
    """The checkpoint of a tiny Transformer 40 steps into learning the 32 short real pairs (before
    that it translates every line as nothing, and any order of the lines would pass)."""
    folder = tmp_path_factory.mktemp("translation_predict")
    return fit_checkpoint(folder, [*tiny(handful_root), "--trainer.max_steps", "40", "--trainer.limit_val_batches", "0",
                                   "--model.init_args.optimizer.init_args.lr", "0.01",
                                   "--model.init_args.lr_scheduler.init_args.warmup_updates", "5"])


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_predict_writes_the_translations_where_test_writes_its_hypotheses(trained, handful_root, capsys):
    assert main(["predict", *tiny(handful_root), "--ckpt_path", str(trained)]) == 0
    closing = capsys.readouterr().out.strip().splitlines()[-1]
    written = trained.parent.parent / "results" / "last" / "predictions.test.txt"
    assert closing.startswith("predict finished: run folder ")
    assert closing.endswith(f"; 32 translations in {written}"), closing  # no trained run beside it to compare
    predicted = written.read_text(encoding="utf-8").splitlines()
    assert len(predicted) == len((handful_root / "test.en").read_text(encoding="utf-8").splitlines()) == 32

    # the lines test writes, decoded the same way; --output_dir puts each where it says
    assert main(["test", *tiny(handful_root), "--ckpt_path", str(trained), "--output_dir", "tested"]) == 0
    assert main(["predict", *tiny(handful_root), "--ckpt_path", str(trained), "--output_dir", "predicted"]) == 0
    assert capsys.readouterr().out.strip().endswith("; 32 translations in predicted/predictions.test.txt")
    # a model one step old translates every line as nothing: test still writes its (empty) lines and BLEU 0
    tested = Path("tested", HYPOTHESES_FILE).read_text(encoding="utf-8").splitlines()
    assert Path("predicted/predictions.test.txt").read_text(encoding="utf-8").splitlines() == tested == predicted
    assert len(set(predicted)) > 5  # 40 steps in, the lines differ: their order means something


def test_an_empty_source_line_is_an_empty_translation_as_translate_gives(trained, handful_root, tmp_path, capsys):
    """A test line with no source text (or only a zero-width space, no piece either): `rescale test`
    and `predict` write an empty line for it, as `rescale translate` does (they had decoded the lone
    eos into words, and translate had for the zero-width space, so a score or a file of them
    differed from translate's on the same lines)."""
    lines = (handful_root / "test.en").read_text(encoding="utf-8").splitlines()
    lines[2], lines[5], lines[7] = "", "   ", "\u200b"  # a zero-width space: no piece either
    corpus = with_test_sources(handful_root, tmp_path, lines)
    assert main(["test", *tiny(corpus), "--ckpt_path", str(trained), "--output_dir", "tested"]) == 0
    assert main(["predict", *tiny(corpus), "--ckpt_path", str(trained), "--output_dir", "predicted"]) == 0
    assert main(["translate", "--ckpt_path", str(trained), "--input", str(corpus / "test.en"),
                 "--output", "translated.txt", "--device", "cpu"]) == 0
    tested = Path("tested", HYPOTHESES_FILE).read_text(encoding="utf-8").splitlines()
    assert tested[2] == tested[5] == tested[7] == "" and len(set(tested)) > 5
    assert Path("predicted/predictions.test.txt").read_text(encoding="utf-8").splitlines() == tested
    assert Path("translated.txt").read_text(encoding="utf-8").splitlines() == tested


def test_a_checkpoint_of_another_sentencepiece_model_of_the_same_size_is_one_line(trained, en_de_pairs, short_pairs,
                                                                                  writers, tmp_path, error_line):
    """Data whose SentencePiece model is another than the checkpoint's, of the same size (other
    training text, as after an edit of the train split): `rescale test` and a resumed `fit` are refused
    in one line before a batch runs; they had read the model's token ids as other pieces and scored
    garbage without a word."""
    pairs = short_pairs(en_de_pairs, 64)
    other = writers.files(tmp_path / "other", {"train": pairs[32:], "valid": pairs[:32], "test": pairs[:32]})
    for command in (["test", "--output_dir", "tested"], ["fit"]):
        assert main([*command, *tiny(other), "--ckpt_path", str(trained)]) == 2
        line = error_line()
        assert line.startswith(f"checkpoint {trained} (--ckpt_path) was trained with another SentencePiece model "
                               "than the data's (")
        assert "give the data.root (or data.spm_model) the run was trained on" in line
    assert not Path("tested", HYPOTHESES_FILE).exists()



def test_data_read_in_the_other_direction_than_the_checkpoint_is_one_line(trained, handful_root, error_line):
    """An English-to-German checkpoint on the same corpus read German to English (the pair given, or the
    one prepare-translation recorded last for the folder): the joint SentencePiece model is the same
    both ways, so `rescale test` had fed German to the network and scored its output against English
    references, and a resumed `fit` had gone on training the other way, without a word."""
    other_way = ["--data.init_args.src_lang", "de", "--data.init_args.tgt_lang", "en"]
    for command in (["test", "--output_dir", "tested"], ["fit"]):
        assert main([*command, *tiny(handful_root), *other_way, "--ckpt_path", str(trained)]) == 2
        assert error_line() == (f"checkpoint {trained} (--ckpt_path) translates en into de but the data is read as de "
                                "into en (data.src_lang/data.tgt_lang, or the pair prepare-translation recorded last for "
                                "data.root): every translation and score would be of the wrong text; pass "
                                "--data.src_lang en --data.tgt_lang de")
    assert not Path("tested", HYPOTHESES_FILE).exists()
    assert main(["test", *tiny(handful_root), "--ckpt_path", str(trained), "--output_dir", "tested"]) == 0


def test_a_checkpoint_of_weights_that_are_not_finite_is_one_line(trained, handful_root, tmp_path, error_line):
    """A checkpoint saved after its run diverged (NaN weights): `rescale predict` had written an empty
    line for every test line, and `test` the same with BLEU 0, each finishing as if it had worked."""
    import torch

    from rescale_tasks.common.checkpoints import safe_load

    checkpoint = safe_load(trained)
    for key, value in checkpoint["state_dict"].items():  # every float, the tied embedding and output projection too
        if value.is_floating_point():
            value.fill_(float("nan"))
    names = [k for k, v in checkpoint["state_dict"].items() if v.is_floating_point()]
    diverged = tmp_path / "diverged.ckpt"
    torch.save(checkpoint, diverged)
    for command in ("predict", "test", "validate"):
        assert main([command, *tiny(handful_root), "--ckpt_path", str(diverged), "--output_dir", "out"]) == 2
        assert error_line() == (f"checkpoint {diverged} (--ckpt_path): {names[0]}, {names[1]} and {len(names) - 2} "
                                "more hold NaN or infinite values (weights saved after the run diverged), from which "
                                "every translation would be an empty line and training would go on from NaN; give a "
                                "checkpoint saved before the divergence")
    assert not Path("out").exists() or not any(Path("out").rglob("*.txt"))


def test_translations_that_are_all_empty_score_bleu_0_and_are_written(trained, handful_root, tmp_path, capsys):
    """A test split every translation of which is empty (here: every source line empty; a model
    early in training that ends every sentence at once): `rescale test` logs BLEU 0 and writes its
    hypotheses and score; it had logged no test/bleu and written neither file, without a word."""
    corpus = with_test_sources(handful_root, tmp_path, [""] * 32)
    assert main(["test", *tiny(corpus), "--ckpt_path", str(trained), "--output_dir", "tested"]) == 0
    assert Path("tested", HYPOTHESES_FILE).read_text(encoding="utf-8") == "\n" * 32
    score = json.loads(Path("tested", BLEU_FILE).read_text(encoding="utf-8"))
    assert score["bleu"] == 0.0 and score["sentences"] == 32
    assert "test BLEU 0.00" in capsys.readouterr().out


def test_a_partial_test_pass_says_which_lines_its_bleu_covers(trained, handful_root, capsys):
    """`rescale test --trainer.limit_test_batches 1` translates and scores the lines of one batch: its
    bleu.test.json counts those sentences (it had said all 32, for statistics of a few) and one warning
    line says the other lines are empty in the hypotheses file, which scored as a whole gives another BLEU."""
    args = [*tiny(handful_root), "--data.init_args.max_tokens", "40", "--trainer.limit_test_batches", "1"]
    assert main(["test", *args, "--ckpt_path", str(trained), "--output_dir", "tested"]) == 0
    written = Path("tested", HYPOTHESES_FILE).read_text(encoding="utf-8").split("\n")[:-1]
    score = json.loads(Path("tested", BLEU_FILE).read_text(encoding="utf-8"))
    assert score["lines"] == len(written) == 32
    translated = 32 - written.count("")
    assert 0 < translated <= score["sentences"] < 32
    captured = capsys.readouterr()
    assert (f"covers {score['sentences']} of the 32 test lines: the other {32 - score['sentences']} were not "
            "translated (trainer.limit_test_batches)") in captured.out + captured.err
    # predict: the same lines left empty in its file, said in one line (it had said nothing)
    args = [*tiny(handful_root), "--data.init_args.max_tokens", "40", "--trainer.limit_predict_batches", "1"]
    assert main(["predict", *args, "--ckpt_path", str(trained), "--output_dir", "predicted"]) == 0
    predicted = Path("predicted/predictions.test.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert predicted == written
    captured = capsys.readouterr()
    assert (f"warning: predict translated {score['sentences']} of the 32 test lines: the other "
            f"{32 - score['sentences']} were not translated (trainer.limit_predict_batches) and are empty lines in "
            "predictions.test.txt") in captured.out + captured.err


def test_a_partial_validation_says_which_lines_its_bleu_covers(handful_root, capsys):
    """`--trainer.limit_val_batches 1` made val/bleu score the lines of the one (length-sorted) batch
    that ran, without a word; one warning line says so, once; a whole validation says nothing."""
    partial = "lines (model.init_args.val_bleu_sentences): the batches of the others did not run"
    for limit, warned in (("1", True), ("1.0", False)):
        assert main(["fit", *tiny(handful_root), "--model.init_args.val_bleu_sentences", "1000",
                     "--data.init_args.max_tokens", "40", "--trainer.max_steps", "2", "--trainer.val_check_interval", "1",
                     "--trainer.limit_val_batches", limit, "--trainer.num_sanity_val_steps", "0",
                     "--trainer.logger", "false", "--trainer.default_root_dir", f"run{limit}"]) == 0
        captured = capsys.readouterr()
        said = [line for line in (captured.out + captured.err).splitlines() if partial in line]
        assert len(said) == int(warned), said
        if warned:
            assert said[0].split("warning: val/bleu covers ")[1].split(" of the first ")[1].startswith("32 validation")
