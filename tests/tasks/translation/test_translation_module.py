"""The translation task end to end through the `rescale` command: a small Transformer without
LayerNorm (`rescale`) overfits 200 real pairs, `rescale test` writes its hypotheses
beside a score any scorer reproduces from them, `rescale translate` gives the same lines."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch

from rescale_tasks.cli import main
from rescale_tasks.common.checkpoints import safe_load
from rescale_tasks.common.errors import ConfigError
from rescale_tasks.common.run import find_summaries, read_summary
from rescale_tasks.translation.module import BLEU_FILE, HYPOTHESES_FILE, TranslationModule
from rescale_tasks.translation.translate import load_translator

REPO = Path(__file__).resolve().parents[3]
TINY = ["--model.init_args.network", "transformer_tiny",
        "--model.init_args.network_options", "{share_embeddings: true, dropout: 0.0, d_model: 64, nhead: 4, "
        "dim_feedforward: 128}",
        "--model.init_args.label_smoothing", "0.0", "--model.init_args.val_bleu_sentences", "200",
        "--data.init_args.vocab_size", "400", "--data.init_args.max_tokens", "4096",
        "--data.init_args.clean", "{len_ratio: null}",
        "--data.init_args.num_workers", "0", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
        "--trainer.precision", "32-true", "--trainer.enable_progress_bar", "false"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, few_hundred_root) -> dict:
    folder = tmp_path_factory.mktemp("wmt_run")
    old = os.getcwd()
    os.chdir(folder)
    os.environ.setdefault("WANDB_MODE", "offline")
    try:
        code = main(["fit", "--config", str(REPO / "experiments/wmt/rescale6.yaml"), *TINY,
                     "--data.init_args.root", str(few_hundred_root), "--trainer.max_steps", "150",
                     "--trainer.val_check_interval", "150", "--trainer.log_every_n_steps", "10",
                     "--model.init_args.optimizer.init_args.lr", "0.005",
                     "--model.init_args.lr_scheduler.init_args.warmup_updates", "15"])
    finally:
        os.chdir(old)
    assert code == 0
    (summary,) = find_summaries(str(folder / "runs"))
    return {"folder": folder, "summary": read_summary(summary), "root": few_hundred_root}


def test_a_small_normalization_free_transformer_overfits_200_pairs(trained, summary_matches_wandb):
    s = trained["summary"]
    summary_matches_wandb(str(trained["folder"] / "runs"))  # val/bleu and val/loss as W&B received them
    assert s["scheme"] == "rescale" and s["status"] == "finished" and s["steps"] == 150
    losses = [v for _, v in s["curves"]["train/loss"]]
    assert losses[-1] < 0.05 * losses[0]
    assert s["final"]["val/bleu"] > 70  # the 200 training pairs, decoded with beam 4


def test_test_writes_hypotheses_that_rescore_to_the_same_bleu(trained, monkeypatch, capsys):
    monkeypatch.chdir(trained["folder"])
    ckpt = trained["summary"]["checkpoint"]
    assert "sentencepiece" in safe_load(ckpt)  # the subword model travels in the checkpoint
    assert main(["test", "--config", str(REPO / "experiments/wmt/rescale6.yaml"), *TINY,
                 "--data.init_args.root", str(trained["root"]), "--ckpt_path", ckpt]) == 0
    printed = capsys.readouterr().out
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a" in printed
    # beside the run that wrote the checkpoint (runs/<project>/<run id>/results/last/), said where
    folder = Path(ckpt).parent.parent / "results" / "last"
    assert f"written to {folder}: {HYPOTHESES_FILE}, {BLEU_FILE}" in printed
    (score_file,) = trained["folder"].rglob(BLEU_FILE)
    assert score_file == folder / BLEU_FILE
    score = json.loads(score_file.read_text())
    hypotheses = (score_file.parent / HYPOTHESES_FILE).read_text(encoding="utf-8").splitlines()
    references = (trained["root"] / "test.de").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == len(references) == score["sentences"] == 200
    assert score["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert score["bleu"] > 70 and score["signature"].startswith("nrefs:1")
    trained["hypotheses"] = hypotheses


def test_translate_writes_one_line_per_input_line_in_order(trained, tmp_path):
    if "hypotheses" not in trained:
        pytest.fail("needs test_test_writes_hypotheses_that_rescore_to_the_same_bleu first")
    sources = (trained["root"] / "test.en").read_text(encoding="utf-8").splitlines()
    source = tmp_path / "in.en"
    source.write_text("\n".join(sources[:5] + [""] + sources[5:]) + "\n", encoding="utf-8")
    out = tmp_path / "out.de"
    assert main(["translate", "--ckpt_path", trained["summary"]["checkpoint"], "--input", str(source),
                 "--output", str(out), "--max_tokens", "64"]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[5] == "" and lines[:5] + lines[6:] == trained["hypotheses"]  # beam 4 as in test


def test_translate_says_which_lines_are_too_long_for_the_model(trained, tmp_path, capsys):
    """A line longer than the model's source positions (256 in transformer_tiny) is translated
    from the pieces that fit, still one output line per input line, and one warning line names
    it with what was left out; input that fits says nothing."""
    ckpt = trained["summary"]["checkpoint"]
    sources = (trained["root"] / "test.en").read_text(encoding="utf-8").splitlines()
    long = " ".join(sources[:150])
    pieces = len(load_translator(ckpt).processor.encode(long))
    assert pieces > 255
    source, out = tmp_path / "in.en", tmp_path / "out.de"
    short = ["--beam", "1", "--max_len_a", "0", "--max_len_b", "8"]  # decoding length is not what is tested
    source.write_text("\n".join([sources[0], long, "", sources[1]]) + "\n", encoding="utf-8")
    assert main(["translate", "--ckpt_path", ckpt, "--input", str(source), "--output", str(out), *short]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4 and lines[1] and not lines[2]
    assert capsys.readouterr().err.splitlines() == [
        f"warning: 1 of 4 lines of {source} (--input) is longer than the model's 256 source positions and is "
        f"translated from its first 255 pieces only: line 2 ({pieces - 255} piece{'s' if pieces != 256 else ''} "
        "cut); split it into sentences to translate it whole"]
    source.write_text("\n".join([sources[0], sources[1]]) + "\n", encoding="utf-8")
    assert main(["translate", "--ckpt_path", ckpt, "--input", str(source), "--output", str(out), *short]) == 0
    assert capsys.readouterr().err == ""


def test_translate_names_the_line_that_is_not_utf8(trained, tmp_path, monkeypatch, capsys):
    """Text that is not UTF-8 (here Latin-1) is one line naming the line, as prepare-translation says
    it, whether it comes on stdin or through --input: not pybind11's 'Unable to cast Python instance
    of type str' or a UnicodeDecodeError traceback."""
    import io

    sources = (trained["root"] / "test.en").read_text(encoding="utf-8").splitlines()[:3]
    latin1 = ("\n".join(sources[:2] + ["Caf\u00e9 and na\u00efve r\u00e9sum\u00e9", sources[2]]) + "\n").encode("latin-1")
    (tmp_path / "latin1.en").write_bytes(latin1)
    ckpt = trained["summary"]["checkpoint"]
    assert main(["translate", "--ckpt_path", ckpt, "--input", str(tmp_path / "latin1.en"),
                 "--output", str(tmp_path / "out.de")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {tmp_path / 'latin1.en'} (--input) line 3 is not UTF-8")
    assert "iconv -f LATIN1 -t UTF-8" in err[0] and not (tmp_path / "out.de").exists()
    # stdin as a POSIX locale gives it: undecodable bytes passed on as surrogates
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(latin1), encoding="utf-8", errors="surrogateescape"))
    assert main(["translate", "--ckpt_path", ckpt]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == err.strip().splitlines()[0]
    assert err.startswith("error: standard input line 3 is not UTF-8") and "Traceback" not in err


def test_translate_says_a_compressed_input_is_to_be_decompressed(trained, tmp_path, capsys):
    """news.en.gz as WMT distributes it: not UTF-8, and the advice was to convert it from Latin-1, which
    gives a valid UTF-8 file of noise that would then be translated without a word. It says to decompress."""
    import gzip

    sources = (trained["root"] / "test.en").read_text(encoding="utf-8").splitlines()[:3]
    (tmp_path / "news.en.gz").write_bytes(gzip.compress(("\n".join(sources) + "\n").encode()))
    out = tmp_path / "out.de"
    assert main(["translate", "--ckpt_path", trained["summary"]["checkpoint"], "--input", str(tmp_path / "news.en.gz"),
                 "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {tmp_path / 'news.en.gz'} (--input) line 1 is not UTF-8")
    assert err[0].endswith("it is gzip-compressed, not text: decompress it first (e.g. gunzip -k FILE).") and \
        "LATIN1" not in err[0] and not out.exists()


def test_translate_refuses_text_whose_lines_break_with_cr_only(trained, tmp_path, capsys):
    """Lines broken by \\r alone (classic Mac OS) are one line when split on \\n: translated so, three
    sentences came out as one line, and nothing said so. One error line with the mend instead; the
    same text with \\r\\n or \\n breaks gives one line per sentence."""
    sources = (trained["root"] / "test.en").read_text(encoding="utf-8").splitlines()[:3]
    ckpt, out = trained["summary"]["checkpoint"], tmp_path / "out.de"
    (tmp_path / "mac.en").write_bytes("\r".join(sources).encode() + b"\r")
    assert main(["translate", "--ckpt_path", ckpt, "--input", str(tmp_path / "mac.en"), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path / 'mac.en'} (--input) breaks lines with \\r only (classic Mac OS line endings): "
                   "convert the \\r to \\n (e.g. tr '\\r' '\\n'); as it is, all of it is one line and would be "
                   "translated as one sentence"]
    assert not out.exists()
    (tmp_path / "crlf.en").write_bytes("\r\n".join(sources).encode() + b"\r\n")
    assert main(["translate", "--ckpt_path", ckpt, "--input", str(tmp_path / "crlf.en"), "--output", str(out)]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 3


def test_translate_refuses_other_checkpoints_in_one_line(tmp_path, capsys):
    other = tmp_path / "classifier.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"network": "resnet50"}}, other)
    assert main(["translate", "--ckpt_path", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a translation checkpoint of this suite" in err[0]


@pytest.mark.parametrize("case", ["stdin closed", "stdout closed", "output under a file", "output a folder",
                                  "output the input", "output the input through a link", "no tokens per batch"])
def test_translate_refuses_what_would_fail_after_translating_before_any_work(case, tmp_path, monkeypatch,
                                                                             error_line):
    """A closed standard stream, an --output that cannot be written or that is --input itself (the
    translations would replace the source), --max_tokens 0: one line before the checkpoint (here
    missing) is even read, the source left as it was."""
    source = tmp_path / "in.en"
    source.write_text("Open file\n", encoding="utf-8")
    (tmp_path / "link.en").symlink_to(source)
    args, expected = {
        "stdin closed": ([], "standard input is closed: give the source sentences with --input FILE or on a pipe"),
        "stdout closed": (["--input", str(source)], "standard output is closed: give --output FILE or redirect it"),
        "output under a file": (["--input", str(source), "--output", str(source / "out.de")],
                                f"cannot write the folder of --output {source}: {source} is a file, not a folder"),
        "output a folder": (["--input", str(source), "--output", str(tmp_path)],
                            f"--output {tmp_path} is a folder: give the file the translations go to"),
        "output the input": (["--input", str(source), "--output", str(source)],
                             f"--output {source} is the --input file: the translations would replace the source"),
        "output the input through a link": (["--input", str(tmp_path / "link.en"), "--output", str(source)],
                                            f"--output {source} is the --input file"),
        "no tokens per batch": (["--max_tokens", "0"], "argument --max_tokens: expected a whole number >= 1, got '0'"),
    }[case]
    monkeypatch.setattr("sys.stdin", None if case == "stdin closed" else sys.stdin)
    monkeypatch.setattr("sys.stdout", None if case == "stdout closed" else sys.stdout)
    assert main(["translate", "--ckpt_path", str(tmp_path / "missing.ckpt"), *args]) == 2
    assert expected in error_line()
    assert source.read_text(encoding="utf-8") == "Open file\n"


def test_translate_refuses_a_device_this_machine_lacks(tmp_path, monkeypatch, error_line):
    ckpt = ["translate", "--ckpt_path", str(tmp_path / "missing.ckpt")]
    assert main([*ckpt, "--device", "foo"]) == 2
    assert error_line() == "bad --device 'foo': expected auto, cpu, cuda, cuda:N or mps"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main([*ckpt, "--device", "cuda"]) == 2
    assert error_line() == "--device cuda: no CUDA GPU on this machine; use --device cpu (or auto)"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main([*ckpt, "--device", "cuda:1"]) == 2
    assert error_line().startswith("--device cuda:1: this machine has 1 CUDA GPU(s), cuda:0 to cuda:0")


def test_decoding_settings_that_cannot_decode_are_a_config_error():
    with pytest.raises(ConfigError, match="model decoding settings: max_len_a 0.0 and max_len_b 0 allow no token"):
        TranslationModule(max_len_a=0.0, max_len_b=0)


def test_a_checkpoint_of_another_vocabulary_is_one_line(trained, monkeypatch, capsys):
    monkeypatch.chdir(trained["folder"])
    code = main(["test", "--config", str(REPO / "experiments/wmt/rescale6.yaml"), *TINY,
                 "--data.init_args.root", str(trained["root"]), "--data.init_args.vocab_size", "380",
                 "--ckpt_path", trained["summary"]["checkpoint"]])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(err) == 1 and "vocab_size=400" in err[0] and "vocab_size=380" in err[0]


def test_a_diverged_run_stops_cleanly_without_validating_its_model(handful_root, tmp_path, monkeypatch):
    """With --divergence.raise_error false (as the studies train), a run that diverges ends with
    exit status 0 and status diverged: the validation Lightning runs when a run stops early is not
    run on the non-finite model (its beam search finishes no sentence)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert main(["fit", "--config", str(REPO / "experiments/wmt/tfixup6.yaml"), *TINY,
                 "--data.init_args.root", str(handful_root), "--data.init_args.max_tokens", "48",
                 "--trainer.max_steps", "6", "--trainer.val_check_interval", "4",
                 "--model.init_args.optimizer.init_args.lr", "1e6", "--divergence.raise_error", "false"]) == 0
    (path,) = find_summaries(str(tmp_path / "runs"))
    summary = read_summary(path)
    assert summary["status"] == "diverged" and summary["diverged_step"] < 4
    assert not [key for key in summary["final"] if key.startswith("val/")], summary["final"]


def test_mixed_precision_fit(fit_at_precision, precision_run, handful_root, tmp_path, monkeypatch):
    """A Transformer without LayerNorm trained and BLEU-validated under autocast (bf16; on a GPU also
    fp16 with gradient scaling), eager and compiled: finite losses, scores and weights. RescaleNet
    in every case, the LayerNorm-free schemes (each at its config's recipe) eager."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    for scheme in ["rescale", *([] if precision_run.compiled else ["tfixup", "deepnorm", "dyt", "derf"])]:
        fit_at_precision(["--config", str(REPO / f"experiments/wmt/{scheme}6.yaml"), *TINY,
                          "--data.init_args.root", str(handful_root), "--data.init_args.max_tokens", "48",
                          "--model.init_args.val_bleu_sentences", "4", "--trainer.max_steps", "3",
                          "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "1"], steps=3,
                         name=scheme)


def test_the_long_line_warning_counts_one_piece_and_one_line_in_the_singular():
    """It said "1 pieces cut" and "1 of 4 lines ... are longer"."""
    from rescale_tasks.translation.translate import cut_warning

    assert cut_warning({1: 1}, 4, 256, "in.en") == (
        "warning: 1 of 4 lines of in.en is longer than the model's 256 source positions and is translated from its "
        "first 255 pieces only: line 2 (1 piece cut); split it into sentences to translate it whole")
    assert "2 of 4 lines of in.en are longer" in cut_warning({0: 1, 2: 3}, 4, 256, "in.en")
    assert "line 1 (1 piece cut), line 3 (3 pieces cut); split them" in cut_warning({0: 1, 2: 3}, 4, 256, "in.en")
