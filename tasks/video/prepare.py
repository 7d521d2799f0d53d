"""Re-encode a video tree for fast training reads: short side 256, a keyframe every 16 frames.

    rescale prepare-video SRC DST [--short_side 256] [--gop 16] [--workers N] [--codec auto]

Why: Kinetics as downloaded decodes slowly. Its files are large (up to 1080p) and have long
GOPs (often one keyframe per 250 frames or more), and the cost of reading one random clip is
dominated by the decoding from the keyframe before it (``docs/design.md``, "Video decoding": a
426x320 clip with a keyframe every 250 frames decodes ~11 random 16-frame clips per CPU-second,
re-encoded with a GOP of 16 ~21). SlowFast and PyTorchVideo users prepare Kinetics the same way
(``ffmpeg -vf scale=-2:256 -g 16``); this command does it with PyAV (its wheel bundles FFmpeg, so
no system FFmpeg is needed), in parallel and resumably.

What it does to every video under SRC (the extensions the ``folders`` layout reads, any depth: the class-folder
tree ``<split>/<class>/<id>.mp4`` as well as a flat folder; hidden files are ignored, the other files are
named in one warning line, as training names what its class folders hold besides videos):

* scales it so the short side is ``--short_side`` pixels (up or down), the long side in
  proportion; both sides are rounded to even numbers (4:2:0 chroma and libx264 need them);
* encodes H.264 (libx264, ``--crf``/``--preset``) with exactly ``--gop`` frames between
  keyframes (no scene-cut keyframes, so the spacing is regular), or MPEG-4 Part 2 when PyAV's
  FFmpeg has no libx264 (``--codec`` chooses explicitly), ``yuv420p``;
* turns the pixels as the source's display matrix says (a phone's portrait clip stored sideways:
  FFmpeg's ``autorotate``, quarter turns and mirrorings, :func:`~rescale_tasks.video.decoding.display_steps`),
  so the output holds upright pixels and no display matrix, and decodes as training decodes the
  source; a display angle that is no multiple of 90 degrees is carried over as it is;
* keeps every decoded frame, in order, at the source's average frame rate (constant frame
  rate: a variable-rate source gets evenly spaced timestamps; the frame count is preserved),
  and drops audio and any other streams;
* writes ``DST/<the same relative path>`` with the suffix ``.mp4`` (MP4 holds both codecs;
  ``.webm`` cannot hold H.264). Two sources that would map to the same output (``a.avi`` and
  ``a.mp4``) are reported as a failure for the second one.

Resumable and safe to kill: a video whose output exists is skipped, so running the command again
continues where it stopped. Each output is written to a hidden temporary name in its own folder
(``.<name>.mp4.partial``) and renamed over the final name (``os.replace``, atomic) only when it
is complete; an interrupted file (Ctrl-C, SIGTERM) deletes its temporary file, and one left by
SIGKILL is never taken for a finished output and is overwritten by the next run.

Every source is checked as training reads it (:func:`encode_video`): unreadable, corrupt or empty
files, and damaged streams (fewer frames than training's decoder counts in the file, decoding
errors FFmpeg conceals, errors mid-stream) fail, with the kind and detail training would report
(``unreadable: damaged stream: 1 of its 270 frames could not be decoded; 5 decoding error(s), the
first: mpeg4: ...``), instead of passing as clean-looking mp4s. Failures do not stop the run: the
last line printed counts the videos done, skipped and failed (failures by kind), and
``DST/failed.tsv`` lists each failed one (path relative to SRC, tab, the reason on one line); the
file is removed by a run without failures. Exit status: 0 when nothing failed, 1 when some video
failed, 2 for unusable arguments (a missing source folder, no videos in it, DST inside SRC, ...:
one line ``error: ...``), 130 when interrupted.

The options that shape the outputs (``--short_side``, ``--gop``, the codec, ``--crf``, ``--preset``)
are kept in ``DST/.prepare-video.json``: a run into a folder holding videos converted with other
ones is refused in one line naming them, instead of skipping those videos as done and leaving a
tree of two sizes (or none of the new one) behind a line that names the new options.

Parallelism: ``--workers`` processes (default: the usable CPU cores), each encoding one file at a
time with ``--threads`` FFmpeg threads (default 1: the processes already fill the cores).
"""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from rescale_tasks.common.errors import ConfigError, DataError, UserArgumentParser
from rescale_tasks.common.run import unread_line
from rescale_tasks.common.system import atomic_path, usable_cores, write_atomically
from rescale_tasks.video.decoding import (DecodeAudit, PyAVDecoder, Step, VideoDataError, display_matrix,
                                          display_steps)
