"""`rescale average-checkpoints` on the checkpoints of a real (tiny) run."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

import pytest
import torch

from rescale_tasks.cli import main
from rescale_tasks.common.checkpoints import safe_load


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, run_config) -> Path:
    """The checkpoints folder of a tiny digits run of 3 epochs x 3 steps saving every 2 steps, as
    the WMT recipe saves every 5000: s002, s004, s006, s008, and beside them the suite's epoch
    checkpoint and last.ckpt, both at step 9 (off that schedule, as a SIGTERM save would be)."""
    import os

    folder = tmp_path_factory.mktemp("avg")
    config = run_config(folder / "run.yaml", trainer={
        "max_epochs": 3, "limit_train_batches": 3, "default_root_dir": str(folder / "root"), "logger": False,
        "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                       "init_args": {"save_top_k": -1, "filename": "s{step:03d}", "auto_insert_metric_name": False,
                                     "every_n_train_steps": 2}}]})
    old = os.getcwd()
    os.chdir(folder)
    try:
        assert main(["fit", "--config", str(config)]) == 0
    finally:
        os.chdir(old)
    return folder / "root" / "checkpoints"


def _save(checkpoint: dict, path: Path, run_id: Optional[str] = None) -> Path:
    """Write ``checkpoint`` to ``path`` (its folders made), as a run logged to W&B as ``run_id`` would
    (its ResumeState records the id); None: as it is."""
    if run_id is not None:
        resume = {**checkpoint["callbacks"]["ResumeState"], "run_id": run_id}
        checkpoint = {**checkpoint, "callbacks": {**checkpoint["callbacks"], "ResumeState": resume}}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, path)
    return path


def _run_folder(checkpoints: Path, folder: Path, names=("s006.ckpt", "s008.ckpt")) -> Path:
    """A checkpoints folder of its own holding copies of ``names``."""
    folder.mkdir(parents=True)
    for name in names:
        shutil.copy(checkpoints / name, folder / name)
    return folder


def test_the_last_n_scheduled_are_averaged_by_global_step(checkpoints, tmp_path, capsys):
    files = sorted(checkpoints.glob("*.ckpt"))
    steps = {f.name: safe_load(f)["global_step"] for f in files}
    assert steps == {"s002.ckpt": 2, "s004.ckpt": 4, "s006.ckpt": 6, "s008.ckpt": 8, "epoch002.ckpt": 9,
                     "last.ckpt": 9}
    out = tmp_path / "avg.ckpt"
    assert main(["average-checkpoints", str(checkpoints), "--num", "2", "--output", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and "global steps 6, 8;" in printed[0], printed  # not step 9
    assert "epoch002.ckpt at step 9 (off the every-2-steps schedule)" in printed[0]
    assert "last.ckpt at step 9 (the resume point)" in printed[0]
    averaged = safe_load(out)
    newest = [safe_load(checkpoints / name) for name in ("s006.ckpt", "s008.ckpt")]
    for key, value in averaged["state_dict"].items():
        a, b = (c["state_dict"][key] for c in newest)
        if value.is_floating_point():
            torch.testing.assert_close(value, ((a.double() + b.double()) / 2).to(a.dtype))
        else:  # counters: the newest checkpoint's
            assert torch.equal(value, newest[1]["state_dict"][key])
    assert "optimizer_states" not in averaged and averaged["hyper_parameters"]["network"] == "cifar_resnet"
    # files named one by one are taken as they are
    assert main(["average-checkpoints", str(checkpoints / "s008.ckpt"), str(checkpoints / "last.ckpt"),
                 "--output", str(tmp_path / "named.ckpt")]) == 0
    assert "global steps 8, 9)" in capsys.readouterr().out


def test_averaging_refuses_what_cannot_be_averaged(checkpoints, tmp_path, capsys):
    assert main(["average-checkpoints", str(checkpoints), "--num", "9", "--output", str(tmp_path / "a.ckpt")]) == 2
    assert "--num 9: 4 checkpoint(s) at distinct steps found on the save schedule" in capsys.readouterr().err
    other = safe_load(next(checkpoints.glob("s*.ckpt")))
    other["state_dict"] = {k + "_x": v for k, v in other["state_dict"].items()}
    torch.save(other, tmp_path / "other.ckpt")
    assert main(["average-checkpoints", str(checkpoints), str(tmp_path / "other.ckpt"),
                 "--output", str(tmp_path / "b.ckpt")]) == 2
    assert "their parameters differ" in capsys.readouterr().err


def test_a_file_at_the_same_step_is_named_as_left_out(checkpoints, tmp_path, capsys):
    # epoch002.ckpt and last.ckpt both hold step 9: averaging both would count that state twice
    names = ("s006.ckpt", "epoch002.ckpt", "last.ckpt")
    assert main(["average-checkpoints", *(str(checkpoints / n) for n in names),
                 "--output", str(tmp_path / "avg.ckpt")]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == (f"averaged 2 checkpoints (global steps 6, 9; left out last.ckpt at step 9 (the same step as "
                       f"epoch002.ckpt)) -> {tmp_path / 'avg.ckpt'}")
    averaged = safe_load(tmp_path / "avg.ckpt")
    assert [(Path(x["path"]).name, x["global_step"]) for x in averaged["averaged_from"]] == [
        ("s006.ckpt", 6), ("epoch002.ckpt", 9)]


def test_checkpoints_of_other_labels_or_networks_are_not_averaged(checkpoints, tmp_path, error_line):
    """The same weights' shapes are not enough: outputs that mean other classes, or another
    scheme's forward pass, are refused in one line naming the two files."""
    newest = checkpoints / "s008.ckpt"
    digits = safe_load(checkpoints / "s006.ckpt")
    assert digits["labels"]["class_names"] == list("0123456789")  # recorded by every checkpoint
    other_order = {**digits, "labels": {"class_names": list("9876543210")}}
    torch.save(other_order, tmp_path / "other_labels.ckpt")
    assert main(["average-checkpoints", str(tmp_path / "other_labels.ckpt"), str(newest),
                 "--output", str(tmp_path / "a.ckpt")]) == 2
    assert error_line() == (
        f"cannot average {tmp_path / 'other_labels.ckpt'} with {newest}: their labels differ (other_labels.ckpt: "
        "10 labels '9', '8', '7' and 7 more; s008.ckpt: 10 labels '0', '1', '2' and 7 more), so the same outputs "
        "stand for other classes; average checkpoints of one run only")
    other_scheme = {**digits, "hyper_parameters": {**digits["hyper_parameters"], "scheme": "skipinit"}}
    torch.save(other_scheme, tmp_path / "skipinit.ckpt")
    assert main(["average-checkpoints", str(tmp_path / "skipinit.ckpt"), str(newest),
                 "--output", str(tmp_path / "b.ckpt")]) == 2
    assert error_line() == (f"cannot average {tmp_path / 'skipinit.ckpt'} with {newest}: they were saved from other "
                            "networks (scheme 'skipinit' in skipinit.ckpt, 'rescale' in s008.ckpt); average "
                            "checkpoints of one run only")
    # files of one name are told apart by their folders
    first = _save(other_scheme, tmp_path / "a" / "last.ckpt")
    second = _save(safe_load(newest), tmp_path / "b" / "last.ckpt")
    assert main(["average-checkpoints", str(first), str(second), "--output", str(tmp_path / "c.ckpt")]) == 2
    assert error_line() == (f"cannot average {first} with {second}: they were saved from other networks (scheme "
                            "'skipinit' in a/last.ckpt, 'rescale' in b/last.ckpt); average checkpoints of one run only")
    assert not any((tmp_path / name).exists() for name in ("a.ckpt", "b.ckpt", "c.ckpt"))


