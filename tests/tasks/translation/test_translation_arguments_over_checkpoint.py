"""`rescale validate|test|predict --ckpt_path X --model.init_args.<arg> V` on the translation
task runs with the decoding settings typed, not with the checkpoint's saved
hyper-parameters, which Lightning's CLI would put in their place; the network is refused."""
from __future__ import annotations

from pathlib import Path

import pytest

from rescale_tasks.cli import main
from wandb_runs import find_offline_runs, read_offline_run

REPO = Path(__file__).resolve().parents[3]


def tiny(root: Path) -> list[str]:
    return ["--config", str(REPO / "experiments/wmt/rescale6.yaml"), "--model.init_args.network", "transformer_tiny",
            "--model.init_args.network_options", "{share_embeddings: true, dropout: 0.0, d_model: 32, nhead: 2, "
            "dim_feedforward: 64, num_encoder_layers: 1, num_decoder_layers: 1}",
            "--model.init_args.val_bleu_sentences", "4", "--data.init_args.root", str(root),
            "--data.init_args.vocab_size", "100", "--data.init_args.max_tokens", "400",
            "--data.init_args.num_workers", "0", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
            "--trainer.precision", "32-true", "--trainer.enable_progress_bar", "false"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, handful_root, fit_checkpoint) -> Path:
    """The checkpoint of a 1-step tiny Transformer run (beam 4, the config's)."""
    folder = tmp_path_factory.mktemp("translation_ckpt")
    return fit_checkpoint(folder, [*tiny(handful_root), "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0"])


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_test_decodes_with_the_beam_and_penalty_typed(trained, handful_root):
    assert main(["test", *tiny(handful_root), "--ckpt_path", str(trained), "--model.init_args.beam", "1",
                 "--model.init_args.len_penalty", "0.6", "--model.init_args.length_penalty_style", "gnmt",
                 "--output_dir", "results"]) == 0
    [run] = [read_offline_run(d) for d in find_offline_runs("runs")]
    built = run.config  # the hyper-parameters the module was built with, as Lightning logged them
    assert (built["beam"], built["len_penalty"], built["length_penalty_style"]) == (1, 0.6, "gnmt")


def test_the_network_cannot_change_with_a_checkpoint(trained, handful_root, error_line):
    assert main(["validate", *tiny(handful_root), "--ckpt_path", str(trained),
                 "--model.init_args.scheme", "pre_ln"]) == 2
    line = error_line()
    assert "differ in scheme" in line and "cannot change with a checkpoint" in line
