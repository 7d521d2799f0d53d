"""`rescale analyze signal|scalars|dead-relu` on the tiny digits run (a depth-8 CIFAR ResNet, base
width 8): the files each writes, table values equal to the probes of rescale_core.analysis (and to
a checkpoint's gains), one-line errors; and the AnalysisPlotsLogger callback: images in an
offline W&B run, trained weights unchanged."""
from __future__ import annotations

import csv
import glob
import os
from types import SimpleNamespace

import pytest
import torch

from rescale_core.analysis import signal_propagation
from rescale_tasks.cli import main
from rescale_tasks.common.cli import run_lightning
from rescale_tasks.common.reporting import AnalysisPlotsLogger
from wandb_runs import find_offline_runs, read_offline_run

VARIANCES = ["var_skip", "var_branch", "var_sum", "var_out", "eta"]
PLOTS_LOGGER = "rescale_tasks.common.reporting.AnalysisPlotsLogger"
EVERY_STEP = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
              "--trainer.callbacks.init_args.every_n_train_steps", "1",
              "--trainer.callbacks.init_args.save_top_k", "-1", "--trainer.callbacks.init_args.filename", "{step}"]


@pytest.fixture(autouse=True)
def _in_tmp(offline_in_tmp):
    """Each test in a folder of its own, W&B offline (tests/tasks/conftest.py)."""


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def written(out: str, name: str) -> list[dict]:
    for ext in ("csv", "md", "png"):
        assert os.path.getsize(f"{out}/{name}.{ext}") > 0
    return read_csv(f"{out}/{name}.csv")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, run_config, suite_wandb_logger):
    """The same 3-step run twice, in W&B offline runs: ``plain`` keeps a checkpoint per step,
    ``probed`` has the AnalysisPlotsLogger at every step. Gains are per channel (vector)."""
    root = tmp_path_factory.mktemp("trained")
    config = run_config(root / "vector8.yaml", model={"init_args": {"scheme_options": {"gain": "vector"}}},
                              trainer={"limit_train_batches": 3,
                                       "logger": suite_wandb_logger("analyze-test", "vector8")})
    runs = {}
    for name, extra in (("plain", EVERY_STEP),
                        ("probed", [f"--trainer.callbacks+={PLOTS_LOGGER}", "--trainer.callbacks.init_args.every_n_steps",
                                    "1", "--trainer.callbacks.init_args.samples", "8"])):
        folder = root / name
        folder.mkdir()
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(folder)
            mp.setenv("WANDB_MODE", "offline")
            mp.setenv("WANDB_SILENT", "true")
            assert main(["fit", "--config", config, *extra]) == 0
        (run_dir,) = find_offline_runs(str(folder / "runs"))
        (last,) = glob.glob(str(folder / "runs/analyze-test/*/checkpoints/last.ckpt"))
        steps = sorted(glob.glob(str(folder / "runs/analyze-test/*/checkpoints/step=*.ckpt")))
        runs[name] = SimpleNamespace(run_dir=run_dir, last=last, steps=steps)
    return SimpleNamespace(config=config, **runs)


# --- signal ----------------------------------------------------------------------------------------

def test_signal_on_training_samples_equals_the_probe(tmp_path, run_config, capsys):
    config = run_config(tmp_path / "rescale8.yaml")
    assert main(["analyze", "signal", "--config", config, "--samples", "16", "--out", "sig"]) == 0
    printed = capsys.readouterr().out
    rows = written("sig", "signal")

    # the same model (same seed) on the first 16 samples of the training loader, probed directly
    cli = run_lightning(["--config", config], run=False)
    cli.datamodule.setup("fit")
    images = next(iter(cli.datamodule.train_dataloader()))[0][:16]
    records = signal_propagation(cli.model.net, images, train=True)
    assert [r["block"] for r in rows] == [r["name"] for r in records] == ["layer1.0", "layer2.0", "layer3.0"]
    for row, record in zip(rows, records):
        assert row["run"] == "rescale8" and row["stage"] == record["stage"] and int(row["k"]) == record["k"]
        for key in VARIANCES:
            assert float(row[key]) == pytest.approx(record[key], rel=1e-6), key
        assert float(row["gain"]) == 1.0
    assert "| run | block | stage | k | var_skip |" in printed and "| rescale8 | layer1.0 | layer1 | 1 |" in printed
    assert "wrote sig/signal.csv, sig/signal.md, sig/signal_stages.csv, sig/signal_stages.md, sig/signal.png" in printed
    # the per-stage summary: one block per stage here, so growth 1 and eta_max = that block's eta
    stages = list(csv.DictReader(open("sig/signal_stages.csv")))
    assert [s["stage"] for s in stages] == ["layer1", "layer2", "layer3"]
    for stage, record in zip(stages, records):
        assert float(stage["var_out_first"]) == pytest.approx(record["var_out"], rel=1e-6)
        assert float(stage["growth"]) == pytest.approx(1.0) and int(stage["blocks"]) == 1
        assert float(stage["eta_max"]) == pytest.approx(record["eta"], rel=1e-6)
    assert "| run | stage | blocks | var_out_first |" in printed