def test_checkpoints_of_other_runs_are_not_averaged(checkpoints, tmp_path, error_line, capsys):
    """Two runs of one config (other seeds) share network, labels and steps: the W&B run id every
    checkpoint records tells them apart, at one step as at others."""
    s006, s008 = (safe_load(checkpoints / name) for name in ("s006.ckpt", "s008.ckpt"))
    first = _save(s008, tmp_path / "id1" / "checkpoints" / "last.ckpt", run_id="id1")
    second = _save(s008, tmp_path / "id2" / "checkpoints" / "last.ckpt", run_id="id2")
    assert main(["average-checkpoints", str(first), str(second), "--output", str(tmp_path / "a.ckpt")]) == 2
    assert error_line() == (
        f"cannot average {first} with {second}: their W&B runs differ (id1/checkpoints/last.ckpt: run id1; "
        "id2/checkpoints/last.ckpt: run id2), so they are the weights of separate trainings (other seeds or "
        "settings); average checkpoints of one run only")
    older = _save(s006, tmp_path / "id2" / "checkpoints" / "s006.ckpt", run_id="id2")
    assert main(["average-checkpoints", str(first), str(older), "--output", str(tmp_path / "b.ckpt")]) == 2
    assert error_line().startswith(f"cannot average {older} with {first}: their W&B runs differ (s006.ckpt: run "
                                   "id2; last.ckpt: run id1)")
    assert not (tmp_path / "a.ckpt").exists() and not (tmp_path / "b.ckpt").exists()
    # a checkpoint that records no run (no W&B logger) is judged by the rest
    assert main(["average-checkpoints", str(checkpoints / "s006.ckpt"), str(first),
                 "--output", str(tmp_path / "c.ckpt")]) == 0
    assert "averaged 2 checkpoints (global steps 6, 8) -> " in capsys.readouterr().out


