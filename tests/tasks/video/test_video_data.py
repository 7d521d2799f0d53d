"""Video clips for training and multi-view testing: shapes, views, bad files through forked
workers, and the DataModule (class list, labels, mid-epoch resume, problem report)."""
from __future__ import annotations

import csv
import functools
import shutil
import warnings

import lightning.pytorch as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from rescale_tasks.common.data import PerSampleSeed
from rescale_tasks.common.errors import ConfigError, DataError
from rescale_tasks.common.run import PROBLEMS_FILE, SkippedDataReport
from rescale_tasks.video.data import KineticsDataModule
from rescale_tasks.video.dataset import BadVideoError, VideoClipDataset, collate_drop_none
from rescale_tasks.video.decoding import make_decoder
from rescale_tasks.video.sampling import clip_indices
from rescale_tasks.video.transforms import KINETICS_MEAN, KINETICS_STD, crop_boxes, eval_transform, train_transform

T, TAU = 4, 2  # the fixture's tiny settings (kinetics_clips.tiny)


def _samples(k, split="train"):
    return [(p, k.classes.index(c)) for p, (_, c) in zip(k.folder_paths(split), getattr(k, split))]


class RawFrames:
    """A transform that keeps the decoded frames (T, C, H, W): lets a test check which were picked."""

    def __call__(self, video):
        return video.as_subclass(torch.Tensor).clone()


def _unnormalise(x: torch.Tensor) -> torch.Tensor:
    return x * KINETICS_STD[0] + KINETICS_MEAN[0]


# ----------------------------------------------------------------------------- transforms


def test_train_transform_scales_crops_and_normalises():
    torch.manual_seed(0)
    video = torch.randint(0, 256, (T, 3, 48, 64), dtype=torch.uint8)
    out = train_transform((32, 40), 32)(video)
    assert out.shape == (3, T, 32, 32) and out.dtype == torch.float32 and type(out) is torch.Tensor
    assert -0.45 / 0.225 - 1e-4 <= out.min() and out.max() <= 0.55 / 0.225 + 1e-4
    outs = {tuple(train_transform((32, 40), 32)(video)[0, 0, 0, :4].tolist()) for _ in range(8)}
    assert len(outs) > 1  # random scale/crop/flip


