"""`rescale export` on the classification task: a CIFAR ResNet (RescaleNet and NF-ResNet), a 2D ResNet
and a VGG trained a step on the embedded digits, written in every format and each file checked against
the PyTorch model on real digits; evaluation (`rescale validate|test|predict`) on the inference plan; and
the one-line errors (a bad format, a checkpoint of another task, an exporter not installed, an unwritable
--out)."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import torch

from rescale_core import create_model
from rescale_tasks.cli import main
from rescale_tasks.common.export import capture, op_counts

pytestmark = pytest.mark.usefixtures("offline_in_tmp")

# network_options replace the tiny run's (a None drops its depth)
FAMILIES = {
    "cifar_resnet": {"model": {"init_args": {"network": "cifar_resnet", "scheme": "rescale",
                                             "network_options": {"depth": 8, "base_width": 8}}}},
    # NF-ResNet: Scaled WS convs standardized once, the pre-activation layout as a plain network
    "cifar_resnet_nf": {"model": {"init_args": {"network": "cifar_resnet", "scheme": "nf",
                                                "network_options": {"depth": 8, "base_width": 8}}}},
    # stochastic depth: training only, the exported network is the one without it
    "cifar_resnet_nf_stochdepth": {"model": {"init_args": {
        "network": "cifar_resnet", "scheme": "nf", "scheme_options": {"stochdepth_rate": 0.5},
        "network_options": {"depth": 8, "base_width": 8}}}},
    "resnet18": {"model": {"init_args": {"network": "resnet18", "scheme": "fixup",
                                         "network_options": {"depth": None, "base_width": 8}}}},
    # five 2x2 pools: the digits at 32x32 pixels
    "vgg11": {"model": {"init_args": {"network": "vgg11", "scheme": "rescale",
                                      "network_options": {"depth": None, "base_width": 8, "hidden_dim": 16}}},
              "data": {"init_args": {"image_size": 32}}},
}
ONE_STEP = {"max_steps": 1, "limit_val_batches": 0}
ALL_FORMATS = ["--format", "onnx", "exported-program", "torchscript"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, run_config, fit_checkpoint):
    """``trained(family) -> (config, checkpoint)``: one training step on the digits, once per family."""
    done: dict[str, tuple[str, Path]] = {}

    def make(family: str) -> tuple[str, Path]:
        if family not in done:
            folder = tmp_path_factory.mktemp(f"export_{family}")
            config = run_config(folder / "run.yaml", trainer=ONE_STEP, **FAMILIES[family])
            done[family] = config, fit_checkpoint(folder, ["--config", config])
        return done[family]

    return make


@pytest.mark.parametrize("family", FAMILIES)
def test_every_format_is_written_read_back_and_matches_pytorch(family, trained, export_files):
    config, ckpt = trained(family)
    written, _ = export_files(["--config", config, "--ckpt_path", str(ckpt), *ALL_FORMATS, "--out", "out/net.onnx"])
    assert sorted(written) == sorted(str(Path("out") / f"net{s}") for s in (".onnx", ".pt2", ".torchscript.pt"))
    assert max(written.values()) < 1e-4, written


def test_the_batch_size_starts_at_the_one_checked_and_a_batch_of_one_runs(trained, export_files):
    """torch.export traces sizes 0 and 1 apart, so its range for the batch starts at 2; export checks
    a batch of one on the program against PyTorch and says ``x[0] 1+``; the written file gives a
    sample alone what it gives it in a batch."""
    config, ckpt = trained("cifar_resnet")
    [path], printed = export_files(["--config", config, "--ckpt_path", str(ckpt), "--format", "exported-program"])
    assert "sizes that may vary: x[0] 1+" in printed, printed
    program = torch.export.load(path)
    x = torch.randn(1, 1, 8, 8)
    torch.testing.assert_close(program.module()(x), program.module()(x.repeat(3, 1, 1, 1))[:1])


def test_the_torchscript_line_says_the_batch_sizes_the_traced_file_was_checked_at(trained, export_files):
    """The TorchScript file is traced at the real batch's sizes; its line says the sizes it was checked
    at (the batch's, and a batch of one), which it takes, as it takes other batches."""
    config, ckpt = trained("cifar_resnet")
    [path], printed = export_files(["--config", config, "--ckpt_path", str(ckpt), "--format", "torchscript"])
    assert "read back by torch.jit.load, traced at the batch's sizes and right at x[0] 1 too: max" in printed, printed
    assert "at these sizes" not in printed, printed
    [network] = json.loads(Path(path).with_name("last.json").read_text())["programs"].values()
    assert network["traced"] == {"torchscript": "traced at the batch's sizes and right at x[0] 1 too"}
    loaded, x = torch.jit.load(path), torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x)[:1], loaded(x[:1]))