def test_files_at_one_step_are_one_state_only_of_one_run(checkpoints, tmp_path, error_line, capsys):
    """Two files at one step of one run hold one state: one is averaged, and the line names both
    apart. Without a run id to tell, other weights at one step are another run's: refused."""
    s008 = safe_load(checkpoints / "s008.ckpt")
    first = _save(s008, tmp_path / "a" / "last.ckpt", run_id="id1")
    second = _save(s008, tmp_path / "b" / "last.ckpt", run_id="id1")
    out = tmp_path / "avg.ckpt"
    assert main(["average-checkpoints", str(first), str(second), "--output", str(out)]) == 0
    assert capsys.readouterr().out.strip() == (f"averaged 1 checkpoint (global step 8; left out a/last.ckpt at step 8 "
                                               f"(the same step as b/last.ckpt)) -> {out}")
    state = {k: v + 1 if v.is_floating_point() else v for k, v in s008["state_dict"].items()}
    other = _save({**s008, "state_dict": state}, tmp_path / "other" / "last.ckpt")
    assert main(["average-checkpoints", str(checkpoints / "s008.ckpt"), str(other),
                 "--output", str(tmp_path / "b.ckpt")]) == 2
    assert error_line() == (f"cannot average {other} with {checkpoints / 's008.ckpt'}: both hold global step 8 but "
                            "other weights and record no W&B run id, so they are not one state of one run; average "
                            "checkpoints of one run only")


def test_an_average_is_not_averaged_again(checkpoints, tmp_path, error_line, capsys):
    """An average taken as a checkpoint would count its checkpoints' weights again: named, it is
    refused; beside the run's checkpoints, it is left out, and it can be written again."""
    folder = _run_folder(checkpoints, tmp_path / "checkpoints")
    average = folder / "avg.ckpt"
    assert main(["average-checkpoints", str(folder), "--output", str(average)]) == 0
    capsys.readouterr()
    assert main(["average-checkpoints", str(average), str(folder / "s006.ckpt"),
                 "--output", str(tmp_path / "again.ckpt")]) == 2
    assert error_line() == (f"cannot average {average}: it is an average of global steps 6, 8 (written by rescale "
                            "average-checkpoints), and taking it as one checkpoint counts those weights again; "
                            "average the run's own checkpoints instead")
    assert not (tmp_path / "again.ckpt").exists()
    assert main(["average-checkpoints", str(folder), "--output", str(tmp_path / "b.ckpt")]) == 0
    assert capsys.readouterr().out.strip() == (f"averaged 2 checkpoints (global steps 6, 8; left out avg.ckpt at step "
                                               f"8 (an average of global steps 6, 8)) -> {tmp_path / 'b.ckpt'}")
    assert main(["average-checkpoints", str(folder), "--num", "1", "--output", str(average)]) == 0
    assert capsys.readouterr().out.strip() == f"averaged 1 checkpoint (global step 8) -> {average}"
    assert [x["global_step"] for x in safe_load(average)["averaged_from"]] == [8]