def test_signal_skipinit_view_bn_skip_variance_grows_with_depth(tmp_path, run_config):
    """Two runs on one plot, Gaussian input of a given shape, a depth override after `--`: under
    BN the stream's variance grows block after block within every stage (SkipInit, Sec. 2)."""
    bn = run_config(tmp_path / "bn20.yaml", model={"init_args": {"scheme": "bn"}})
    rescale = run_config(tmp_path / "rescale20.yaml")
    assert main(["analyze", "signal", "--config", bn, "--config", rescale, "--input", "gaussian", "--shape", "1,8,8",
                 "--samples", "32", "--", "--model.init_args.network_options", "{depth: 20, base_width: 8}"]) == 0
    rows = written("analysis/signal", "signal")  # the default folder
    assert [r["run"] for r in rows] == ["bn20"] * 9 + ["rescale20"] * 9
    for stage in ("layer1", "layer2", "layer3"):
        out = [float(r["var_out"]) for r in rows if r["run"] == "bn20" and r["stage"] == stage]
        assert out[0] < out[1] < out[2], (stage, out)
    skip = [float(r["var_skip"]) for r in rows if r["run"] == "bn20" and r["stage"] == "layer1"]
    assert skip[0] < skip[1] < skip[2]  # no projection in the first stage: the skip path carries it
    assert all(r["gain"] == "" for r in rows if r["run"] == "bn20")


def test_missing_checkpoint_is_one_line(tmp_path, run_config, error_line):
    config = run_config(tmp_path / "rescale8.yaml")
    assert main(["analyze", "signal", "--config", config, "--ckpt", "nope.ckpt"]) == 2
    assert error_line().startswith("checkpoint not found: nope.ckpt (--ckpt).")


def test_signal_of_a_vgg_is_one_line(tmp_path, run_config, error_line):
    config = run_config(tmp_path / "vgg.yaml")
    assert main(["analyze", "signal", "--config", config, "--", "--model.init_args.network", "vgg11",
                 "--model.init_args.network_options", "{base_width: 8}"]) == 2
    line = error_line()
    assert line.startswith("vgg: vgg11 (scheme ") and "has no residual blocks" in line
    assert not os.path.exists("analysis")


def test_bad_flag_is_one_line(error_line):
    assert main(["analyze", "signal", "--samples", "3"]) == 2
    assert "the following arguments are required: --config" in error_line()


def test_a_wandb_run_it_cannot_log_to_is_refused_before_the_probes(tmp_path, run_config, error_line):
    """Refused only at the end before, once every model was built and probed."""
    config = run_config(tmp_path / "rescale8.yaml")
    assert main(["analyze", "signal", "--config", config, "--wandb_run", "abc123", "--out", "sig"]) == 2
    assert error_line() == "--wandb_run abc123: a run id needs --wandb_project (or give the run's folder)"
    assert not os.path.exists("sig")


# --- scalars ---------------------------------------------------------------------------------------

def test_scalars_of_checkpoints_are_the_checkpoints_gains(trained, capsys):
    first, last = trained.plain.steps[0], trained.plain.steps[-1]
    assert main(["analyze", "scalars", "--config", trained.config, "--ckpt", first, "--ckpt", last,
                 "--out", "sc"]) == 0
    assert "| vector8 | 1 | layer1.0 | layer1 | 1 |" in capsys.readouterr().out
    rows = written("sc", "scalars")
    assert [(int(r["step"]), r["block"]) for r in rows] == [(s, b) for s in (1, 3)
                                                             for b in ("layer1.0", "layer2.0", "layer3.0")]
    for path, step in ((first, 1), (last, 3)):
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        assert checkpoint["global_step"] == step
        for row in (r for r in rows if int(r["step"]) == step):
            gain = checkpoint["state_dict"][f"net.{row['block']}.merge.gain.weight"].double()
            assert gain.numel() == 8 * 2 ** (int(row["k"]) - 1) and gain.std() > 0  # trained, per channel
            for key, value in (("gain", gain.mean()), ("gain_min", gain.min()), ("gain_max", gain.max()),
                               ("gain_std", gain.std(unbiased=False))):
                assert float(row[key]) == pytest.approx(float(value), rel=1e-12), key