def test_a_batch_of_one_still_exports_a_program_for_any_batch(trained, export_files, caplog):
    """``--data.batch_size 1``: torch.export fixes a size it samples at 1, so the sample is taken twice
    for the capture; the files take any batch, and give a sample what they give it alone. Then (a later
    checkpoint, say) an export as ExportedProgram alone to the same --out: the earlier ``last.onnx``
    stayed beside the new sidecar, and a runtime loading it served the earlier network without a word.
    The earlier files go with the move."""
    config, ckpt = trained("cifar_resnet")
    args = ["--config", config, "--ckpt_path", str(ckpt), "--data.init_args.batch_size", "1", "--out", "one/"]
    written, printed = export_files([*args, "--format", "exported-program", "onnx"])
    assert "sizes that may vary: x[0] 1+" in printed, printed
    x = torch.randn(3, 1, 8, 8)
    program = torch.export.load("one/last.pt2").module()
    torch.testing.assert_close(program(x)[:1], program(x[:1]))
    import onnxruntime

    session = onnxruntime.InferenceSession("one/last.onnx", providers=["CPUExecutionProvider"])
    [logits] = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(logits), program(x), atol=1e-5, rtol=1e-4)

    assert sorted(p.name for p in Path("one").iterdir()) == ["last.json", "last.onnx", "last.pt2"]
    caplog.set_level(logging.INFO, logger="rescale_tasks.common.export.command")
    assert main(["export", *args, "--format", "exported-program"]) == 0
    assert sorted(p.name for p in Path("one").iterdir()) == ["last.json", "last.pt2"]
    assert any("took away the earlier export's " in r.getMessage() and r.getMessage().split(":")[0].endswith("one/last.onnx")
               for r in caplog.records)
    assert json.loads(Path("one/last.json").read_text())["programs"]["network"]["files"] == {
        "exported-program": "last.pt2"}


def test_a_channels_last_run_exports_weights_that_load_without_a_warning(tmp_path, run_config, fit_checkpoint,
                                                                         export_files, recwarn):
    """``channels_last`` is how the run's steps ran; the files hold the weights in the default memory
    format, which ``torch.export.load`` reads whole (channels_last weights: "No complete tensor found
    in the group!" at the export and at every load of the file)."""
    overrides = {"model": {"init_args": {"channels_last": True}}, "trainer": ONE_STEP}
    config = run_config(tmp_path / "cl" / "run.yaml", **overrides)
    ckpt = fit_checkpoint(tmp_path / "cl", ["--config", config])
    recwarn.clear()
    written, _ = export_files(["--config", config, "--ckpt_path", str(ckpt), "--format", "exported-program",
                               "--out", "cl.pt2"])
    assert max(written.values()) < 1e-4, written
    torch.export.load("cl.pt2")
    assert not [w for w in recwarn if "complete tensor" in str(w.message)], [str(w.message) for w in recwarn]


@pytest.mark.parametrize("out", ["exports/", "made"], ids=["ending-in-slash", "existing-folder"])
def test_out_naming_a_folder_writes_the_checkpoints_name_in_it(out, trained, export_files, tmp_path):
    """``--out exports/`` (or a folder that exists) is where the files go, under the checkpoint's
    name; a format given twice is written once."""
    (tmp_path / "made").mkdir()
    config, ckpt = trained("cifar_resnet")
    written, _ = export_files(["--config", config, "--ckpt_path", str(ckpt), "--format", "torchscript", "torchscript",
                               "--out", f"{tmp_path}/{out}"])
    assert list(written) == [str(tmp_path / out.rstrip("/") / "last.torchscript.pt")]


