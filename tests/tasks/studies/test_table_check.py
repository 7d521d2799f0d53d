"""``rescale study tables --check`` reads each table's ``.csv`` back as ``write_table`` wrote it:
text that looks like a number stays text, and a ``.csv`` or ``.md`` edited by hand is caught, even
an edit the rounding hides."""
from __future__ import annotations

import pytest

from rescale_tasks.cli import main
from rescale_tasks.studies.outputs import WRITTEN_SUFFIX, write_table

ROWS = [{"scheme": "bn", "lr": "1e-3", "note": "NaN", "final val/acc1": 0.95123, "std": float("nan"), "n": 3,
         "stable": True, "label": "0.10", "error": None},
        {"scheme": "rescale", "lr": "0.001", "note": "1/3 diverged", "final val/acc1": 1e-05, "std": None, "n": 2,
         "stable": False, "label": "True", "error": "1_000"}]


@pytest.fixture
def doc(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_table(ROWS, str(tmp_path / "s/grid"), title="Depth study")
    path = tmp_path / "doc.md"
    path.write_text("<!-- study-table: s/grid.md -->\n<!-- /study-table -->\n")
    assert main(["study", "tables", str(path)]) == 0
    return path


def test_an_untouched_pair_passes_whatever_its_text_looks_like(doc, tmp_path):
    assert main(["study", "tables", str(doc), "--check"]) == 0
    table = (tmp_path / "s/grid.md").read_text()
    assert "| bn | 1e-3 | NaN | 0.9512 | nan | 3 | yes | 0.10 |  |" in table
    assert "| rescale | 0.001 | 1/3 diverged | 1e-05 |  | 2 | no | True | 1_000 |" in table


@pytest.mark.parametrize("file, old, new", [
    ("grid.md", "0.9512", "0.9612"),     # a figure of the published table
    ("grid.csv", "0.95123", "0.95118"),  # a full-precision value, even one that rounds the same
    ("grid.csv", "1e-05", "1e-5"),       # the same number, not as the study wrote it
])
def test_a_file_edited_by_hand_is_caught_in_one_line(doc, tmp_path, error_line, file, old, new):
    path = tmp_path / "s" / file
    path.write_text(path.read_text().replace(old, new))
    if file.endswith(".md"):
        doc.write_text(doc.read_text().replace(old, new))
    text = doc.read_text()
    for check in (["--check"], []):
        assert main(["study", "tables", str(doc), *check]) == 2
        assert error_line().startswith("study table s/grid.md")
    assert doc.read_text() == text


def test_a_pair_written_before_the_record_reads_numbers_only_as_the_csv_writes_them(doc, tmp_path):
    (tmp_path / "s" / f"grid{WRITTEN_SUFFIX}").unlink()
    write_table([r for r in ROWS if r["scheme"] == "bn"], str(tmp_path / "s/grid"), title="Depth study")
    (tmp_path / "s" / f"grid{WRITTEN_SUFFIX}").unlink()
    assert main(["study", "tables", str(doc)]) == 0 and main(["study", "tables", str(doc), "--check"]) == 0


def test_numpy_cells_are_recorded_as_the_numbers_they_are_and_the_record_is_written_last(tmp_path, monkeypatch):
    """np.int64 / np.float64 / np.bool_ cells (pandas' and numpy's means) read back as numbers and
    booleans; a rewrite removes the old record before writing the files it describes."""
    import json

    import numpy as np

    stem = str(tmp_path / "t/grid")
    write_table([{"n": np.int64(3), "mean": np.float64(0.5), "stable": np.bool_(True)}], stem)
    assert json.loads((tmp_path / ("t/grid" + WRITTEN_SUFFIX)).read_text())["kinds"] == [["int", "float", "bool"]]
    written = []
    import rescale_tasks.studies.outputs as outputs
    real_open = outputs.atomic_open

    def spy(path, *args, **kwargs):
        written.append((path.rsplit("/", 1)[-1], (tmp_path / ("t/grid" + WRITTEN_SUFFIX)).exists()))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(outputs, "atomic_open", spy)
    write_table([{"n": 4}], stem)
    assert written == [("grid.csv", False), ("grid.md", False), ("grid" + WRITTEN_SUFFIX, False)]
