"""The export sidecar's ``preprocessing`` read off the evaluation transform itself: every step it
describes, and a step it cannot describe refused by name (never left out of the description)."""
from __future__ import annotations

import pytest
import torch
from torchvision.transforms import v2

from rescale_tasks.common.data import describe_transforms


def test_each_step_is_read_off_its_transform():
    transform = v2.Compose([v2.ToImage(), v2.Resize(36, antialias=True), v2.CenterCrop(32),
                            v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize((0.5,), (0.25,))]),
                            v2.ToPureTensor()])
    assert describe_transforms([transform]) == {
        "pixel_scale": 1 / 255, "resize": {"size": 36, "to": "shorter side", "interpolation": "bilinear",
                                           "antialias": True},
        "center_crop": 32, "mean": [0.5], "std": [0.25]}
    exact = describe_transforms([v2.Resize((20, 30), antialias=False, max_size=None), v2.CenterCrop((10, 12))])
    assert exact["resize"] == {"size": [20, 30], "to": "exact", "interpolation": "bilinear", "antialias": False}
    assert exact["center_crop"] == [10, 12] and exact["pixel_scale"] is None and exact["mean"] is None


@pytest.mark.parametrize("steps, named", [
    ([v2.Resize(36), v2.GaussianBlur(3)], "GaussianBlur in an evaluation transform"),
    ([v2.Normalize((0.5,), (0.2,)), v2.Normalize((0.1,), (0.3,))], "Normalize: a second mean"),
    ([v2.Resize(size=None, max_size=64)], r"Resize\(size=None, max_size=64\) in an evaluation transform: the "
                                          r"export's preprocessing does not describe it \(describe_transforms reads "
                                          r"Resize with a size: the shorter side or \[height, width\]\)$"),
])
def test_a_step_the_description_cannot_hold_is_refused_by_name(steps, named):
    with pytest.raises(TypeError, match=f"^{named}"):
        describe_transforms(steps)
