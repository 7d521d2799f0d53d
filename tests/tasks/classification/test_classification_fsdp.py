"""The FSDP overlay (``experiments/cluster/fsdp.yaml``) on 2 CPU processes (gloo).

Lightning's FSDPStrategy refuses any accelerator but CUDA, so ``rescale fit`` with the overlay runs
only on GPUs (on CPU it is one clear line: test_classification_ddp.py). What the overlay does to
the network does run here: the overlay's strategy is built by the CLI, and its settings (one FSDP
unit per residual block, FULL_SHARD, the kwargs Lightning hands to FSDP) wrap the configured
``rescale50`` in torch's FullyShardedDataParallel, exactly as the strategy does on GPUs. Two
sharded processes train as one process with the global batch does (the mean-shift statistics are
measured over both ranks), and the full state dict (``state_dict_type: full``) loads into the
plain network."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import rescale_core
from fsdp_rank import batches, sharded_rank, train
from rescale_tasks.common.cli import run_lightning

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.ddp
def test_two_sharded_processes_train_as_one(tmp_path, monkeypatch):
    from lightning.pytorch.strategies import FSDPStrategy

    monkeypatch.chdir(tmp_path)
    # the Trainer itself needs CUDA with FSDP: build everything but the Trainer
    monkeypatch.setattr("rescale_tasks.common.cli.RescaleCLI.instantiate_trainer", lambda self, **kwargs: None)
    cli = run_lightning(["fit", "--config", str(REPO / "experiments/imagenet/rescale50.yaml"),
                         "--config", str(REPO / "experiments/cluster/fsdp.yaml"), "--trainer.logger", "false",
                         "--model.init_args.network_options", "{base_width: 8}",
                         "--model.init_args.plan", "lean",  # the plan a GPU runs by default
                         # no dropout: each rank would draw its own masks, one process others
                         "--model.init_args.scheme_options.conv_dropout", "0",
                         "--model.init_args.scheme_options.classifier_dropout", "0"], run=False)
    strategy = cli.config_init.trainer.strategy
    assert isinstance(strategy, FSDPStrategy) and strategy._state_dict_type == "full"
    net = cli.model.net
    classes = net.fc.out_features
    initial = {k: v.clone() for k, v in net.state_dict().items()}
    out = tmp_path / "sharded.pt"
    settings = {"sharding_strategy": strategy.sharding_strategy, "kwargs": strategy.kwargs, "classes": classes}
    mp.spawn(sharded_rank, args=(2, str(tmp_path / "rendezvous"), net, settings, str(out)), nprocs=2)
    sharded = torch.load(out, weights_only=True)

    blocks = [m for m in net.modules() if isinstance(m, rescale_core.blocks.ResidualBlock)]
    assert sharded["units"] == len(blocks) + 1  # one unit per block, and the root
    train(net, batches(classes))  # one process, the global batch
    single = net.state_dict()
    assert set(sharded["state_dict"]) == set(single)  # the plain network's keys: loads anywhere
    moved = max((single[k].double() - initial[k].double()).abs().max().item() for k in single if k.endswith("weight"))
    assert moved > 1e-3
    for key, value in single.items():
        torch.testing.assert_close(sharded["state_dict"][key], value, rtol=1e-4, atol=1e-5, msg=lambda m: f"{key}: {m}")
    mu0 = [k for k in single if k.endswith(".mu0")]
    assert mu0 and all(int(v) > 0 for k, v in single.items() if k.endswith(".count"))  # measured, over both ranks
