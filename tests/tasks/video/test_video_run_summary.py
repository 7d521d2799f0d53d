"""The run summary of the real video task over 4 epochs validating at epochs 2 and 4 holds both
validations, at their steps, with the multi-view accuracy the logger received (logged in the
module's ``on_validation_epoch_end``), not one validation at the previous step."""
from __future__ import annotations

import torch

from rescale_tasks.video.data import KineticsDataModule
from rescale_tasks.video.module import VideoClassificationModule


def test_both_validations_of_a_4_epoch_run_are_in_its_summary(kinetics_clips, tmp_path, fit_with_summary, same_curve):
    data = KineticsDataModule(root=str(kinetics_clips.root), preset=None, **kinetics_clips.tiny, val_clips=1,
                              val_crops=1, batch_size=3, eval_batch_size=3, num_workers=0, pin_memory=False,
                              persistent_workers=False)
    module = VideoClassificationModule("r3d_18", "rescale", network_options={"base_width": 4},
                                       num_classes=data.num_classes,
                                       optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
    run = fit_with_summary(tmp_path, module, data, max_epochs=4, check_val_every_n_epoch=2, limit_train_batches=1,
                           num_sanity_val_steps=0)
    s, logged = run["summary"], run["logged"]
    assert [step for step, _ in logged["val/acc1"]] == [2, 4]
    for key in ("val/acc1", "val/clip_acc1", "val/loss"):
        assert same_curve(s["curves"][key], logged[key]), (key, s["curves"][key], logged[key])
        assert s["final"][key] == s["curves"][key][-1][1]
    # throughput in clips: 4 steps of 3 clips, to the logger and the summary
    assert (s["throughput_unit"], s["samples"]) == ("clips", 12) and s["samples_per_second"] > 0
    assert s["final"]["throughput/run_clips_per_s"] == s["samples_per_second"]