@pytest.mark.parametrize("family", ["cifar_resnet", "cifar_resnet_nf", "cifar_resnet_nf_stochdepth"])
def test_the_export_is_a_plain_network_beside_the_run(family, trained, export_files):
    """The written graph holds the ops of the same network without normalization (the floor) and no
    scheme's: RescaleNet's offsets fold into biases and ReLU floors (``max(z + e, e)``), its gains into
    weights; NF-ResNet's standardized weights are constants (no batch-norm over a weight), its
    pre-activation ReLUs out of place (the stream is the skip); the shortcuts' average pools are the
    architecture's own. Without --out the file goes to export/ in the run's folder."""
    config, ckpt = trained(family)
    [path], _ = export_files(["--config", config, "--ckpt_path", str(ckpt), "--format", "exported-program"])
    assert Path(path) == ckpt.parent.parent / "export" / "last.pt2"
    written = op_counts(torch.export.load(path))
    floor = create_model("cifar_resnet", scheme="none", depth=8, base_width=8, num_classes=10, in_channels=1)
    plain = op_counts(capture(floor, (torch.zeros(2, 1, 8, 8),)))
    assert set(written) - set(plain) <= {"aten.maximum.default", "aten.avg_pool2d.default",
                                         "aten.relu.default"}, written
    assert written["aten.conv2d.default"] == plain["aten.conv2d.default"] == 9


def test_evaluation_runs_on_the_inference_plan(trained, frozen_calls):
    """validate, test and predict evaluate in eval mode with autograd off: the frozen plan computes
    the network."""
    config, ckpt = trained("cifar_resnet")
    for command in ("validate", "test", "predict"):
        frozen_calls.clear()
        one_batch = f"--trainer.limit_{'val' if command == 'validate' else command}_batches"
        assert main([command, "--config", config, "--ckpt_path", str(ckpt), one_batch, "1"]) == 0
        assert frozen_calls and {(grad, training) for _, grad, training in frozen_calls} == {(False, False)}, command


def test_a_file_beyond_the_tolerance_fails_in_one_line_and_replaces_no_earlier_file(trained, error_line):
    """onnxruntime's kernels round differently from PyTorch's: no difference is allowed at tolerance 0.
    The failing file is kept for inspection beside the earlier export's, which stay as they were, the
    ExportedProgram that passed its check before it included: files are moved into place only once
    every one has passed."""
    config, ckpt = trained("vgg11")
    for name in ("vgg.onnx", "vgg.pt2"):
        Path(name).write_text("an earlier export")
    assert main(["export", "--config", config, "--ckpt_path", str(ckpt), "--format", "exported-program", "onnx",
                 "--tolerance", "0", "--out", "vgg.onnx"]) == 1
    line = error_line()
    assert line.startswith("vgg.rejected.onnx: the network read back by onnxruntime: max |difference| from PyTorch")
    assert "above the tolerance 0" in line and Path("vgg.rejected.onnx").is_file()
    assert [Path(name).read_text() for name in ("vgg.onnx", "vgg.pt2")] == ["an earlier export"] * 2
    assert sorted(p.name for p in Path().iterdir() if p.name.startswith("vgg") or p.name.startswith(".export")) == [
        "vgg.onnx", "vgg.pt2", "vgg.rejected.onnx"]


