"""The Kinetics data module's fingerprint (run_summary.json's ``data``): per split its videos and a
hash of their paths under the root and sizes; the same for a copy elsewhere, another without a video."""
from __future__ import annotations

import shutil

from rescale_tasks.video.data import KineticsDataModule


def _fingerprint(k, **layout) -> dict:
    dm = KineticsDataModule(preset=None, **k.tiny, num_workers=0, **layout)
    dm.setup("fit")
    return dm.data_fingerprint()


def test_the_fingerprint_follows_the_videos_not_the_folder(kinetics_clips, tmp_path):
    k = kinetics_clips
    found = _fingerprint(k, root=str(k.root))
    assert found["class"] == "KineticsDataModule" and found["root"] == str(k.root)
    assert found["splits"]["train"]["count"] == len(k.train) and found["splits"]["val"]["count"] == len(k.val)
    assert all(len(s["hash"]) == 12 for s in found["splits"].values())
    copy = tmp_path / "copy"
    shutil.copytree(k.root, copy)
    assert _fingerprint(k, root=str(copy))["splits"] == found["splits"]
    next((copy / "val").glob("*/*")).unlink()
    fewer = _fingerprint(k, root=str(copy))["splits"]
    assert fewer["val"]["count"] == len(k.val) - 1 and fewer["val"]["hash"] != found["splits"]["val"]["hash"]
    assert fewer["train"] == found["splits"]["train"]
    cvdf = _fingerprint(k, layout="cvdf", root=None, train_csv=str(k.train_csv), val_csv=str(k.val_csv),
                        video_dir=str(k.video_dir))
    assert cvdf["root"] == str(k.video_dir) and cvdf["splits"]["train"]["count"] == len(k.train)
