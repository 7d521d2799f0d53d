"""The Kinetics recipe's schedule is SlowFast's (SLOW_8x8_R50: SOLVER.WARMUP_EPOCHS 34,
WARMUP_START_LR 0.01 of BASE_LR 0.1, a cosine over MAX_EPOCH 196 from epoch 0)."""
from __future__ import annotations

from pathlib import Path

from rescale_tasks.common.cli.config_files import load_yaml

KINETICS = Path(__file__).resolve().parents[3] / "experiments" / "kinetics"


def test_the_kinetics_schedule_is_slowfasts():
    config = load_yaml((KINETICS / "_defaults.yaml").read_text())
    init = config["model"]["init_args"]
    assert init["lr_scheduler"]["class_path"].endswith("WarmupCosineLR")
    assert init["lr_scheduler"]["init_args"] == {"warmup_epochs": 34, "cosine_after_warmup": False,
                                                 "warmup_start_factor": 0.1}
    assert init["optimizer"]["init_args"]["lr"] == 0.1 and config["trainer"]["max_epochs"] == 196
