"""`rescale compare` on run folders written here with known values: the exact table."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from rescale_core.schemes import definition, get_scheme
from rescale_tasks.cli import main
from rescale_tasks.studies.compare import mean_std


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")


def write_run(folder: Path, group: str, scheme: str, acc: float | None, speed: float, loss: float,
              seed: int, status: str = "finished", **extra) -> None:
    folder.mkdir(parents=True)
    options = extra.pop("scheme_options", {})
    summary = {"name": f"{scheme}-{seed}", "group": group, "network": "resnet50", "scheme": scheme,
               "scheme_options": options, "seed": seed, "status": status, "samples_per_second": speed,
               "final": {"train/loss_epoch": loss, "val/acc1": acc if acc is not None else "nan"},
               "best": {"val/acc1": acc} if acc is not None else {},
               "curves": {"train/loss": [[1, 2.3], [2, loss]], "val/acc1": [[0, acc or 0.1]]}, **extra}
    (folder / "run_summary.json").write_text(json.dumps(summary))


@pytest.fixture
def runs(tmp_path) -> Path:
    root = tmp_path / "runs"
    write_run(root / "a", "imagenet-r50", "bn", 0.70, 100.0, 1.0, 0)
    write_run(root / "b", "imagenet-r50", "bn", 0.74, 100.0, 0.8, 1)
    write_run(root / "c", "imagenet-r50", "rescale", 0.73, 150.0, 0.9, 0)
    write_run(root / "d", "imagenet-r50", "rescale", 0.77, 130.0, 0.7, 1)
    write_run(root / "e" / "deep", "imagenet-r50", "none", None, 200.0, float("nan"), 0, status="diverged")
    write_run(root / "f", "digits", "skipinit", 0.95, 10.0, 0.1, 0)
    write_run(root / "g", "digits", "bn", 0.97, 20.0, 0.05, 0)
    return root


def test_compare_gives_exactly_the_expected_table(runs, tmp_path, capsys):
    assert main(["compare", str(runs), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        rows = list(csv.DictReader(f))
    got = [(r["experiment"], r["variant"], r["role"], r["runs"], r["mean"], r["std"], r["vs_baseline"],
            r["better"], r["train_loss"], r["samples_per_s"], r["speed_vs_baseline"], r["diverged"]) for r in rows]
    std2 = mean_std([0.70, 0.74])[1]
    assert std2 == pytest.approx(0.0282842712, rel=1e-8)  # sample std: sqrt(0.0008 / 1)
    expected = [
        ("digits", "bn", "baseline", "1", "0.97", "", "0.0", "", "0.05", "20.0", "1.0", "0/1"),
        ("digits", "skipinit", "", "1", "0.95", "", str(0.95 - 0.97), "False", "0.1", "10.0", "0.5", "0/1"),
        ("imagenet-r50", "bn", "baseline", "2", str((0.70 + 0.74) / 2), str(std2), "0.0", "", "0.9", "100.0",
         "1.0", "0/2"),
        ("imagenet-r50", "none", "", "1", "", "", "", "", "", "", "", "1/1"),  # diverged: no throughput
        ("imagenet-r50", "rescale", "", "2", str((0.73 + 0.77) / 2), str(mean_std([0.73, 0.77])[1]),
         str((0.73 + 0.77) / 2 - (0.70 + 0.74) / 2), "True", "0.8", "140.0", "1.4", "0/2"),
    ]
    assert got == expected
    out = capsys.readouterr().out
    assert "| imagenet-r50 | rescale |  | 2 | val/acc1 | 0.75 | 0.02828 | 2 | 0.03 | yes | 0.8 | 140 | 1.4 | 0/2 |" in out
    for name in ("compare.md", "imagenet-r50_curves.png", "imagenet-r50_metric.png", "digits_curves.png"):
        assert (tmp_path / "cmp" / name).stat().st_size > 0


def test_a_diverged_runs_throughput_is_no_speed(tmp_path):
    """A baseline seed that diverged at step 2 logged the rate of its first steps: the baseline's
    throughput and every ratio to it are of the runs that did not diverge (it made 1.5x read 0.3x)."""
    root = tmp_path / "runs"
    write_run(root / "a", "digits", "bn", 0.97, 100.0, 0.05, 0)
    write_run(root / "b", "digits", "bn", None, 900.0, float("nan"), 1, status="diverged")
    write_run(root / "c", "digits", "rescale", 0.96, 150.0, 0.06, 0)
    write_run(root / "d", "digits", "rescale", None, 10.0, float("nan"), 1, status="diverged")
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        rows = [(r["variant"], r["samples_per_s"], r["speed_vs_baseline"], r["diverged"]) for r in csv.DictReader(f)]
    assert rows == [("bn", "100.0", "1.0", "1/2"), ("rescale", "150.0", "1.5", "1/2")]


def test_compare_names_its_baseline_and_metric(runs, tmp_path):
    assert main(["compare", str(runs), "--out", "cmp", "--baseline", "rescale", "--metric", "train/loss_epoch",
                 "--use", "final"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["experiment"] == "imagenet-r50"]
    assert [r["variant"] for r in rows] == ["rescale", "bn", "none"]
    assert rows[1]["better"] == "False"  # a loss: lower is better, bn's 0.9 > rescale's 0.8


@pytest.mark.parametrize("args,expected", [
    ([], "needs run folders"),
    (["nowhere"], "no such folder nowhere"),
    (["empty"], "no run_summary.json under empty"),
    (["--wandb_project", "me/proj"], "no run_summary.json of project proj under runs"),
])
def test_compare_bad_input_is_one_line(args, expected, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["compare", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0]


def test_compare_scores_each_experiment_by_its_own_task_metric():
    from rescale_tasks.studies.compare import compare_rows

    def run(group, scheme, final):
        return {"group": group, "scheme": scheme, "status": "finished", "final": final, "best": final}
    runs = [run("wmt", "post_ln", {"val/bleu": 20.0}), run("wmt", "rescale", {"val/bleu": 21.0}),
            run("coco", "bn", {"val/bbox_AP": 0.30}), run("coco", "rescale", {"val/bbox_AP": 0.31}),
            run("digits", "bn", {"val/acc1": 0.97}), run("digits", "rescale", {"val/acc1": 0.975})]
    rows, _ = compare_rows(runs)
    metric = {(r["experiment"], r["variant"]): (r["metric"], r["mean"]) for r in rows}
    assert metric[("wmt", "rescale")] == ("val/bleu", 21.0)
    assert metric[("coco", "rescale")] == ("val/bbox_AP", 0.31)
    assert metric[("digits", "rescale")] == ("val/acc1", 0.975)


def test_a_paper_models_runs_are_named_by_the_scheme_its_name_fixes():
    from rescale_tasks.studies.compare import variant_of

    assert variant_of({"network": "rescale50", "scheme": None}) == "rescale"  # W&B records scheme: null
    assert variant_of({"network": "fixup50"}) == "fixup"
    assert variant_of({"network": "no_such_net"}) == "unknown"



MALFORMED = {  # folder: (run_summary.json's text, why it is not a run summary)
    "truncated": ('{"name": "bn-2", "group": "digits", "sch',
                  "invalid JSON (Unterminated string starting at: line 1 column 37); a truncated file?"),
    "a_list": ("[1, 2]", "it holds a list, not an object"),
    "speed_text": ('{"scheme": "bn", "samples_per_second": "fast"}',
                   "'samples_per_second' is a string (\"fast\"), not a number"),
    "best_text": ('{"scheme": "bn", "best": {"val/acc1": "high"}}', "best['val/acc1'] is a string, not a number"),
    "curve_bad": ('{"scheme": "bn", "curves": {"train/loss": [[1]]}}',
                  "curves['train/loss'] is not a list of [step, value] pairs"),
    "scheme_number": ('{"scheme": 3}', "'scheme' is a number (3), not a string"),
}


def test_malformed_summaries_are_named_and_skipped(runs, tmp_path, capsys):
    for name, (content, _) in MALFORMED.items():
        (runs / name).mkdir()
        (runs / name / "run_summary.json").write_text(content)
    assert main(["compare", str(runs), "--out", "cmp"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert sorted(err[:-1]) == sorted(f"warning: skipped {runs / name / 'run_summary.json'} is not a run summary: "
                                      f"{why}" for name, (_, why) in MALFORMED.items()), err
    assert err[-1] == "warning: skipped 6 of 13 run_summary.json files as malformed (named above)"
    with open(tmp_path / "cmp/compare.csv") as f:
        assert len(list(csv.DictReader(f))) == 5  # the good runs' table, as without the bad files
    assert "6 malformed run_summary.json left out" in (tmp_path / "cmp/compare.md").read_text()


def test_only_malformed_summaries_is_one_line(tmp_path, capsys):
    (tmp_path / "runs/a").mkdir(parents=True)
    (tmp_path / "runs/a/run_summary.json").write_text("{")
    assert main(["compare", "runs"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("error: no readable run_summary.json (1 malformed, named above) under runs: every `rescale "
                       "fit` writes one beside its config; point at the runs' folders")
    assert len(err) == 2 and err[0].startswith("warning: skipped ")


def test_a_resumed_run_counts_once_and_seeds_are_distinct_runs(tmp_path):
    """Each segment of a resumed run writes a summary covering the run so far (the same run id);
    the furthest one stands for the run: two seeds, one resumed twice, are two runs."""
    root = tmp_path / "segments"
    write_run(root / "s0-a", "digits", "rescale", 0.60, 10.0, 1.0, 0, status="interrupted", run_id="s0", steps=5)
    write_run(root / "s0-b", "digits", "rescale", 0.75, 10.0, 0.8, 0, status="interrupted", run_id="s0", steps=9)
    write_run(root / "s0-c", "digits", "rescale", 0.80, 10.0, 0.5, 0, run_id="s0", steps=12)
    write_run(root / "s1", "digits", "rescale", 0.70, 10.0, 0.6, 1, run_id="s1", steps=12)
    write_run(root / "bn", "digits", "bn", 0.90, 10.0, 0.1, 0, run_id="b0", steps=12)
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        (row,) = [r for r in csv.DictReader(f) if r["variant"] == "rescale"]
    assert row["runs"] == "2" and float(row["mean"]) == pytest.approx(0.75)
    assert float(row["std"]) == pytest.approx(mean_std([0.80, 0.70])[1])
    assert row["train_loss"] == str((0.5 + 0.6) / 2)


def test_runs_of_other_settings_are_not_pooled_silently_as_seeds(tmp_path, capsys):
    """AGC changes the method: its runs are a variant of their own. Runs of one variant at other
    learning rates and batch sizes, or of one seed, are pooled but named in one warning line and
    marked in the table."""
    root = tmp_path / "settings"
    same = {"lr": 0.1, "batch_size": 64}
    write_run(root / "bn", "digits", "bn", 0.97, 20.0, 0.05, 0, **same)
    write_run(root / "nf", "digits", "nf", 0.90, 10.0, 0.2, 0, agc_clip=None, **same)
    write_run(root / "nf_agc", "digits", "nf", 0.94, 10.0, 0.1, 0, agc_clip=0.01, **same)
    write_run(root / "fixup0", "digits", "fixup", 0.92, 10.0, 0.1, 0, **same)
    write_run(root / "fixup1", "digits", "fixup", 0.94, 10.0, 0.1, 1, **same)
    write_run(root / "skip_a", "digits", "skipinit", 0.93, 10.0, 0.1, 0, **same)
    write_run(root / "skip_b", "digits", "skipinit", 0.95, 10.0, 0.1, 0, lr=0.4, batch_size=256)
    write_run(root / "rezero_a", "digits", "rezero", 0.91, 10.0, 0.1, 3, **same)
    write_run(root / "rezero_b", "digits", "rezero", 0.92, 10.0, 0.1, 3, **same)
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        rows = {r["variant"]: (r["runs"], r["mean"], r["mixed"]) for r in csv.DictReader(f)}
    assert rows == {
        "bn": ("1", "0.97", ""), "fixup": ("2", str((0.92 + 0.94) / 2), ""), "nf": ("1", "0.9", ""),
        "nf[agc_clip=0.01]": ("1", "0.94", ""), "rezero": ("2", str((0.91 + 0.92) / 2), "shared seed 3"),
        "skipinit": ("2", str((0.93 + 0.95) / 2), "lr, batch_size, shared seed 0"),
    }
    tail = ("yet are pooled as its seeds (marked in the mixed column); give such runs different W&B groups, "
            "or compare their folders apart")
    assert capsys.readouterr().err.strip().splitlines() == [
        f"warning: digits: the 2 runs of rezero share seed 3, {tail}",
        f"warning: digits: the 2 runs of skipinit differ in lr (0.1, 0.4) and batch_size (64, 256), and share "
        f"seed 0, {tail}",
    ]
    assert main(["compare", str(root), "--out", "cmp", "--baseline", "nf"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        assert [r["variant"] for r in csv.DictReader(f) if r["role"]] == ["nf"]  # not nf[agc_clip=0.01]


def test_a_sweeps_folder_is_named_in_one_warning_line(tmp_path, capsys):
    """A batch-size / learning-rate study's folder: each variant pooled over the same settings (and
    seeds repeated at each point) is one line for the experiment, not one per variant."""
    root = tmp_path / "sweep"
    for scheme, acc in (("bn", 0.97), ("rescale", 0.95), ("fixup", 0.94)):
        for batch, lr in ((64, 0.05), (256, 0.2), (1024, 0.8)):
            for seed in (0, 1):
                write_run(root / f"{scheme}-{batch}-{seed}", "digits", scheme, acc, 10.0, 0.1, seed, lr=lr,
                          batch_size=batch)
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    assert capsys.readouterr().err.strip().splitlines() == [
        "warning: digits: the runs of each of its 3 variants (bn, fixup, rescale) differ in lr (0.05, 0.2, 0.8) "
        "and batch_size (64, 256, 1024), and share seeds 0 and 1, yet are pooled as their seeds (marked in the "
        "mixed column); give such runs different W&B groups, or compare their folders apart"]
    with open(tmp_path / "cmp/compare.csv") as f:
        assert {r["mixed"] for r in csv.DictReader(f)} == {"lr, batch_size, shared seed 0, 1"}


def test_agc_runs_that_clip_otherwise_are_variants_of_their_own(tmp_path, capsys):
    """AGC with the classifier clipped too, or at another eps, is another method: not a seed of the
    default AGC's row. The defaults (eps 1e-3, classifier left alone) keep the short name, and eps
    or the classifier switch recorded without an agc_clip (AGC off) name nothing."""
    root = tmp_path / "agc"
    same = {"lr": 0.1, "batch_size": 64}
    write_run(root / "bn", "digits", "bn", 0.97, 20.0, 0.05, 0, **same)
    write_run(root / "nf", "digits", "nf", 0.80, 10.0, 0.2, 0, agc_clip=None, agc_eps=0.5,
              agc_clip_classifier=True, **same)
    write_run(root / "agc", "digits", "nf", 0.90, 10.0, 0.1, 0, agc_clip=0.01, agc_eps=0.001,
              agc_clip_classifier=False, **same)
    write_run(root / "agc_all", "digits", "nf", 0.50, 10.0, 0.1, 1, agc_clip=0.01, agc_eps=0.001,
              agc_clip_classifier=True, **same)
    write_run(root / "agc_eps", "digits", "nf", 0.60, 10.0, 0.1, 2, agc_clip=0.01, agc_eps=0.1,
              agc_clip_classifier=False, **same)
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        rows = {r["variant"]: (r["runs"], r["mean"]) for r in csv.DictReader(f)}
    assert rows == {"bn": ("1", "0.97"), "nf": ("1", "0.8"), "nf[agc_clip=0.01]": ("1", "0.9"),
                    "nf[agc_clip=0.01,agc_clip_classifier=True]": ("1", "0.5"),
                    "nf[agc_clip=0.01,agc_eps=0.1]": ("1", "0.6")}
    assert "warning" not in capsys.readouterr().err


def test_runs_of_two_definitions_of_one_scheme_are_not_pooled_as_its_seeds(tmp_path, capsys):
    """`rezero` came to share one gain per Transformer layer (`layer_gain`): a run recording the
    definition before was averaged with the new ones as one scheme. It is the variant the options
    that build its network now name (`rezero[layer_gain=False]`), pooled with the runs given that
    option; a summary without the record counts as the scheme it names, as before."""
    root, now = tmp_path / "runs", definition(get_scheme("rezero"))
    old = {**now, "layer_gain": False}
    tiny = {"network": "transformer_tiny"}
    write_run(root / "post_ln", "wmt", "post_ln", 0.97, 20.0, 0.05, 0, **tiny)
    write_run(root / "new", "wmt", "rezero", 0.90, 10.0, 0.1, 0, scheme_fields=now, **tiny)
    write_run(root / "unrecorded", "wmt", "rezero", 0.80, 10.0, 0.1, 1, **tiny)
    write_run(root / "old", "wmt", "rezero", 0.50, 10.0, 0.1, 0, scheme_fields=old, **tiny)
    write_run(root / "option", "wmt", "rezero", 0.60, 10.0, 0.1, 1, scheme_options={"layer_gain": False},
              scheme_fields=old, **tiny)
    # a conv network reads no layer_gain: the same network before and after, one variant
    write_run(root / "conv_old", "cifar", "rezero", 0.70, 10.0, 0.1, 0, scheme_fields=old)
    write_run(root / "conv_new", "cifar", "rezero", 0.72, 10.0, 0.1, 1, scheme_fields=now)
    write_run(root / "conv_bn", "cifar", "bn", 0.75, 10.0, 0.1, 0)
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        rows = {(r["experiment"], r["variant"]): (r["runs"], r["mean"]) for r in csv.DictReader(f)}
    assert rows == {("wmt", "post_ln"): ("1", "0.97"), ("wmt", "rezero"): ("2", str((0.90 + 0.80) / 2)),
                    ("wmt", "rezero[layer_gain=False]"): ("2", str((0.50 + 0.60) / 2)),
                    ("cifar", "bn"): ("1", "0.75"), ("cifar", "rezero"): ("2", str((0.70 + 0.72) / 2))}
    assert "warning" not in capsys.readouterr().err


def test_a_wandb_run_with_agc_is_a_variant_of_its_own():
    from rescale_tasks.studies.compare import run_from_wandb, variant_of

    config = {"seed_everything": 2, "data": {"init_args": {"batch_size": 128}},
              "model": {"init_args": {"network": "resnet20", "scheme": "nf", "agc_clip": 0.01,
                                      "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.2}}}}}
    run = run_from_wandb(config=config, summary={}, history=[])
    assert variant_of(run) == "nf[agc_clip=0.01]"
    config["model"]["init_args"].update(agc_clip_classifier=True, agc_eps=0.01)
    run = run_from_wandb(config=config, summary={}, history=[])
    assert variant_of(run) == "nf[agc_clip=0.01,agc_clip_classifier=True,agc_eps=0.01]"
    assert (run["seed_everything"], run["data_seed"], run["lr"], run["batch_size"]) == (2, None, 0.2, 128)


def test_a_wandb_runs_throughput_is_its_whole_runs():
    """The W&B summary holds the last window's rate under throughput/<unit>_per_s and the whole
    run's under throughput/run_<unit>_per_s: compare reads the latter; an older run's only key."""
    from rescale_tasks.studies.compare import run_from_wandb

    config = {"model": {"init_args": {"network": "resnet20", "scheme": "nf"}}}
    summary = {"throughput/images_per_s": 900.0, "throughput/run_images_per_s": 700.0}
    assert run_from_wandb(config=config, summary=summary, history=[])["samples_per_second"] == 700.0
    old = {"throughput/images_per_s": 800.0}
    assert run_from_wandb(config=config, summary=old, history=[])["samples_per_second"] == 800.0


def test_a_layernorm_free_scheme_is_never_the_baseline(tmp_path, capsys):
    """dyt and derf replace LayerNorm (their norm field names them): without post_ln or pre_ln a
    study of them has no baseline, said in one line; with one, that one is the baseline."""
    root = tmp_path / "transformers"
    for folder, group, scheme, bleu in (("a", "wmt-6L", "dyt", 20.0), ("b", "wmt-6L", "derf", 21.0),
                                        ("c", "wmt-6L", "rescale", 22.0), ("d", "wmt-18L", "dyt", 20.0),
                                        ("e", "wmt-18L", "deepnorm", 19.0)):
        (root / folder).mkdir(parents=True)
        (root / folder / "run_summary.json").write_text(json.dumps(
            {"group": group, "scheme": scheme, "seed": 0, "status": "finished", "final": {"val/bleu": bleu},
             "best": {"val/bleu": bleu}}))
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        rows = [(r["experiment"], r["variant"], r["role"], r["vs_baseline"], r["better"]) for r in csv.DictReader(f)]
    assert rows == [("wmt-18L", "deepnorm", "baseline", "0.0", ""), ("wmt-18L", "dyt", "", "1.0", "True"),
                    ("wmt-6L", "derf", "", "", ""), ("wmt-6L", "dyt", "", "", ""), ("wmt-6L", "rescale", "", "", "")]
    assert capsys.readouterr().err.strip().splitlines() == [
        "warning: wmt-6L: no normalized baseline (none of bn, gn, post_ln, pre_ln, nor another scheme with "
        "BatchNorm, GroupNorm or LayerNorm) among its variants derf, dyt, rescale; its rows have no comparison to "
        "a baseline (name one of its variants with --baseline)"]


def test_a_scheme_whose_options_remove_its_norm_is_not_the_baseline(tmp_path, capsys):
    """A normalized scheme's name with options that replace its norm (post_ln[norm=None], pre_ln[norm=dyt])
    is no normalized baseline; bn[norm=gn] still is."""
    root = tmp_path / "options"
    for folder, group, scheme, options, value in (("a", "wmt", "post_ln", {"norm": None}, 10.0),
                                                  ("b", "wmt", "dyt", {}, 20.0),
                                                  ("c", "wmt", "pre_ln", {"norm": "dyt"}, 21.0),
                                                  ("d", "digits", "bn", {"norm": "gn"}, 0.9),
                                                  ("e", "digits", "rescale", {}, 0.95)):
        (root / folder).mkdir(parents=True)
        (root / folder / "run_summary.json").write_text(json.dumps(
            {"group": group, "scheme": scheme, "scheme_options": options, "seed": 0, "status": "finished",
             "final": {"val/bleu" if group == "wmt" else "val/acc1": value},
             "best": {"val/bleu" if group == "wmt" else "val/acc1": value}}))
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        roles = {(r["experiment"], r["variant"]): r["role"] for r in csv.DictReader(f)}
    assert roles == {("digits", "bn[norm=gn]"): "baseline", ("digits", "rescale"): "",
                     ("wmt", "dyt"): "", ("wmt", "post_ln[norm=None]"): "", ("wmt", "pre_ln[norm=dyt]"): ""}
    assert "wmt: no normalized baseline" in capsys.readouterr().err


def test_a_tie_with_the_baseline_is_not_better():
    from rescale_tasks.studies.compare import compare_rows

    def run(scheme, metric, value):
        return {"group": "g", "scheme": scheme, "status": "finished", "final": {metric: value}, "best": {metric: value}}
    for metric in ("val/bleu", "val/loss"):
        rows, _ = compare_rows([run("post_ln", metric, 0.0), run("rezero", metric, 0.0)], metric=metric)
        assert [(r["variant"], r["vs_baseline"], r["better"]) for r in rows] == [
            ("post_ln", 0.0, None), ("rezero", 0.0, False)], metric


@pytest.mark.parametrize("args,expected", [
    (["--metric", "val/acc"], "error: --metric val/acc: no run logged it as a best value (--use best); their best "
                              "values: val/acc1"),
    (["--metric", "train/loss_epoch"], "error: --metric train/loss_epoch: no run logged it as a best value (--use "
                                       "best); their best values: val/acc1; it is among their final values: "
                                       "--use final"),
])
def test_a_metric_no_run_logged_is_one_line(runs, tmp_path, capsys, args, expected):
    """A mistyped metric, or a training metric (no best value), gave a table of empty cells and bars
    labelled diverged: now one line naming the metrics the runs hold, and nothing written."""
    assert main(["compare", str(runs), "--out", "cmp", *args]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [expected]
    assert not (tmp_path / "cmp/compare.csv").exists()


def test_an_experiment_without_the_metric_is_named(tmp_path, capsys):
    root = tmp_path / "runs"
    write_run(root / "a", "digits", "bn", 0.97, 20.0, 0.05, 0)
    write_run(root / "b", "digits", "rescale", 0.96, 20.0, 0.05, 0)
    for folder, scheme in (("c", "post_ln"), ("d", "rescale")):
        (root / folder).mkdir(parents=True)
        (root / folder / "run_summary.json").write_text(json.dumps(
            {"group": "wmt", "scheme": scheme, "seed": 0, "status": "finished", "final": {"val/loss": 2.0},
             "best": {"val/loss": 2.0}}))
    assert main(["compare", str(root), "--out", "cmp", "--metric", "val/acc1"]) == 0
    assert capsys.readouterr().err.strip().splitlines() == [
        "warning: wmt: none of its runs logged val/acc1 (as a best value); its rows have no val/acc1 (its runs' "
        "best values: val/loss)"]


def test_runs_of_other_lengths_are_not_pooled_silently_as_seeds(tmp_path, capsys):
    """A seed stopped early (never resumed, or still training: its summary is an earlier segment's)
    pooled with finished seeds pulls the variant's mean: named in one warning line with the steps
    each trained, and marked in the table; a diverged run stops early by design and is left out."""
    root = tmp_path / "lengths"
    write_run(root / "bn", "digits", "bn", 0.97, 20.0, 0.05, 0, steps=100)
    write_run(root / "r0", "digits", "rescale", 0.95, 10.0, 0.1, 0, steps=100)
    write_run(root / "r1", "digits", "rescale", 0.50, 10.0, 0.1, 1, steps=10, status="interrupted")
    write_run(root / "f0", "digits", "fixup", 0.94, 10.0, 0.1, 0, steps=100)
    write_run(root / "f1", "digits", "fixup", None, 10.0, float("nan"), 1, steps=7, status="diverged")
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        assert {r["variant"]: r["mixed"] for r in csv.DictReader(f)} == {"bn": "", "fixup": "", "rescale": "steps"}
    assert capsys.readouterr().err.strip().splitlines() == [
        "warning: digits: the 2 runs of rescale differ in steps (10 interrupted, 100), yet are pooled as its seeds "
        "(marked in the mixed column); give such runs different W&B groups, or compare their folders apart; resume "
        "a run that did not finish to its end (rescale fit ... --ckpt_path <its last.ckpt>)"]


def test_a_variant_against_a_baseline_of_another_network_is_named(tmp_path, capsys):
    """One W&B group holding a depth-20 BN run and a depth-56 RescaleNet (a depth overridden on the
    command line keeps the config's group) compared them silently: now one warning line and the
    mixed column. A paper model's name that fixes only its scheme (rescale50 is resnet50 under
    rescale) is the same network."""
    root = tmp_path / "depths"
    write_run(root / "bn", "digits", "bn", 0.90, 20.0, 0.05, 0, network="cifar_resnet",
              network_options={"depth": 20})
    write_run(root / "r", "digits", "rescale", 0.95, 10.0, 0.1, 0, network="cifar_resnet",
              network_options={"depth": 56})
    write_run(root / "f", "digits", "fixup", 0.93, 10.0, 0.1, 0, network="cifar_resnet",
              network_options={"depth": 20})
    write_run(root / "in_bn", "imagenet", "bn", 0.76, 20.0, 0.05, 0, network="resnet50")
    write_run(root / "in_r", "imagenet", "rescale", 0.76, 20.0, 0.05, 0, network="rescale50")
    write_run(root / "in_r101", "imagenet", "fixup", 0.78, 20.0, 0.05, 0, network="resnet101")
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        assert {(r["experiment"], r["variant"]): r["mixed"] for r in csv.DictReader(f)} == {
            ("digits", "bn"): "", ("digits", "fixup"): "", ("digits", "rescale"): "network vs baseline",
            ("imagenet", "bn"): "", ("imagenet", "fixup"): "network vs baseline", ("imagenet", "rescale"): ""}
    tail = ("yet is compared with it (marked in the mixed column); give such runs different W&B groups, or compare "
            "their folders apart")
    assert capsys.readouterr().err.strip().splitlines() == [
        f'warning: digits: rescale ran another network than its baseline bn (cifar_resnet {{"depth": 56}} against '
        f'cifar_resnet {{"depth": 20}}), {tail}',
        f"warning: imagenet: fixup ran another network than its baseline bn (resnet101 against resnet50), {tail}"]


def test_a_baseline_without_a_value_is_named(tmp_path, capsys):
    """Every run of the baseline diverged (or logged no finite value): its variants' rows compare
    to nothing, said in one warning line, as an experiment without a baseline is."""
    root = tmp_path / "nobase"
    write_run(root / "bn0", "digits", "bn", None, 20.0, float("nan"), 0, status="diverged")
    write_run(root / "bn1", "digits", "bn", None, 20.0, float("nan"), 1, status="diverged")
    write_run(root / "r", "digits", "rescale", 0.95, 10.0, 0.1, 0)
    write_run(root / "g", "mnist", "gn", None, 20.0, 0.1, 0)
    write_run(root / "f", "mnist", "fixup", 0.9, 10.0, 0.1, 0)
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    tail = "its variants' rows have no comparison to a baseline (name another of its variants with --baseline)"
    assert capsys.readouterr().err.strip().splitlines() == [
        f"warning: digits: the baseline bn has no val/acc1: its 2 runs diverged; {tail}",
        f"warning: mnist: the baseline gn has no val/acc1: its runs logged no finite val/acc1 (best value); {tail}"]
    with open(tmp_path / "cmp/compare.csv") as f:
        assert {r["vs_baseline"] for r in csv.DictReader(f)} == {""}


def test_a_wandb_run_still_training_is_named_among_its_seeds(caplog):
    """A W&B project's run still training (state running) has its steps so far from its history: pooled
    with finished seeds, it is named as a run of other length."""
    from rescale_tasks.studies.compare import compare_rows, run_from_wandb

    def run(scheme, seed, steps, state):
        config = {"seed_everything": seed, "model": {"init_args": {"network": "resnet20", "scheme": scheme}}}
        history = [{"trainer/global_step": s, "val/acc1": 0.5 + s / 1000} for s in range(9, steps, 10)]
        return run_from_wandb(config=config, summary={}, history=history, group="digits", run_id=f"{scheme}{seed}",
                              state=state)
    runs = [run("bn", 0, 100, "finished"), run("rescale", 0, 100, "finished"), run("rescale", 1, 40, "running")]
    assert [r["steps"] for r in runs] == [100, 100, 40]
    rows, _ = compare_rows(runs)
    assert [r["mixed"] for r in rows] == ["", "steps"]
    assert "the 2 runs of rescale differ in steps (40 running, 100)" in caplog.text


def test_a_bar_without_value_says_why():
    """The metric plot labelled every variant without a value diverged, also one whose runs logged no
    value (stopped before validating, or a NaN metric)."""
    from rescale_tasks.studies.compare import bar_label, compare_rows

    def run(scheme, status, best):
        return {"group": "g", "scheme": scheme, "status": status, "final": {}, "best": best}
    rows, _ = compare_rows([run("bn", "finished", {"val/acc1": 0.9}), run("none", "diverged", {}),
                            run("fixup", "interrupted", {"val/acc1": None}), run("fixup", "diverged", {})])
    assert [bar_label(r) for r in rows] == ["bn", "fixup (no value)", "none (diverged)"]


def test_the_wandb_run_is_checked_first_and_an_id_takes_the_projects_name(runs, tmp_path, capsys):
    """--wandb_run <id> was refused for want of --wandb_project even when it was given (compare did
    not pass it on), and only once the table was written: now checked before anything is read, and
    the id is a run of the project compared."""
    assert main(["compare", str(runs), "--out", "cmp", "--wandb_run", "abc123"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --wandb_run abc123: a run id needs --wandb_project (or give the run's folder)"]
    assert not (tmp_path / "cmp").exists()
    for summary in runs.rglob("run_summary.json"):
        summary.write_text(json.dumps({**json.loads(summary.read_text()), "project": "proj"}))
    assert main(["compare", "--wandb_project", "me/proj", "--wandb_dir", str(runs), "--out", "cmp",
                 "--wandb_run", "abc123"]) == 0
    assert "logged to W&B run abc123" in capsys.readouterr().out
    assert len(list(tmp_path.glob("wandb/offline-run-*-abc123/run-abc123.wandb"))) == 1


def test_experiments_of_one_file_name_each_keep_their_plots(tmp_path, capsys):
    """Groups "en de" and "en_de" both make en_de_*.png: the second overwrote the first's plots."""
    root = tmp_path / "slugs"
    for group in ("en de", "en_de"):
        write_run(root / group / "bn", group, "bn", 0.9, 10.0, 0.1, 0)
        write_run(root / group / "r", group, "rescale", 0.8, 10.0, 0.1, 0)
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    assert sorted(p.name for p in (tmp_path / "cmp").glob("*.png")) == [
        "en_de-2_curves.png", "en_de-2_metric.png", "en_de_curves.png", "en_de_metric.png"]


def test_the_seeds_are_read_by_their_own_names_older_summaries_too(tmp_path):
    """A summary names ``seed_everything`` and the data order's ``data_seed`` apart (an older one
    has ``seed``, which was seed_everything): runs sharing a data seed only are not flagged as
    sharing a seed; two sharing seed_everything are, in the new and the old form alike."""
    root = tmp_path / "runs"
    for name, everything in (("a", 0), ("b", 1)):
        write_run(root / name, "digits", "bn", 0.9, 10.0, 0.1, everything)
    for name, everything in (("c", 4), ("d", 4)):
        write_run(root / name, "digits", "rescale", 0.9, 10.0, 0.1, 0, seed_everything=everything, data_seed=0)
    for name in ("e", "f"):
        write_run(root / name, "digits", "skipinit", 0.9, 10.0, 0.1, 5)
    for path in (root / "c" / "run_summary.json", root / "d" / "run_summary.json"):
        summary = json.loads(path.read_text())
        del summary["seed"]
        path.write_text(json.dumps(summary))
    for name, everything in (("g", 6), ("h", 7)):
        write_run(root / name, "digits", "fixup", 0.9, 10.0, 0.1, 0, seed_everything=everything, data_seed=0)
        summary = json.loads((root / name / "run_summary.json").read_text())
        del summary["seed"]
        (root / name / "run_summary.json").write_text(json.dumps(summary))
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        mixed = {r["variant"]: r["mixed"] for r in csv.DictReader(f)}
    assert mixed == {"bn": "", "rescale": "shared seed 4", "skipinit": "shared seed 5", "fixup": ""}, mixed


def test_wandb_runs_of_other_data_are_named_as_mixed():
    """The data fingerprint the suite pushed into a W&B run's config (``data_fingerprint``) is its
    ``data``: runs of one variant whose data differ are named; an older run without it is unknown."""
    from rescale_tasks.studies.compare import pooled_differences, run_from_wandb

    def run(seed, val=None):
        config = {"seed_everything": seed, "model": {"init_args": {"network": "resnet20", "scheme": "bn"}}}
        if val is not None:
            config["data_fingerprint"] = {"class": "DigitsDataModule", "splits": {"val": {"count": val, "hash": f"{val:012d}"}}}
        return run_from_wandb(config=config, summary={}, history=[])

    assert run(0)["data"] is None and pooled_differences([run(0), run(1, 270), run(2, 270)]) == {}
    assert pooled_differences([run(0, 270), run(1, 360)]) == {
        "data": ["DigitsDataModule[val 270 #000000000270]", "DigitsDataModule[val 360 #000000000360]"]}
    # a run that recorded one split more (its summary besides its W&B config) read the same data
    more = run(3, 270)
    more["data"] = {**more["data"], "splits": {**more["data"]["splits"], "test": {"count": 9, "hash": "9" * 12}}}
    assert pooled_differences([run(1, 270), more]) == {}


def test_a_diverged_runs_training_loss_is_left_out_of_the_mean(tmp_path):
    """A seed that diverged stopped with a large but finite loss: the variant's train_loss is of the
    runs that did not diverge, as its throughput is (it made 0.06 read 25.03)."""
    root = tmp_path / "runs"
    write_run(root / "a", "digits", "bn", 0.97, 100.0, 0.05, 0)
    write_run(root / "c", "digits", "rescale", 0.96, 150.0, 0.06, 0)
    write_run(root / "d", "digits", "rescale", None, 150.0, 50.0, 1, status="diverged")
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        rows = [(r["variant"], r["train_loss"], r["diverged"]) for r in csv.DictReader(f)]
    assert rows == [("bn", "0.05", "0/1"), ("rescale", "0.06", "1/2")]


def test_a_variant_against_a_baseline_on_other_data_is_named(tmp_path, capsys):
    """A BN run on the 8x8 digits and a RescaleNet run of the same network on MNIST 5k, both without
    a W&B group (the experiment is the network), were set against each other silently: now one
    warning line and the mixed column. A run that recorded no data (an older summary) is not named."""
    digits = {"class": "DigitsDataModule", "splits": {"val": {"count": 270, "hash": "521e"}}}
    mnist = {"class": "MNIST5kDataModule", "splits": {"val": {"count": 1000, "hash": "9c1b"}}}
    root = tmp_path / "runs"
    write_run(root / "bn", None, "bn", 0.97, 20.0, 0.05, 0, network="cifar_resnet", data=digits)
    write_run(root / "r", None, "rescale", 0.90, 10.0, 0.1, 0, network="cifar_resnet", data=mnist)
    write_run(root / "f", None, "fixup", 0.95, 10.0, 0.1, 0, network="cifar_resnet", data={**digits, "root": "/x"})
    write_run(root / "s", None, "skipinit", 0.95, 10.0, 0.1, 0, network="cifar_resnet")
    # the same data, its fingerprint holding a split more (as the data module reads it): not named
    write_run(root / "n", None, "nf", 0.95, 10.0, 0.1, 0, network="cifar_resnet",
              data={**digits, "splits": {**digits["splits"], "test": {"count": 270, "hash": "e343"}}})
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        assert {r["variant"]: r["mixed"] for r in csv.DictReader(f)} == {
            "bn": "", "fixup": "", "nf": "", "rescale": "data vs baseline", "skipinit": ""}
    assert capsys.readouterr().err.strip().splitlines() == [
        "warning: cifar_resnet: rescale read other data than its baseline bn (MNIST5kDataModule[val 1000 #9c1b] "
        "against DigitsDataModule[val 270 #521e]), yet is compared with it (marked in the mixed column); give such "
        "runs different W&B groups, or compare their folders apart"]


def test_a_run_read_from_its_folder_and_from_wandb_counts_once(tmp_path):
    """``rescale compare runs/ --wandb_project me/rescale-digits`` logged in: a run's summary under
    runs/ names its project ``rescale-digits``, W&B's API read the same run as of
    ``me/rescale-digits``; the two were two seeds (n doubled, the std shrunk), now one run."""
    from rescale_tasks.studies.compare import latest_segments, run_from_wandb

    config = {"seed_everything": 0, "model": {"init_args": {"network": "resnet20", "scheme": "bn"}}}
    history = [{"trainer/global_step": 99, "val/acc1": 0.9}]
    online = run_from_wandb(config=config, summary={}, history=history, group="digits", run_id="abc",
                            project="me/rescale-digits", state="finished")
    folder = {**online, "project": "rescale-digits", "path": str(tmp_path / "run_summary.json")}
    assert len(latest_segments([folder, online])) == 1
    assert len(latest_segments([folder, {**online, "run_id": "xyz"}])) == 2


def test_the_runs_a_mean_is_of_are_counted(tmp_path):
    """A finished seed whose metric is not finite (NaN) is left out of the mean, which the table
    said was of every run of the variant (runs 2, diverged 0/2): n says of how many."""
    root = tmp_path / "runs"
    write_run(root / "a", "digits", "bn", 0.97, 100.0, 0.05, 0)
    write_run(root / "b", "digits", "rescale", 0.96, 150.0, 0.06, 0)
    write_run(root / "c", "digits", "rescale", float("nan"), 150.0, 0.06, 1)
    assert main(["compare", str(root), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        rows = [(r["variant"], r["runs"], r["mean"], r["n"], r["diverged"]) for r in csv.DictReader(f)]
    assert rows == [("bn", "1", "0.97", "1", "0/1"), ("rescale", "2", "0.96", "1", "0/2")]
