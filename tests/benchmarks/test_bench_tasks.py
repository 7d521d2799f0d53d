"""The detection and video_loader sections of the benchmark harness at their tiniest sizes: the
tables, the ratio metrics and the goals they feed. No timing is asserted (a ratio's value is
noise at these sizes); the structure and the arithmetic are."""
from __future__ import annotations

import torch

from benchmarks import report
from benchmarks.__main__ import build_settings, parse_args, selected_sections
from benchmarks.detection import DETECTION_DEFAULTS, detection_contenders, detector_options, synthetic_batch
from benchmarks.sections import SECTIONS
from benchmarks.toolkit import Settings
from benchmarks.timing import Summary



def tiny_settings(**kwargs) -> Settings:
    return Settings(device=torch.device("cpu"), amp_dtype=None, channels_last=False, batch=2,
                    image_size=8, warmup=2, eval_warmup=1, repeats={"detection": 2, "video_loader": 2},
                    min_run_time=0.001, verbose=False, **kwargs)


def test_synthetic_detection_targets_are_valid():
    images, targets = synthetic_batch(2, (40, 56), boxes=3, num_classes=5)
    assert [tuple(x.shape) for x in images] == [(3, 40, 56)] * 2
    for t in targets:
        b = t["boxes"]
        assert b.shape == (3, 4) and bool((b[:, 2:] > b[:, :2]).all())
        assert bool((b[:, 0] >= 0).all() and (b[:, 2] <= 56).all() and (b[:, 3] <= 40).all())
        assert t["masks"].shape == (3, 40, 56) and t["masks"].dtype == torch.uint8
        assert bool((t["masks"].flatten(1).sum(1) > 0).all())  # every object has mask pixels
        assert bool(((t["labels"] >= 1) & (t["labels"] < 5)).all())


def test_detection_section_reports_ratios_to_frozen_bn():
    settings = tiny_settings(detection={
        "batch": 1, "image_size": (64, 80), "min_size": 64, "max_size": 80, "boxes": 1, "num_classes": 3,
        "out_channels": 32, "head_channels": 32, "fc_dim": 32, "network_options": {"base_width": 8},
        "warmup": 2, "detector_options": {"rpn_pre_nms_top_n_train": 50, "rpn_post_nms_top_n_train": 20,
                                          "rpn_pre_nms_top_n_test": 20, "rpn_post_nms_top_n_test": 10,
                                          "box_batch_size_per_image": 16, "box_detections_per_img": 5}})
    res = SECTIONS["detection"](settings)
    train, infer = res.tables
    assert [r[0] for r in train.rows] == [r[0] for r in infer.rows] == ["FrozenBN", "GN", "rescale50"]
    assert train.columns[3] == "time vs FrozenBN" and infer.columns[3] == "img/s vs FrozenBN"
    assert train.rows[0][3] == "1.000 [1.000, 1.000]" and train.rows[1][4] == "1.000 [1.000, 1.000]"
    m = res.metrics
    for name in ("FrozenBN", "GN", "rescale50"):
        assert m[f"detection.train.vs_baseline.{name}"].n == 2
        assert m[f"detection.train.per_second.{name}"] > 0 and m[f"detection.eval.per_second.{name}"] > 0
    assert m["detection.train.vs_baseline.FrozenBN"].median == 1.0
    # the frozen stages really are frozen (trainable_layers=3 by default): fewer trainable params
    params = [r[5] for r in train.rows]
    assert all("M (" in p for p in params)
    assert "[5] detections" in infer.notes[0]  # box_score_thresh 0: the mask head gets them all
    marks = {g.goal.key: g.status for g in report.evaluate_goals(m, "cpu")}
    for key in ("detection.train.vs_baseline.rescale50", "detection.train.vs_gn.rescale50",
                "detection.eval.vs_baseline.rescale50"):
        assert marks[key].split()[0] in ("PASS", "FAIL")
    table = report.goals_table(report.evaluate_goals(m, "cpu"), "cpu", ran={"detection"})
    assert "detection" in table.title and any(n.startswith("detection:") for n in table.notes)


