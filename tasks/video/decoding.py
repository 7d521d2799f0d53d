"""Video decoding behind one small interface, opened lazily in the process that reads.

Three facts shape this module (measured: ``docs/design.md``, "Video decoding"):

* torchvision 0.29 has no video reader any more; PyAV (``av``) bundles FFmpeg and needs nothing
  installed system-wide, so it is the default. torchcodec is optional: it loads only when the
  system's FFmpeg shared libraries are present.
* A decoder (an open FFmpeg context) created in the DataLoader's parent process breaks in forked
  and spawned workers. So a decoder object holds only its path until first use, opens the file in
  the process that calls it, remembers that process id, and re-opens after a fork. Pickling
  (spawn) drops the open handle.
* Headers lie: some files report more frames than they decode, some report 0. The frame count is
  therefore never taken from the header (``stream.frames``): :class:`PyAVDecoder` builds its own
  index of the file once (demuxing every video packet, which reads the bytes but decodes nothing)
  and counts the frames there. Files whose packets carry no timestamps fall back to a full
  decode-count.

Exact seeking (:meth:`VideoDecoder.get_frames`): frame ``i`` is the ``i``-th frame in
presentation order, identified by its presentation timestamp (pts) from the index. To fetch a set
of indices the decoder seeks to the last keyframe at or before the earliest wanted frame, decodes
forward and keeps the frames whose pts is wanted; it seeks again only when a later keyframe lies
between the current position and the next wanted frame (so sparse-keyframe files stay exact, and
dense ones are not decoded needlessly). This differs from SlowFast's ``decoder.pyav_decode``,
which seeks by *time* with a margin and then keeps whatever frames fall in a time window (not
guaranteed to be the frames asked for, and it decodes whole videos when the clip is long).
Timestamps are checked as frames come (consecutive indices after a seek): files whose decoded
frames carry out-of-order stamps (B-frames in AVI, ``docs/design.md``) are indexed by one full decode
instead (:class:`PyAVDecoder`), and what that decode meets is audited as ``prepare-video`` audits
every source (:class:`DecodeAudit`): one definition of a damaged stream.

Display rotation: phones store portrait clips as landscape pixels plus a display matrix (FFmpeg's
``DISPLAYMATRIX`` side data, from the MP4/MOV track header or the Matroska projection) saying how
to turn them. :class:`PyAVDecoder` gives every frame as FFmpeg's ``autorotate`` shows it
(:func:`display_steps`: quarter turns and mirrorings; an angle that is no multiple of 90 degrees is
left unapplied, with one warning per file). The torchcodec backend gives the stored pixels;
``rescale prepare-video`` writes upright pixels, which both backends read alike.

Errors are one line, a :class:`VideoDataError` (a ``rescale_tasks.common.errors.DataError``) that
names the file and a ``kind`` the dataset can count: ``"unreadable"``, ``"no video stream"``,
``"empty"``.

Over 500 lines, kept as one module: most of it is :class:`PyAVDecoder`'s exact seeking and the parts
only it uses (its index, the lookahead that catches out-of-order stamps), and :func:`make_decoder`
needs both decoders beside the interface and the errors they share.
"""
from __future__ import annotations

import abc
import bisect
import collections
import contextlib
import functools
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from rescale_tasks.common.errors import ConfigError, DataError

__all__ = [
    "BACKENDS", "BackendUnavailable", "DecodeAudit", "PyAVDecoder", "TorchCodecDecoder", "VideoDataError",
    "VideoDecoder",
    "Step", "display_matrix", "display_rotation", "display_steps", "make_decoder", "upright", "upright_steps",
]

log = logging.getLogger(__name__)

BACKENDS = ("pyav", "torchcodec")


