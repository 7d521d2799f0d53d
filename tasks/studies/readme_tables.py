"""``rescale study tables docs/studies.md``: the published tables of a document, copied from the
files a study wrote, never typed by hand.

A block of the document::

    <!-- study-table: studies/digits-depth/depth_grid.md -->
    ... (replaced by that file's content)
    <!-- /study-table -->

names the table file (``<out>/<name>.md`` of ``rescale study ...`` or ``rescale study aggregate``,
relative to the document's folder); the command replaces each block's body with the file's
current content and says which blocks changed. ``--check`` changes nothing and exits 1 when a
block differs from its file (what a test or CI runs, so that a figure edited by hand is caught),
and both refuse a table file that is not the rounding of the full-precision ``.csv`` written beside
it (a figure edited by hand in the study's ``.md``).
"""
from __future__ import annotations

import csv
import logging
import os
import re
import shlex

from ..common.errors import UserError
from ..common.system import write_atomically
from .outputs import TableEdited, csv_markdown_table

__all__ = ["check_markers", "fill_tables", "update_document"]

log = logging.getLogger(__name__)

_BLOCK = re.compile(r"(<!-- study-table: (?P<path>[^>]+?) -->\n)(?P<body>.*?)(<!-- /study-table -->)", re.S)
_MARKER = re.compile(r"<!-- (?P<close>/)?study-table\b[^\n]*")


def check_markers(text: str, where: str = "the document") -> None:
    """Refuse, in one line naming the line, a block that would swallow what is not its table: an
    opening marker not closed before the next one (or the end), a closing one that closes nothing,
    an opening one that is not ``<!-- study-table: PATH -->`` alone on its line."""
    opened = None  # the line of the block open at this point
    for match in _MARKER.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        if match.group("close"):
            if opened is None:
                raise UserError(f"{where}, line {line}: <!-- /study-table --> closes no block: remove it, or "
                                "add <!-- study-table: PATH --> above its table")
            opened = None
            continue
        if opened is not None:
            raise UserError(f"{where}, line {opened}: its study-table block is not closed before the next one "
                            f"(line {line}): add <!-- /study-table --> after its table")
        at_line_start = match.start() == 0 or text[match.start() - 1] == "\n"
        if not at_line_start or not re.fullmatch(r"<!-- study-table: [^>]+? -->", match.group(0).rstrip()):
            raise UserError(f"{where}, line {line}: write the marker as <!-- study-table: PATH --> on a line of "
                            "its own")
        opened = line
    if opened is not None:
        raise UserError(f"{where}, line {opened}: its study-table block is never closed: add "
                        "<!-- /study-table --> after its table")


def fill_tables(text: str, root: str, where: str = "the document") -> tuple[str, list[str], list[str]]:
    """``text`` with every study-table block's body replaced by its file's content (paths relative
    to ``root``); the paths of the blocks that changed, and of all blocks. Markers that do not pair
    up are refused first (:func:`check_markers`), before anything is replaced."""
    check_markers(text, where)
    changed, seen = [], []

    def replace(match: re.Match) -> str:
        rel = match.group("path").strip()
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            raise UserError(f"study table {rel} (named in the document) not found under {root}: "
                            "run the study command shown above the block, or rescale study aggregate")
        with open(path, encoding="utf-8") as f:
            body = f.read()
        _check_against_csv(rel, path, body)
        body = body if body.endswith("\n") else body + "\n"
        seen.append(rel)
        if body != match.group("body"):
            changed.append(rel)
        return match.group(1) + body + match.group(4)

    return _BLOCK.sub(replace, text), changed, seen


def _check_against_csv(rel: str, path: str, body: str) -> None:
    """Refuse, in one line, a table file whose table is not the rounding of the ``.csv`` the study
    wrote beside it (a number edited by hand in the ``.md``), or a ``.csv`` that is not the one the
    study wrote (:func:`~.outputs.csv_markdown_table`: its ``.written.json`` records it); a table
    without a ``.csv`` is taken as it is."""
    table = os.path.splitext(path)[0] + ".csv"
    if not os.path.isfile(table):
        return
    again = f"write both again with rescale study aggregate {shlex.quote(os.path.dirname(path))}"
    try:
        expected = csv_markdown_table(table).splitlines()
    except TableEdited as err:
        raise UserError(f"study table {rel}: {err}: {again}") from None
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise UserError(f"study table {rel}: cannot read {os.path.basename(table)} beside it ({err}): {again}") from None
    if [line for line in body.splitlines() if line.startswith("|")] != expected:
        raise UserError(f"study table {rel} is not the table of {os.path.basename(table)} beside it (a number "
                        f"edited by hand?): write both again with rescale study aggregate {shlex.quote(os.path.dirname(path))}")


def update_document(document: str, check: bool = False) -> int:
    """Fill (or, with ``check``, compare) the study tables of ``document``; the exit status: 1 when
    ``check`` finds a table that differs from its file, else 0."""
    if not os.path.isfile(document):
        raise UserError(f"document not found: {document}")
    with open(document, encoding="utf-8") as f:
        text = f.read()
    new, changed, seen = fill_tables(text, os.path.dirname(os.path.abspath(document)), document)
    if check:
        for rel in changed:  # what makes the check fail: said under --quiet too
            log.warning(f"warning: {document}: the table from {rel} differs from the file "
                        f"(run rescale study tables {shlex.quote(document)})")
        if not changed:
            log.info(f"{document}: {len(seen)} study tables, all equal to their files")
        return 1 if changed else 0
    if changed:
        write_atomically(document, new)
    log.info(f"{document}: {len(seen)} study tables, {len(changed)} updated"
             + (f" ({', '.join(changed)})" if changed else ""))
    return 0