from rescale_tasks.video.layouts import VIDEO_EXTENSIONS  # the files training reads

__all__ = ["VIDEO_EXTENSIONS", "CODECS", "Job", "Outcome", "find_videos", "output_path", "scaled_size",
           "pick_codec", "encode_video", "prepare_tree", "main"]

logger = logging.getLogger(__name__)

CODECS = ("auto", "libx264", "mpeg4")
FAILED_TSV = "failed.tsv"
#: the options the outputs of DST were converted with (see the module docstring)
SETTINGS_JSON = ".prepare-video.json"
PARTIAL = ".partial"


def find_videos(root: Path, left_out: list[str] | None = None) -> list[Path]:
    """Video files under ``root`` (any depth, sorted, hidden files and folders left out); the other
    files (not hidden) are appended to ``left_out`` when it is given."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            if f.startswith("."):
                continue
            if Path(f).suffix.lower() in VIDEO_EXTENSIONS:
                out.append(Path(folder) / f)
            elif left_out is not None:
                left_out.append(os.path.join(folder, f))
    return out


def output_path(src_root: Path, dst_root: Path, video: Path) -> Path:
    """``dst_root / <video relative to src_root>`` with the suffix ``.mp4``."""
    return (dst_root / video.relative_to(src_root)).with_suffix(".mp4")


def _even(x: float) -> int:
    return max(2, 2 * int(round(x / 2)))


def scaled_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """(width, height) with the short side ``short_side`` and the aspect ratio kept, both even."""
    if width <= height:
        return _even(short_side), _even(height * short_side / width)
    return _even(width * short_side / height), _even(short_side)


def pick_codec(requested: str = "auto") -> str:
    """``libx264`` when PyAV's FFmpeg has it (``auto``), else ``mpeg4``; an explicit request
    that this FFmpeg cannot encode is a one-line ``ConfigError``."""
    import av

    have = av.codecs_available
    if requested == "auto":
        return "libx264" if "libx264" in have else "mpeg4"
    if requested not in have:
        raise ConfigError(f"--codec {requested}: PyAV {av.__version__}'s FFmpeg cannot encode it; "
                          f"use --codec auto")
    return requested


@dataclass(frozen=True)
class Job:
    """One video to convert and how."""

    src: str
    dst: str
    short_side: int = 256
    gop: int = 16
    codec: str = "libx264"
    crf: int = 23
    preset: str = "veryfast"
    threads: int = 1
    size: Optional[tuple[int, int]] = None  # exact (width, height) instead of short_side (benchmarks)
    max_frames: Optional[int] = None  # stop after this many frames (benchmarks, tests)
    loop_to: Optional[int] = None  # repeat the source's frames until this many are written (benchmarks)


@dataclass(frozen=True)
class Outcome:
    src: str
    ok: bool
    reason: str = ""
    frames: int = 0
    kind: str = ""  # of a failure: the training decoder's kind ("unreadable", ...) or "error"


def _rate(stream) -> Fraction:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    rate = Fraction(rate) if rate else Fraction(30)
    if rate <= 0:
        rate = Fraction(30)
    # averages of variable-rate files can be fractions with huge terms; encoders want small ones
    return rate.limit_denominator(1001)


def _open_encoder(out, job: Job, width: int, height: int, rate: Fraction):
    if job.codec == "libx264":
        options = {"g": str(job.gop), "keyint_min": str(job.gop), "sc_threshold": "0",
                   "crf": str(job.crf), "preset": job.preset, "threads": str(job.threads)}
    else:  # MPEG-4 Part 2 has no CRF: a bit rate that keeps Kinetics-like 256p near transparent
        options = {"g": str(job.gop), "threads": str(job.threads)}
    stream = out.add_stream(job.codec, rate=rate, options=options)
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    stream.codec_context.gop_size = job.gop
    if job.codec != "libx264":
        stream.codec_context.bit_rate = int(0.25 * width * height * float(rate))
    return stream


def _upright_graph(steps: tuple[Step, ...], width: int, height: int):
    """An FFmpeg filter graph that applies ``steps`` (:func:`~rescale_tasks.video.decoding.display_steps`)
    to ``yuv420p`` frames of ``width`` x ``height``: push a frame, pull it turned."""
    import av.filter

    graph = av.filter.Graph()
    last = graph.add_buffer(width=width, height=height, format="yuv420p", time_base=Fraction(1, 1000))
    for name, argument in steps:
        node = graph.add(name, argument)
        last.link_to(node)
        last = node
    last.link_to(graph.add("buffersink"))
    graph.configure()
    return graph


def _frames(job: Job, container, stream) -> Iterator:
    """The source's frames, from the start again until ``job.loop_to`` are given (when set)."""
    given = 0
    while True:
        if given:
            container.seek(0, stream=stream)
        before = given
        for frame in container.decode(stream):
            yield frame
            given += 1
            if job.loop_to is not None and given >= job.loop_to:
                return
        if job.loop_to is None or given == before:
            return


