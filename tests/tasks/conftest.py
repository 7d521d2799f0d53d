"""What the task tests share: the smallest real run config (a depth-8 CIFAR ResNet on the embedded
digits, two steps, on the CPU), written as YAML with per-test overrides."""
from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any, NamedTuple, Optional

import pytest
import yaml

TINY_RUN: dict[str, Any] = {
    "model": {
        "class_path": "rescale_tasks.classification.module.ClassificationModule",
        "init_args": {"network": "cifar_resnet", "scheme": "rescale",
                      "network_options": {"depth": 8, "base_width": 8}},
    },
    "data": {"class_path": "rescale_tasks.classification.data.DigitsDataModule",
             "init_args": {"batch_size": 64}},
    "trainer": {"max_epochs": 1, "limit_train_batches": 2, "limit_val_batches": 1, "accelerator": "cpu",
                "devices": 1, "enable_progress_bar": False, "enable_model_summary": False, "logger": False},
}


def merged(base: dict, overrides: dict) -> dict:
    """``base`` with ``overrides`` merged in (nested mappings merged, anything else replaced;
    a value of ``None`` removes the key)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def write_run_config(path: Path, **overrides: Any) -> str:
    """Write :data:`TINY_RUN` with ``overrides`` (top-level sections) to ``path``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(merged(TINY_RUN, overrides), sort_keys=False))
    return str(path)


@pytest.fixture(scope="session")
def run_config():
    """``run_config(path, model={"init_args": {...}}, trainer={...}) -> str``: see :func:`write_run_config`."""
    return write_run_config


def wandb_logger(project: str, name: str, save_dir: str = "runs", **extra: Any) -> dict:
    """The trainer's ``logger`` section for an offline W&B run of the suite."""
    return {"class_path": "rescale_tasks.common.reporting.SuiteWandbLogger",
            "init_args": {"project": project, "name": name, "save_dir": str(save_dir), **extra}}


@pytest.fixture(scope="session")
def suite_wandb_logger():
    return wandb_logger


