"""Real multi-process training through the `rescale` command, on CPU over gloo:

- `rescale fit --trainer.devices 2 --trainer.strategy ddp` (Lightning launches the second process)
  ends with the same weights and mean-shift `mu0` on both ranks, logs validation metrics equal to
  a single process's over the whole validation set, and matches a 1-process run with the same
  global batch (the classification loaders shard one seeded permutation over the ranks);
- `torchrun --nproc_per_node 2` starts the same command with the multi-node overlay
  `experiments/cluster/multinode_ddp.yaml` (Lightning detects TorchElastic);
- the FSDP overlay `experiments/cluster/fsdp.yaml` builds Lightning's FSDPStrategy wrapping each
  residual block. Lightning refuses FSDP on CPU (its accelerator connector requires CUDA), so
  an FSDP run itself needs GPUs; on CPU it is one clear error line.

Every rank writes its final state through the probe callback in `rank_state_probe.py`.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import rescale_core
from rescale_tasks.classification.data import DigitsDataModule
from rescale_tasks.classification.module import ClassificationModule
from rescale_tasks.cli import main
from rescale_tasks.common.cli import run_lightning
import forked
from wandb_runs import find_offline_runs, read_offline_run

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
BIN = Path(sys.executable).parent
PROBE = "rank_state_probe.SaveRankState"

def write_run(path: Path, run_config, suite_wandb_logger) -> str:
    """8 steps of a rescale network (no batch statistics: ranks and runs must agree) on the digits,
    validating on the whole val set."""
    return run_config(path, model={"init_args": {
        "scheme_options": {"measure_batches": 3},
        "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.2, "momentum": 0.9, "weight_decay": 0.0005}},
        "lr_scheduler": {"class_path": "rescale_tasks.common.training.WarmupCosineLR",
                         "init_args": {"warmup_epochs": 0.25}}}},
        data={"init_args": {"batch_size": 32}},
        trainer={"limit_train_batches": 8, "limit_val_batches": None, "log_every_n_steps": 1,
                 "logger": suite_wandb_logger("rescale-test", "digits")})


def rescale(args: list[str], cwd: Path, launcher: list[str] = (), timeout: int = 300) -> None:
    """Run the installed `rescale` command (optionally under a launcher such as torchrun)."""
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    env.pop("WANDB_SERVICE", None)  # a service of this test process: the run gets its own
    # the installed `rescale` (optionally under the installed launcher), its processes forked from
    # the suite's zygote as their console scripts' modules (tests/forked.py)
    command = [*launcher, str(BIN / "rescale"), *args]
    done = forked.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def rank_states(folder: Path, world_size: int) -> list[dict]:
    states = [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
    assert all(s["world_size"] == world_size for s in states)
    return states


def evaluate(state_dict: dict, batch_size: int = 1000) -> tuple[float, float]:
    """Loss and top-1 accuracy of the run's network over the whole digits validation set, in this
    one process."""
    module = ClassificationModule("cifar_resnet", scheme="rescale", scheme_options={"measure_batches": 3},
                                  network_options={"depth": 8, "base_width": 8}, num_classes=10, in_channels=1)
    module.load_state_dict(state_dict)
    module.eval()
    data = DigitsDataModule()
    data.setup()
    x, y = data.val_set.tensors
    with torch.no_grad():
        logits = module(x)
    return F.cross_entropy(logits, y).item(), (logits.argmax(-1) == y).float().mean().item()


def max_difference(a: dict, b: dict, keys) -> float:
    return max((a[k].double() - b[k].double()).abs().max().item() for k in keys)


@pytest.mark.slow
@pytest.mark.ddp
def test_two_process_ddp_matches_one_process_with_the_same_global_batch(tmp_path, monkeypatch, run_config,
                                                                       suite_wandb_logger):
    monkeypatch.chdir(tmp_path)  # the in-process model build below creates its logger's folder
    write_run(tmp_path / "run.yaml", run_config, suite_wandb_logger)
    ddp_dir, one_dir = tmp_path / "ddp", tmp_path / "one"
    ddp_dir.mkdir()
    one_dir.mkdir()
    common = ["fit", "--config", str(tmp_path / "run.yaml"), f"--trainer.callbacks+={PROBE}",
              "--trainer.callbacks.init_args.folder", "state"]
    rescale([*common, "--trainer.devices", "2", "--trainer.strategy", "ddp"], ddp_dir)  # batch 32 per rank
    rescale([*common, "--data.init_args.batch_size", "64"], one_dir)                    # one process, 64

    rank0, rank1 = rank_states(ddp_dir / "state", 2)
    (single,) = rank_states(one_dir / "state", 1)
    assert rank0["strategy"] == "DDPStrategy" and rank0["global_step"] == single["global_step"] == 8
    weights = rank0["state_dict"]
    fresh = run_lightning(["fit", "--config", str(tmp_path / "run.yaml")], run=False).model  # same seed
    mu0 = [k for k in weights if k.endswith(".mu0")]
    assert len(mu0) == len(rescale_core.mean_shift_layers(fresh.net)) > 0
    # every rank ends with the same measured means and weights
    assert max_difference(rank0["state_dict"], rank1["state_dict"], weights) == 0.0
    assert all(int(v) == 3 for k, v in weights.items() if k.endswith(".count"))

    # metrics are synchronised: both ranks hold, and rank 0 logged, what one process computes
    # over the whole validation set (each rank only saw half of it)
    for key in ("val/loss", "val/acc1", "train/loss_epoch"):
        assert rank0["metrics"][key] == pytest.approx(rank1["metrics"][key], rel=1e-6)
    loss, acc1 = evaluate(weights)
    (run_dir,) = find_offline_runs(str(ddp_dir / "runs"))
    logged = read_offline_run(run_dir)
    assert logged.metric("val/loss")[-1] == pytest.approx(loss, rel=1e-5)
    assert logged.metric("val/acc1")[-1] == pytest.approx(acc1, abs=1e-6)

    # the same run as one process with the global batch, up to the order of float sums
    moved = max_difference(weights, fresh.state_dict(), [k for k in weights if k.endswith("weight")])
    difference = max_difference(weights, single["state_dict"], weights)
    assert difference < 1e-5 and moved > 1e-2, (difference, moved)  # trained, and identically
    assert max_difference(weights, single["state_dict"], mu0) < 1e-6


@pytest.mark.slow
@pytest.mark.ddp
def test_torchrun_starts_the_multinode_overlay(tmp_path):
    rescale(["fit", "--config", str(REPO / "experiments/imagenet/rescale50.yaml"),
             "--config", str(REPO / "experiments/cluster/multinode_ddp.yaml"),
             # the cluster settings, scaled down to 2 CPU processes on one node, and digits data
             "--trainer.accelerator", "cpu", "--trainer.num_nodes", "1", "--trainer.devices", "2",
             "--data", "rescale_tasks.classification.data.DigitsDataModule", "--data.init_args.image_size", "32",
             "--data.init_args.batch_size", "8", "--data.init_args.num_workers", "0",
             "--model.init_args.network_options", "{base_width: 8}", "--trainer.max_epochs", "1",
             "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
             "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.save_dir", "runs",
             f"--trainer.callbacks+={PROBE}", "--trainer.callbacks.init_args.folder", "state"],
            tmp_path, launcher=[str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2"])
    rank0, rank1 = rank_states(tmp_path / "state", 2)
    assert rank0["environment"] == rank1["environment"] == "TorchElasticEnvironment"
    assert rank0["strategy"] == "DDPStrategy" and rank0["global_step"] == 2
    mu0 = [k for k in rank0["state_dict"] if k.endswith(".mu0")]
    assert mu0 and max_difference(rank0["state_dict"], rank1["state_dict"], rank0["state_dict"]) == 0.0
    assert len(find_offline_runs(str(tmp_path / "runs"))) == 1  # rank 0 alone logs


def test_fsdp_overlay_wraps_every_residual_block(tmp_path, monkeypatch):
    from lightning.pytorch.strategies import FSDPStrategy

    monkeypatch.chdir(tmp_path)
    # the Trainer itself needs CUDA with FSDP: build everything but the Trainer
    monkeypatch.setattr("rescale_tasks.common.cli.RescaleCLI.instantiate_trainer", lambda self, **kwargs: None)
    cli = run_lightning(["fit", "--config", str(REPO / "experiments/imagenet/rescale50.yaml"),
                         "--config", str(REPO / "experiments/cluster/fsdp.yaml"),
                         "--model.init_args.network_options", "{base_width: 8}"], run=False)
    strategy = cli.config_init.trainer.strategy
    assert isinstance(strategy, FSDPStrategy) and strategy.sharding_strategy.name == "FULL_SHARD"
    policy = strategy.kwargs["auto_wrap_policy"]
    units = policy._run_policy(cli.model, ignored_modules=set(), root_kwargs={})
    blocks = [m for m in cli.model.modules() if isinstance(m, rescale_core.blocks.ResidualBlock)]
    assert len(blocks) == 16 and set(units) == set(blocks)  # one FSDP unit per block (the root wraps the rest)


def test_fsdp_on_cpu_is_one_clear_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    code = main(["fit", "--config", str(REPO / "experiments/imagenet/rescale50.yaml"),
                 "--config", str(REPO / "experiments/cluster/fsdp.yaml"), "--trainer.accelerator", "cpu"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: bad trainer setting")
    assert "requires a GPU accelerator" in lines[0]


@pytest.mark.slow
@pytest.mark.ddp
def test_a_batch_corrupt_on_one_rank_only_is_skipped_by_every_rank(tmp_path, imagenet_folder):
    """Batch size 1 per rank over 12 files, one of them corrupt: at one step one rank's batch is
    empty. Every rank turns that step into a zero-loss step together (no rank waits in an
    all-reduce the other never joins, Lightning's refusal of `None` under DDP is not met), all 6
    steps complete and the ranks end with the same weights."""
    good = imagenet_folder / "train/n002/n002_1.JPEG"
    good.write_bytes(good.read_bytes()[:200])  # truncated in place: still 12 train files, no padding
    rescale(["fit", "--config", str(REPO / "experiments/imagenet/rescale50.yaml"),
             "--model.init_args.network_options", "{base_width: 8}", "--data.init_args.root", str(imagenet_folder),
             "--data.init_args.num_classes", "3", "--data.init_args.image_size", "32",
             "--data.init_args.eval_resize", "36", "--data.init_args.batch_size", "1",
             "--data.init_args.num_workers", "0", "--data.init_args.skip_corrupt", "true",
             "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp",
             "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "0",
             "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.save_dir", "runs",
             f"--trainer.callbacks+={PROBE}", "--trainer.callbacks.init_args.folder", "state"],
            tmp_path, timeout=240)
    rank0, rank1 = rank_states(tmp_path / "state", 2)
    assert rank0["global_step"] == rank1["global_step"] == 6
    (run_dir,) = find_offline_runs(str(tmp_path / "runs"))
    assert read_offline_run(run_dir).metric("data/skipped_corrupt")[-1] == 1  # the step was met
    assert max_difference(rank0["state_dict"], rank1["state_dict"], rank0["state_dict"]) == 0.0


@pytest.mark.slow
@pytest.mark.ddp
def test_validation_under_ddp_counts_each_image_of_an_odd_val_set_once(tmp_path, imagenet_folder, monkeypatch):
    """9 validation images on 2 processes: Lightning's DistributedSampler would pad them to 10
    with the first image counted twice, and its own weighted mean of the loss would divide the sum
    by 2 x 4 (its integer image counts averaged over ranks, truncated). The logged val/loss,
    val/acc1 and val/acc5 are one process's over the 9 images."""
    for name in ("n001", "n002", "n003"):  # 3 val images a class (9), one more from train/
        (imagenet_folder / "train" / name / f"{name}_3.JPEG").rename(imagenet_folder / "val" / name / "extra.JPEG")
    args = ["fit", "--config", str(REPO / "experiments/imagenet/rescale50.yaml"),
            "--model.init_args.network_options", "{base_width: 8}", "--data.init_args.root", str(imagenet_folder),
            "--data.init_args.num_classes", "3", "--data.init_args.image_size", "32",
            "--data.init_args.eval_resize", "36", "--data.init_args.batch_size", "2",
            "--data.init_args.num_workers", "0", "--trainer.accelerator", "cpu", "--trainer.max_epochs", "1",
            "--trainer.limit_train_batches", "1", "--trainer.logger", "false"]
    rescale([*args, "--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.enable_progress_bar", "false",
             f"--trainer.callbacks+={PROBE}", "--trainer.callbacks.init_args.folder", "state"], tmp_path, timeout=240)
    rank0, rank1 = rank_states(tmp_path / "state", 2)
    assert all(rank0["metrics"][k] == rank1["metrics"][k] for k in ("val/loss", "val/acc1", "val/acc5"))

    monkeypatch.chdir(tmp_path)
    cli = run_lightning(args, run=False)
    module, data = cli.model, cli.datamodule
    module.load_state_dict(rank0["state_dict"])
    module.eval()
    data.setup("validate")
    assert len(data.val_set) == 9
    x, y = next(iter(torch.utils.data.DataLoader(data.val_set, batch_size=9)))
    with torch.no_grad():
        logits = module(x)
    top5 = logits.topk(3, dim=-1).indices
    assert rank0["metrics"]["val/loss"] == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-5)
    assert rank0["metrics"]["val/acc1"] == pytest.approx((logits.argmax(-1) == y).float().mean().item(), abs=1e-6)
    assert rank0["metrics"]["val/acc5"] == pytest.approx((top5 == y[:, None]).any(-1).float().mean().item(), abs=1e-6)