def indexed_frames(path: str) -> int:
    """The frames training's decoder counts in ``path`` (its demux index: one per video packet);
    a file it cannot index raises the same :class:`VideoDataError` as at training time."""
    decoder = PyAVDecoder(path)
    try:
        return decoder.num_frames
    finally:
        decoder.close()


def encode_video(job: Job) -> int:
    """Convert ``job.src`` into ``job.dst`` (atomically, via a temporary file next to it);
    returns the frames written. Raises on any problem (the temporary file is removed).

    The source is checked as training reads it: its frames are counted by training's decoder
    index, and the decode is audited (:class:`~rescale_tasks.video.decoding.DecodeAudit`): a
    stream that gives fewer frames, reports decoding errors or stops early is damaged and fails
    with the training decoder's kind (``unreadable: damaged stream: ...``), instead of becoming
    a clean-looking mp4 that hides the loss (not checked with ``max_frames``/``loop_to``)."""
    import av

    dst = Path(job.dst)
    count = 0
    audit = DecodeAudit(indexed_frames(job.src)) if job.max_frames is None and job.loop_to is None else None
    with atomic_path(dst, temporary=f".{dst.name}{PARTIAL}") as tmp:
        with av.open(job.src, "r") as inp:
            if not inp.streams.video:
                raise DataError("no video stream")
            vin = inp.streams.video[0]
            vin.thread_count = job.threads
            rate = _rate(vin)
            with av.open(tmp, "w", format="mp4") as out:
                vout = graph = None
                frames = _frames(job, inp, vin)
                for frame in (audit.count(frames) if audit is not None else frames):
                    if vout is None:  # sized and turned as the first decoded frame says (headers can lie)
                        matrix = display_matrix(frame)
                        steps = display_steps(matrix)
                        quarter = any(name == "transpose" for name, _ in steps or ())
                        w, h = ((job.size[::-1] if quarter else job.size) if job.size
                                else scaled_size(frame.width, frame.height, job.short_side))
                        vout = _open_encoder(out, job, *((h, w) if quarter else (w, h)), rate)
                        if steps is None:  # an angle FFmpeg turns within the frame: left to the player
                            vout.set_display_matrix(np.frombuffer(matrix, dtype=np.int32).tolist())
                        graph = _upright_graph(steps, w, h) if steps else None
                    image = frame.reformat(width=w, height=h, format="yuv420p", interpolation="BICUBIC")
                    if graph is not None:
                        graph.vpush(image)
                        image = graph.vpull()
                    image.pts, image.time_base = count, 1 / rate
                    image.pict_type = av.video.frame.PictureType.NONE  # the encoder picks keyframes
                    out.mux(vout.encode(image))
                    count += 1
                    if job.max_frames is not None and count >= job.max_frames:
                        break
                problem = audit.problem() if audit is not None else None
                if problem:
                    raise VideoDataError(job.src, "unreadable", problem)
                if vout is None:
                    raise DataError("no video frames decoded")
                out.mux(vout.encode())
    return count


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, VideoDataError):  # the file is the row's path already
        return f"{exc.kind}: {exc.detail}" if exc.detail else exc.kind
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    return name if not text else text if isinstance(exc, DataError) else f"{name}: {text}"


_BUSY = False  # a worker is converting a file (else SIGTERM just ends it)


