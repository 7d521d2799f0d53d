"""Studies over seeds and per-scheme recipes, and the published study tables copied from their files.

- a depth or batch-lr study with ``--seeds`` has one point per seed (its own ``--seed_everything``,
  after the study's) and ``--recipe`` adds each scheme's recipe config where it exists;
- steps to 90% of the final metric are read from a run's learning curve (a slow start is a large
  number, not a failure), and the seeds of a setting collapse into mean, sample std and n, with the
  diverged runs counted apart (a setting is stable only when no seed diverged);
- the study tables of ``docs/studies.md`` equal the files the study commands wrote (no hand-typed
  figures), and ``rescale study tables`` checks that page by default.
"""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from rescale_tasks.common.errors import UserError
from rescale_tasks.studies.readme_tables import fill_tables, update_document
from rescale_tasks.studies.seeded import collapse_seeds, mean_curve, steps_to_fraction
from rescale_tasks.studies.points import batch_lr_points, depth_points
from rescale_tasks.studies.tables import batch_lr_tables, depth_axis, depth_seed_tables

REPO = Path(__file__).resolve().parents[3]
M = "val/acc1"


def test_seeded_points_carry_their_seed_and_the_schemes_recipe(tmp_path):
    (tmp_path / "rescale.yaml").write_text("model: {}\n")
    template = str(tmp_path / "{scheme}.yaml")
    points = depth_points(["base.yaml"], [20, 56], ["bn", "rescale"], "s", seeds=[0, 1], recipe=template)
    assert [p.name for p in points][:4] == ["d20-bn-s0", "d20-bn-s1", "d56-bn-s0", "d56-bn-s1"]
    by = {p.name: p for p in points}
    assert by["d56-rescale-s1"].configs == ["base.yaml", str(tmp_path / "rescale.yaml")]
    assert by["d56-rescale-s1"].params == {"depth": 56, "scheme": "rescale", "recipe": "rescale", "seed": 1}
    assert by["d20-bn-s0"].configs == ["base.yaml"] and by["d20-bn-s0"].params["recipe"] == "base"
    assert by["d56-rescale-s1"].overrides[-2:] == ["--seed_everything", "1"]
    # without seeds: the names and arguments of before
    (plain,) = depth_points(["base.yaml"], [20], ["bn"], "s")
    assert plain.name == "d20-bn" and "--seed_everything" not in plain.overrides and "seed" not in plain.params
    lr_points = batch_lr_points(["base.yaml"], [64], [0.1], ["bn"], "s", seeds=[3])
    assert [p.name for p in lr_points] == ["bn-b64-lr0.1-s3"]


def test_steps_to_ninety_percent_of_the_final_value():
    slow = [[10, 0.1], [20, 0.3], [30, 0.85], [40, 0.95]]
    assert steps_to_fraction(slow, 0.95) == 40  # 90% of 0.95 is 0.855: 0.85 at step 30 is not there yet
    fast = [[10, 0.9], [20, 0.95]]
    assert steps_to_fraction(fast, 0.95) == 10
    assert steps_to_fraction([[5, 2.0], [10, 1.1], [15, 1.0]], 1.0, higher=False) == 10  # a loss: <= final / 0.9
    assert steps_to_fraction([], 0.9) is None and steps_to_fraction(slow, None) is None


def _row(scheme, depth, seed, status="trained", final=None, steps=None, diverged_step=None):
    return {"scheme": scheme, "depth": depth, "seed": seed, "status": status, f"final {M}": final,
            f"best {M}": final, "train_loss": 0.01, "steps_to_90": steps, "diverged_step": diverged_step,
            "throughput": 100.0 * (seed + 1), "point": f"d{depth}-{scheme}-s{seed}"}


