"""A network with fewer positions than the data's limits (``network_options.max_positions`` below
``data.max_source_positions``/``max_target_positions``, 1024 by default; ``transformer_tiny`` has
256): its positions are the limits, so `rescale fit` leaves out the longer training pairs and
`rescale test` cuts a longer test sentence as `rescale translate` does, instead of ending with the
network's traceback at the first such batch."""
from __future__ import annotations

from pathlib import Path

from rescale_tasks.cli import main
from rescale_tasks.translation.module import HYPOTHESES_FILE

REPO = Path(__file__).resolve().parents[3]


def tiny(root: Path, positions: int) -> list[str]:
    return ["--config", str(REPO / "experiments/wmt/rescale6.yaml"), "--model.init_args.network", "transformer_tiny",
            "--model.init_args.network_options", "{share_embeddings: true, dropout: 0.0, d_model: 32, nhead: 2, "
            f"dim_feedforward: 64, num_encoder_layers: 1, num_decoder_layers: 1, max_positions: {positions}}}",
            "--model.init_args.beam", "1", "--data.init_args.root", str(root), "--data.init_args.vocab_size", "100",
            "--data.init_args.max_tokens", "400", "--data.init_args.num_workers", "0",
            "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.precision", "32-true",
            "--trainer.enable_progress_bar", "false", "--trainer.logger", "CSVLogger",
            "--trainer.logger.init_args.save_dir", "runs"]


def test_the_networks_positions_bound_training_and_test_sentences(en_de_pairs, short_pairs, writers, tmp_path,
                                                                  monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    pairs = short_pairs(en_de_pairs, 32)
    long = (" ".join(e for e, _ in pairs), " ".join(d for _, d in pairs))  # far over 16 pieces a side
    root = writers.files(tmp_path / "corpus", {"train": pairs + [long], "valid": pairs, "test": pairs + [long]})
    assert main(["fit", *tiny(root, 16), "--trainer.max_steps", "40", "--trainer.limit_val_batches", "0",
                 "--model.init_args.optimizer.init_args.lr", "0.01",
                 "--model.init_args.lr_scheduler.init_args.warmup_updates", "5"]) == 0  # it says something
    said = [r.getMessage() for r in caplog.records if "the network's 16 positions" in r.getMessage()]
    assert len(said) == 1 and "over_positions" in said[0], said
    checkpoint = next(Path("runs").rglob("last.ckpt"))

    assert main(["test", *tiny(root, 16), "--ckpt_path", str(checkpoint), "--output_dir", "tested"]) == 0
    tested = Path("tested", HYPOTHESES_FILE).read_text(encoding="utf-8").splitlines()
    assert len(tested) == 33
    assert main(["translate", "--ckpt_path", str(checkpoint), "--input", str(root / "test.en"),
                 "--output", "translated.txt", "--device", "cpu"]) == 0
    assert Path("translated.txt").read_text(encoding="utf-8").splitlines() == tested