def _convert(job: Job) -> Outcome:
    global _BUSY
    _BUSY = True
    try:
        return Outcome(job.src, True, frames=encode_video(job))
    except Exception as exc:  # any failure of one file is reported, never fatal to the run
        return Outcome(job.src, False, _one_line(exc), kind=exc.kind if isinstance(exc, VideoDataError) else "error")
    finally:
        _BUSY = False


class _Stop(BaseException):
    """SIGTERM, raised where the process is so ``finally`` blocks run (temporary files go);
    a BaseException, so no ``except Exception`` takes it for a failed video."""


def _raise_stop(signum, frame):
    raise _Stop(f"signal {signum}")


def _worker_stop(signum, frame):
    if _BUSY:
        raise _Stop(f"signal {signum}")  # unwinds encode_video (its temporary file is removed)
    os._exit(128 + signum)  # idle: nothing to clean up


def _convert_in_worker(job: Job) -> Outcome:
    try:
        return _convert(job)
    except _Stop:
        os._exit(128 + signal.SIGTERM)  # the temporary file is gone; the pool is being terminated


def _worker_init() -> None:
    signal.signal(signal.SIGTERM, _worker_stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it terminates the pool


@dataclass
class Summary:
    done: int = 0
    skipped: int = 0
    failed: list = None  # (relative path, reason)
    interrupted: bool = False
    kinds: dict = None  # failures by kind (the training decoder's kinds, as in data_problems.tsv)

    def __post_init__(self) -> None:
        self.failed = [] if self.failed is None else self.failed
        self.kinds = {} if self.kinds is None else self.kinds

    def fail(self, path: str, reason: str, kind: str) -> None:
        self.failed.append((path, reason))
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def line(self) -> str:
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.kinds.items()))
        return f"done {self.done}, skipped {self.skipped}, failed {len(self.failed)}" + (f" ({kinds})" if kinds else "")


def _check_roots(src: Path, dst: Path) -> None:
    if not src.is_dir():
        raise DataError(f"source folder not found: {src}; pass the folder holding the videos "
                        "(class folders or a flat folder)")
    s, d = src.resolve(), dst.resolve()
    if d == s or s in d.parents:
        raise ConfigError(f"destination {dst} is inside the source {src}; choose a folder outside it")
    if d.exists() and not d.is_dir():
        raise ConfigError(f"destination {dst} exists and is not a folder")


def _keep_settings(dst: Path, settings: dict, converted: int) -> None:
    """Record ``settings`` in ``dst``; refuse them (one line) when ``converted`` videos there were
    converted with others."""
    path = dst / SETTINGS_JSON
    try:
        before = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        before = None
    if converted and isinstance(before, dict) and before != settings:
        changed = ", ".join(f"--{key} {before.get(key)}" for key, value in settings.items()
                            if before.get(key) != value)
        raise ConfigError(f"{converted} video(s) in {dst} were converted with {changed} ({path}); run again with "
                          "those options to finish that tree, or convert into another folder")
    if before != settings:
        write_atomically(path, json.dumps(settings) + "\n")