class VideoDataError(DataError):
    """A video that cannot be used, as one line: ``<path>: <kind>: <detail>``.

    ``kind`` is a short fixed string (``"unreadable"``, ``"no video stream"``, ``"empty"``, and
    ``"short"`` from :mod:`~rescale_tasks.video.sampling`) so a dataset can count skipped videos by
    kind and report them at epoch end.
    """

    def __init__(self, path: str | os.PathLike, kind: str, detail: str = "") -> None:
        self.path = str(path)
        self.kind = kind
        self.detail = " ".join(str(detail).split())  # one line, whatever FFmpeg said
        super().__init__(f"{self.path}: {kind}" + (f": {self.detail}" if self.detail else ""))


class BackendUnavailable(ConfigError):
    """A decoding backend that cannot be used on this machine (one line, suggests PyAV)."""


class VideoDecoder(abc.ABC):
    """One video file. Cheap to construct and to pickle: nothing is opened until first use.

    Subclasses implement :meth:`_open`, :meth:`_count` and :meth:`_decode`; this base class keeps
    the fork-safety (open lazily, per process id) and the argument checks in one place.
    """

    backend: str = ""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        self._handle: Any = None
        self._pid: int | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        """Open the file in *this* process (re-opening after a fork; a no-op when already open)."""
        pid = os.getpid()
        if self._handle is not None and self._pid == pid:
            return
        # After a fork the inherited handle shares FFmpeg state with the parent: never reuse or
        # close it here, just forget it and open our own.
        self._handle = None
        if not Path(self.path).is_file():
            raise VideoDataError(self.path, "unreadable", "no such file")
        self._handle = self._open()
        self._pid = pid

    def close(self) -> None:
        """Close the handle if this process opened it."""
        if self._handle is not None and self._pid == os.getpid():
            self._close(self._handle)
        self._handle = None
        self._pid = None

    def __getstate__(self) -> dict:
        # Spawned workers receive a pickled copy: send the path and any cached index, no handle.
        state = self.__dict__.copy()
        state["_handle"] = None
        state["_pid"] = None
        return state

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"

    # --- public API ------------------------------------------------------------------------
    @property
    def num_frames(self) -> int:
        """Frames in the file, counted from the file itself (never the header's claim)."""
        self.open()
        return self._count()

    @property
    def fps(self) -> float:
        """Average frames per second (from the stream's average rate, else from the timestamps)."""
        self.open()
        return self._fps()

    def get_frames(self, indices: Sequence[int]) -> torch.Tensor:
        """The frames at ``indices`` (presentation order, 0-based; repeats and any order allowed)
        as a ``uint8`` tensor ``[T, H, W, C]`` (RGB), in the order asked for; PyAV turns them as the
        file's display matrix says (:func:`upright_steps`)."""
        idx = [int(i) for i in indices]
        if not idx:
            raise ValueError("get_frames needs at least one index")
        n = self.num_frames
        bad = [i for i in idx if not 0 <= i < n]
        if bad:
            raise IndexError(f"{self.path}: frame index {bad[0]} outside [0, {n}) ({len(bad)} out of range)")
        wanted = sorted(set(idx))
        decoded = self._decode(wanted)  # {index: HxWxC uint8 array}
        return torch.from_numpy(np.stack([decoded[i] for i in idx]))

    # --- backend hooks ---------------------------------------------------------------------
    @abc.abstractmethod
    def _open(self) -> Any: ...

    def _close(self, handle: Any) -> None:
        pass

    @abc.abstractmethod
    def _count(self) -> int: ...

    @abc.abstractmethod
    def _fps(self) -> float: ...

    @abc.abstractmethod
    def _decode(self, wanted: list[int]) -> dict[int, np.ndarray]: ...


#: one step that brings a picture upright: an FFmpeg filter and its argument
Step = tuple[str, str | None]
#: the steps FFmpeg's autorotate uses, on ``[H, W, C]`` arrays (views, no copy)
_ARRAY_STEPS = {
    ("transpose", "clock"): lambda a: np.rot90(a, -1),
    ("transpose", "cclock"): lambda a: np.rot90(a, 1),
    ("transpose", "cclock_flip"): lambda a: a.transpose(1, 0, 2),  # a quarter turn counterclockwise, then vflip
    ("transpose", "clock_flip"): lambda a: a[::-1, ::-1].transpose(1, 0, 2),  # clockwise, then vflip
    ("hflip", None): lambda a: a[:, ::-1],
    ("vflip", None): lambda a: a[::-1],
}
_odd_angles_warned: set[str] = set()  # files whose display angle was left unapplied, warned in this process


