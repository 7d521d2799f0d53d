"""``rescale prepare-translation`` reports its progress through ``logging``: SentencePiece's start and
end, each side encoded (count, time, rate); ``RESCALE_LOG_LEVEL`` or a logging configuration of
one's own silences it."""
from __future__ import annotations

import logging
import shutil

import pytest

from rescale_tasks.cli import main

VOCAB = "200"


@pytest.fixture
def corpus(tmp_path, parallel_root):
    """A copy of the test corpus (the command writes beside it); with a new --cache_dir every step runs."""
    root = tmp_path / "corpus"
    shutil.copytree(parallel_root, root)
    return root


def test_prepare_translation_reports_progress_and_a_logging_config_silences_it(corpus, capsys, monkeypatch):
    assert main(["prepare-translation", str(corpus), "--vocab_size", VOCAB, "--cache_dir", str(corpus / "fresh")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("SentencePiece: reading train.en and train.de to train a bpe model of 200 pieces")
               for line in out), out
    assert any(line.startswith("SentencePiece: model trained in ") for line in out), out
    for name in ("train.en", "train.de", "valid.en", "test.de"):  # every side encoded: count, time, rate
        assert any(line.startswith(f"encoding {name}: ") and " sentences in " in line and "sentences/s" in line
                   for line in out), out
    assert any(line.startswith("done in ") for line in out), out

    monkeypatch.setenv("RESCALE_LOG_LEVEL", "WARNING")  # the command's default level from the environment
    assert main(["prepare-translation", str(corpus), "--vocab_size", VOCAB, "--cache_dir", str(corpus / "fresh")]) == 0
    assert capsys.readouterr().out == ""

    monkeypatch.delenv("RESCALE_LOG_LEVEL")
    suite = logging.getLogger("rescale_tasks")
    monkeypatch.setattr(suite, "level", logging.WARNING)  # what logging.config or a notebook sets
    assert main(["prepare-translation", str(corpus), "--vocab_size", VOCAB, "--cache_dir", str(corpus / "fresh")]) == 0
    assert capsys.readouterr().out == ""
    assert suite.level == logging.WARNING  # left as configured