def test_video_loader_section_against_the_train_step(tmp_path):
    settings = tiny_settings(
        resnet3d={"arch": "resnet3d_18", "frames": 2, "image_size": 16, "batch": 2}, base_width=4,
        video_loader={"size": (64, 48), "frames": 24, "gops": (4, 24), "workers": 1, "clips": 4,
                      "root": str(tmp_path)})
    res = SECTIONS["video_loader"](settings)
    (table,) = res.tables
    settings_rows = [(r[0], r[1], r[2]) for r in table.rows if r[1] != "-"]
    assert settings_rows == [("pyav", "4", "0"), ("pyav", "4", "1"), ("pyav", "24", "0"), ("pyav", "24", "1")]
    assert table.rows[-1][0] == "(3D rescale train step)"
    m = res.metrics
    assert m["video_loader.train.per_second"] > 0
    for gop in (4, 24):
        for w in (0, 1):
            assert m[f"video_loader.per_second.pyav.gop{gop}.workers={w}"] > 0
        assert isinstance(m[f"video_loader.keeps_up.pyav.gop{gop}"], Summary)
    # the ratio is (loader clips/s) / (train clips/s), formed per repeat: its median lies
    # between the extremes of the ratio of the medians' per-second figures over the repeats
    ratio = m["video_loader.keeps_up.pyav.gop4"]
    approx = m["video_loader.per_second.pyav.gop4.workers=1"] / m["video_loader.train.per_second"]
    assert ratio.n == 2 and 0.2 < ratio.median / approx < 5
    # torchcodec: measured where it loads, else one row with the one-line reason
    if "video_loader.per_second.torchcodec.gop4.workers=0" not in m:
        row = next(r for r in table.rows if r[0] == "torchcodec")
        assert "torchcodec" in row[-1] and "\n" not in row[-1]
    # the clips are written once: a second section run finds them
    assert len(list(tmp_path.glob("64x48_24f_gop4/*.mp4"))) >= 1
    marks = {g.goal.key: g for g in report.evaluate_goals(m, "cpu")}
    goal = marks["video_loader.keeps_up.pyav.gop16"]  # not measured at GOP 4
    assert goal.status == "not measured" and goal.goal.higher
    m16 = {"video_loader.keeps_up.pyav.gop16": Summary(1.3, 1.2, 1.4, 3),
           "video_loader.keeps_up.torchcodec.gop16": Summary(0.8, 0.7, 0.9, 3)}
    marks = {g.goal.key: g.status for g in report.evaluate_goals(m16, "cpu")}
    assert marks["video_loader.keeps_up.pyav.gop16"] == "PASS"
    assert marks["video_loader.keeps_up.torchcodec.gop16"] == "FAIL"  # a measured backend gets a goal


def test_command_line_sizes_and_markdown_tags(tmp_path):
    args = parse_args(["--quick", "--only", "detection", "video_loader", "--detection-batch", "3",
                       "--video-workers", "4", "--device", "cpu",
                       "--threads", str(torch.get_num_threads())])  # --quick alone would set 1 here
    assert selected_sections(args) == ["detection", "video_loader"]
    assert selected_sections(parse_args(["--only", "train", "ops", "train"])) == ["train", "ops"]  # as given
    s = build_settings(args)
    assert s.detection["batch"] == 3 and s.detection["image_size"] == (128, 160)
    assert s.video_loader["workers"] == 4 and s.repeats["detection"] == s.repeats["video_loader"] == 2
    full = build_settings(parse_args(["--device", "cpu", "--threads", str(torch.get_num_threads())]))
    assert full.detection.get("batch", 2) == 2 and full.repeats["detection"] == 3
    assert report.results_tag(s, "detection") == "detection"
    path = tmp_path / "RESULTS.md"
    env = [("date", "today")]
    goals = report.goals_table([], "cpu", set())
    for tag in ("", "detection", "video_loader"):
        report.write_results(path, report.render_markdown(env, [], goals, tag), tag)
    text = path.read_text()
    assert "<!-- bench:begin detection -->" in text and "<!-- bench:begin video_loader -->" in text
    assert text.count("<!-- bench:begin") == 3


def test_detection_mask_head_workload_is_the_objects():
    """The positive quota is the objects per image, so every contender's mask head trains on
    ``batch * boxes`` RoIs whatever its random-weight RPN proposes (torchvision's default quota made
    that count, and with it the train-step ratio, depend on the backbone's random weights)."""
    o = {**DETECTION_DEFAULTS, "batch": 2, "image_size": (64, 80), "min_size": 64, "max_size": 80,
         "boxes": 3, "num_classes": 3, "out_channels": 32, "head_channels": 32, "fc_dim": 32,
         "network_options": {"base_width": 8},
         "detector_options": {"rpn_post_nms_top_n_train": 40, "box_batch_size_per_image": 32}}
    assert int(32 * detector_options(o)["box_positive_fraction"]) == 3
    images, targets = synthetic_batch(o["batch"], o["image_size"], o["boxes"], o["num_classes"])
    for contender in detection_contenders(o):
        torch.manual_seed(0)
        model = contender.build().train()
        rois = []
        model.roi_heads.mask_roi_pool.register_forward_hook(lambda m, args, out: rois.append(out.shape[0]))
        model(images, targets)
        assert rois == [o["batch"] * o["boxes"]], contender.name


def test_no_section_starts_after_the_deadline(capsys):
    """``--deadline``: the sections left when it has passed are reported as not run, and the run
    fails (make bench-gpu's budget on a lent machine)."""
    from benchmarks.__main__ import main

    assert main(["--device", "cpu", "--quick", "--only", "ops", "train", "--deadline", "0"]) == 1
    out = capsys.readouterr().out
    assert "[ops] FAILED: not run: the 0 s deadline had passed (time it alone with --only ops)" in out
    assert "[train] FAILED: not run" in out