def test_the_output_never_replaces_a_checkpoint(checkpoints, tmp_path, error_line):
    """``--output`` naming one of the run's checkpoints (or any file but an earlier average) is
    refused before anything is read: the weights saved at that step are kept."""
    folder = _run_folder(checkpoints, tmp_path / "checkpoints")
    target = folder / "s008.ckpt"
    saved = target.read_bytes()
    assert main(["average-checkpoints", str(folder), "--output", str(target)]) == 2
    assert error_line() == (f"--output {target} is a checkpoint at global step 8, not an average written by rescale "
                            "average-checkpoints: writing the average there would replace it; give --output a new "
                            "file name")
    assert target.read_bytes() == saved
    notes = tmp_path / "notes.txt"
    notes.write_text("BLEU 27.3\n")
    assert main(["average-checkpoints", str(folder), "--output", str(notes)]) == 2
    assert error_line() == (f"--output {notes} exists and is not a checkpoint: writing the average there would "
                            "replace it; give --output a new file name")
    assert notes.read_text() == "BLEU 27.3\n"


def test_an_output_that_cannot_be_written_is_one_line_about_the_output(checkpoints, tmp_path):
    """The disk fills as the average is written (here: a real process whose files may not grow past
    4 KB, so the write fails in the operating system as on a full disk): the line said
    "no checkpoint of this run had been written yet: free space and start again", as a training run's."""
    import os
    import resource
    import sys

    import forked

    out = tmp_path / "avg.ckpt"
    done = forked.run([sys.executable, "-m", "rescale_tasks.cli", "average-checkpoints", str(checkpoints / "s006.ckpt"),
                       str(checkpoints / "s008.ckpt"), "--output", str(out)], cwd=tmp_path,
                      env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300,
                      rlimits={"RLIMIT_FSIZE": (4096, resource.RLIM_INFINITY)})
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert errors[0] == (f"error: cannot write {out}: File too large ([Errno 27]); nothing was written (an earlier file "
                         "there is as it was): free space, or give --output a folder on another disk")
    assert list(tmp_path.iterdir()) == []


def test_weights_that_are_not_finite_are_not_averaged(checkpoints, tmp_path, error_line):
    """A checkpoint saved after its run diverged holds NaN weights: averaged in, it would make those
    of the average NaN (a network whose every output is NaN), so it is refused in one line."""
    folder = _run_folder(checkpoints, tmp_path / "run")
    diverged = safe_load(folder / "s008.ckpt")
    name = next(k for k, v in diverged["state_dict"].items() if v.is_floating_point())
    diverged["state_dict"][name] = torch.full_like(diverged["state_dict"][name], float("inf"))
    _save(diverged, folder / "s008.ckpt")
    out = tmp_path / "avg.ckpt"
    assert main(["average-checkpoints", str(folder), "--num", "2", "--output", str(out)]) == 2
    assert error_line() == (f"cannot average {folder / 's008.ckpt'} (global step 8): {name} holds NaN or infinite "
                            "values, weights saved after the run diverged, which would make those of the average NaN "
                            "too; name the checkpoints saved before the divergence one by one")
    assert not out.exists()
    assert main(["average-checkpoints", str(folder / "s006.ckpt"), "--output", str(out)]) == 0