def test_scalars_at_init_and_one_line_errors(tmp_path, run_config, trained, error_line, capsys):
    config = run_config(tmp_path / "rescale8.yaml")  # scalar gains
    assert main(["analyze", "scalars", "--config", config]) == 0
    rows = read_csv("analysis/scalars/scalars.csv")
    assert [(r["step"], r["gain"], r["gain_min"]) for r in rows] == [("0", "1.0", "")] * 3
    capsys.readouterr()

    assert main(["analyze", "scalars", "--config", config, "--ckpt", trained.plain.last]) == 2
    line = error_line()
    assert f"checkpoint {trained.plain.last} was saved from" in line and "they differ in scheme_options" in line
    assert "Give the --config the checkpoint was trained with" in line

    bn = run_config(tmp_path / "bn8.yaml", model={"init_args": {"scheme": "bn"}})
    assert main(["analyze", "scalars", "--config", bn]) == 2
    assert error_line() == ("bn8: cifar_resnet (scheme bn) has no learned branch multipliers (scheme gain: none); "
                            "`rescale analyze scalars` needs a scheme with gains: fixup, nf_skipinit, rescale, rezero, "
                            "skipinit, skipinit_reg")


def test_the_config_a_run_saved_is_accepted(trained):
    """The one-line error of a checkpoint of another config says to give the config the run saved
    (rescale_config.yaml): that file holds fit's own ckpt_path and weights_only, which `rescale
    analyze` (and `export`) refused as unknown keys."""
    saved = os.path.join(trained.plain.run_dir, "files", "rescale_config.yaml")
    assert "ckpt_path: null" in open(saved).read()
    assert main(["analyze", "scalars", "--config", saved, "--ckpt", trained.plain.last, "--out", "saved"]) == 0
    assert main(["analyze", "scalars", "--config", trained.config, "--ckpt", trained.plain.last, "--out", "given"]) == 0
    strip = [{k: v for k, v in row.items() if k != "run"} for row in written("saved", "scalars")]
    assert strip == [{k: v for k, v in row.items() if k != "run"} for row in written("given", "scalars")]


def test_runs_of_one_config_name_are_never_pooled(trained):
    """The configs two runs saved share a name (``<run>/files/rescale_config.yaml``), and two
    checkpoints of one run can share a step (the last step's and last.ckpt): each is a run of its
    own in the tables. They were one, whose per-stage rows took the first block of one run and the
    last of the other (growth 2 blocks long in a 1-block stage)."""
    saved = [os.path.join(run.run_dir, "files", "rescale_config.yaml") for run in (trained.plain, trained.probed)]
    assert main(["analyze", "signal", "--config", *saved[:1], "--config", saved[1], "--input", "gaussian",
                 "--samples", "8", "--out", "two"]) == 0
    names = [f"{os.path.basename(run.run_dir)}/files/rescale_config" for run in (trained.plain, trained.probed)]
    assert [(r["run"], r["blocks"]) for r in read_csv("two/signal_stages.csv")] == [
        (name, "1") for name in names for _ in range(3)]
    last_step = trained.plain.steps[-1]
    assert main(["analyze", "signal", "--config", trained.config, "--ckpt", last_step, "--ckpt", trained.plain.last,
                 "--input", "gaussian", "--samples", "8", "--out", "same_step"]) == 0
    assert [(r["run"], r["blocks"]) for r in read_csv("same_step/signal_stages.csv")] == [
        (run, "1") for run in ("vector8 step 3", "vector8 (last.ckpt) step 3") for _ in range(3)]


# --- dead-relu -------------------------------------------------------------------------------------

def test_dead_relu_depends_on_samples_only_with_mean_shift(tmp_path, run_config, capsys):
    config = run_config(tmp_path / "rescale8.yaml")
    assert main(["analyze", "dead-relu", "--config", config, "--max_samples", "16", "--eval_samples", "16",
                 "--out", "dr"]) == 0
    rows = written("dr", "dead_relu")
    shifted = [r for r in rows if r["mean_shift"] == "True"]
    plain = [r for r in rows if r["mean_shift"] == "False"]
    assert [int(r["samples"]) for r in shifted] == [int(r["samples"]) for r in plain] == [1, 2, 4, 8, 16]
    assert len({r["dead_per_sample"] for r in shifted}) > 1       # mu0 measured on 1..16 samples
    assert len({(r["dead_fraction"], r["dead_per_sample"]) for r in plain}) == 1  # nothing to measure
    # the re-parameterisation keeps ReLUs alive (Sec. 4.4)
    assert float(shifted[-1]["dead_per_sample"]) < float(plain[-1]["dead_per_sample"])
    assert "| rescale8 | yes | 16 |" in capsys.readouterr().out