def test_an_onnx_file_with_external_data_is_kept_with_it_rejected_or_moved_in(trained, error_line, monkeypatch):
    """An ONNX network over the exporter's size limit keeps its weights beside it, ``<file>.data``, which
    the file names: a rejected file was renamed alone, its data deleted with the staging folder (a
    file no runtime could load). Weights saved as external data from 0 bytes on, as above 2 GB. Then a
    network holding its weights (a small one) to the same --out: the earlier ``vgg.onnx.data`` was left
    beside it (gigabytes of stale weights a deployment copying ``vgg.onnx*`` took along). It goes in the
    same move as the files, a rejected file's too; a failed export leaves the earlier pair as it was."""
    import onnxruntime

    from rescale_tasks.common.export import formats

    big = formats.ONNX_EXTERNAL_DATA_BYTES
    monkeypatch.setattr(formats, "ONNX_EXTERNAL_DATA_BYTES", 0)
    config, ckpt = trained("vgg11")
    args = ["export", "--config", config, "--ckpt_path", str(ckpt), "--format", "onnx", "--out", "vgg.onnx"]
    assert main([*args, "--tolerance", "0"]) == 1
    assert error_line().startswith("vgg.rejected.onnx: the network read back by onnxruntime")
    assert sorted(p.name for p in Path().iterdir()) == ["vgg.rejected.onnx", "vgg.rejected.onnx.data"]
    assert main(args) == 0
    assert sorted(p.name for p in Path().iterdir()) == ["vgg.json", "vgg.onnx", "vgg.onnx.data",
                                                         "vgg.rejected.onnx", "vgg.rejected.onnx.data"]
    assert json.loads(Path("vgg.json").read_text())["programs"]["network"]["data_files"] == {"onnx": "vgg.onnx.data"}
    x = torch.randn(2, 1, 32, 32).numpy()
    runs = {}
    for name in ("vgg.rejected.onnx", "vgg.onnx"):
        session = onnxruntime.InferenceSession(name, providers=["CPUExecutionProvider"])
        [runs[name]] = session.run(None, {session.get_inputs()[0].name: x})
    assert (runs["vgg.rejected.onnx"] == runs["vgg.onnx"]).all()

    monkeypatch.setattr(formats, "ONNX_EXTERNAL_DATA_BYTES", big)  # the weights in the file from here on
    assert main([*args, "--tolerance", "0"]) == 1  # rejected: the earlier pair kept as it was
    assert sorted(p.name for p in Path().iterdir()) == ["vgg.json", "vgg.onnx", "vgg.onnx.data", "vgg.rejected.onnx"]
    assert main(args) == 0
    assert sorted(p.name for p in Path().iterdir()) == ["vgg.json", "vgg.onnx", "vgg.rejected.onnx"]
    assert "data_files" not in json.loads(Path("vgg.json").read_text())["programs"]["network"]
    onnxruntime.InferenceSession("vgg.onnx", providers=["CPUExecutionProvider"])


# --- one line for bad input ----------------------------------------------------------------------

def test_a_bad_format_is_one_line(trained, error_line):
    config, ckpt = trained("cifar_resnet")
    assert main(["export", "--config", config, "--ckpt_path", str(ckpt), "--format", "onnxx"]) == 2
    line = error_line()
    assert "invalid choice: 'onnxx'" in line and "exported-program" in line
    assert main(["export", "--config", config, "--ckpt_path", str(ckpt), "--format", "onnx", "--tolerance", "-1"]) == 2
    assert "argument --tolerance: expected a number >= 0, got '-1'" in error_line()


def test_a_checkpoint_of_another_task_is_one_line(trained, tmp_path, run_config, error_line):
    config, ckpt = trained("cifar_resnet")
    video = run_config(tmp_path / "video.yaml", model={
        "class_path": "rescale_tasks.video.module.VideoClassificationModule",
        "init_args": {"network": "r3d_18", "network_options": {"depth": None, "base_width": 4}}})
    assert main(["export", "--config", video, "--ckpt_path", str(ckpt), "--format", "onnx"]) == 2
    line = error_line()
    assert "module=ClassificationModule" in line and "module=VideoClassificationModule" in line


def test_a_missing_exporter_is_one_line_naming_the_install(trained, monkeypatch, error_line):
    config, ckpt = trained("cifar_resnet")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what Python does for a package not installed
    assert main(["export", "--config", config, "--ckpt_path", str(ckpt), "--format", "onnx"]) == 2
    line = error_line()
    assert "onnxruntime" in line and 'pip install "rescale-suite[export]"' in line


def test_an_unwritable_out_is_one_line(trained, tmp_path, error_line):
    config, ckpt = trained("cifar_resnet")
    (tmp_path / "file").write_text("")
    assert main(["export", "--config", config, "--ckpt_path", str(ckpt), "--format", "onnx",
                 "--out", str(tmp_path / "file" / "net.onnx")]) == 2
    assert "cannot write --out" in error_line()