@pytest.fixture
def offline_in_tmp(tmp_path, monkeypatch):
    """The test runs in its own ``tmp_path``, with W&B offline and silent."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tmp_path


@pytest.fixture
def error_line(capsys):
    """``error_line()``: asserts stderr ends in one ``error: ...`` line, without traceback or
    usage dump (the lines before it, if any, are the run's logged warnings, each one line), and
    returns its message (without ``error: ``)."""
    def read() -> str:
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error")]
        assert len(errors) == 1 and lines[-1] == errors[0], err
        assert "Traceback" not in err and "usage:" not in err, err
        return lines[-1][len("error: "):]
    return read


@pytest.fixture
def classification_checkpoint(tmp_path):
    """``make(network, **options) -> (net, path)``: a 2D network whose RescaleNet mean-shift means are
    random and finished measuring, saved as ``rescale fit`` saves it (``state_dict`` of ``net.*``),
    the starting point the detection backbones and the video inflation load."""
    import torch

    from rescale_core import create_model
    from rescale_core.layers import MeanShiftBias

    def make(network: str, **options: Any):
        net = create_model(network, **options)
        for m in net.modules():
            if isinstance(m, MeanShiftBias):
                m.mu0.normal_()
                m.finish_measuring()
        path = tmp_path / f"{network}.ckpt"
        torch.save({"state_dict": {f"net.{k}": v for k, v in net.state_dict().items()}}, path)
        return net, path

    return make


def fit_in_folder(folder: Path, args: list[str]) -> Path:
    """``rescale fit *args`` run from ``folder`` (W&B offline), then its ``last.ckpt``: the
    checkpoint that the tests of what a command does with ``--ckpt_path`` start from."""
    import os

    from rescale_tasks.cli import main

    old = os.getcwd()
    os.chdir(folder)
    os.environ.setdefault("WANDB_MODE", "offline")
    try:
        assert main(["fit", *args]) == 0
    finally:
        os.chdir(old)
    [ckpt] = sorted(Path(folder).rglob("last.ckpt"))
    return ckpt


@pytest.fixture(scope="session")
def fit_checkpoint():
    """``fit_checkpoint(folder, args) -> Path``: see :func:`fit_in_folder`."""
    return fit_in_folder


@pytest.fixture
def rescale_processes():
    """``run(args, devices) -> CompletedProcess``: the ``rescale`` command in processes of its own
    on ``devices`` CPU processes (``ddp`` over gloo when more than one, the ranks started as
    ``torchrun`` starts them; one thread each), forked from the suite's zygote (``tests/forked.py``),
    for tests comparing a multi-process run with a single-process one."""
    import os

    import forked

    def run(args: list[str], devices: int = 1):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        args = [*args, "--trainer.devices", str(devices)]
        if devices > 1:
            done = forked.ddp_run("rescale_tasks.cli", [*args, "--trainer.strategy", "ddp"], devices, env=env,
                                  timeout=300)
        else:
            done = forked.run([sys.executable, "-m", "rescale_tasks.cli", *args], capture_output=True, text=True,
                              timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    return run


@pytest.fixture
def fit_then_validate():
    """``run(module, data, steps) -> metrics``: ``steps`` training steps on the CPU (seed 0, no
    logger, checkpoint or validation while training), then one validation; for the tests that
    show a task's model learns its few samples."""
    import lightning.pytorch as L

    def run(module, data, steps: int) -> dict:
        L.seed_everything(0)
        trainer = L.Trainer(max_steps=steps, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                            accelerator="cpu", num_sanity_val_steps=0, check_val_every_n_epoch=1000)
        trainer.fit(module, data)
        return trainer.validate(module, data, verbose=False)[0]

    return run


@pytest.fixture
def summary_matches_wandb():
    """``check(run_folder_root="runs") -> summary``: the one W&B offline run and the one
    ``run_summary.json`` under the folder hold the same validations: every ``val/`` key the run
    logged appears in the summary's curve once per validation, at its step (W&B's
    ``trainer/global_step`` counts from 0, the summary's steps from 1), with the logged value;
    and the same throughput (``throughput/run_<unit>_per_s``, the whole run's, logged once; the
    per-window ``throughput/<unit>_per_s`` once per logged step)."""
    import math

    from wandb_runs import find_offline_runs, read_offline_run
    from rescale_tasks.common.run import find_summaries, read_summary

    def check(root: str = "runs") -> dict:
        (folder,) = find_offline_runs(root)
        (path,) = find_summaries(root)
        run, summary = read_offline_run(folder), read_summary(path)
        keys = {k for row in run.history for k in row if k.startswith("val/")}
        assert keys and keys <= set(summary["curves"]), (keys, sorted(summary["curves"]))
        for key in keys:
            logged = [(row["trainer/global_step"] + 1, row[key]) for row in run.history if key in row]
            curve = [tuple(point) for point in summary["curves"][key]]
            assert [s for s, _ in curve] == [s for s, _ in logged], (key, curve, logged)
            for (_, mine), (_, theirs) in zip(curve, logged):
                assert mine == pytest.approx(theirs, rel=1e-6) or (math.isnan(mine) and math.isnan(theirs)), key
        # the throughput in the task's unit: the whole run's, in the W&B summary and the run summary
        unit = summary["throughput_unit"].replace(" ", "_")
        key, whole = f"throughput/{unit}_per_s", f"throughput/run_{unit}_per_s"
        assert summary["samples_per_second"] > 0 and run.summary[whole] == pytest.approx(summary["samples_per_second"])
        assert summary["final"][whole] == pytest.approx(summary["samples_per_second"])
        assert sum(whole in row for row in run.history) == 1  # once, when training ends
        steps = [row["trainer/global_step"] for row in run.history if key in row]  # while training
        assert steps and len(steps) == len(set(steps)), steps  # one rate per step on a chart
        return summary

    return check


def _same_curve(a: list, b: list) -> bool:
    """The same steps and, to float32's precision (loggers receive tensors), the same values."""
    return [s for s, _ in a] == [s for s, _ in b] and [v for _, v in a] == pytest.approx([v for _, v in b], rel=1e-6)


@pytest.fixture(scope="session")
def same_curve():
    """``same_curve(a, b)``: two ``[[step, value], ...]`` curves agree (steps exactly, values to 1e-6)."""
    return _same_curve


@pytest.fixture
def fit_with_summary():
    """``run(folder, module, train, val=None, max_epochs=1, ckpt_path=None, **trainer_args) -> dict``:
    the real Lightning loop on the CPU (seed 0) with the suite's :class:`RunSummary` and Lightning's
    CSVLogger; returns ``summary`` (the written ``run_summary.json``), ``logged`` (what the logger
    received, ``{val/ key: [[step, value], ...]}``, the step as the summary counts it: optimizer steps
    done, Lightning's loggers count from 0) and ``trainer``. ``train`` is a DataLoader or a data module."""
    import contextlib
    import csv

    import lightning.pytorch as L
    from lightning.pytorch.loggers import CSVLogger

    from rescale_tasks.common.run import RunSummary, read_summary

    def run(folder, module, train, val=None, max_epochs: int = 1, ckpt_path=None, **trainer_args) -> dict:
        L.seed_everything(0)
        summary = Path(folder) / "run_summary.json"
        options = dict(accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
                       log_every_n_steps=1, default_root_dir=folder)
        trainer = L.Trainer(max_epochs=max_epochs, logger=CSVLogger(folder, name="csv", version=0),
                            callbacks=[RunSummary(str(summary))], **{**options, **trainer_args})
        if isinstance(train, L.LightningDataModule):
            trainer.fit(module, datamodule=train, ckpt_path=ckpt_path)
        else:
            trainer.fit(module, train, val, ckpt_path=ckpt_path)
        logged: dict[str, list] = {}
        metrics = Path(folder) / "csv" / "version_0" / "metrics.csv"
        with open(metrics, newline="") if metrics.exists() else contextlib.nullcontext([]) as f:  # none: nothing logged
            for row in csv.DictReader(f):
                for key, value in row.items():
                    if key.startswith("val/") and value != "":
                        logged.setdefault(key, []).append([int(row["step"]) + 1, float(value)])
        return {"summary": read_summary(str(summary)), "logged": logged, "trainer": trainer}

    return run


def reorder_checkpoint_labels(ckpt, path, names, order, classifier: str = "net.fc", entry: str = "labels"):
    """Write ``ckpt``'s network to ``path`` with its outputs listed in ``order`` (output i is the old
    output ``order[i]``, its classifier rows moved with it) and its class names (``names``, by old
    output) to match: the same network, as if trained on data listing the classes in that order.
    ``entry``: where the names go (``labels``; older checkpoints of the video task keep them in the
    data module's state, ``KineticsDataModule``). Returns ``path`` as a string."""
    import torch

    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    for key in (f"{classifier}.weight", f"{classifier}.bias"):
        checkpoint["state_dict"][key] = checkpoint["state_dict"][key][order]
    checkpoint.pop("labels", None)
    checkpoint[entry] = {"class_names": [names[i] for i in order]}
    torch.save(checkpoint, path)
    return str(path)


@pytest.fixture(scope="session")
def reordered_checkpoint():
    """:func:`reorder_checkpoint_labels`: a checkpoint's classes in another order, the same network."""
    return reorder_checkpoint_labels


@pytest.fixture(scope="session")
def cpu_trainer():
    """``cpu_trainer(**options) -> Trainer``: one CPU, no logger, checkpoint callback, progress bar,
    model summary or sanity validation (``options`` add or override)."""
    import lightning.pytorch as L

    def make(**options):
        return L.Trainer(**{**dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                                   enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0),
                            **options})
    return make


