"""The imports of the suite point one way (``tools/layering.py``): import-linter's contracts in
pyproject.toml (benchmarks -> rescale_tasks -> rescale_core; in rescale_tasks the command line ->
studies -> the task folders, which never import each other -> common; inside common export -> cli ->
module -> run -> reporting -> checkpoints -> training -> data -> system -> errors), with no import
cycle, no private name taken from another module and a reason beside every first-party import made
inside a function. Each run is one ``python -m tools.layering`` process (the code is parsed, never
imported)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tools.layering import contracts

REPO = Path(__file__).resolve().parents[1]


def _check(root: Path) -> subprocess.CompletedProcess:
    """``python -m tools.layering`` on the packages under ``root`` (found there first)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    return subprocess.run([sys.executable, "-m", "tools.layering"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_suite_keeps_its_layers():
    done = _check(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 3 kept, 0 broken." in done.stdout
    assert "import cycles between modules: 0" in done.stdout
    assert "without a reason: 0" in done.stdout


def test_every_module_of_common_and_of_the_package_has_its_layer():
    by_id = {c["id"]: c for c in contracts(REPO / "pyproject.toml")}
    assert by_id["common"]["layers"] == ["export", "cli", "module", "run", "reporting", "checkpoints", "training",
                                         "data", "system", "errors"]
    assert by_id["common"]["exhaustive"] and by_id["tasks"]["exhaustive"]
    assert by_id["tasks"]["layers"][-2:] == ["classification | detection | translation | video", "common"]


@pytest.fixture
def copy(tmp_path) -> Path:
    """The packages and their contracts in a folder of their own (``tasks/`` under its import name)."""
    for source, name in (("rescale_core", "rescale_core"), ("tasks", "rescale_tasks"), ("benchmarks", "benchmarks")):
        shutil.copytree(REPO / source, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.md"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    return tmp_path


def _add(root: Path, name: str, text: str) -> None:
    path = root / name
    path.write_text((path.read_text() if path.exists() else "") + textwrap.dedent(text))


def test_each_kind_of_fault_breaks_the_check(copy):
    """One fault of each kind planted in a copy: an import up a layer inside common, one between task
    folders, a module no layer holds, a cycle, a private name, a function-local import without a
    reason; the check names each and fails."""
    _add(copy, "rescale_tasks/common/system/cores.py", "from ..run import outputs\n")
    _add(copy, "rescale_tasks/video/clips_extra.py", """\
        def peek():
            from ..classification import data  # the slow decoder libraries: only when asked
            from .. import cli
            from rescale_core.registry import _REGISTRY  # the registry: only when asked
            import rescale_core.registry  # the registry: only when asked
            return rescale_core.registry._hidden
        """)
    _add(copy, "rescale_tasks/common/stray.py", "")
    _add(copy, "rescale_core/cyc_a.py", "from . import cyc_b\n")
    _add(copy, "rescale_core/cyc_b.py", "from . import cyc_a\n")
    done = _check(copy)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "rescale_tasks.common.system.cores -> rescale_tasks.common.run.outputs" in out
    assert "rescale_tasks.video.clips_extra -> rescale_tasks.classification.data" in out
    assert "rescale_tasks.video.clips_extra -> rescale_tasks.cli" in out
    assert "rescale_tasks.common.stray" in out  # exhaustive: not in any layer
    assert "\n  rescale_core.cyc_a -> rescale_core.cyc_b -> rescale_core.cyc_a\n" in out.split("import cycles", 1)[1]
    faults = out.split("without a reason: ", 1)[1]
    assert faults.startswith("3\n"), faults
    assert "rescale_tasks/video/clips_extra.py:3  rescale_tasks.video.clips_extra: a first-party import inside a function" in faults
    assert "clips_extra.py:4  rescale_tasks.video.clips_extra takes _REGISTRY from rescale_core.registry" in faults
    assert "clips_extra.py:6  rescale_tasks.video.clips_extra reads rescale_core.registry._hidden" in faults