def display_matrix(frame: Any) -> bytes | None:
    """The decoded PyAV ``frame``'s display matrix (nine native ``int32``, FFmpeg's layout), or None.

    Read through a side-data container of its own: ``frame.side_data`` would tie the frame into a
    reference cycle that only the garbage collector frees, maybe in a forked DataLoader worker,
    where freeing the frame's swscale context waits for threads that exist only in the parent.
    """
    from av.sidedata.sidedata import SideDataContainer

    side = SideDataContainer(frame).get("DISPLAYMATRIX")
    return bytes(side) if side is not None else None


def display_rotation(matrix: bytes) -> float | None:
    """The angle (degrees, counterclockwise) by which ``matrix`` turns the picture, as FFmpeg's
    ``av_display_rotation_get`` and ffprobe give it; None for a singular matrix."""
    m = np.frombuffer(matrix, dtype=np.int32)[:5].astype(np.float64) / 65536  # a, b, u, c, d in 16.16
    scale_x, scale_y = math.hypot(m[0], m[3]), math.hypot(m[1], m[4])
    if not scale_x or not scale_y:
        return None
    return -math.degrees(math.atan2(m[1] / scale_y, m[0] / scale_x))


@functools.lru_cache(maxsize=64)
def display_steps(matrix: bytes | None) -> tuple[Step, ...] | None:
    """The filters FFmpeg's ``autorotate`` inserts for ``matrix`` (``ffmpeg`` and ``ffplay`` alike):
    ``()`` when the picture is upright already, None for an angle that is no multiple of 90 degrees
    (FFmpeg turns those inside the frame, cutting its corners)."""
    rotation = None if matrix is None else display_rotation(matrix)
    if rotation is None:
        return ()
    m = np.frombuffer(matrix, dtype=np.int32)
    # FFmpeg's get_rotation: the clockwise angle that brings the picture upright, in [0, 360)
    theta = -float(round(rotation))
    theta -= 360 * math.floor(theta / 360 + 0.9 / 360)
    if abs(theta - 90) < 1:
        return (("transpose", "cclock_flip" if m[3] > 0 else "clock"),)
    if abs(theta - 180) < 1:
        return tuple(step for step, flip in ((("hflip", None), m[0] < 0), (("vflip", None), m[4] < 0)) if flip)
    if abs(theta - 270) < 1:
        return (("transpose", "clock_flip" if m[3] < 0 else "cclock"),)
    if abs(theta) > 1:
        return None
    return (("vflip", None),) if m[4] < 0 else ()


def upright_steps(frame: Any, path: str) -> tuple[Step, ...]:
    """The steps that turn the frames of the stream of the decoded PyAV ``frame`` (of the file at
    ``path``) as its display matrix says (:func:`display_steps`); an angle that is no multiple of
    90 degrees is left unapplied (``()``) and warned about once per file."""
    matrix = display_matrix(frame)
    steps = display_steps(matrix)
    if steps is not None:
        return steps
    if path not in _odd_angles_warned:
        _odd_angles_warned.add(path)
        log.warning("%s: display rotation of %.0f degrees is no multiple of 90; its frames are used as "
                    "stored (FFmpeg would turn them within the frame, cutting its corners)", path,
                    display_rotation(matrix))
    return ()


def upright(rgb: np.ndarray, steps: tuple[Step, ...]) -> np.ndarray:
    """``rgb`` ``[H, W, C]`` turned by ``steps`` (:func:`display_steps`; a view, no copy)."""
    for step in steps:
        rgb = _ARRAY_STEPS[step](rgb)
    return rgb