@pytest.fixture
def export_files(capsys):
    """``run(args) -> ({path: difference}, printed)``: ``rescale export *args`` (it must succeed), each
    file it says it wrote (it must exist) with the largest difference from the PyTorch model it
    printed, and all it printed."""
    import os
    import re

    from rescale_tasks.cli import main

    def run(args: list[str]) -> tuple[dict[str, float], str]:
        status = main(["export", *args])
        printed = capsys.readouterr()
        assert status == 0, printed.err
        lines = re.findall(r"^(\S+): the .* max \|difference\| from PyTorch (\S+)$", printed.out, re.M)
        assert lines and all(os.path.isfile(path) for path, _ in lines), printed.out
        return {path: float(difference) for path, difference in lines}, printed.out

    return run


@pytest.fixture
def frozen_calls(monkeypatch):
    """The calls of the frozen (inference) plan from now on, as ``(module type, grad enabled, training)``:
    a spy wrapped around each module type's frozen implementation, which still computes."""
    import torch

    from rescale_core.plans.dispatch import FROZEN, Implementation, Planned

    calls: list[tuple[str, bool, bool]] = []

    def spy(impl: Implementation) -> Implementation:
        def run(module, x, *args, **kwargs):
            calls.append((type(module).__name__, torch.is_grad_enabled(), module.training))
            return impl.run(module, x, *args, **kwargs)
        return Implementation(run, impl.applies)

    classes = [Planned]
    while classes:
        cls = classes.pop()
        classes += cls.__subclasses__()
        impl = cls.__dict__.get("plan_implementations", {}).get(FROZEN)
        if impl is not None:
            monkeypatch.setattr(cls, "plan_implementations", {**cls.plan_implementations, FROZEN: spy(impl)})
    return calls