@pytest.mark.parametrize("height,width", [(48, 64), (64, 48)])
def test_three_test_crops_cover_start_centre_end_of_the_long_side(height, width):
    # every pixel holds its own position along the long side, so a crop shows where it was taken
    long = max(height, width)
    ramp = torch.arange(long, dtype=torch.uint8)
    video = (ramp.view(1, 1, 1, -1) if width >= height else ramp.view(1, 1, -1, 1)).expand(T, 3, height, width)
    out = eval_transform(test_short_side=48, crop=32, num_crops=3)(video.contiguous())  # short side 48: no resize
    assert out.shape == (3, 3, T, 32, 32)
    positions = (_unnormalise(out) * 255).round()
    along = positions[..., 0, :] if width >= height else positions[..., :, 0]  # (crop, C, T, 32)
    firsts = along[:, 0, 0, 0].tolist()
    assert firsts == [0, (long - 32) // 2, long - 32]  # start, centre, end
    assert crop_boxes(height, width, 32, 3) == ([(8, 0), (8, 16), (8, 32)] if width >= height
                                                 else [(0, 8), (16, 8), (32, 8)])
    assert not torch.equal(out[0], out[1]) and not torch.equal(out[1], out[2])
    centre = eval_transform(48, 32, 1)(video.contiguous())
    assert centre.shape == (1, 3, T, 32, 32) and torch.equal(centre[0], out[1])


def test_the_sidecar_preprocessing_turns_decoded_frames_into_the_test_input(turned_clips):
    """The export's ``preprocessing`` is read off the test's transform (so it cannot drift from it):
    followed with numpy and PIL on real decoded frames, it gives the centre view the test evaluates."""
    import numpy as np
    from PIL import Image

    from rescale_tasks.video.transforms import describe_eval_transform

    frames = np.stack(turned_clips[0](T))  # [T, 48, 64, 3] uint8, real frames
    transform = eval_transform(test_short_side=40, crop=32, num_crops=1)
    pre = describe_eval_transform(transform)
    assert pre["crops"] == 1 and pre["resize"]["to"] == "shorter side" and pre["resize"]["antialias"]
    expected = transform(torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous())[0].numpy()  # C, T, H, W
    mean, std = np.asarray(pre["mean"], np.float32), np.asarray(pre["std"], np.float32)
    views = []
    for frame in frames:
        picture, short = Image.fromarray(frame), pre["resize"]["size"]
        width, height = picture.size
        picture = picture.resize((width * short // height, short) if width >= height else
                                 (short, height * short // width), Image.BILINEAR)
        x, side = np.asarray(picture, np.float32), pre["center_crop"]
        top, left = (x.shape[0] - side) // 2, (x.shape[1] - side) // 2
        views.append((x[top:top + side, left:left + side] * pre["pixel_scale"] - mean) / std)
    got = np.stack(views).transpose(3, 0, 1, 2)
    assert got.shape == expected.shape and np.abs(got - expected).max() <= 2 / 255 / std.min()


# ----------------------------------------------------------------------------- dataset


def test_train_items_are_one_seeded_random_clip_per_video(kinetics_clips):
    k = kinetics_clips
    ds = VideoClipDataset(_samples(k), "train", T, TAU, transform=train_transform((32, 40), 32))
    assert len(ds) == 9
    seeded = PerSampleSeed(ds)
    clip, label, video, clip_index = seeded[(5, 123)]
    assert clip.shape == (3, T, 32, 32) and clip.dtype == torch.float32
    assert (label, video, clip_index) == (1, 5, 0)
    assert torch.equal(seeded[(5, 123)][0], clip)  # the same seed, the same clip and augmentation
    assert any(not torch.equal(seeded[(5, s)][0], clip) for s in range(1, 5))
    # the temporal position comes from the per-sample seed
    raw = PerSampleSeed(VideoClipDataset(_samples(k), "train", T, TAU, transform=RawFrames()))
    starts = set()
    decoder = make_decoder(k.folder_paths("train")[2])  # 40 frames
    frames = decoder.get_frames(range(40)).permute(0, 3, 1, 2)
    for seed in range(6):
        got = raw[(2, seed)][0]
        match = [s for s in range(40 - (T - 1) * TAU) if torch.equal(frames[s:s + (T - 1) * TAU + 1:TAU], got)]
        assert match
        starts.add(match[0])
    assert len(starts) > 1


def test_test_items_are_K_uniform_clips_with_their_crops(kinetics_clips):
    k = kinetics_clips
    samples = _samples(k)
    K = 4
    ds = VideoClipDataset(samples, "test", T, TAU, num_clips=K, num_crops=3, transform=eval_transform(36, 32, 3))
    assert len(ds) == 9 * K
    clips, label, video, clip = ds[2 * K + 3]
    assert clips.shape == (3, 3, T, 32, 32) and (label, video, clip) == (0, 2, 3)
    raw = VideoClipDataset(samples, "test", T, TAU, num_clips=K, transform=RawFrames())
    n = k.frames[samples[2][0]]  # 40 frames: delta 33, starts 0, 11, 22, 33
    frames = make_decoder(samples[2][0]).get_frames(range(n)).permute(0, 3, 1, 2)
    starts = []
    for c in range(K):
        item = raw[2 * K + c]
        idx = clip_indices(n, T, TAU, "test", clip_idx=c, num_clips=K)
        assert torch.equal(item[0], frames[idx]) and item[3] == c
        starts.append(idx[0])
    assert starts == [0, 11, 22, 33]


def test_a_forked_epoch_over_bad_files_finishes_and_counts_them_by_kind(kinetics_clips):
    k = kinetics_clips
    bad = [(str(k.bad[kind]), 0) for kind in ("corrupt", "truncated", "short", "lying")]
    samples = _samples(k)[:4] + bad
    ds = VideoClipDataset(samples, "val", T, TAU, num_clips=2, num_crops=1, transform=eval_transform(36, 32, 1))
    ds[0]  # a decoder opened in the parent: the workers must not reuse it
    loader = DataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context="fork",
                        collate_fn=functools.partial(collate_drop_none, clip_shape=(1, 3, T, 32, 32)))
    seen = []
    for clips, labels, videos, clip_index in loader:
        assert clips.shape[1:] == (1, 3, T, 32, 32) and len(clips) == len(videos)
        seen += list(zip(videos.tolist(), clip_index.tolist()))
    kept = [0, 1, 2, 3, 6, 7]  # corrupt (4) and truncated (5) dropped; short looped; lying is fine
    assert sorted(seen) == [(v, c) for v in kept for c in range(2)]
    assert ds.problems() == {"unreadable": 2, "short_loop": 1}  # recorded in the workers, seen here
    assert sorted(ds.problem_files()) == sorted([(str(k.bad["corrupt"]), "unreadable"),
                                                 (str(k.bad["truncated"]), "unreadable"),
                                                 (str(k.bad["short"]), "short_loop")])
    assert ds.skipped == 2


def test_short_policy_skip_drops_and_no_skip_bad_raises_one_line(kinetics_clips):
    k = kinetics_clips
    samples = [(str(k.bad["short"]), 0), (str(k.bad["lying"]), 1)]
    ds = VideoClipDataset(samples, "train", T, TAU, transform=train_transform((32, 40), 32), short_policy="skip")
    assert ds[0] is None and ds[1] is not None and ds.problems() == {"short": 1}
    repeat = VideoClipDataset(samples, "test", T, TAU, transform=RawFrames(), short_policy="repeat_last")
    assert repeat[0][0].shape[0] == T and repeat.problems() == {"short_repeat_last": 1}
    strict = VideoClipDataset([(str(k.bad["corrupt"]), 0)], "train", T, TAU, skip_bad=False,
                              transform=train_transform((32, 40), 32))
    batches = iter(DataLoader(strict, batch_size=1, num_workers=1, collate_fn=collate_drop_none))
    with pytest.raises(BadVideoError) as err:  # re-raised from the worker: still one line
        next(batches)
    message = str(err.value)
    # stop the worker now: left to the garbage collector (the traceback keeps the iterator in a
    # reference cycle) torch's shutdown waits its 5 s status interval before killing it
    batches._shutdown_workers()
    assert "\n" not in message and "corrupt.mp4" in message and "unreadable" in message
    assert "--data.skip_bad true" in message


def test_all_bad_batch_collates_to_empty_tensors():
    clips, labels, videos, clip_index = collate_drop_none([None, None], clip_shape=(3, 3, T, 32, 32))
    assert clips.shape == (0, 3, 3, T, 32, 32) and labels.shape == videos.shape == clip_index.shape == (0,)
    assert labels.dtype == torch.long


# ----------------------------------------------------------------------------- DataModule


def _dm(k, **kwargs) -> KineticsDataModule:
    assert (k.tiny["frames"], k.tiny["stride"], k.tiny["crop"]) == (T, TAU, 32)
    options = dict(root=str(k.root), preset=None, **k.tiny, num_clips=2, num_crops=3, batch_size=2,
                   eval_batch_size=2, num_workers=0, pin_memory=False, persistent_workers=False)
    options.update(kwargs)
    return KineticsDataModule(**options)


def test_datamodule_knows_classes_at_init_and_says_what_its_labels_are(kinetics_clips):
    k = kinetics_clips
    dm = _dm(k)
    assert dm.num_classes == 3 and dm.class_names == k.classes and dm.train_set is None  # nothing decoded yet
    assert (dm.frames, dm.stride) == (T, TAU)
    assert KineticsDataModule(root=str(k.root), preset="16x4").frames == 16
    for layout, args in (("cvdf", dict(train_csv=str(k.train_csv), val_csv=str(k.val_csv), video_dir=str(k.video_dir))),
                         ("list", dict(train_list=str(k.train_list), val_list=str(k.val_list),
                                       list_prefix=str(k.list_prefix)))):
        assert _dm(k, layout=layout, root=None, **args).class_names == k.classes
    # what checkpoints carry and match by name (common.data.labels; tests/tasks/video/test_video_labels.py)
    labels = dm.labels()
    assert labels.names == tuple(k.classes) and labels.key == "data.root" and str(k.root) in labels.source
    with pytest.raises(ConfigError, match="data.crop"):
        _dm(k, crop=64)
    with pytest.raises(ConfigError, match="data.frames"):
        KineticsDataModule(root=str(k.root), preset=None)


def test_datamodule_loaders_give_the_views(kinetics_clips):
    k = kinetics_clips
    dm = _dm(k)
    clips, labels, videos, clip_index = next(iter(dm.train_dataloader()))
    assert clips.shape == (2, 3, T, 32, 32) and clip_index.tolist() == [0, 0]
    val = list(dm.val_dataloader())
    assert val[0][0].shape == (2, 1, 3, T, 32, 32)  # one centre view while fitting
    assert sorted(v for b in val for v in b[2].tolist()) == [0, 1, 2]
    test = list(dm.test_dataloader())
    assert test[0][0].shape == (2, 3, 3, T, 32, 32)
    keys = [(v, c) for b in test for v, c in zip(b[2].tolist(), b[3].tolist())]
    assert keys == [(v, c) for v in range(3) for c in range(2)]  # in order, 2 clips x 3 crops each
    assert [b[1].tolist() for b in test] == [[0, 0], [1, 1], [2, 2]]


def test_train_loader_resumes_mid_epoch_with_the_same_samples(kinetics_clips):
    k = kinetics_clips
    full = _dm(k, seed=3).train_dataloader()
    full.sampler.set_epoch(1)
    epoch = list(full)
    assert len(epoch) == 4  # 9 videos, batch 2, the last odd one dropped
    partial = _dm(k, seed=3).train_dataloader()
    partial.sampler.set_epoch(1)
    it = iter(partial)
    next(it), next(it)
    state = partial.state_dict()
    resumed = _dm(k, seed=3).train_dataloader()  # a fresh process, as after a restart
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == 2
    for (a, la, va, _), (b, lb, vb, _) in zip(epoch[2:], rest):
        assert torch.equal(va, vb) and torch.equal(la, lb) and torch.equal(a, b)  # same clips, same crops


class _TinyVideoNet(L.LightningModule):
    """The least a module needs to fit on video batches (the real one is tasks/video/module.py)."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.head = torch.nn.Linear(3, num_classes)

    def training_step(self, batch, _):
        clips, labels = batch[0], batch[1]
        if not len(clips):
            return None
        return torch.nn.functional.cross_entropy(self.head(clips.mean((2, 3, 4))), labels)

    def validation_step(self, batch, _):
        clips = batch[0]
        if len(clips):
            self.head(clips.mean((1, 3, 4, 5)))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_problems_are_logged_by_kind_and_listed_in_the_run_dir(kinetics_clips, tmp_path):
    k = kinetics_clips
    dm = _dm(k, root=str(k.bad_root), val_clips=1, val_crops=1)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=CSVLogger(tmp_path), num_sanity_val_steps=0,
                        callbacks=[SkippedDataReport()], enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False)
    with pytest.warns(UserWarning, match=r"data problems: 4 file\(s\) \(short_loop 2, unreadable 2\): 2 skipped, "
                                         r"2 repaired and kept; the files are listed in "):
        trainer.fit(_TinyVideoNet(dm.num_classes), datamodule=dm)
    assert dm.data_problems() == {"unreadable": 2, "short_loop": 2} and dm.skipped_corrupt == 2
    listed = (tmp_path / "lightning_logs" / "version_0" / PROBLEMS_FILE).read_text().splitlines()
    assert listed[0] == "path\tkind" and len(listed) == 5
    assert f"{k.bad_root / 'train' / k.classes[0] / 'zz_corrupt.mp4'}\tunreadable" in listed
    assert f"{k.bad_root / 'val' / k.classes[1] / 'zz_short.mp4'}\tshort_loop" in listed
    with open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    last = {key: value for row in rows for key, value in row.items() if value}
    assert float(last["data/unreadable"]) == 2 and float(last["data/short_loop"]) == 2
    assert float(last["data/skipped_corrupt"]) == 2


def test_listed_videos_not_on_disk_are_reported_as_missing(kinetics_clips, tmp_path):
    """The list layout's absent videos are left out and counted like the other problems: ``data/missing``
    logged, the paths in data_problems.tsv, the count in the end-of-run line."""
    k = kinetics_clips
    listed = tmp_path / "train.txt"
    listed.write_text(k.train_list.read_text() + "train/bikes/gone.mp4 bikes\n")
    dm = _dm(k, layout="list", root=None, train_list=str(listed), val_list=str(k.val_list),
             list_prefix=str(k.list_prefix), val_clips=1, val_crops=1)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=CSVLogger(tmp_path), num_sanity_val_steps=0,
                        limit_train_batches=1, callbacks=[SkippedDataReport()], enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    with pytest.warns(UserWarning, match=r"data problems: 1 file\(s\) \(missing 1\): 1 skipped"):
        trainer.fit(_TinyVideoNet(dm.num_classes), datamodule=dm)
    assert len(dm.train_set.samples) == len(k.train) and dm.data_problems() == {"missing": 1}
    listed = (tmp_path / "lightning_logs" / "version_0" / PROBLEMS_FILE).read_text().splitlines()
    assert listed[1:] == [f"{k.list_prefix / 'train/bikes/gone.mp4'}\tmissing"]
    with open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv") as f:
        last = {key: value for row in csv.DictReader(f) for key, value in row.items() if value}
    assert float(last["data/missing"]) == 1 and float(last["data/skipped_corrupt"]) == 0
    evaluating = _dm(k, layout="list", root=None, train_list=str(tmp_path / "train.txt"), val_list=str(k.val_list),
                     list_prefix=str(k.list_prefix))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a test serves val alone: training's missing videos are not its
        evaluating.setup("test")
    assert evaluating.data_problems() == {}


def test_an_evaluation_warns_only_about_the_videos_it_reads(kinetics_clips, tmp_path):
    """`rescale test` on the cvdf layout with train_csv given, where only the validation videos were
    downloaded, and one of them is not: one warning line, of the validation split's absent video; the
    training CSV gives the classes, and its absent videos neither warn nor refuse the test. Training
    still needs them."""
    k = kinetics_clips
    folder = tmp_path / "videos"
    folder.mkdir()
    val = [name for name, _ in k.val]
    for name in val[1:]:
        shutil.copy(k.video_dir / name, folder / name)
    dm = _dm(k, layout="cvdf", root=None, train_csv=str(k.train_csv), val_csv=str(k.val_csv), video_dir=str(folder))
    with pytest.warns(UserWarning) as record:
        dm.setup("test")
    assert [str(w.message) for w in record] == [
        f"1 of {len(val)} videos listed in {k.val_csv} (data.val_csv) are not in {folder} (Kinetics downloads always "
        "miss some); going on without them"]
    assert dm.class_names == k.classes and len(dm.test_set.samples) == len(val) - 1 and dm.data_problems() == {"missing": 1}
    with pytest.raises(DataError, match=r"^None of the 9 videos of .*train\.csv \(data\.train_csv\) is in"):
        _dm(k, layout="cvdf", root=None, train_csv=str(k.train_csv), val_csv=str(k.val_csv),
            video_dir=str(folder)).setup("fit")


def test_what_the_class_folders_hold_besides_videos_is_named_not_dropped_in_silence(kinetics_clips, tmp_path):
    """A clip of another container (.flv), a sub-folder of clips and a file beside the class folders
    are not read; the scan lists them and the run names them in one warning line, as the image
    folders do, instead of validating on fewer videos without a word."""
    k = kinetics_clips
    root = tmp_path / "kinetics"
    shutil.copytree(k.root, root)
    clip = root / "val" / k.classes[0] / k.val[0][0]
    shutil.copy(clip, root / "val" / k.classes[0] / "flash.flv")
    (root / "train" / k.classes[1] / "more").mkdir()
    shutil.copy(clip, root / "train" / k.classes[1] / "more" / "deeper.mp4")
    (root / "train" / "README.txt").write_text("Kinetics-400, downloaded 2024\n")
    unread = {str(root / p) for p in (f"val/{k.classes[0]}/flash.flv", f"train/{k.classes[1]}/more", "train/README.txt")}
    dm = _dm(k, root=str(root))
    dm.setup("fit")
    assert set(dm.unread_files) == unread
    assert len(dm.train_set.samples) == len(k.train) and len(dm.val_set.samples) == len(k.val)  # videos only
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, limit_train_batches=1,
                        limit_val_batches=0, callbacks=[SkippedDataReport()], enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    with pytest.warns(UserWarning) as warned:
        trainer.fit(_TinyVideoNet(dm.num_classes), datamodule=_dm(k, root=str(root)))
    lines = [str(w.message) for w in warned if "not read" in str(w.message)]
    assert lines == [f"data: 3 file(s) under {root} were found but not read (.flv 1, .txt 1, folder 1), "
                     f"e.g. {root / 'train' / 'README.txt'}; only .mp4/.avi/.mkv/.webm/.mov/.m4v/.mpg/.mpeg files "
                     "are read: convert them or move them out of the data folder"]


def test_class_folders_holding_val_alone_serve_validate_test_and_predict(kinetics_clips, tmp_path):
    """An evaluation machine holding Kinetics' val/ without its train/ (hundreds of GB): the classes are
    val/'s class folders (a checkpoint's are matched to them by name) and the evaluation loaders serve
    every view; fit still needs train/ and says so in one line."""
    from rescale_tasks.common.errors import DataError

    k = kinetics_clips
    alone = tmp_path / "val_alone"
    shutil.copytree(k.root / "val", alone / "val")
    beside = _dm(k)
    beside.setup("test")
    dm = _dm(k, root=str(alone))
    assert dm.class_names == k.classes and dm.labels().names == beside.labels().names
    dm.setup("test")
    assert dm.train_set is None and [label for _, label in dm.test_set.samples] == \
        [label for _, label in beside.test_set.samples]
    clips, labels, videos, views = next(iter(dm.test_dataloader()))
    expected = next(iter(beside.test_dataloader()))
    assert torch.equal(clips, expected[0]) and torch.equal(labels, expected[1])
    assert len(list(dm.predict_dataloader())) == len(list(beside.predict_dataloader()))
    with pytest.raises(DataError, match=r"has no train/ sub-folder"):
        _dm(k, root=str(alone)).setup("fit")


@pytest.mark.parametrize("layout", ["cvdf", "list"])
def test_evaluation_runs_without_the_training_annotation_file(kinetics_clips, tmp_path, layout):
    """An evaluation machine with the validation CSV or list alone (the training one unset, or not
    copied there): the classes are the validation file's (a checkpoint's are matched to them by
    name) and the evaluation loaders serve every view; fit still needs the training file, in one line."""
    from rescale_tasks.common.errors import DataError

    k = kinetics_clips
    given = (dict(layout="cvdf", train_csv=str(k.train_csv), val_csv=str(k.val_csv), video_dir=str(k.video_dir))
             if layout == "cvdf" else
             dict(layout="list", train_list=str(k.train_list), val_list=str(k.val_list), list_prefix=str(k.list_prefix)))
    key = f"train_{'csv' if layout == 'cvdf' else 'list'}"
    beside = _dm(k, root=None, **given)
    beside.setup("test")
    for train in (None, str(tmp_path / "not_copied.txt")):
        dm = _dm(k, root=None, **{**given, key: train})
        assert dm.class_names == k.classes and dm.labels().names == beside.labels().names
        assert dm.labels().key == f"data.val_{key[6:]}"
        dm.setup("test")
        assert dm.train_set is None and dm.test_set.samples == beside.test_set.samples
        clips, labels, _, _ = next(iter(dm.test_dataloader()))
        expected = next(iter(beside.test_dataloader()))
        assert torch.equal(clips, expected[0]) and torch.equal(labels, expected[1])
        assert len(list(dm.predict_dataloader())) == len(list(beside.predict_dataloader()))
        with pytest.raises(DataError, match=rf"data\.{key}"):
            _dm(k, root=None, **{**given, key: train}).setup("fit")


def test_a_class_count_other_than_the_named_classes_is_refused(tmp_path):
    """Class folders and CSV labels are their own count: a data.num_classes that disagrees is one
    line naming both counts and where the classes came from; an equal one passes."""
    for split in ("train", "val"):
        for name in ("a", "b", "c"):
            (tmp_path / split / name).mkdir(parents=True)
    assert KineticsDataModule(root=str(tmp_path), num_classes=3).num_classes == 3
    with pytest.raises(ConfigError) as refused:
        KineticsDataModule(root=str(tmp_path), num_classes=5)
    assert str(refused.value) == (f"data.num_classes is 5 but the folders layout names 3 classes (read from data.root: "
                                  f"{tmp_path}); set --data.num_classes 3 or null (the classes found), or fix the data.")
    train_csv = tmp_path / "train.csv"
    train_csv.write_text("label,youtube_id,time_start,time_end,split\na,x,0,10,train\nb,y,0,10,train\n")
    with pytest.raises(ConfigError, match=r"is 3 but the cvdf layout names 2 classes \(read from data.train_csv"):
        KineticsDataModule(layout="cvdf", train_csv=str(train_csv), num_classes=3)
    assert not KineticsDataModule.counts_integer_labels({"layout": "folders", "root": str(tmp_path)})
    assert not KineticsDataModule.counts_integer_labels({"layout": "cvdf", "train_csv": str(train_csv)})


def test_an_evaluation_fills_the_checkpoints_class_count_only_for_integer_labels(tmp_path):
    """`validate/test/predict --ckpt_path` sets a null data.num_classes to the checkpoint's for
    integer-labelled lists alone: class folders (a validation split that lacks some of the
    checkpoint's classes) keep counting their own, and are not refused."""
    from jsonargparse import Namespace

    from rescale_tasks.common.cli.lightning_commands import _class_count_from_checkpoint

    ckpt = tmp_path / "model.ckpt"
    torch.save({"hyper_parameters": {"num_classes": 5}}, ckpt)
    for name in ("a", "b", "c"):
        (tmp_path / "val" / name).mkdir(parents=True)
    listed = tmp_path / "val.txt"
    listed.write_text("a.mp4 0\nb.mp4 1\n")
    path = f"{KineticsDataModule.__module__}.{KineticsDataModule.__name__}"
    folders = Namespace(data=Namespace(class_path=path, init_args=Namespace(layout="folders", root=str(tmp_path),
                                                                            num_classes=None)))
    _class_count_from_checkpoint(folders, str(ckpt))
    assert folders.data.init_args.num_classes is None
    assert KineticsDataModule(**folders.data.init_args.as_dict()).num_classes == 3
    lists = Namespace(data=Namespace(class_path=path, init_args=Namespace(layout="list", val_list=str(listed),
                                                                          num_classes=None)))
    _class_count_from_checkpoint(lists, str(ckpt))
    assert lists.data.init_args.num_classes == 5
