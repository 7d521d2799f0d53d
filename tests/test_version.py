"""The suite's version lives once (pyproject.toml): the packages, ``rescale --version``, the
changelog and the type markers follow it."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import rescale_core
import rescale_tasks

REPO = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_both_packages_carry_the_version_of_pyproject_and_the_changelog_names_it():
    assert rescale_core.__version__ == rescale_tasks.__version__ == VERSION
    headings = [line for line in (REPO / "CHANGELOG.md").read_text().splitlines() if line.startswith("## ")]
    assert headings[0] == "## [Unreleased]" and any(h.startswith(f"## [{VERSION}]") for h in headings)


def test_the_packages_are_typed_and_install_their_markers():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, folder in (("rescale_core", "rescale_core"), ("rescale_tasks", "tasks")):
        assert (REPO / folder / "py.typed").is_file()
        assert "py.typed" in setuptools["package-data"][package]


def test_rescale_version_prints_the_version_and_commit(capsys):
    """The installed command, as a user runs it; ``rescale --help`` names it."""
    from rescale_tasks.cli import main
    from rescale_tasks.common.system import describe_code

    rescale = str(Path(sys.executable).with_name("rescale"))
    done = subprocess.run([rescale, "--version"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"rescale {describe_code()}\n" and "(commit " in done.stdout
    assert main(["--help"]) == 0 and "rescale --version" in capsys.readouterr().out


def test_python_m_rescale_tasks_is_the_command_and_needs_no_git(tmp_path):
    """Without git on ``PATH`` the version is printed alone."""
    env = {**os.environ, "PATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "rescale_tasks", "--version"], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"rescale {VERSION}\n"


def test_version_and_help_answer_without_loading_torch_or_lightning():
    """``rescale --version`` and ``rescale --help`` load neither torch nor Lightning (~9 s of
    imports on 2 cores; they answer in 0.2 s): those load with the first command that runs."""
    code = ("import sys; from rescale_tasks.cli import main; assert main(['--version']) == main(['--help']) == 0; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning', 'rescale_core')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"