#: frames a decoder may hold back and emit in another order (the B-frame depth; H.264 allows 16)
REORDER_WINDOW = 16
#: indices learned by a full decode, kept per process for the files' next decoders (a data set
#: opens a decoder per item), by (path, size, mtime); a few hundred small lists of ints
DECODED_INDEX_CACHE = 512
_decoded_indices: "collections.OrderedDict[tuple, _Index]" = collections.OrderedDict()


class _OutOfOrder(Exception):
    """Decoded frames carry timestamps that are not in presentation order, or a decoding error cut
    the check short (see :class:`PyAVDecoder`): only a full decode can tell where the frames are."""


@dataclass(frozen=True)
class _Index:
    """Where every frame is: frame ``i`` (presentation order) carries the timestamp ``stamps[i]``.

    From one demux pass the stamps are the packets' pts, sorted. When the decoder turns out to emit
    frames whose stamps are not in that order (``decoded``), they are the stamps read off one full
    decode, in the order the frames came out.
    """

    stamps: list[int]
    key_pos: list[int]  # frame index of each keyframe to seek to, ascending
    key_dts: list[int]  # their decode timestamps (what the demuxer's seek index is keyed on)
    by_pts: bool  # False: no usable timestamps, frames are addressed by decode count
    decoded: bool = False

    @functools.cached_property
    def position(self) -> dict[int, int]:
        """Frame index by stamp."""
        return {stamp: i for i, stamp in enumerate(self.stamps)}


class _Lookahead:
    """An iterator over decoded frames that can peek ahead without losing what it peeked at.

    A decoding error met while peeking is raised when the iteration reaches it, not earlier."""

    def __init__(self, frames: Iterator) -> None:
        self._frames, self._buffer, self._error = frames, collections.deque(), None

    def __iter__(self) -> "_Lookahead":
        return self

    def __next__(self):
        if self._buffer:
            return self._buffer.popleft()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return next(self._frames)

    @property
    def failed(self) -> bool:
        """Whether peeking met a decoding error (raised once the iteration reaches it)."""
        return self._error is not None

    def peek(self, count: int) -> list:
        while len(self._buffer) < count and self._error is None:
            try:
                self._buffer.append(next(self._frames))
            except StopIteration:
                break
            except VideoDataError as exc:
                self._error = exc
        return list(self._buffer)[:count]