def test_seeds_collapse_into_mean_std_with_diverged_runs_apart():
    rows = [_row("bn", 20, 0, final=0.90, steps=100), _row("bn", 20, 1, final=0.94, steps=120),
            _row("bn", 20, 2, final=0.92, steps=140),
            _row("none", 20, 0, "diverged at step 3", diverged_step=3), _row("none", 20, 1, final=0.5, steps=400),
            _row("none", 20, 2, "diverged at step 5", diverged_step=5),
            _row("fixup", 20, 0, "diverged at step 2", diverged_step=2),
            _row("fixup", 20, 1, "diverged at step 4", diverged_step=4)]
    collapsed, wide = depth_seed_tables(rows, M)
    bn, none, fixup = collapsed
    assert bn[f"final {M}"] == pytest.approx(0.92) and bn[f"final {M} std"] == pytest.approx(statistics.stdev([.9, .94, .92]))
    assert bn[f"final {M} n"] == 3 and bn["steps_to_90"] == pytest.approx(120) and bn["status"] == "trained"
    assert none["status"] == "partly diverged" and none["diverged"] == 2 and none[f"final {M} n"] == 1
    assert none["diverged_steps"] == "3 5" and fixup["status"] == "diverged"
    # the throughput of every run that ran, diverged or not: a diverged run's speed was measured all the same
    assert bn["throughput"] == none["throughput"] == pytest.approx(200.0) and none["throughput n"] == 3
    assert fixup["throughput"] == pytest.approx(150.0) and fixup["throughput n"] == 2
    cells = {r["scheme"]: r["depth 20"] for r in wide}
    assert cells["bn"] == "0.920 ± 0.020 (90% at 120)"
    assert cells["none"] == "0.500 (2/3 diverged; 90% at 400)"
    assert cells["fixup"] == "diverged 2/2 (@2,4)"


def test_a_depth_study_over_another_key_heads_its_columns_with_that_key():
    """``--depth_key trainer.max_epochs --depths 3 5 10``: a study of budgets, headed max_epochs 3 ..."""
    assert depth_axis(None) == depth_axis("model.init_args.network_options.depth") == "depth"
    assert depth_axis("trainer.max_epochs") == "max_epochs"
    rows = [_row("bn", 3, 0, final=0.9, steps=10), _row("bn", 10, 0, final=0.95, steps=40)]
    _, (wide,) = depth_seed_tables(rows, M, depth_axis("trainer.max_epochs"))
    assert list(wide) == ["scheme", "max_epochs 3", "max_epochs 10"]


def test_a_learning_rate_is_stable_only_when_no_seed_diverged():
    rows = []
    for lr, statuses in ((0.1, ["trained", "trained"]), (0.2, ["trained", "diverged at step 9"]),
                         (0.4, ["diverged at step 2", "diverged at step 3"])):
        for seed, status in enumerate(statuses):
            rows.append({"scheme": "rescale", "batch_size": 64, "lr": lr, "seed": seed, "status": status,
                         f"final {M}": None if status.startswith("d") else 0.9 + lr / 10, f"best {M}": None,
                         "train_loss": None, "steps_to_90": None, "diverged_step": None})
    collapsed = [{**r, "status": "diverged" if r["diverged"] else r["status"]}
                 for r in collapse_seeds(rows, ["scheme", "batch_size", "lr"], M)]
    (summary,) = batch_lr_tables(collapsed, M)
    assert summary["largest_stable_lr"] == 0.1 and summary["optimal_lr"] == 0.1 and summary["diverged"] == 2
    assert summary["largest_learning_lr"] == 0.1
    collapsed[0]["status"] = "failed to learn"  # finite but at chance: stable, not learning
    (summary,) = batch_lr_tables(collapsed, M)
    assert summary["largest_stable_lr"] == 0.1 and summary["largest_learning_lr"] is None


def test_seeds_not_done_are_counted_where_the_others_of_their_learning_rate_trained():
    """lr 0.2 with 1 of 3 seeds finished: its mean (the optimal one here) is of one seed, and the
    table's not_done says so (it read 0: only a learning rate none of whose seeds ran counted)."""
    rows = []
    for lr, statuses in ((0.1, ["trained"] * 3), (0.2, ["trained", "interrupted", "not run"]),
                         (0.4, ["not run"] * 3)):
        for seed, status in enumerate(statuses):
            rows.append({"scheme": "rescale", "batch_size": 64, "lr": lr, "seed": seed, "status": status,
                         f"final {M}": (0.9 + lr / 10) if status == "trained" else None, f"best {M}": None,
                         "train_loss": None, "steps_to_90": None, "diverged_step": None})
    collapsed = [{**r, "status": "diverged" if r["diverged"] else r["status"]}
                 for r in collapse_seeds(rows, ["scheme", "batch_size", "lr"], M)]
    (summary,) = batch_lr_tables(collapsed, M)
    assert summary["optimal_lr"] == 0.2 and summary["not_done"] == 5
    (plain,) = batch_lr_tables([r for r in rows if r["seed"] == 1], M)  # without seeds: one run a row
    assert plain["not_done"] == 2


