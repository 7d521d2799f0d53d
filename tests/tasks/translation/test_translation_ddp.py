"""Translation under real DDP: 2 CPU processes over gloo through the `rescale` command. The ranks
stay in step (equal batch counts), end with the same weights, and the validation BLEU both log,
summed from each rank's share of the sentences, equals one process scoring every sentence."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import forked
from rescale_core.generation import generate
from rescale_tasks.translation.bleu import corpus_bleu
from rescale_tasks.translation.loss import label_smoothed_nll_loss

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
PROBE = HERE.parent / "classification"  # rank_state_probe.py


@pytest.mark.slow
@pytest.mark.ddp
def test_two_processes_agree_and_score_every_sentence_once(tmp_path, handful_root, monkeypatch):
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(PROBE), os.environ.get("PYTHONPATH", "")]))
    env.pop("WANDB_SERVICE", None)
    args = ["fit", "--config", str(REPO / "experiments/wmt/rescale6.yaml"),
            "--model.init_args.network", "transformer_tiny",
            "--model.init_args.network_options", "{share_embeddings: true, dropout: 0.0}",
            "--model.init_args.val_bleu_sentences", "32", "--model.init_args.beam", "2",
            "--model.init_args.optimizer.init_args.lr", "0.003",
            "--model.init_args.lr_scheduler.init_args.warmup_updates", "10",
            "--data.init_args.root", str(handful_root), "--data.init_args.vocab_size", "150",
            "--data.init_args.max_tokens", "400", "--data.init_args.num_workers", "0",
            "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp",
            "--trainer.precision", "32-true", "--trainer.max_steps", "150", "--trainer.val_check_interval", "150",
            "--trainer.enable_progress_bar", "false"]
    probe = ["--trainer.callbacks+=rank_state_probe.SaveRankState", "--trainer.callbacks.init_args.folder", "state"]
    # both ranks forked from the suite's zygote, started as torchrun starts them (tests/forked.py)
    done = forked.ddp_run("rescale_tasks.cli", [*args, *probe], 2, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    ranks = [torch.load(tmp_path / "state" / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert ranks[0]["world_size"] == 2 and ranks[0]["global_step"] == ranks[1]["global_step"] == 150
    weights = ranks[0]["state_dict"]
    assert all(torch.equal(weights[k], ranks[1]["state_dict"][k]) for k in weights)
    bleu = ranks[0]["metrics"]["val/bleu"]
    assert bleu == ranks[1]["metrics"]["val/bleu"]

    # one process, every validation sentence, the same weights and search
    from rescale_tasks.common.cli import run_lightning

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    cli = run_lightning([*args, "--trainer.devices", "1", "--trainer.strategy", "auto"], run=False)
    module, data = cli.model, cli.datamodule
    module.load_state_dict(weights)
    data.setup("fit")
    module.processor = data.processor
    sources, references = data.sources("valid"), data.references("valid")
    src = torch.nn.utils.rnn.pad_sequence([data.encode(s) for s in sources], batch_first=True,
                                          padding_value=data.pad_index)
    hyps = [module.detokenize(n[0].tokens) for n in generate(module.net, src, bos=data.bos_index,
                                                              eos=data.eos_index, config=module.generation)]
    single = corpus_bleu(hyps, references).score
    assert single > 5 and bleu == pytest.approx(single, abs=1e-4)
    # and the validation loss per token both ranks logged is one process's over the same data
    loss = tokens = 0.0
    module.eval()
    with torch.no_grad():
        for batch in data.loader("valid", num_replicas=1, rank=0):
            logits = module(batch["src_tokens"], batch["prev_output_tokens"])
            loss += label_smoothed_nll_loss(logits, batch["target"], module.label_smoothing, data.pad_index)[0].item()
            tokens += batch["ntokens"]
    assert ranks[0]["metrics"]["val/loss"] == pytest.approx(loss / tokens, rel=1e-5)