class DecodeAudit:
    """What a decode of a whole stream from its start meets: the frames it gives, the errors FFmpeg
    reports on the way (damage it conceals logs an error and still gives a frame; lost data gives
    no frame at all) and an exception that ends it early.

    The one definition of a damaged stream, shared by training (the index of a file whose frames
    come out of order is such a decode, see :class:`PyAVDecoder`) and by ``rescale prepare-video``
    (which decodes every source from its start): :meth:`problem` is the same one-line detail for
    both, under the kind ``"unreadable"``. ``expected``: the frames the file holds (the decoder's
    index: its video packets; None: not checked).

        audit = DecodeAudit(expected)
        for frame in audit.count(container.decode(stream)): ...
        audit.problem()  # None, or "damaged stream: ..."

    FFmpeg's error messages reach Python only while PyAV's log level admits them: while the
    decoder works on the next frame (only then, so an encoder fed in between is not heard) the
    level is at least ``ERROR`` and the messages of every thread are captured (frame threads log
    from their own); the previous settings are restored in between.
    """

    def __init__(self, expected: int | None = None) -> None:
        self.expected = expected
        self.frames = 0
        self.errors: list[str] = []  # "component: message", one per error FFmpeg reported
        self.failure: str | None = None  # the exception that ended the decode early

    @contextlib.contextmanager
    def _listening(self) -> Iterator[None]:
        import av.logging

        level, skip_repeated = av.logging.get_level(), av.logging.get_skip_repeated()
        if level is None or level < av.logging.ERROR:
            av.logging.set_level(av.logging.ERROR)
        av.logging.set_skip_repeated(False)  # PyAV folds a repeat into the next message, maybe another decode's
        try:
            with av.logging.Capture(local=False) as logs:
                yield
        finally:
            av.logging.set_skip_repeated(skip_repeated)
            if av.logging.get_level() != level:
                av.logging.set_level(level)
            self.errors += [f"{name}: {message.strip()}" if name else message.strip()
                            for lib_level, name, message in logs if lib_level <= av.logging.ERROR]

    def count(self, frames: Iterable) -> Iterator:
        """``frames``, counted; an exception ends them and is recorded, not raised."""
        iterator = iter(frames)
        while True:
            with self._listening():
                try:
                    frame = next(iterator)
                except StopIteration:
                    return
                except Exception as exc:  # av.error.InvalidDataError ... : the stream ends here
                    self.failure = " ".join(f"{type(exc).__name__}: {exc}".split())
                    return
            self.frames += 1
            yield frame

    def problem(self) -> str | None:
        """One line saying how the stream is damaged, or None when it decoded cleanly."""
        parts = []
        if self.expected is not None and self.frames < self.expected:
            parts.append(f"{self.expected - self.frames} of its {self.expected} frames could not be decoded")
        if self.failure is not None:
            parts.append(f"decoding stopped after frame {self.frames} ({self.failure})")
        if self.errors:
            parts.append(f"{len(self.errors)} decoding error(s), the first: {self.errors[0]}")
        return "damaged stream: " + "; ".join(parts) if parts else None