# ------------------------------------------------ mixed precision, eager and compiled (make bench-gpu)
class PrecisionRun(NamedTuple):
    device: str
    precision: str
    compiled: bool


def _precision_runs() -> list:
    """bf16 autocast on the CPU (here: the check of the check), then on a GPU bf16 and fp16 with
    gradient scaling (where a network without normalization overflows first), eager and compiled."""
    import torch

    on_gpu = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
    runs = [pytest.param(PrecisionRun("cpu", "bf16-mixed", False), id="cpu-bf16-eager")]
    for precision in ("bf16-mixed", "16-mixed"):
        for compiled in (False, True):
            name = f"cuda-{precision.split('-')[0]}-{'compiled' if compiled else 'eager'}"
            runs.append(pytest.param(PrecisionRun("cuda", precision, compiled), id=name, marks=on_gpu))
    return runs


def pytest_generate_tests(metafunc):
    """A test asking for ``precision_run`` runs once per :func:`_precision_runs` entry."""
    if "precision_run" in metafunc.fixturenames:
        metafunc.parametrize("precision_run", _precision_runs())


def _csv_log(metrics_csv: Path) -> dict[str, list[float]]:
    """Every number a CSV logger wrote, by column (train/ and val/ keys only)."""
    import csv

    logged: dict[str, list[float]] = {}
    with open(metrics_csv, newline="") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key.startswith(("train/", "val/")) and value != "":
                    logged.setdefault(key, []).append(float(value))
    return logged


@pytest.fixture
def fit_at_precision(precision_run, tmp_path):
    """``fit(args, steps, undefined=None, name="") -> logged``: ``rescale fit *args`` on ``precision_run``'s
    device, precision and compilation, logging every step to CSV. The run must end ``finished``
    after ``steps`` optimizer steps and at least one validation, with every logged training loss and
    validation number finite (NaN allowed for the validation keys matching the regular expression
    ``undefined``: a metric the data leaves undefined), finite weights in its checkpoint, and,
    compiled, at least one graph compiled. Returns what was logged, ``{key: [values]}``. ``name``
    tells apart the runs of one test (each in its own folder)."""
    import json
    import math
    import re

    import torch
    from torch._dynamo.utils import counters

    from rescale_tasks.cli import main
    from rescale_tasks.common.run import find_summaries, read_summary

    device, precision, compiled = precision_run

    def fit(args: list[str], steps: int, undefined: Optional[str] = None, name: str = "") -> dict[str, list[float]]:
        out = tmp_path / f"{device}-{precision}-{'compiled' if compiled else 'eager'}{name and '-' + name}"
        logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(out)}}
        torch._dynamo.reset()
        counters.clear()
        assert main(["fit", *args, "--trainer.accelerator", device, "--trainer.devices", "1",
                     "--trainer.precision", precision, "--model.init_args.compile", str(compiled).lower(),
                     "--trainer.default_root_dir", str(out), "--trainer.logger", json.dumps(logger),
                     "--trainer.log_every_n_steps", "1"]) == 0
        [summary] = [read_summary(path) for path in find_summaries(str(out))]
        assert summary["status"] == "finished" and summary["steps"] == steps, summary
        [metrics] = sorted(out.rglob("metrics.csv"))
        logged = _csv_log(metrics)
        losses = [v for key, values in logged.items() if key.startswith("train/loss") for v in values]
        assert len(losses) >= steps and all(math.isfinite(v) for v in losses), logged
        evaluated = {key: values for key, values in logged.items() if key.startswith("val/")}
        assert evaluated and all(math.isfinite(v) or (undefined and re.search(undefined, key) and math.isnan(v))
                                 for key, values in evaluated.items() for v in values), logged
        [ckpt] = sorted(out.rglob("last.ckpt")) or sorted(out.rglob("*.ckpt"))[-1:]
        state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
        if compiled:
            assert counters["stats"]["unique_graphs"] >= 1  # the network really ran compiled
        torch._dynamo.reset()
        return logged

    return fit
