"""`rescale translate` on an untrained checkpoint (no training: a second to build): weights that are
NaN or infinite (saved after a run diverged) would finish no hypothesis and give an empty line for
every input line with exit status 0, so one line refuses them; read from a terminal, it says how to
end the input instead of waiting without a word."""
from __future__ import annotations

import io

import pytest
import sentencepiece as spm
import torch

from rescale_tasks.cli import main
from rescale_tasks.translation.module import TranslationModule

TINY = {"share_embeddings": True, "dropout": 0.0, "d_model": 32, "nhead": 2, "dim_feedforward": 32,
        "num_encoder_layers": 1, "num_decoder_layers": 1}


@pytest.fixture(scope="module")
def untrained_checkpoint(tmp_path_factory, en_de_pairs) -> dict:
    """An untrained translation checkpoint (a 100-piece SentencePiece model inside), as rescale fit saves them."""
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter([s for p in en_de_pairs[:300] for s in p]),
                                   model_writer=proto, vocab_size=100, bos_id=0, pad_id=1, eos_id=2, unk_id=3,
                                   minloglevel=2)
    torch.manual_seed(0)
    module = TranslationModule("transformer_tiny", "rescale", network_options=TINY, vocab_size=100)
    return {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
            "sentencepiece": proto.getvalue()}


def test_translate_refuses_weights_that_are_not_finite(untrained_checkpoint, tmp_path, error_line):
    source = tmp_path / "in.en"
    source.write_text("Open file\nSave as\n", encoding="utf-8")
    good = tmp_path / "good.ckpt"
    torch.save(untrained_checkpoint, good)
    assert main(["translate", "--ckpt_path", str(good), "--input", str(source), "--output", str(tmp_path / "good.de"),
                 "--device", "cpu", "--max_len_b", "3"]) == 0
    assert len((tmp_path / "good.de").read_text(encoding="utf-8").splitlines()) == 2
    diverged = {**untrained_checkpoint, "state_dict": dict(untrained_checkpoint["state_dict"])}
    names = [k for k, v in diverged["state_dict"].items() if v.is_floating_point()]
    for name in names[:3]:
        diverged["state_dict"][name] = torch.full_like(diverged["state_dict"][name], float("nan"))
    broken = tmp_path / "diverged.ckpt"
    torch.save(diverged, broken)
    out = tmp_path / "out.de"
    assert main(["translate", "--ckpt_path", str(broken), "--input", str(source), "--output", str(out),
                 "--device", "cpu"]) == 2
    assert error_line() == (f"checkpoint {broken} (--ckpt_path): {names[0]}, {names[1]} and 1 more "
                            "hold NaN or infinite values (weights saved after the run diverged), from which every "
                            "translation would be an empty line and training would go on from NaN; give a checkpoint "
                            "saved before the divergence")
    assert not out.exists()


def test_translate_from_a_terminal_says_how_to_end_the_input(untrained_checkpoint, tmp_path, monkeypatch, capsys):
    """Typed at a terminal without ``< file``, the command reads standard input to its end before
    translating: it says so on stderr (stdout may be the output file) instead of waiting without a word."""
    import os
    import sys

    checkpoint = tmp_path / "model.ckpt"
    torch.save(untrained_checkpoint, checkpoint)
    typing, terminal = os.openpty()
    os.write(typing, b"Open file\nSave as\n\x04")  # Ctrl-D on a line of its own: the end of the input
    with open(terminal, "rb", buffering=0) as raw:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(raw)))
        out = tmp_path / "out.de"
        assert main(["translate", "--ckpt_path", str(checkpoint), "--output", str(out), "--device", "cpu",
                     "--max_len_b", "3"]) == 0
    os.close(typing)
    err = capsys.readouterr().err
    assert "standard input is this terminal: type the source sentences, one per line, and end them with Ctrl-D" in err
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2
