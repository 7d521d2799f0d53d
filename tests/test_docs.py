"""The documentation lives in the repository and can be followed from it.

- the README is the short front page: the two commands, and a link to every page of ``docs/``;
- every relative link of the README and of ``docs/`` reaches a file of the repository, and its
  ``#anchor`` a heading of that file;
- no text of the project cites a file outside the repository (a reader cannot follow it) or an
  issue number (the history is git's: the text says what the code is and why).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").rglob("*.md"))
# the pages people write (docs/studies/ holds the tables and plots the study commands wrote)
PAGES = [REPO / "README.md"] + [p for p in DOCS if "studies" not in p.relative_to(REPO / "docs").parts[:-1]]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".sh"}
OUTPUTS = {"demo_output", "runs", "studies", "analysis"}  # what commands write at the top level
LINK = re.compile(r"\]\(([^)\s]+)\)")


def project_files():
    """The project's text files (sources, configs, docs, tests; not the environment or outputs)."""
    for folder, dirs, files in os.walk(REPO):
        top = Path(folder) == REPO
        dirs[:] = [d for d in dirs if not (top and (d in OUTPUTS or d.startswith(".") and d != ".ci"))
                   and d != "__pycache__" and not d.endswith(".egg-info")]
        for name in files:
            path = Path(folder) / name
            if path.suffix in TEXT_SUFFIXES or name in ("Makefile", "run"):
                yield path


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a markdown file."""
    out = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_the_readme_is_the_front_page():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text
    assert len(text.splitlines()) <= 150, "the README is the front page: the guides live in docs/"
    linked = {(REPO / m).resolve() for m in (t.split("#")[0] for t in LINK.findall(text)) if m}
    missing = [str(p.relative_to(REPO)) for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"pages of docs/ the README does not link: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_reaches_a_file_and_its_heading(page):
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.is_file() and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: links that lead nowhere: {broken}"


def test_no_text_cites_a_file_outside_the_repository_or_an_issue_number():
    # built from parts, so that this guard does not match itself: the lead's notes file, the
    # machine's work folder and the shared folder beside the repository
    outside = re.compile("|".join(re.escape(part) for part in ("METHOD" + ".md", "/" + "work/", "/" + "shared/")))
    issue = re.compile(r"[Ii]ssues? #\d+|\(#\d+\)")
    found = []
    for path in project_files():
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            code = path.suffix in (".py", ".toml") or path.name == "Makefile"
            if outside.search(line) or (code and issue.search(line)):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, ("cite docs/ instead of a file outside the repository, and no issue numbers:\n"
                       + "\n".join(found))
