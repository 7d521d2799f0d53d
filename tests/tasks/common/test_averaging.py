"""`rescale average-checkpoints` on the checkpoints of a real (tiny) run."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rescale_tasks.cli import main
from rescale_tasks.common.checkpointing import safe_load


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, run_config) -> Path:
    """Three epoch checkpoints (steps 2, 4, 6) and last.ckpt of a tiny digits run."""
    import os

    folder = tmp_path_factory.mktemp("avg")
    config = run_config(folder / "run.yaml", trainer={
        "max_epochs": 3, "default_root_dir": str(folder / "root"), "logger": None,
        "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                       "init_args": {"dirpath": str(folder / "ckpts"), "save_top_k": -1,
                                     "filename": "e{epoch}", "every_n_train_steps": 2}}]})  # own state key
    old = os.getcwd()
    os.chdir(folder)
    try:
        assert main(["fit", "--config", str(config)]) == 0
    finally:
        os.chdir(old)
    return folder / "ckpts"


def test_the_last_n_are_averaged_by_global_step(checkpoints, tmp_path, capsys):
    files = sorted(checkpoints.glob("e*.ckpt"))
    steps = {f.name: safe_load(f)["global_step"] for f in files}
    assert sorted(steps.values()) == [2, 4, 6]
    out = tmp_path / "avg.ckpt"
    assert main(["average-checkpoints", str(checkpoints), "--num", "2", "--output", str(out)]) == 0
    assert "global steps 4, 6" in capsys.readouterr().out
    averaged = safe_load(out)
    newest = [safe_load(f) for f in files if steps[f.name] in (4, 6)]
    for key, value in averaged["state_dict"].items():
        a, b = (c["state_dict"][key] for c in newest)
        if value.is_floating_point():
            torch.testing.assert_close(value, ((a.double() + b.double()) / 2).to(a.dtype))
        else:  # counters: the newest checkpoint's
            assert torch.equal(value, max(newest, key=lambda c: c["global_step"])["state_dict"][key])
    assert "optimizer_states" not in averaged and averaged["hyper_parameters"]["network"] == "cifar_resnet"


def test_averaging_refuses_what_cannot_be_averaged(checkpoints, tmp_path, capsys):
    assert main(["average-checkpoints", str(checkpoints), "--num", "9", "--output", str(tmp_path / "a.ckpt")]) == 2
    assert "--num 9: 3 checkpoint(s) at distinct steps found" in capsys.readouterr().err
    other = safe_load(next(checkpoints.glob("e*.ckpt")))
    other["state_dict"] = {k + "_x": v for k, v in other["state_dict"].items()}
    torch.save(other, tmp_path / "other.ckpt")
    assert main(["average-checkpoints", str(checkpoints), str(tmp_path / "other.ckpt"),
                 "--output", str(tmp_path / "b.ckpt")]) == 2
    assert "their parameters differ" in capsys.readouterr().err