class PyAVDecoder(VideoDecoder):
    """PyAV (FFmpeg bundled in the ``av`` wheel) decoder with exact, keyframe-aware seeking.

    Frame ``i`` is the ``i``-th frame the decoder gives from the start of the stream (presentation
    order). It is found by the timestamp it carries: the demux index sorts the packets' pts, which
    is right wherever the pts are presentation times (MP4, MKV, most AVIs). Some files carry other
    stamps: AVI stores no pts, and H.264 or packed MPEG-4 Part 2 B-frames in AVI come out of the
    decoder in presentation order with stamps such as 1, 3, 4, 2, 6, 7, 5 ... (``docs/design.md``,
    "Video decoding"). Every decode checks that the frames after a seek carry consecutive indices;
    when a later frame holds a stamp the sequence skipped (within :data:`REORDER_WINDOW` frames),
    the stamps are not presentation times, and the index is rebuilt from one full decode (the stamps
    in the order the frames came out, :class:`DecodeAudit`: a damaged stream is unreadable, as in
    ``prepare-video``; kept for the file's next decoders in this process); so is it when a decoding
    error cuts that look ahead short. A frame whose stamp never comes is missing: ``frame X (pts Y)
    could not be decoded`` names its index and the stamp it should carry.

    ``threads``: FFmpeg decoding threads per decoder. The default 1 suits DataLoader workers
    (parallelism comes from the workers; extra threads would oversubscribe the cores).
    """

    backend = "pyav"

    def __init__(self, path: str | os.PathLike, threads: int = 1) -> None:
        super().__init__(path)
        self.threads = int(threads)
        self._index: _Index | None = None  # pure data, survives fork and pickling
        self._steps: tuple[Step, ...] | None = None  # how to turn the frames upright, from the first one decoded

    def _open(self) -> Any:
        import av

        try:
            container = av.open(self.path, mode="r")
        except Exception as exc:  # av.error.InvalidDataError, OSError, ... : one line, one kind
            raise VideoDataError(self.path, "unreadable", f"{type(exc).__name__}: {exc}") from None
        if not container.streams.video:
            container.close()
            raise VideoDataError(self.path, "no video stream")
        # Set before the codec opens (PyAV refuses to change it afterwards).
        container.streams.video[0].thread_count = self.threads
        return container

    def _close(self, handle: Any) -> None:
        handle.close()

    def _stream(self) -> Any:
        return self._handle.streams.video[0]

    def _rewind(self) -> None:
        try:
            self._handle.seek(0, stream=self._stream(), backward=True, any_frame=False)
        except Exception:
            pass  # a file that cannot seek is still read from the start

    # The index: one demux pass (no decoding). Packets flagged "discard" (e.g. frames an MP4 edit
    # list cuts) are left out because FFmpeg's decoder drops them too; packets without data are
    # flush markers. If any packet lacks a pts the file is indexed by a full decode instead.
    def _build_index(self) -> _Index:
        container = self._handle
        stream = self._stream()
        pts: list[int] = []
        keys: list[tuple[int, int]] = []
        self._rewind()
        by_pts = True
        try:
            for packet in container.demux(stream):
                if packet.size == 0 or packet.is_discard:
                    continue
                if packet.pts is None:
                    by_pts = False
                    break
                pts.append(packet.pts)
                if packet.is_keyframe:
                    keys.append((packet.pts, packet.dts if packet.dts is not None else packet.pts))
        except EOFError:
            pass  # the container ended (an empty stream ends like this): counted below
        except Exception as exc:
            if not pts:
                raise VideoDataError(self.path, "unreadable", f"{type(exc).__name__}: {exc}") from None
            # A truncated tail: keep what was demuxed; frames past it do not exist.
        if not by_pts:
            return self._decode_count_index()
        if not pts:
            raise VideoDataError(self.path, "empty", "no video frames in the file")
        if not keys:
            raise VideoDataError(self.path, "unreadable", "no keyframe in the video stream")
        pts.sort()
        keys.sort()
        return _Index(stamps=pts, key_pos=[bisect.bisect_left(pts, k) for k, _ in keys],
                      key_dts=[d for _, d in keys], by_pts=True)

    def _decode_count_index(self) -> _Index:
        """Fallback for files without packet timestamps: decode everything once and count."""
        self._rewind()
        count = 0
        try:
            for _ in self._handle.decode(self._stream()):
                count += 1
        except Exception as exc:
            if count == 0:
                raise VideoDataError(self.path, "unreadable", f"{type(exc).__name__}: {exc}") from None
        if count == 0:
            raise VideoDataError(self.path, "empty", "no decodable video frames")
        return _Index(stamps=list(range(count)), key_pos=[0], key_dts=[0], by_pts=False)

    def _decoded_index(self, index: _Index) -> _Index:
        """The index of a file whose frames come out of order: their stamps in the order one full
        decode gives them; the file's frame count stays the demux index's (frames it cannot give
        make it a damaged stream, ``unreadable``)."""
        audit = DecodeAudit(len(index.stamps))
        self._rewind()
        stamps = [frame.pts for frame in audit.count(self._handle.decode(self._stream()))]
        problem = audit.problem()
        if problem:
            raise VideoDataError(self.path, "unreadable", problem)
        key_dts = {index.stamps[p]: d for p, d in zip(index.key_pos, index.key_dts)}
        if None in stamps or len(set(stamps)) != len(stamps) or stamps[0] not in key_dts:
            # stamps that cannot name a frame: address frames by decode count from the start
            return _Index(stamps=list(range(len(stamps))), key_pos=[0], key_dts=[0], by_pts=False)
        keys = sorted((i, key_dts[s]) for i, s in enumerate(stamps) if s in key_dts)
        return _Index(stamps=stamps, key_pos=[i for i, _ in keys], key_dts=[d for _, d in keys], by_pts=True,
                      decoded=True)

    def _file_key(self) -> tuple:
        stat = os.stat(self.path)
        return self.path, stat.st_size, stat.st_mtime_ns

    def _ensure_index(self) -> _Index:
        if self._index is None:
            key = self._file_key()
            if key in _decoded_indices:  # learned by an earlier decoder of this file
                _decoded_indices.move_to_end(key)
                self._index = _decoded_indices[key]
            else:
                self._index = self._build_index()
        return self._index

    def _count(self) -> int:
        return len(self._ensure_index().stamps)

    def _fps(self) -> float:
        stream = self._stream()
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        if rate:
            return float(rate)
        index = self._ensure_index()  # no rate in the header: estimate from the timestamps
        if index.by_pts and len(index.stamps) > 1 and stream.time_base:
            span = max(index.stamps) - min(index.stamps)
            return (len(index.stamps) - 1) / float(span * stream.time_base) if span else 0.0
        return 0.0

    def _decode(self, wanted: list[int]) -> dict[int, np.ndarray]:
        index = self._ensure_index()
        if not index.by_pts:
            return self._decode_sequential(wanted)
        try:
            return self._decode_by_stamp(index, wanted)
        except _OutOfOrder:
            if index.decoded:  # the decoder gave another order this time: count from the start
                self._index = _Index(stamps=list(range(len(index.stamps))), key_pos=[0], key_dts=[0], by_pts=False)
            else:
                self._index = _decoded_indices[self._file_key()] = self._decoded_index(index)
                while len(_decoded_indices) > DECODED_INDEX_CACHE:
                    _decoded_indices.popitem(last=False)
            return self._decode(wanted)

    def _decode_by_stamp(self, index: _Index, wanted: list[int]) -> dict[int, np.ndarray]:
        """Seek to the keyframe before the first wanted frame, decode forward, keep the wanted ones;
        seek again only when a keyframe lies between the decoder and the next wanted frame (so
        sparse-keyframe files stay exact and dense ones are not decoded needlessly). Raises
        :class:`_OutOfOrder` when the frames' stamps are not in presentation order."""
        stream = self._stream()
        position = index.position
        todo = list(wanted)  # ascending, still missing
        out: dict[int, np.ndarray] = {}
        frames: _Lookahead | None = None
        last: int | None = None  # index of the last frame the decoder gave since the seek
        back = 0  # extra keyframes stepped back for the current target (a seek that landed late)
        while todo:
            k = max(bisect.bisect_right(index.key_pos, todo[0]) - 1 - back, 0)
            # Seek when not decoding yet, or when a keyframe lies between where the decoder is and
            # the next wanted frame (decoding from it is never slower than going on).
            if frames is None or last is None or index.key_pos[k] > last:
                # Seek by the keyframe's dts: the MP4 seek index is keyed on decode time, and a
                # seek by pts can land on a *later* keyframe when B-frames shift pts.
                self._handle.seek(index.key_dts[k], stream=stream, backward=True, any_frame=False)
                frames = _Lookahead(self._frames(stream))
                last = None
            missed = False
            for frame in frames:
                at = position.get(frame.pts)
                if at is None:
                    continue
                if last is not None:
                    if at <= last:
                        raise _OutOfOrder  # presentation order went backwards
                    if at > last + 1 and (any(position.get(f.pts, at) < at for f in frames.peek(REORDER_WINDOW))
                                          or frames.failed):
                        raise _OutOfOrder  # a frame the sequence skipped comes later, or may have
                last = at
                if at < todo[0]:
                    continue
                if at > todo[0]:
                    missed = True  # the decoder went past a wanted frame without giving it
                    break
                out[at] = self._rgb(frame)
                todo.pop(0)
                back = 0
                if not todo:
                    break
                if index.key_pos[bisect.bisect_right(index.key_pos, todo[0]) - 1] > at:
                    break  # a keyframe closer to the next wanted frame: seek there
            else:
                missed = bool(todo)  # the file ended first
            if missed:
                if k == 0:
                    raise VideoDataError(self.path, "unreadable",
                                         f"frame {todo[0]} (pts {index.stamps[todo[0]]}) could not be decoded")
                back += 1  # retry from an earlier keyframe
                frames = None
        return out

    def _rgb(self, frame: Any) -> np.ndarray:
        """``frame`` as RGB ``[H, W, 3]``, turned as the stream's display matrix says (:func:`upright_steps`)."""
        if self._steps is None:
            self._steps = upright_steps(frame, self.path)
        return upright(frame.to_ndarray(format="rgb24"), self._steps)

    def _frames(self, stream: Any):
        try:
            yield from self._handle.decode(stream)
        except Exception as exc:  # corrupt data mid-stream
            raise VideoDataError(self.path, "unreadable", f"{type(exc).__name__}: {exc}") from None

    def _decode_sequential(self, wanted: list[int]) -> dict[int, np.ndarray]:
        """No usable timestamps: decode from the start and pick frames by their decode count."""
        self._rewind()
        want = set(wanted)
        out: dict[int, np.ndarray] = {}
        for i, frame in enumerate(self._frames(self._stream())):
            if i in want:
                out[i] = self._rgb(frame)
                if len(out) == len(want):
                    break
        if len(out) != len(want):
            missing = min(want - set(out))
            raise VideoDataError(self.path, "unreadable", f"frame {missing} could not be decoded")
        return out


