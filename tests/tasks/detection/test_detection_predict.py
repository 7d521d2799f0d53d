"""`rescale predict` on detection writes ``coco_results.predict.json`` where `test` writes (beside the
checkpoint's run, or `--output_dir`), and its closing line names the file with its detections, as
every task's predict names its predictions file."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_detection_cli import tiny_config

from rescale_tasks.cli import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory, coco_canvases) -> tuple[Path, Path]:
    """(config, checkpoint) of a 1-step tiny Mask R-CNN run without a logger."""
    folder = tmp_path_factory.mktemp("detection_predict")
    config = tiny_config(folder / "tiny.yaml", coco_canvases.root)
    assert main(["fit", "--config", str(config), "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0",
                 "--trainer.logger", "false", "--trainer.default_root_dir", str(folder)]) == 0
    [ckpt] = sorted(folder.rglob("last.ckpt"))
    return config, ckpt


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_the_closing_line_names_the_results_file(trained, capsys):
    config, ckpt = trained
    for args, written in (([], ckpt.parent.parent / "results" / "last" / "coco_results.predict.json"),
                          (["--output_dir", "out"], Path("out/coco_results.predict.json"))):
        assert main(["predict", "--config", str(config), "--ckpt_path", str(ckpt), "--trainer.logger", "false",
                     *args]) == 0
        printed = capsys.readouterr().out.strip().splitlines()
        detections = json.loads(written.read_text())
        assert printed[-1].startswith("predict finished: run folder ")
        assert printed[-1].endswith(f"; {len(detections):,} detections in {written}"), printed[-1]
        assert not [line for line in printed if line.startswith("predict: ")]  # said once, in the closing line


def test_predict_on_an_image_info_json_without_annotations(trained, coco_canvases, caplog):
    """COCO test-dev comes as an image-info json (images and categories, no 'annotations' list):
    `predict` on it writes the detections of every image under the json's ids, as on the
    validation json it was cut from; training and evaluation still refuse such a json."""
    config, ckpt = trained
    root = coco_canvases.root
    val = json.loads((root / "annotations" / "instances_val2017.json").read_text())
    info = Path("image_info_test.json")
    info.write_text(json.dumps({k: v for k, v in val.items() if k != "annotations"}))
    runs = {}
    for name, annotations in (("info", info), ("val", root / "annotations" / "instances_val2017.json")):
        assert main(["predict", "--config", str(config), "--ckpt_path", str(ckpt), "--trainer.logger", "false",
                     "--data.init_args.predict_annotations", str(annotations),
                     "--data.init_args.predict_images", str(root / "val2017"), "--output_dir", name]) == 0
        runs[name] = json.loads(Path(name, "coco_results.predict.json").read_text())
    assert runs["info"] == runs["val"] and runs["info"]
    assert {r["image_id"] for r in runs["info"]} <= {image["id"] for image in val["images"]}
    caplog.clear()
    assert main(["validate", "--config", str(config), "--ckpt_path", str(ckpt), "--trainer.logger", "false",
                 "--data.init_args.val_annotations", str(info), "--data.init_args.val_images",
                 str(root / "val2017")]) != 0
    assert "has no 'annotations' list" in caplog.text



@pytest.mark.parametrize("draw", [0, 1], ids=["results", "drawing"])
def test_a_failed_write_of_the_results_or_a_drawing_is_one_line(trained, tmp_path, draw):
    """The disk fills as predict writes coco_results.predict.json (a real process whose files may not
    grow past 4 KB), or a drawing's folder cannot be made (a file holds its name): one line naming
    the file, as every task's predict, not a traceback."""
    import os
    import resource
    import sys

    import forked

    config, ckpt = trained
    out = tmp_path / "out"
    out.mkdir()
    if draw:
        (out / "predictions").write_text("a file where the drawings' folder goes")
    done = forked.run([sys.executable, "-m", "rescale_tasks.cli", "predict", "--config", str(config), "--ckpt_path",
                       str(ckpt), "--trainer.logger", "false", "--output_dir", str(out),
                       "--model.init_args.draw_predictions", str(draw)], cwd=tmp_path,
                      env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300,
                      rlimits={} if draw else {"RLIMIT_FSIZE": (4096, resource.RLIM_INFINITY)})
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    written = out / "predictions" if draw else out / "coco_results.predict.json"
    assert errors[0].startswith(f"error: cannot write {written}"), errors[0]
    assert ("give --output_dir a folder you can write" if draw else
            "File too large ([Errno 27]); nothing of it was written") in errors[0], errors[0]


@pytest.mark.ddp
def test_two_processes_draw_the_first_images_of_the_split_once(trained, coco_canvases, tmp_path, rescale_processes):
    """Under 2-process DDP each rank drew its own first draw_predictions images: up to twice as many
    drawings, not the split's first ones. Now the first draw_predictions of the split, as 1 process."""
    config, ckpt = trained
    drawn = {}
    for devices in (1, 2):
        out = tmp_path / f"out{devices}"
        done = rescale_processes(["predict", "--config", str(config), "--ckpt_path", str(ckpt), "--trainer.logger",
                                  "false", "--output_dir", str(out), "--model.init_args.draw_predictions", "2"],
                                 devices)
        drawn[devices] = sorted(p.name for p in (out / "predictions").iterdir())
        assert ", 2 drawn images in" in done.stdout, done.stdout[-2000:]
    first = [image["id"] for image in coco_canvases.truth["val"]][:2]
    assert drawn[2] == drawn[1] == sorted(f"{i}.png" for i in first)
