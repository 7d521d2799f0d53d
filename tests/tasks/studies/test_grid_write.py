"""A study's files (grid.json, each point's outcome) are written whole or not at all."""
from __future__ import annotations

import json
import os

import pytest

from rescale_tasks.studies.grid import read_json, write_json


def test_a_grid_file_that_fails_midway_leaves_the_old_one_and_no_temporary_file(tmp_path):
    path = str(tmp_path / "grid.json")
    write_json(path, {"points": [1, 2]})
    # json.dump writes the first keys before it meets the value it cannot encode
    with pytest.raises(TypeError):
        write_json(path, {"points": [1, 2, 3], "bad": object()})
    assert read_json(path) == {"points": [1, 2]}
    assert os.listdir(tmp_path) == ["grid.json"]
    write_json(path, {"points": [3]})
    assert json.loads(open(path).read()) == {"points": [3]} and os.listdir(tmp_path) == ["grid.json"]