def test_mean_curve_at_the_shared_steps():
    assert mean_curve([[[10, 0.2], [20, 0.4]], [[10, 0.4], [20, 0.8], [30, 0.9]]]) == [
        (10, pytest.approx(0.3), 0.2, 0.4), (20, pytest.approx(0.6), 0.4, 0.8)]


def test_tables_are_copied_into_the_document_and_checked(tmp_path, capsys):
    (tmp_path / "t").mkdir()
    (tmp_path / "t/grid.md").write_text("| a |\n|---|\n| 1 |\n")
    doc = tmp_path / "README.md"
    doc.write_text("x\n<!-- study-table: t/grid.md -->\nold, typed by hand\n<!-- /study-table -->\ny\n")
    assert update_document(str(doc), check=True) == 1
    assert "t/grid.md differs" in capsys.readouterr().err
    from rescale_tasks.cli import main

    # a failing check says why under --quiet too, and how to mend this document (not the default one)
    assert main(["--quiet", "study", "tables", str(doc), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"warning: {doc}: the table from t/grid.md differs from the file (run rescale study tables {doc})" in err
    assert update_document(str(doc)) == 0
    assert doc.read_text() == "x\n<!-- study-table: t/grid.md -->\n| a |\n|---|\n| 1 |\n<!-- /study-table -->\ny\n"
    assert update_document(str(doc), check=True) == 0
    with pytest.raises(UserError, match="gone.md .*not found"):
        fill_tables("<!-- study-table: gone.md -->\n<!-- /study-table -->", str(tmp_path))


@pytest.mark.parametrize("text, refusal", [
    ("<!-- study-table: t/grid.md -->\nold\n\n## Prose\nhand text\n<!-- study-table: t/grid.md -->\nold\n"
     "<!-- /study-table -->\n", "line 1: its study-table block is not closed before the next one (line 6)"),
    ("x\n<!-- study-table: t/grid.md -->\n| 9.999 |\n", "line 2: its study-table block is never closed"),
    ("x\n<!-- /study-table -->\n", "line 2: <!-- /study-table --> closes no block"),
    ("see <!-- study-table: t/grid.md -->\n<!-- /study-table -->\n", "line 1: write the marker as"),
])
def test_markers_that_do_not_pair_up_are_refused_and_the_document_is_kept(tmp_path, error_line, text, refusal):
    """A block whose closing marker is missing would swallow the prose down to the next block's
    closing marker (or be left unchecked): refused by naming the line, before anything is written."""
    from rescale_tasks.cli import main

    (tmp_path / "t").mkdir()
    (tmp_path / "t/grid.md").write_text("| a |\n|---|\n| 1 |\n")
    doc = tmp_path / "doc.md"
    doc.write_text(text)
    for check in ([], ["--check"]):
        assert main(["study", "tables", str(doc), *check]) == 2
        assert error_line().startswith(f"{doc}, {refusal}")
    assert doc.read_text() == text


def test_a_table_file_edited_by_hand_against_its_csv_is_refused(tmp_path, error_line):
    """The study wrote depth_grid.csv (full precision) and its rounding depth_grid.md; a number
    edited by hand in the .md, and copied into the document, passed --check: now both commands
    refuse it in one line, and the document is kept."""
    from rescale_tasks.cli import main
    from rescale_tasks.studies.outputs import write_table

    study = tmp_path / "s"
    write_table([{"scheme": "bn", "final val/acc1": 0.95123, "n": 3, "stable": True, "note": None},
                 {"scheme": "rescale", "final val/acc1": 0.94, "n": 2, "stable": False, "note": "1/3 diverged"}],
                str(study / "depth_grid"), title="Depth study")
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- study-table: s/depth_grid.md -->\n<!-- /study-table -->\n")
    assert main(["study", "tables", str(doc)]) == 0 and main(["study", "tables", str(doc), "--check"]) == 0
    table = (study / "depth_grid.md").read_text()
    assert "| bn | 0.9512 | 3 | yes |  |" in table
    (study / "depth_grid.md").write_text(table.replace("0.9512", "0.9612"))
    text = doc.read_text().replace("0.9512", "0.9612")
    doc.write_text(text)
    for check in (["--check"], []):
        assert main(["study", "tables", str(doc), *check]) == 2
        assert error_line() == ("study table s/depth_grid.md is not the table of depth_grid.csv beside it (a number "
                                f"edited by hand?): write both again with rescale study aggregate {study}")
    assert doc.read_text() == text


@pytest.mark.parametrize("document, tables", [("docs/studies.md", 19), ("README.md", 3)])
def test_the_published_study_tables_are_the_files_the_studies_wrote(document, tables):
    text = (REPO / document).read_text()
    new, changed, seen = fill_tables(text, str((REPO / document).parent))
    assert len(seen) == tables, f"{document} publishes its study tables from files"
    assert not changed, f"{document} tables differ from their files: {changed} (run: rescale study tables {document})"


def test_study_tables_checks_the_studies_page_by_default(monkeypatch, capsys):
    from rescale_tasks.studies.study import main

    monkeypatch.chdir(REPO)
    assert main(["tables", "--check"]) == 0
    assert capsys.readouterr().out.strip() == "docs/studies.md: 19 study tables, all equal to their files"



def test_cifar_rescale_configs_and_the_recipe_carry_rescalenets_lr_scaling_and_warm_up():
    import yaml

    cifar = REPO / "experiments/cifar"
    batch = yaml.safe_load((cifar / "_defaults.yaml").read_text())["data"]["init_args"]["batch_size"]
    files = sorted(cifar.glob("wrn*_rescale.yaml")) + [cifar / "recipes/rescale.yaml"]
    assert len(files) >= 5
    for path in files:
        init = yaml.safe_load(path.read_text())["model"]["init_args"]
        assert init["optimizer"]["init_args"]["lr"] == pytest.approx(0.1 * batch / 256), path.name
        assert init["lr_scheduler"]["init_args"]["warmup_epochs"] == 5, path.name
    # the depth study's points pick the recipe up for rescale only
    points = depth_points(["base.yaml"], [16], ["bn", "rescale"], "s",
                          recipe=str(cifar / "recipes/{scheme}.yaml"))
    assert [p.params["recipe"] for p in points] == ["base", "rescale"]


def test_a_recipe_template_that_names_no_file_is_one_line(tmp_path, monkeypatch, capsys):
    from rescale_tasks.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.yaml").write_text("model: {}\n")
    assert main(["study", "depth", "--config", "base.yaml", "--depths", "20", "--schemes", "bn", "rescale",
                 "--recipe", "recipes/{scheme}.yml", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --recipe recipes/{scheme}.yml: no recipe file for any of the schemes bn rescale "
                   "(a scheme without one trains on the base config)"]


def test_a_recipe_from_another_experiments_folder_is_refused_in_one_line(capsys):
    """The CIFAR recipe on the MNIST 5k yardstick would bring experiments/cifar/_defaults.yaml
    with it: a Wide-ResNet on CIFAR's data instead of the base config's network and data."""
    from pathlib import Path

    from rescale_tasks.cli import main

    root = Path(__file__).resolve().parents[3] / "experiments"
    base = str(root / "mnist5k" / "resnet20_bn.yaml")
    assert main(["study", "depth", "--config", base, "--depths", "20", "--schemes", "bn", "rescale",
                 "--recipe", str(root / "cifar" / "recipes" / "{scheme}.yaml"), "--dry-run"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: --recipe {root / 'cifar' / 'recipes' / 'rescale.yaml'}: it lies under "
                           f"{root / 'cifar'}, whose _defaults.yaml would replace the network and data of {base}")
    assert main(["study", "depth", "--config", base, "--depths", "20", "--schemes", "bn", "rescale",
                 "--recipe", str(root / "mnist5k" / "recipes" / "{scheme}.yaml"), "--dry-run"]) == 0
