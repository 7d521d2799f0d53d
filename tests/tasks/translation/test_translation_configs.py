"""Every run config of experiments/wmt/ builds its network (narrowed to d_model 16, so 60 + 12
layers build in a moment) with the recipe it names, without data on disk."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
import torch

from rescale_tasks.common.cli import run_lightning
from rescale_tasks.common.training import InverseSqrtLR

WMT = Path(__file__).resolve().parents[3] / "experiments/wmt"
CONFIGS = sorted(p for p in WMT.glob("*.yaml") if not p.name.startswith("_"))
LAYERS = {"6": (6, 6), "18": (18, 6), "60": (60, 12)}
NARROW = ["--model.init_args.network_options.d_model", "16", "--model.init_args.network_options.nhead", "2",
          "--model.init_args.network_options.dim_feedforward", "32", "--data.init_args.vocab_size", "64"]


def test_the_papers_grid_is_there():
    names = {p.stem for p in CONFIGS}
    assert names == {f"{s}{d}" for s in ("post_ln", "pre_ln", "rescale", "rezero", "skipinit", "tfixup", "deepnorm",
                                          "dyt", "derf") for d in LAYERS}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_every_wmt_config_builds_its_recipe(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = run_lightning(["fit", "--config", str(config), *NARROW], run=False)
    module, data = cli.model, cli.datamodule
    scheme, depth = config.stem.rstrip("0123456789"), config.stem[len(config.stem.rstrip("0123456789")):]
    net = module.net
    assert module.scheme_name == scheme and net.config.d_model == 16
    assert (len(net.encoder.layers), len(net.decoder.layers)) == LAYERS[depth]
    assert module.hparams.vocab_size == data.vocab_size == 64 and module.pad_index == data.pad_index
    assert net.encoder.embed.embed_tokens.weight is net.decoder.embed.embed_tokens.weight  # joint vocabulary
    assert module.label_smoothing == 0.1 and module.generation.length_penalty_style == "gnmt"
    adam = module.optimizer_factory(module.net.parameters())
    scheduler = module.scheduler_factory(adam, steps_per_epoch=10, max_epochs=None)
    assert isinstance(adam, torch.optim.Adam) and adam.defaults["betas"] == (0.9, 0.98)
    if scheme == "tfixup":  # no warm-up: T-Fixup's inverse_sqrt_nowarmup from its script's 5e-4
        assert scheduler.warmup_updates == 0 and scheduler.decay_period == 4000 and adam.defaults["lr"] == 5e-4
        assert scheduler.get_last_lr() == [5e-4] and not any(isinstance(m, torch.nn.LayerNorm) for m in net.modules())
    else:
        assert isinstance(scheduler, InverseSqrtLR) and scheduler.warmup_updates == 4000
    assert cli.trainer.logger._wandb_init["group"] == f"en-de-{depth}L"  # the languages of the data
    kept = [c for c in cli.trainer.checkpoint_callbacks if c._every_n_train_steps == 5000]
    assert len(kept) == 1 and kept[0].save_top_k == -1  # the checkpoints average-checkpoints averages


@pytest.mark.parametrize("scheme", ["post_ln", "rescale"])
def test_the_big_recipe_sits_over_the_base_one(scheme, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = run_lightning(["fit", "--config", str(WMT / "big" / f"{scheme}.yaml"), *NARROW], run=False)
    module = cli.model
    assert module.hparams.network == "transformer_big" and module.scheme_name == scheme
    assert module.optimizer_factory(module.net.parameters()).defaults["lr"] == 1e-3
    assert cli.datamodule.max_tokens == 3584 and cli.config.trainer.accumulate_grad_batches == 16
    assert module.label_smoothing == 0.1  # the rest from ../_defaults.yaml
    # its 30000 updates saved every 1000, all kept: the last five average the run's end (every 5000,
    # the base recipe's, would average from update 10000)
    kept = [c for c in cli.trainer.checkpoint_callbacks if c._every_n_train_steps]
    assert cli.config.trainer.max_steps == 30000
    assert [(c._every_n_train_steps, c.save_top_k) for c in kept] == [(1000, -1)]
    # its callbacks list replaces the base recipe's whole: the same list, but for the save interval
    base, big = (yaml.safe_load((folder / "_defaults.yaml").read_text())["trainer"]["callbacks"]
                 for folder in (WMT, WMT / "big"))
    for callback in base + big:
        callback.get("init_args", {}).pop("every_n_train_steps", None)
    assert big == base


@pytest.mark.parametrize("scheme", ["post_ln", "tfixup"])
def test_the_cpu_depth_study_config_and_its_recipe(scheme, tmp_path, monkeypatch):
    """experiments/wmt/cpu/: the narrow Transformer of the CPU depth study, each side's layers set by
    the study's key (network_options.depth) without losing the config's width, T-Fixup's recipe
    (no warm-up, its decay period scaled to the budget) applied over it."""
    monkeypatch.chdir(tmp_path)
    cpu = WMT / "cpu"
    recipe = ["--config", str(cpu / "recipes" / f"{scheme}.yaml")] if (cpu / "recipes" / f"{scheme}.yaml").exists() else []
    cli = run_lightning(["fit", "--config", str(cpu / "depth.yaml"), *recipe, "--model.init_args.scheme", scheme,
                         "--model.init_args.network_options.depth", "3", "--data.init_args.vocab_size", "64"],
                        run=False)
    module, data, net = cli.model, cli.datamodule, cli.model.net
    assert module.scheme_name == scheme and net.config.d_model == 64 and net.config.dim_feedforward == 256
    assert (len(net.encoder.layers), len(net.decoder.layers)) == (3, 3)
    assert data.settings.tgt_lang == "fr" and data.max_tokens == 1024 and cli.config.trainer.max_steps == 1000
    adam = module.optimizer_factory(module.net.parameters())
    scheduler = module.scheduler_factory(adam, steps_per_epoch=10, max_epochs=None)
    if scheme == "tfixup":
        assert scheduler.warmup_updates == 0 and scheduler.decay_period == 200 and adam.defaults["lr"] == 5e-4
    else:
        assert scheduler.warmup_updates == 200 and adam.defaults["lr"] == 7e-4
    assert module.label_smoothing == 0.1 and module.generation.beam == 4  # the rest from ../_defaults.yaml
