"""Clip index sampling (SlowFast-style, T frames at stride tau): exact arithmetic, uniform test
clips, reproducible training positions, and each short-video policy."""
from __future__ import annotations

import numpy as np
import pytest

from rescale_tasks.common.errors import ConfigError, DataError
from rescale_tasks.video.sampling import PRESETS, ShortVideo, clip_indices, preset


def test_presets():
    assert PRESETS == {"8x8": (8, 8), "16x4": (16, 4), "32x2": (32, 2)}
    assert preset("16x4") == (16, 4)
    with pytest.raises(ConfigError, match="8x8"):
        preset("4x16")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_train_clip_is_T_frames_at_stride_tau(name):
    T, tau = PRESETS[name]
    rng = np.random.default_rng(0)
    starts = set()
    for _ in range(200):
        idx = clip_indices(300, T, tau, "train", rng=rng)
        assert len(idx) == T and np.all(np.diff(idx) == tau)
        assert 0 <= idx[0] and idx[-1] <= 299
        starts.add(idx[0])
    span = (T - 1) * tau + 1
    assert min(starts) >= 0 and max(starts) <= 300 - span and len(starts) > 20  # random position


def test_exact_fit_and_known_values():
    assert clip_indices(57, 8, 8, "train", rng=0) == list(range(0, 57, 8))  # span (8-1)*8+1 = 57
    assert clip_indices(10, 1, 1, "test", clip_idx=0, num_clips=1) == [4]  # centre for one clip
    # 10 test clips of 8x8 in 120 frames: delta 63, starts round(i * 63 / 9) = 0, 7, ..., 63
    assert [clip_indices(120, 8, 8, "test", clip_idx=i)[0] for i in range(10)] == [7 * i for i in range(10)]


def test_seeded_train_positions_are_reproducible():
    a = [clip_indices(500, 16, 4, "train", rng=np.random.default_rng(7)) for _ in range(3)]
    b = [clip_indices(500, 16, 4, "train", rng=7) for _ in range(3)]
    assert a == b
    g1, g2 = np.random.default_rng(3), np.random.default_rng(3)
    assert [clip_indices(500, 16, 4, rng=g1) for _ in range(5)] == [clip_indices(500, 16, 4, rng=g2) for _ in range(5)]


@pytest.mark.parametrize("num_frames,K", [(300, 10), (64, 10), (1000, 3), (250, 1)])
def test_test_clips_cover_the_video_uniformly(num_frames, K):
    T, tau = 8, 8
    starts = [clip_indices(num_frames, T, tau, "test", clip_idx=i, num_clips=K)[0] for i in range(K)]
    delta = num_frames - ((T - 1) * tau + 1)
    if K > 1:
        assert starts[0] == 0 and starts[-1] == delta  # first clip at the start, last at the end
        gaps = np.diff(starts)
        assert gaps.max() - gaps.min() <= 1  # evenly spaced up to rounding
    else:
        assert starts == [delta // 2]
    assert starts == sorted(starts)


def test_short_video_loop_wraps_around():
    idx = clip_indices(20, 8, 4, "train", rng=0, short="loop")  # span 29 > 20
    start = idx[0]
    assert idx == [(start + 4 * k) % 20 for k in range(8)]
    tests = [clip_indices(20, 8, 4, "test", clip_idx=i, num_clips=4, short="loop") for i in range(4)]
    assert [t[0] for t in tests] == [0, 5, 10, 15]  # uniform around the loop
    assert tests[1] == [(5 + 4 * k) % 20 for k in range(8)]


def test_short_video_repeat_last_pads_with_the_last_frame():
    assert clip_indices(10, 8, 2, "train", rng=0, short="repeat_last") == [0, 2, 4, 6, 8, 9, 9, 9]
    assert clip_indices(10, 8, 2, "test", clip_idx=3, short="repeat_last") == [0, 2, 4, 6, 8, 9, 9, 9]


def test_short_video_skip_raises_a_countable_signal():
    with pytest.raises(ShortVideo) as err:
        clip_indices(56, 8, 8, "train", rng=0, short="skip")  # one frame short of 57
    assert isinstance(err.value, DataError) and err.value.kind == "short"
    assert err.value.num_frames == 56 and err.value.needed == 57
    with pytest.raises(ShortVideo):
        clip_indices(0, 8, 8, "train", rng=0, short="loop")  # nothing to loop over


def test_bad_arguments():
    with pytest.raises(ValueError):
        clip_indices(100, 8, 8, "test")  # no clip_idx
    with pytest.raises(ValueError):
        clip_indices(100, 8, 8, "test", clip_idx=10, num_clips=10)
    with pytest.raises(ValueError):
        clip_indices(100, 8, 8, "val")
    with pytest.raises(ValueError):
        clip_indices(100, 8, 8, short="pad")
