"""The package surface: every module documents the paper it implements (He et al. 2016,
Shao et al. 2020, ...), and the top-level helpers for the mean-shift statistics."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

import rescale_core

PACKAGE = Path(rescale_core.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))
CITATION = re.compile(r"et al\.|\b(19|20)\d\d\b")


def test_modules_found():
    names = {p.relative_to(PACKAGE).as_posix() for p in MODULES}
    assert {"__init__.py", "schemes.py", "layers.py", "blocks.py", "init.py", "registry.py",
            "optim.py", "analysis.py", "models/__init__.py", "models/resnet.py",
            "models/vgg.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_module_docstring_cites_a_paper(path):
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc, f"{path} has no module docstring"
    assert CITATION.search(doc), f"{path}: the module docstring cites no paper"


def test_public_names():
    for name in rescale_core.__all__:
        assert hasattr(rescale_core, name), name


def test_mean_shift_helpers():
    model = rescale_core.create_model("resnet18", scheme="rescale", base_width=8, num_classes=3)
    layers = rescale_core.mean_shift_layers(model)
    assert layers and all(isinstance(m, rescale_core.MeanShiftBias) for m in layers)
    assert rescale_core.mean_shift_layers(torch.nn.Linear(2, 2)) == []
    rescale_core.finish_measuring(model)
    assert not any(m.measuring for m in layers)
