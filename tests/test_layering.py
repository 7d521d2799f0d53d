"""The imports of the suite point one way (``tools/layering.py``): rescale_core <- tasks/common <- the
task folders <- tasks/studies <- tasks/cli.py, and inside tasks/common errors <- system/ <- data/ <-
training/ <- checkpoints/ <- reporting/ <- run/ <- module <- cli/ <- export/, with no cycle, no private
name taken from another module and a reason beside every first-party import made inside a function.
Pure parsing: nothing is imported."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tools.layering import build, main, unit_of

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report():
    return build(REPO)


def test_the_whole_code_is_read(report):
    sources = {i.source for i in report.imports}
    assert {"rescale_tasks.cli", "rescale_tasks.studies.study", "rescale_tasks.common.cli.lightning_commands",
            "rescale_core.registry", "benchmarks.sections"} <= sources


def test_every_module_of_common_has_its_layer(report):
    assert report.unplaced() == []
    layers = {m: unit_of(m)[0] for m in report.modules}
    assert layers["rescale_tasks.common.errors"] < layers["rescale_tasks.common.system.cores"] \
        < layers["rescale_tasks.common.data.sampling"] < layers["rescale_tasks.common.training.class_paths"] \
        < layers["rescale_tasks.common.checkpoints.files"] < layers["rescale_tasks.common.reporting.wandb_logger"] \
        < layers["rescale_tasks.common.run.outputs"] < layers["rescale_tasks.common.module"] \
        < layers["rescale_tasks.common.cli.lightning_commands"] < layers["rescale_tasks.common.export.command"] \
        < layers["rescale_tasks.classification.module"]


def test_no_import_cycle(report):
    assert report.cycles() == []


def test_imports_point_down_the_layers_and_task_folders_never_import_each_other(report):
    assert [f"{i.path}:{i.line} {i.source} -> {i.target}" for i in report.wrong_way()] == []


def test_no_private_name_is_taken_from_another_module(report):
    assert report.private_imports() == []


def test_every_first_party_import_inside_a_function_says_why(report):
    assert [f"{i.path}:{i.line} {i.source} -> {i.target}" for i in report.unexplained_local_imports()] == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_the_check_finds_each_kind_of_fault(tmp_path, capsys):
    """A small tree with one fault of each kind: the report names each, and the command exits 1."""
    root = _tree(tmp_path, {
        "rescale_core/__init__.py": "",
        "rescale_core/a.py": "_hidden = 1\n",
        "tasks/__init__.py": "",
        "tasks/cli.py": "",
        "tasks/common/__init__.py": "",
        "tasks/common/spine.py": "from ..studies import leaf\n",
        "tasks/studies/__init__.py": "",
        "tasks/studies/leaf.py": """\
            from rescale_core.a import _hidden
            from ..common import spine


            def late():
                from .. import cli
            """,
        "tasks/video/__init__.py": "",
        "tasks/video/clips.py": """\
            import rescale_core.a


            def peek():
                from ..classification import images  # the slow decoder libraries: only when asked
                return rescale_core.a._hidden
            """,
        "tasks/classification/__init__.py": "",
        "tasks/classification/images.py": "",
        "benchmarks/__init__.py": "",
    })
    report = build(root)
    assert report.cycles() == [["rescale_tasks.common.spine", "rescale_tasks.studies.leaf",
                                "rescale_tasks.common.spine"]]
    assert {(i.source, i.target) for i in report.wrong_way()} == {
        ("rescale_tasks.common.spine", "rescale_tasks.studies.leaf"),
        ("rescale_tasks.studies.leaf", "rescale_tasks.cli"),
        ("rescale_tasks.video.clips", "rescale_tasks.classification.images")}
    assert report.private_imports() == [
        "tasks/studies/leaf.py:1  rescale_tasks.studies.leaf takes _hidden from rescale_core.a",
        "tasks/video/clips.py:6  rescale_tasks.video.clips reads rescale_core.a._hidden"]
    assert [(i.source, i.target) for i in report.unexplained_local_imports()] == [
        ("rescale_tasks.studies.leaf", "rescale_tasks.cli")]
    assert [i.comment for i in report.local_imports() if i.comment] == [
        "# the slow decoder libraries: only when asked"]
    assert main(["--repo", str(root)]) == 1
    printed = capsys.readouterr().out
    assert "cycles: 1" in printed and "arrows up a layer or between task folders: 3" in printed


def test_an_import_up_between_subpackages_of_common_is_reported(tmp_path, capsys):
    """The subpackages of tasks/common are layers of their own: system/ imports errors and its own
    modules, run/ imports system/; system/ importing run/ is an arrow up a layer, and so is any import
    by a module that COMMON_LAYERS does not place (it sits with the lowest until it is placed)."""
    root = _tree(tmp_path, {
        "rescale_core/__init__.py": "",
        "tasks/__init__.py": "",
        "tasks/cli.py": "from .common.run import folder\n",
        "tasks/common/__init__.py": "",
        "tasks/common/errors.py": "",
        "tasks/common/system/__init__.py": "from .cores import usable_cores\n",
        "tasks/common/system/atomic.py": "from ..errors import UserError\n",
        "tasks/common/system/cores.py": "from ..run.outputs import run_directory\nfrom .atomic import UserError\n",
        "tasks/common/run/__init__.py": "",
        "tasks/common/run/outputs.py": "from ..errors import UserError\n",
        "tasks/common/run/folder.py": "from ..system import usable_cores\nfrom .outputs import run_directory\n",
        "tasks/common/stray.py": "from .system import cores\n",
        "benchmarks/__init__.py": "",
    })
    report = build(root)
    assert report.cycles() == []
    assert [(i.source, i.target) for i in report.wrong_way()] == [
        ("rescale_tasks.common.stray", "rescale_tasks.common.system.cores"),
        ("rescale_tasks.common.system.cores", "rescale_tasks.common.run.outputs")]
    assert report.unplaced() == ["rescale_tasks.common.stray"]
    assert main(["--repo", str(root)]) == 1
    printed = capsys.readouterr().out
    assert ("tasks/common/system/cores.py:1  rescale_tasks.common.system.cores -> rescale_tasks.common.run.outputs  "
            "(tasks/common/system imports tasks/common/run)") in printed
    assert "modules of tasks/common in no layer (add them to COMMON_LAYERS): 1" in printed
