"""Each run records which data it read (run_summary.json's ``data``), and ``rescale compare`` names
a row that pools runs of other data."""
from __future__ import annotations

import csv
import json

from rescale_tasks.cli import main
from rescale_tasks.common.run import read_summary


def _fit(tmp_path, run_config, name: str, *args: str) -> dict:
    config = run_config(tmp_path / f"{name}.yaml", trainer={"logger": None})
    summary = str(tmp_path / "runs" / name / "run_summary.json")
    assert main(["fit", "--config", config, "--run_summary.path", summary, *args]) == 0
    return read_summary(summary)


def test_the_summary_names_the_data_and_compare_flags_a_row_of_other_data(tmp_path, run_config, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    first = _fit(tmp_path, run_config, "a", "--seed_everything", "0")
    again = _fit(tmp_path, run_config, "b", "--seed_everything", "1")
    other = _fit(tmp_path, run_config, "c", "--seed_everything", "2", "--data.init_args.val_fraction", "0.2")
    data = first["data"]
    assert data["class"] == "DigitsDataModule"
    assert set(data["splits"]) == {"train", "val", "test"}
    assert all(len(s["hash"]) == 12 and s["count"] > 0 for s in data["splits"].values())
    assert sum(s["count"] for s in data["splits"].values()) == 1797
    json.dumps(data)
    assert again["data"] == data and other["data"] != data
    assert other["data"]["splits"]["val"]["count"] > data["splits"]["val"]["count"]

    # a summary written before the fingerprint existed is unknown, not a difference
    old = {k: v for k, v in again.items() if k != "data"}
    (tmp_path / "runs" / "b" / "run_summary.json").write_text(json.dumps(old))
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "runs" / "a"), str(tmp_path / "runs" / "b"), "--out", "same"]) == 0
    with open(tmp_path / "same/compare.csv") as f:
        assert [r["mixed"] for r in csv.DictReader(f)] == [""]

    assert main(["compare", str(tmp_path / "runs"), "--out", "cmp"]) == 0
    with open(tmp_path / "cmp/compare.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and rows[0]["runs"] == "3" and rows[0]["mixed"] == "data"
    assert "differ in data (DigitsDataModule[test 270 #" in capsys.readouterr().err  # counts and hashes, not JSON