@pytest.mark.parametrize("fmt", ["onnx", "exported-program", "torchscript"])
def test_a_full_disk_is_one_line_and_leaves_the_earlier_export_as_it_was(fmt, trained, tmp_path):
    """The disk fills while the files are written (here: a real ``rescale export`` process whose
    files may not grow past 8 KB, so a write fails in the operating system as on a full disk).
    torch's own file writer aborted the whole process (``terminate called after throwing``, its
    staging folder left behind), ONNX's ended in a traceback: one line now, and the earlier export
    untouched."""
    import os
    import resource

    import forked

    config, ckpt = trained("cifar_resnet")
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "net.json").write_text("the earlier export's")
    command = [sys.executable, "-m", "rescale_tasks.cli", "export", "--config", config, "--ckpt_path", str(ckpt),
               "--format", fmt, "--out", str(deploy / "net")]
    done = forked.run(command, cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                      text=True, timeout=300, rlimits={"RLIMIT_FSIZE": (8192, resource.RLIM_INFINITY)})
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert errors[0].startswith(f"error: cannot write the export in {deploy}: File too large ([Errno 27]); none of "
                                "its files was moved there")
    assert [p.name for p in deploy.iterdir()] == ["net.json"]  # no staging folder left
    assert (deploy / "net.json").read_text() == "the earlier export's"


# --- the sidecar: a runtime with the exported folder alone ------------------------------------------

#: What a runtime outside the suite runs: onnxruntime on the exported folder and its sidecar, on raw
#: pixel values (argv: the folder, the sidecar's name, the raw images as .npy); prints the top-1 class
#: names as JSON, and fails if anything of the suite was imported.
CLASSIFY = '''
import json, os, sys
import numpy as np
import onnxruntime

folder, sidecar, raw = sys.argv[1:]
meta = json.load(open(os.path.join(folder, sidecar)))
pre = meta["preprocessing"]
assert pre["layout"] == "NCHW" and pre["resize"] is None and pre["center_crop"] is None, pre
x = np.load(raw).astype(np.float32) * pre["pixel_scale"]
x = x.reshape(len(x), pre["channels"], *x.shape[-2:])
mean = np.asarray(pre["mean"], np.float32).reshape(1, -1, 1, 1)
std = np.asarray(pre["std"], np.float32).reshape(1, -1, 1, 1)
[network] = meta["programs"].values()
session = onnxruntime.InferenceSession(os.path.join(folder, network["files"]["onnx"]),
                                       providers=["CPUExecutionProvider"])
[logits] = session.run(None, {network["inputs"][0]["name"]: ((x - mean) / std).astype(np.float32)})
assert not [m for m in sys.modules if m.split(".")[0] in ("rescale_core", "rescale_tasks", "tasks", "torch")]
print(json.dumps([meta["classes"][i] for i in logits.argmax(axis=1)]))
'''