def prepare_tree(src: str | Path, dst: str | Path, *, short_side: int = 256, gop: int = 16,
                 workers: int = 1, codec: str = "auto", crf: int = 23, preset: str = "veryfast",
                 threads: int = 1, progress_every: float = 30.0, log=None) -> Summary:
    """Convert every video under ``src`` into ``dst`` (see the module docstring) and write
    ``dst/failed.tsv``; returns the counts. Argument problems raise one-line user errors."""
    src, dst = Path(src), Path(dst)
    _check_roots(src, dst)
    if short_side < 16 or short_side % 2:
        raise ConfigError(f"--short_side must be an even number of pixels >= 16, got {short_side}")
    if gop < 1 or workers < 1 or threads < 1:
        raise ConfigError(f"--gop, --workers and --threads must be >= 1, got {gop}, {workers}, {threads}")
    codec = pick_codec(codec)
    left_out: list[str] = []
    videos = find_videos(src, left_out)
    if not videos:
        raise DataError(f"no videos ({' '.join(VIDEO_EXTENSIONS)}) under {src}; pass the folder "
                        "holding them")
    if left_out:  # neither converted nor read by training: said, not left behind without a word
        logger.warning("prepare-video: " + unread_line(left_out, VIDEO_EXTENSIONS).removeprefix("data: "))
    dst.mkdir(parents=True, exist_ok=True)
    log = log or logger.info
    summary = Summary()
    jobs, claimed = [], {}
    for video in videos:
        out = output_path(src, dst, video)
        rel = str(video.relative_to(src))
        if out in claimed:
            summary.fail(rel, f"same output {out.relative_to(dst)} as {claimed[out]}; rename one", "same output")
            continue
        claimed[out] = rel
        if out.exists():
            summary.skipped += 1
            continue
        jobs.append(Job(str(video), str(out), short_side, gop, codec, crf, preset, threads))
    _keep_settings(dst, {"short_side": short_side, "gop": gop, "codec": codec, "crf": crf, "preset": preset},
                   summary.skipped)
    log(f"prepare-video: {len(videos)} videos under {src}: {summary.skipped} already done, "
        f"{len(jobs)} to convert ({codec}, short side {short_side}, gop {gop}, {workers} workers)")

    start = last = time.monotonic()

    def record(outcome: Outcome) -> None:
        nonlocal last
        if outcome.ok:
            summary.done += 1
        else:
            summary.fail(str(Path(outcome.src).relative_to(src)), outcome.reason, outcome.kind or "error")
        now = time.monotonic()
        finished = summary.done + len(summary.failed)
        if now - last >= progress_every and finished < len(jobs):
            last = now
            rate = summary.done / (now - start)
            log(f"  {finished}/{len(jobs)} converted ({len(summary.failed)} failed), {rate:.2f} videos/s")

    previous = signal.signal(signal.SIGTERM, _raise_stop) if _main_thread() else None
    pool = None
    try:
        if workers == 1 or len(jobs) <= 1:
            for job in jobs:
                record(_convert(job))
        else:
            # fork: the workers need nothing from the parent but the jobs (PyAV opens per file)
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
            pool = ctx.Pool(min(workers, len(jobs)), initializer=_worker_init)
            for outcome in pool.imap_unordered(_convert_in_worker, jobs, chunksize=1):
                record(outcome)
            pool.close()
            pool.join()
    except (KeyboardInterrupt, _Stop):
        summary.interrupted = True
        if pool is not None:
            pool.terminate()  # SIGTERM: each worker removes its temporary file
            pool.join()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    _write_failed(dst, summary.failed)
    return summary


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _write_failed(dst: Path, failed: list) -> None:
    path = dst / FAILED_TSV
    if not failed:
        if path.exists():
            path.unlink()
        return
    lines = ["path\treason"] + [f"{p}\t{' '.join(r.split())}" for p, r in sorted(failed)]
    write_atomically(path, "\n".join(lines) + "\n")


def _parser() -> UserArgumentParser:
    p = UserArgumentParser(prog="rescale prepare-video", description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="folder of videos: class folders (any depth) or flat")
    p.add_argument("dst", help="output folder (same relative paths, .mp4); may exist (resumes, with the "
                   "options it was converted with)")
    p.add_argument("--short_side", type=int, default=256, help="short side in pixels, even (256)")
    p.add_argument("--gop", type=int, default=16, help="frames from one keyframe to the next (16)")
    cores = usable_cores()
    p.add_argument("--workers", type=int, default=cores, help=f"processes (default: {cores}, the usable cores)")
    p.add_argument("--threads", type=int, default=1, help="FFmpeg threads per process (1)")
    p.add_argument("--codec", choices=CODECS, default="auto", help="auto: libx264 if available, else mpeg4")
    p.add_argument("--crf", type=int, default=23, help="libx264 constant rate factor (23; lower = better)")
    p.add_argument("--preset", default="veryfast", help="libx264 speed preset (veryfast)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    started = time.monotonic()
    summary = prepare_tree(args.src, args.dst, short_side=args.short_side, gop=args.gop,
                           workers=args.workers, codec=args.codec, crf=args.crf, preset=args.preset,
                           threads=args.threads)
    where = f"; see {Path(args.dst) / FAILED_TSV}" if summary.failed else ""
    if summary.interrupted:
        logger.info(f"interrupted: {summary.line()}; run the same command again to resume")
        return 130
    logger.info(f"{summary.line()} in {time.monotonic() - started:.0f} s{where}")
    return 1 if summary.failed else 0


if __name__ == "__main__":  # pragma: no cover
    from rescale_tasks.cli import main as rescale  # the command: its logging, its one-line errors

    sys.exit(rescale(["prepare-video", *sys.argv[1:]]))
