"""Translation's throughput is in target tokens: the progress lines of a run logging to a file
print tokens/s, and its run summary and W&B run hold the same unit."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from rescale_tasks.cli import main
from wandb_runs import find_offline_runs, read_offline_run
from rescale_tasks.common.run import find_summaries, read_summary

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("RESCALE_PROGRESS", raising=False)


def test_a_translation_run_logged_to_a_file_prints_target_tokens_per_second(handful_root, capfd):
    assert main(["fit", "--config", str(REPO / "experiments/wmt/rescale6.yaml"),
                 "--model.init_args.network", "transformer_tiny", "--model.init_args.network_options",
                 "{share_embeddings: true, dropout: 0.0, d_model: 32, nhead: 2, dim_feedforward: 64, "
                 "num_encoder_layers: 1, num_decoder_layers: 1}",
                 "--data.init_args.root", str(handful_root), "--data.init_args.vocab_size", "100",
                 "--data.init_args.max_tokens", "200", "--data.init_args.num_workers", "0",
                 "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.precision", "32-true",
                 "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0", "--trainer.log_every_n_steps",
                 "1"]) == 0
    out, err = capfd.readouterr()
    assert "\r" not in out and "\r" not in err
    lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert [re.search(r"step (\d+)/2 ", line).group(1) for line in lines] == ["1", "2"], out
    assert all(re.search(r"  train/loss \S+  (.*  )?\d\S* target tokens/s  elapsed ", line) for line in lines), lines
    (path,) = find_summaries("runs")
    s = read_summary(path)
    assert s["throughput_unit"] == "target tokens" and s["samples"] > 0 and s["samples_per_second"] > 0
    (run,) = [read_offline_run(d) for d in find_offline_runs("runs")]
    assert run.summary["throughput/run_target_tokens_per_s"] == pytest.approx(s["samples_per_second"])