def test_dead_relu_of_a_compiled_config_equals_the_eager_one(tmp_path, run_config):
    """A config with ``compile: true``: the network was compiled in place, and every copy that
    measured mu0 ran the original's compiled code (hooks on the copy never called): 0 dead units
    at every n, silently. The subjects are built uncompiled."""
    config = run_config(tmp_path / "rescale8.yaml")
    compiled = run_config(tmp_path / "compiled8.yaml", model={"init_args": {
        "compile": True, "compile_options": {"backend": "eager"}}})  # dynamo's tracing, no compiler's wait
    for name, path in (("dr", config), ("drc", compiled)):
        assert main(["analyze", "dead-relu", "--config", path, "--max_samples", "4", "--eval_samples", "8",
                     "--input", "gaussian", "--out", name]) == 0
    eager, rows = read_csv("dr/dead_relu.csv"), read_csv("drc/dead_relu.csv")
    assert any(float(r["dead_per_sample"]) > 0 for r in eager if r["mean_shift"] == "True")
    assert [{**r, "run": ""} for r in rows] == [{**r, "run": ""} for r in eager]


def test_dead_relu_measures_up_to_max_samples(tmp_path, run_config):
    """--max_samples 1024 stopped at 512 samples (the series was cut at 2^9 whatever was asked)."""
    config = run_config(tmp_path / "rescale8.yaml")
    assert main(["analyze", "dead-relu", "--config", config, "--max_samples", "1500", "--eval_samples", "2",
                 "--input", "gaussian", "--batch_size", "512", "--out", "dr"]) == 0
    assert [int(r["samples"]) for r in read_csv("dr/dead_relu.csv") if r["mean_shift"] == "True"] == [
        2 ** i for i in range(11)]


def test_dead_relu_reports_a_bad_override_as_itself(tmp_path, run_config, error_line):
    """A typo in an override was blamed on mean shift: "this one cannot take them; leave its config
    out (bad value for ...)", though the config takes mean-shift biases well."""
    config = run_config(tmp_path / "rescale8.yaml")
    assert main(["analyze", "dead-relu", "--config", config, "--out", "dr", "--",
                 "--model.init_args.compile_options", "{backend:eager}"]) == 2
    assert error_line().startswith("bad value for model.init_args.compile_options")
    assert not (tmp_path / "dr").exists()


def test_dead_relu_refuses_a_scheme_that_cannot_take_mean_shift_before_measuring(tmp_path, run_config, error_line):
    rescale = run_config(tmp_path / "rescale8.yaml")
    nf = run_config(tmp_path / "nf8.yaml", model={"init_args": {"scheme": "nf"}})
    assert main(["analyze", "dead-relu", "--config", rescale, "--config", nf, "--out", "dr"]) == 2
    assert error_line().startswith("nf8: `rescale analyze dead-relu` compares the network with and without "
                                   "mean-shift biases (scheme_options.mean_shift true and false), and this one "
                                   "cannot take them; leave its config out (cannot build network")
    assert not (tmp_path / "dr").exists()


# --- the training callback -------------------------------------------------------------------------

def test_plots_logger_logs_images_and_leaves_training_unchanged(trained):
    logged = read_offline_run(trained.probed.run_dir)
    for key in ("analysis/signal_propagation", "analysis/learned_scalars"):
        assert logged.metric(f"{key}/_type") == ["image-file"] * 3, key
        for path in logged.metric(f"{key}/path"):  # the PNGs in the run's media folder
            assert os.path.getsize(os.path.join(trained.probed.run_dir, "files", path)) > 0
    assert len(logged.metric("analysis/seconds")) == 3
    assert read_offline_run(trained.plain.run_dir).metric("analysis/seconds") == []

    # the probe ran during the mean-shift measuring steps (3 of 8): same weights, same measuring state
    probed = torch.load(trained.probed.last, map_location="cpu", weights_only=True)["state_dict"]
    plain = torch.load(trained.plain.last, map_location="cpu", weights_only=True)["state_dict"]
    assert probed.keys() == plain.keys()
    assert all(int(v) == 3 for k, v in probed.items() if k.endswith(".count"))
    for key in plain:
        assert torch.equal(probed[key], plain[key]), key


def test_plots_logger_without_wandb_does_nothing():
    callback = AnalysisPlotsLogger(every_n_steps=1)
    trainer = SimpleNamespace(global_step=1, loggers=[], is_global_zero=True)
    callback.on_train_batch_end(trainer, None, None, None, 0)  # no module touched, no error
    assert callback.seconds == []