def test_a_runtime_with_the_exported_folder_alone_gives_the_labels_rescale_predict_gives(tmp_path, run_config,
                                                                                       fit_checkpoint, export_files):
    """The export writes ``<name>.json`` beside the files, moved in with them: the task, network and
    checkpoint, the inputs, the class names in output order and the preprocessing. A script with
    onnxruntime, numpy and the exported folder alone turns raw digits (scikit-learn's 0-16 pixel
    values) into the labels ``rescale predict`` writes for them."""
    import csv
    import subprocess

    import numpy
    from sklearn.datasets import load_digits

    from rescale_tasks.classification.data import DigitsDataModule

    trainer = {"max_epochs": 3, "limit_train_batches": 10, "limit_val_batches": 0}
    config = run_config(tmp_path / "run" / "run.yaml", trainer=trainer)
    ckpt = fit_checkpoint(tmp_path / "run", ["--config", config])
    written, printed = export_files(["--config", config, "--ckpt_path", str(ckpt), "--format", "onnx",
                                     "--out", "deploy/"])
    assert sorted(p.name for p in Path("deploy").iterdir()) == ["last.json", "last.onnx"]
    meta = json.loads(Path("deploy/last.json").read_text())
    assert (meta["task"], meta["network"], meta["scheme"]) == ("classification", "cifar_resnet", "rescale")
    assert meta["checkpoint"]["path"] == str(ckpt.resolve()) and meta["code"]["version"]
    assert meta["classes"] == [str(d) for d in range(10)]
    [network] = meta["programs"].values()
    assert network["inputs"] == [{"name": "x", "shape": [64, 1, 8, 8], "dtype": "float32", "free": {"0": "1+"}}]

    assert main(["predict", "--config", config, "--ckpt_path", str(ckpt), "--trainer.limit_predict_batches", "1",
                 "--output_dir", "predicted"]) == 0
    with open("predicted/predictions.test.csv", newline="") as f:
        expected = {int(row["index"]): row["top1"] for row in csv.DictReader(f)}
    index = sorted(expected)[:16]
    data = DigitsDataModule()
    data.setup()
    raw = load_digits().images[data.split_indices["test"][index].numpy()]
    np_path = tmp_path / "raw.npy"
    numpy.save(np_path, raw)
    script = tmp_path / "classify.py"
    script.write_text(CLASSIFY)
    done = subprocess.run([sys.executable, str(script), "deploy", "last.json", str(np_path)], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    labels = json.loads(done.stdout)
    assert labels == [expected[i] for i in index], (labels, expected)
    assert len(set(labels)) > 2, labels  # a network that tells digits apart


#: What a runtime outside the suite runs on image files: Pillow decodes each as the sidecar's
#: ``preprocessing.decode`` says, then resize, center crop and normalization as it says, onnxruntime
#: (argv: the folder, the sidecar's name, the image files); prints each file's class probabilities.
CLASSIFY_FILES = '''
import json, os, sys
import numpy as np
import onnxruntime
from PIL import Image, ImageOps

folder, sidecar, *files = sys.argv[1:]
meta = json.load(open(os.path.join(folder, sidecar)))
pre = meta["preprocessing"]
decode, size, crop = pre["decode"], pre["resize"]["size"], pre["center_crop"]
assert decode == {"exif_orientation": "applied", "transparency": "composited over white",
                  "high_bit_depth": "scaled to 8 bits over the full range"}, decode
[network] = meta["programs"].values()
session = onnxruntime.InferenceSession(os.path.join(folder, network["files"]["onnx"]),
                                       providers=["CPUExecutionProvider"])
out = {}
for path in files:
    image = Image.open(path)
    image = ImageOps.exif_transpose(image)
    if image.has_transparency_data:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    image = image.convert("RGB")
    assert min(image.size) == size, image.size  # written at the eval size: no resampling to compare
    left, top = (image.size[0] - crop) // 2, (image.size[1] - crop) // 2
    x = np.asarray(image.crop((left, top, left + crop, top + crop)), np.float32).transpose(2, 0, 1)[None]
    x = (x * pre["pixel_scale"] - np.reshape(pre["mean"], (1, 3, 1, 1))) / np.reshape(pre["std"], (1, 3, 1, 1))
    [logits] = session.run(None, {network["inputs"][0]["name"]: x.astype(np.float32)})
    probs = np.exp(logits[0] - logits[0].max())
    out[path] = dict(zip(meta["classes"], (probs / probs.sum()).tolist()))
print(json.dumps(out))
'''


def test_a_runtime_decoding_image_files_as_the_sidecar_says_gets_rescale_predicts_probabilities(
        tmp_path, run_config, fit_checkpoint, data_writers, export_files, monkeypatch, capsys):
    """A phone photo (stored sideways with an EXIF orientation) and a transparent PNG: the sidecar of an
    image-folder export says how a file is decoded (``preprocessing.decode``: the orientation applied,
    transparency over white), and a runtime doing so gets the probabilities ``rescale predict`` writes.
    The sidecar said nothing of it before: a runtime feeding the stored pixels got other ones."""
    import csv
    import runpy

    import numpy as np
    from PIL import Image

    root = data_writers.imagefolder(tmp_path / "images", train_per_class=2, val_per_class=1, size=36)
    upright = np.asarray(Image.open(root / "val" / "n002" / "n002_0.JPEG").convert("RGB").resize((36, 48)))
    exif = Image.Exif()
    exif[0x0112] = 6  # the viewer turns the stored pixels 90 degrees clockwise
    phone = root / "val" / "n002" / "phone photo.jpg"
    Image.fromarray(np.rot90(upright, 1).copy()).save(phone, exif=exif.tobytes(), quality=95)
    rgba = np.dstack([np.asarray(Image.open(root / "val" / "n001" / "n001_0.JPEG").convert("RGB")),
                      np.tile(np.linspace(0, 255, 36).astype(np.uint8), (36, 1))])
    clear = root / "val" / "n001" / "transparent.png"
    Image.fromarray(rgba, "RGBA").save(clear)
    config = run_config(tmp_path / "run" / "run.yaml", data={
        "class_path": "rescale_tasks.classification.data.ImageFolderDataModule",
        "init_args": {"root": str(root), "num_classes": 3, "image_size": 32, "eval_resize": 36, "batch_size": 4,
                      "num_workers": 0, "pin_memory": False, "persistent_workers": False}},
        trainer={"max_steps": 2, "limit_val_batches": 0})
    ckpt = fit_checkpoint(tmp_path / "run", ["--config", config])
    export_files(["--config", config, "--ckpt_path", str(ckpt), "--format", "onnx", "--out", "deploy/"])
    assert main(["predict", "--config", config, "--ckpt_path", str(ckpt), "--output_dir", "predicted"]) == 0
    with open("predicted/predictions.test.csv", newline="", encoding="utf-8") as f:
        predicted = {row["path"]: {row[f"top{i}"]: float(row[f"top{i}_prob"]) for i in (1, 2, 3)}
                     for row in csv.DictReader(f)}
    script = tmp_path / "classify_files.py"
    script.write_text(CLASSIFY_FILES)
    # run here rather than in an interpreter of its own: the script imports numpy, onnxruntime and
    # PIL alone, and reads nothing but the folder, its sidecar and the image files
    monkeypatch.setattr(sys, "argv", [str(script), "deploy", "last.json", str(phone), str(clear)])
    capsys.readouterr()
    runpy.run_path(str(script), run_name="__main__")
    runtime = json.loads(capsys.readouterr().out)
    assert sorted(runtime) == sorted([str(phone), str(clear)])
    for path, probs in runtime.items():
        assert probs == pytest.approx(predicted[path], abs=1e-4), path


def test_a_machine_holding_the_val_split_alone_exports_on_its_first_batch(tmp_path, run_config, fit_checkpoint,
                                                                         data_writers, export_files, error_line):
    """An image folder trained on, then on a machine with ``val/`` alone (no ``train/``): export took
    its check batch from the training loader and stopped at the missing train folder. It checks on
    the first batch of the first split there is (train, val, test, predict: here val), and says
    which; with no split at all, one line."""
    import shutil

    root = data_writers.imagefolder(tmp_path / "images", train_per_class=2, val_per_class=1)
    data = {"class_path": "rescale_tasks.classification.data.ImageFolderDataModule",
            "init_args": {"root": str(root), "num_classes": 3, "image_size": 32, "eval_resize": 36, "batch_size": 3,
                          "num_workers": 0}}
    config = run_config(tmp_path / "run" / "run.yaml", data=data, trainer=ONE_STEP,
                        model={"init_args": {"in_channels": 3, "num_classes": 3}})
    ckpt = fit_checkpoint(tmp_path / "run", ["--config", config])
    shutil.rmtree(root / "train")
    written, printed = export_files(["--config", config, "--ckpt_path", str(ckpt), "--format", "onnx", "--out",
                                     str(tmp_path / "deploy" / "net")])
    assert list(written) == [str(tmp_path / "deploy" / "net.onnx")]
    assert "checking the exported files on the first batch of the val split" in printed
    shutil.rmtree(root / "val")
    assert main(["export", "--config", config, "--ckpt_path", str(ckpt), "--format", "onnx", "--out",
                 str(tmp_path / "again" / "net")]) != 0
    message = error_line()
    assert "gives no batch to check the exported network on (of the train, val, test and predict splits" in message
    assert not (tmp_path / "again" / "net.onnx").exists()
