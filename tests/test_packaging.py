"""Packaging: every package directory is installed, and `tasks/` only under a project name."""
from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_package_directory_is_listed():
    cfg = _pyproject()["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = {v: k for k, v in cfg["package-dir"].items()}  # folder -> import name
    found = set()
    for top in ("rescale_core", "tasks"):
        for init in (REPO / top).rglob("__init__.py"):
            parts = list(init.parent.relative_to(REPO).parts)
            parts[0] = mapping.get(parts[0], parts[0])
            found.add(".".join(parts))
    assert found == listed


def test_tasks_is_installed_under_the_project_name():
    cfg = _pyproject()
    assert cfg["tool"]["setuptools"]["package-dir"]["rescale_tasks"] == "tasks"
    assert not any(p == "tasks" or p.startswith("tasks.") for p in cfg["tool"]["setuptools"]["packages"])
    assert cfg["project"]["scripts"]["rescale"] == "rescale_tasks.cli:main"


def test_torch_and_torchvision_are_pinned_as_a_pair():
    deps = _pyproject()["project"]["dependencies"]
    assert "torch==2.14.1" in deps and "torchvision==0.29.1" in deps
    import torchvision
    from torchvision.ops import nms
    import torch

    keep = nms(torch.tensor([[0.0, 0, 10, 10], [1, 1, 10, 10]]), torch.tensor([0.9, 0.8]), 0.5)
    assert keep.tolist() == [0] and torchvision.__version__.startswith("0.29.1")
