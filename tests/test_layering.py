"""The imports of the suite point one way (``tools/layering.py``): rescale_core <- tasks/common <- the
task folders <- tasks/studies <- tasks/cli.py, with no cycle, no private name taken from another
module and a reason beside every first-party import made inside a function. Pure parsing: nothing
is imported."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tools.layering import build, main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report():
    return build(REPO)


def test_the_whole_code_is_read(report):
    sources = {i.source for i in report.imports}
    assert {"rescale_tasks.cli", "rescale_tasks.studies.study", "rescale_tasks.common.lightning_cli",
            "rescale_core.registry", "benchmarks.sections"} <= sources


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