class TorchCodecDecoder(VideoDecoder):
    """torchcodec's ``VideoDecoder`` (``seek_mode="exact"``: it scans the file once for an exact
    frame index, as :class:`PyAVDecoder` does). Optional: needs ``torchcodec`` and the system's
    FFmpeg shared libraries. Constructing it checks both and raises :class:`BackendUnavailable`
    (one line, suggesting PyAV) when either is missing."""

    backend = "torchcodec"

    def __init__(self, path: str | os.PathLike, threads: int = 1) -> None:
        super().__init__(path)
        self.threads = int(threads)
        self._check_available()

    @staticmethod
    def _check_available() -> None:
        try:
            import torchcodec.decoders  # noqa: F401  (loading it loads libavcodec & co.)
        except ModuleNotFoundError:
            raise BackendUnavailable(
                "video backend 'torchcodec' is not installed; use backend='pyav' (PyAV bundles FFmpeg)"
            ) from None
        except Exception as exc:  # OSError/RuntimeError: the FFmpeg shared libraries are missing
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BackendUnavailable(
                "video backend 'torchcodec' cannot load the system FFmpeg libraries "
                f"({first[:160]}); install FFmpeg (e.g. Debian 'ffmpeg') or use backend='pyav'"
            ) from None

    def _open(self) -> Any:
        from torchcodec.decoders import VideoDecoder as _TCDecoder

        try:
            dec = _TCDecoder(self.path, seek_mode="exact", dimension_order="NHWC", num_ffmpeg_threads=self.threads)
        except Exception as exc:
            msg = str(exc).lower()
            kind = "no video stream" if "stream" in msg and "video" in msg else "unreadable"
            raise VideoDataError(self.path, kind, f"{type(exc).__name__}: {exc}") from None
        n = dec.metadata.num_frames
        if not n:
            raise VideoDataError(self.path, "empty", "no video frames in the file")
        return dec

    def _count(self) -> int:
        return int(len(self._handle))

    def _fps(self) -> float:
        return float(self._handle.metadata.average_fps or 0.0)

    def _decode(self, wanted: list[int]) -> dict[int, np.ndarray]:
        try:
            batch = self._handle.get_frames_at(indices=wanted)
        except Exception as exc:
            raise VideoDataError(self.path, "unreadable", f"{type(exc).__name__}: {exc}") from None
        data = batch.data.numpy()
        return {i: data[j] for j, i in enumerate(wanted)}


def make_decoder(path: str | os.PathLike, backend: str = "pyav", **options: Any) -> VideoDecoder:
    """A lazily opened decoder for ``path``: ``backend`` is ``"pyav"`` (default) or ``"torchcodec"``."""
    if backend == "pyav":
        return PyAVDecoder(path, **options)
    if backend == "torchcodec":
        return TorchCodecDecoder(path, **options)
    raise ConfigError(f"unknown video backend {backend!r}; choose one of {', '.join(BACKENDS)}")
